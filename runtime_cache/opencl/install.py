"""Route pyopencl's own ``Program.build()`` source builds through runtime-cache.

pyopencl keeps its own binary cache only on platforms without a driver cache
(it turns it off for PoCL and NVIDIA, trusting theirs). :func:`install` wraps
``pyopencl.Program.build`` so that every source build, including the kernels
pyopencl generates for arrays, elementwise operations, reductions and scans,
is fetched from and stored in our cache on every platform. Programs created
from binaries or IL, or already created (``_prg`` set), are passed to
pyopencl unchanged. A failing source build is pyopencl's own build, so it
raises pyopencl's own error with the build log. :func:`uninstall` restores
the original method.

The binaries of a program built from source are read back and stored later
(:mod:`.write_behind`: at :func:`flush` or at exit, by default; at exit, on a
driver that compiles for that read, by a detached process, :mod:`.detached_store`),
so the build
returns as soon as the driver has built it; ``install(store="inline")``
stores them before the build returns. An explicit ``Program.build(cache_dir=...)`` (a folder) is
honoured: that call goes to pyopencl's own binary cache in that folder, and
ours is not used for it. Otherwise ``install()`` replaces pyopencl's own
cache: pyopencl's builds are made with ``cache_dir=False``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import InvalidValueError
from ..fork_locks import renew_in_child
from ._driver import import_pyopencl

if TYPE_CHECKING:
    from ..cache import Cache
    from .driver_cache import DriverCaches

# Importing this module and calling install() load none of the cache's machinery: a
# process that builds nothing never pays for it. The first source build imports it.

__all__ = ["driver_cache_wanted", "flush", "install", "installed", "is_installed", "uninstall"]

_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_lock")  # (held at a fork: free in the child)
_original: Callable[..., Any] | None = None
_cache: Cache | None = None
_store_mode = "deferred"
STORE_MODES = ("deferred", "background", "inline")
#: With the driver cache on: one set of driver files per context, for all of pyopencl's programs.
_driver: dict[int, DriverCaches] | None = None
#: The attribute naming the driver program a build through :func:`install` gave a Program.
_MADE = "_runtime_cache_prg"
#: The attribute holding a Program's build lock (see :func:`_build_lock`).
_LOCK = "_runtime_cache_build_lock"


def driver_cache_wanted(flag: bool | None = None) -> bool:
    """:func:`.driver_cache.driver_cache_enabled`, without importing that module (and
    the cache with it) while ``flag`` is ``None`` and ``RUNTIME_CACHE_DRIVER_CACHE`` is unset."""
    if flag is not None:
        return bool(flag)
    if not os.environ.get("RUNTIME_CACHE_DRIVER_CACHE", "").strip():
        return False  # unset or empty is off; only a value needs the module to read it
    from .driver_cache import driver_cache_enabled

    return driver_cache_enabled()


def _restore_driver_cache(context: Any, store: Cache) -> None:
    if _driver is None:  # the driver cache is off: leave its module unimported
        return
    from .driver_cache import DriverCaches

    with _lock:
        if _driver is None:
            return
        caches = _driver.setdefault(int(context.int_ptr), DriverCaches(context, "pyopencl"))
    caches.restore(store)


def _cached_build(
    original: Callable[..., Any],
) -> Callable[..., Any]:
    @functools.wraps(original)
    def build(
        self: Any,
        options: Any = None,
        devices: Sequence[Any] | None = None,
        cache_dir: Any = None,
    ) -> Any:
        if getattr(self, "__dict__", {}).get("_source") is None:  # from binaries or IL
            return original(self, options, devices, cache_dir)
        # One build of a Program at a time: a second thread's build again would otherwise
        # replace ``_prg`` between this build and the note of what it made.
        with _build_lock(self):
            return _build(original, self, options, devices, cache_dir)

    return build


def _build_lock(program: Any) -> threading.RLock:
    # Kept in the Program itself: hashing one (a dict's key) makes its ``_prg`` from source.
    with _lock:
        lock: threading.RLock = program.__dict__.setdefault(_LOCK, threading.RLock())
        return lock


def _build(
    original: Callable[..., Any],
    self: Any,
    options: Any,
    devices: Sequence[Any] | None,
    cache_dir: Any,
) -> Any:
    """:func:`install`'s ``Program.build``, under the Program's own lock."""
    # Read from the instance: a missing attribute is a kernel name to pyopencl's
    # Program.__getattr__ (and, with ``_prg`` None, a recursion).
    state = getattr(self, "__dict__", {})
    source, context = state.get("_source"), state.get("_context")
    made = state.get("_prg", True)
    if made is not None and made is state.get(_MADE):
        # Built again: pyopencl would build ``_prg`` again in place, but ours may be
        # a program from binaries, and a queued store reads the first build's
        # binaries from it. So it gets a new program, as on its first build.
        from .capture import forget

        self._prg = made = None  # (first: a late store then notes nothing, see remember)
        forget(self)
    if made is not None or source is None or context is None:
        return original(self, options, devices, cache_dir)
    if isinstance(cache_dir, (str, os.PathLike)):  # the caller asked for pyopencl's cache
        return original(self, options, devices, cache_dir)
    from ..keys import module_id_from_sources
    from ..provider import get_cache
    from .build_inputs import settle
    from .counters import counters
    from .program import fetch, holds_its_kernels, plan_program
    from .store_jobs import store_now
    from .write_behind import write_behind

    store = _cache if _cache is not None else get_cache()
    plan = plan_program(
        context,
        source,
        options,
        devices=devices,
        module_id=module_id_from_sources(source, name="pyopencl"),
    )
    if plan.keys is None:
        counters.add(uncacheable=1)
    else:
        _restore_driver_cache(context, store)
        started = time.perf_counter()
        found = store.get_many_views(plan.keys)
        loaded = fetch(context, plan, store, found)
        if loaded is not None and holds_its_kernels(store, plan, loaded, found):
            self._prg = loaded._prg
            setattr(self, _MADE, self._prg)
            self._build_duration_info = (
                "runtime-cache retrieval",
                True,
                time.perf_counter() - started,
            )
            return self
    started = time.perf_counter()
    original(self, options, devices, cache_dir=False)
    seconds = time.perf_counter() - started
    made = self._prg
    setattr(self, _MADE, made)
    self._context = context  # (pyopencl drops it after some builds: kept to build again)
    counters.add(source_builds=1)
    plan = settle(plan)  # (here, in the build's folder: a store in the background reads none)
    if plan.keys is not None and not (
        _store_mode != "inline"
        and write_behind.submit(
            store, plan, self, seconds, background=_store_mode == "background", made=made
        )
    ):
        store_now(store, plan, self, seconds, made)
    return self


def install(
    cache: Cache | None = None, *, driver_cache: bool | None = None, store: str = "deferred"
) -> None:
    """Wrap ``pyopencl.Program.build`` so source builds go through ``cache``.

    ``cache=None`` uses the process-wide cache (:func:`runtime_cache.get_cache`)
    at each build. Calling it again only changes the cache and ``store``.
    ``store`` says when the binaries of a source build are read back and
    stored (:mod:`.write_behind`): ``"deferred"`` at :func:`flush` or at exit,
    ``"background"`` also on a background thread once builds are quiet (only
    for drivers safe with that: not PoCL 3.1), ``"inline"`` before the build
    returns; another value raises :class:`~runtime_cache.errors.InvalidValueError`.
    ``driver_cache=True`` (``None``: ``RUNTIME_CACHE_DRIVER_CACHE``) also carries
    the driver's own JIT cache (:mod:`runtime_cache.opencl.driver_cache`); call
    ``install`` before the first ``pyopencl.get_platforms()`` then, since the
    driver reads its folder variable when it starts.
    """
    global _original, _cache, _driver, _store_mode
    if store not in STORE_MODES:
        raise InvalidValueError(f"install(store={store!r}): expected one of {STORE_MODES}")
    if driver_cache_wanted(driver_cache):
        from .driver_cache import prepare

        prepare()
    cl = import_pyopencl()
    with _lock:
        _cache = cache
        _store_mode = store
        if driver_cache_wanted(driver_cache):
            _driver = _driver if _driver is not None else {}
        if _original is None:
            _original = cl.Program.build
            cl.Program.build = _cached_build(_original)


def uninstall() -> bool:
    """Restore pyopencl's own ``Program.build``; return whether it was installed."""
    global _original, _cache, _driver
    cl = import_pyopencl()
    with _lock:
        if _original is None:
            return False
        cl.Program.build = _original
        _original, _cache, _driver = None, None, None
        return True


def flush(timeout: float | None = None) -> bool:
    """Store the binaries of every program :func:`install` has built so far.

    They are read back and stored in the calling thread, so call it when no
    other thread is using OpenCL (after start-up, say). Returns ``False`` if
    ``timeout`` (seconds) ran out first. At exit this happens by itself: in a
    detached process where the read-back is slow (see :mod:`.detached_store`;
    :func:`~runtime_cache.opencl.wait_for_detached_stores` waits for it), else
    here within ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS``.
    """
    queue = sys.modules.get(f"{__package__}.write_behind")
    if queue is None:
        return True  # no build has run, so nothing was ever queued (nor imported to queue it)
    return bool(queue.write_behind.flush(timeout))


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _original is not None


@contextmanager
def installed(cache: Cache | None = None) -> Iterator[None]:
    """Route pyopencl's source builds through the cache within a ``with`` block."""
    was = is_installed()
    previous = _cache
    install(cache)
    try:
        yield
    finally:
        if was:
            install(previous)
        else:
            uninstall()
