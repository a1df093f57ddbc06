"""The precompiled-program bundles of :class:`~runtime_cache.opencl.OpenCLModule`.

:class:`PrecompiledPrograms` gives the module ``get_precompiled_programs``,
``set_precompiled_programs`` and their kin: every program's binaries in one blob
tagged with device fingerprints, for apps that keep the bytes themselves (see
:mod:`.precompiled` for the format and the checks).
"""

from __future__ import annotations

import functools
from typing import Protocol

from ..bundles import LoadResult
from .bundle import unpack_programs
from .cached_load import Claim
from .module_host import ModuleCore
from .precompiled import load_bundle, pack_built

__all__ = ["PrecompiledPrograms"]


class _Host(ModuleCore, Protocol):
    """What :class:`PrecompiledPrograms`' methods use of the module they belong to."""

    _seconds: dict[str, float]

    @property
    def _claims(self) -> Claim: ...

    def _stop_reading_ahead(self) -> list[str]: ...

    def build_all(self) -> int: ...


class PrecompiledPrograms:
    """The bundle methods of :class:`~runtime_cache.opencl.OpenCLModule`."""

    def supports_precompiled_programs(self: _Host) -> bool:
        """Whether binaries can be read back: every device of the context has a compiler."""
        return all(bool(d.compiler_available) for d in self.context.devices)

    def get_precompiled_programs(self: _Host) -> bytes:
        """Return a bundle of every program's binaries, tagged with device fingerprints.

        Builds whatever is missing first. Programs that cannot be cached (an
        unresolvable ``#include``) are left out and later built from source. With
        a secret, the bundle and its entries are signed with it (a cache with the
        same secret loads them without vetting; one with another secret refuses them).
        """
        self.build_all()
        with self._lock:
            programs = dict(self._programs)
            seconds = dict(self._seconds)
        return pack_built(programs, seconds, self._plan, self.cache.secret_keys())

    def set_precompiled_programs(self: _Host, data: bytes) -> LoadResult:
        """Load programs from a bundle; return how many programs it supplied.

        Entries for another device, other options, or a module whose sources
        differ do not match this module's keys and are ignored; those programs
        are built from source later. Programs already built are kept. A
        malformed blob raises :class:`~runtime_cache.errors.InvalidBundleError`
        and leaves the module as it was. Accepted binaries are also stored in
        the cache, so other processes find them. With a secret, a bundle it did
        not sign raises :class:`~runtime_cache.errors.InvalidBundleError` (as
        :meth:`~runtime_cache.Cache.loads` does), and an entry it did not sign is
        refused (``rejected``): such a bundle could otherwise be loaded and then
        stored signed. Without one, binaries not known on this machine are first
        tried in a child process (:mod:`runtime_cache.opencl.vetting`), so one that
        crashes the driver is built from source instead of reaching this process.

        The result is an ``int`` with details (:class:`~runtime_cache.bundles.LoadResult`):
        ``unsigned`` counts programs no secret of the cache verified (only without a
        secret), ``rejected`` the entries a secret refused, and
        ``withheld`` those of them not stored because the cache is shared
        (others would run them): they are used by this module only.
        """
        cache = self.cache
        entries = unpack_programs(data, secret=cache.secret_keys(), limits=cache.limits)
        pending = self._stop_reading_ahead()  # (what the read-ahead loaded is adopted)
        plans = {name: self._plan(name) for name in pending}
        adopt = functools.partial(self._adopt, cached=True)
        return load_bundle(self.context, cache, entries, plans, adopt, self._claims)

    def recapture_binaries(self: _Host) -> int:
        """Re-read every built program's binaries after first launch; re-store changed ones.

        See :func:`runtime_cache.opencl.recapture_binaries` for when to call it.
        """
        from .capture import recapture_binaries

        with self._lock:
            programs = list(self._programs.values())
        return sum(recapture_binaries(p) for p in programs)
