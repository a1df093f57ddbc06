"""CallbackBackend type-checks what user callbacks return."""

from __future__ import annotations

import pytest

import runtime_cache as rc
from runtime_cache.backends.callback import CallbackBackend
from runtime_cache.errors import BackendError, CallbackTypeError


def test_wrong_return_types_are_typed_errors() -> None:
    backend = CallbackBackend(
        load=lambda k: "text", store=lambda k, v: None, delete=lambda k: "yes"
    )  # type: ignore[arg-type, return-value]
    with pytest.raises(CallbackTypeError):
        backend.get("a/b")
    with pytest.raises(CallbackTypeError):
        backend.delete("a/b")
    with pytest.raises(CallbackTypeError):
        list(CallbackBackend(load=lambda k: None, store=lambda k, v: None, keys=lambda: [1]).keys())  # type: ignore[list-item]
    with pytest.raises(TypeError):
        CallbackBackend(load="nope", store=lambda k, v: None)  # type: ignore[arg-type]


def test_callback_exceptions_become_backend_errors_and_misses() -> None:
    def load(key: str) -> bytes | None:
        raise OSError("app storage unavailable")

    backend = CallbackBackend(load=load, store=lambda k, v: None)
    with pytest.raises(BackendError, match="app storage unavailable"):
        backend.get("a/b")
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.get(key) is None and cache.stats().errors == 1
    assert cache.get_or_build(key, lambda: b"v") == b"v"


def test_optional_callbacks() -> None:
    store: dict[str, bytes] = {}
    backend = CallbackBackend(load=store.get, store=store.__setitem__)
    backend.set("a/b", b"v")
    assert backend.get("a/b") == b"v"
    assert backend.delete("a/b") is False and list(backend.keys()) == []
    assert CallbackBackend(load=lambda k: bytearray(b"x"), store=lambda k, v: None).get("k") == b"x"
