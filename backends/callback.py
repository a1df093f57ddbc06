"""A backend over user callbacks, for apps that keep the bytes themselves.

Example, an Android-style app store of named blobs::

    store: dict[str, bytes] = {}
    backend = CallbackBackend(
        load=store.get,
        store=store.__setitem__,
        delete=lambda k: store.pop(k, None) is not None,
        keys=lambda: list(store),
    )
    cache = rc.Cache(backend)

What the callbacks return is type-checked: a ``load`` that returns anything but
``bytes`` or ``None`` raises :class:`~runtime_cache.errors.CallbackTypeError`,
which the front counts as a backend error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from runtime_cache.api import Backend
from runtime_cache.errors import BackendError, CallbackTypeError

__all__ = ["CallbackBackend"]


class CallbackBackend(Backend):
    """Delegates storage to ``load(key)``, ``store(key, value)``, and optionally
    ``delete(key) -> bool`` and ``keys() -> iterable of str``.

    Without ``delete``, deleting is a no-op that returns ``False``; without
    ``keys``, listing yields nothing.
    """

    scheme = "callback"

    def __init__(
        self,
        load: Callable[[str], bytes | None],
        store: Callable[[str, bytes], object],
        delete: Callable[[str], object] | None = None,
        keys: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        for name, fn in (("load", load), ("store", store), ("delete", delete), ("keys", keys)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, not {type(fn).__name__}")
        self._load = load
        self._store = store
        self._delete = delete
        self._keys = keys

    @staticmethod
    def _call(name: str, fn: Callable[..., object], *args: object) -> object:
        try:
            return fn(*args)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"callback {name} raised {type(exc).__name__}: {exc}") from exc

    def get(self, key: str) -> bytes | None:
        value = self._call("load", self._load, key)
        if value is None:
            return None
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        if not isinstance(value, bytes):
            raise CallbackTypeError(
                f"load({key!r}) must return bytes or None, not {type(value).__name__}"
            )
        return value

    def set(self, key: str, value: bytes) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"value must be bytes, not {type(value).__name__}")
        self._call("store", self._store, key, bytes(value))

    def delete(self, key: str) -> bool:
        if self._delete is None:
            return False
        result = self._call("delete", self._delete, key)
        if result is not None and not isinstance(result, bool):
            raise CallbackTypeError(
                f"delete({key!r}) must return bool, not {type(result).__name__}"
            )
        return bool(result)

    def keys(self, prefix: str = "") -> Iterator[str]:
        if self._keys is None:
            return iter(())
        listed = self._call("keys", self._keys)
        if not isinstance(listed, Iterable) or isinstance(listed, (str, bytes)):
            raise CallbackTypeError(f"keys() must return an iterable of str, not {listed!r}")
        out = []
        for key in listed:
            if not isinstance(key, str):
                raise CallbackTypeError(f"keys() yielded {type(key).__name__}, not str")
            if key.startswith(prefix):
                out.append(key)
        return iter(out)

    def __repr__(self) -> str:
        return f"<CallbackBackend load={getattr(self._load, '__qualname__', self._load)!r}>"
