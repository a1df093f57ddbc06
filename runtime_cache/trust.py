"""Shared stores are signed by default.

A store that others can write (``redis://``, ``rediss://``, ``redis+cluster://``, ``redis+unix://``,
``dir://...?shared=1``: a backend whose :attr:`~runtime_cache.api.Backend.shared`
is true) lets any of them plant a binary that every reader then runs. So a
:class:`~runtime_cache.Cache` over one refuses to open without a secret, unless
the store was opened unsigned on purpose (``insecure=1`` in its URL, or
``insecure=True``), as Redis's protected mode refuses remote clients until told
otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable

from .api import Backend
from .check import check_entry
from .codec import Limits, SecretKeys
from .environment import ENV_SECRET, ENV_SECRET_FILE
from .errors import CorruptEntryError, InsecureStoreError
from .fork_locks import renew_in_child

__all__ = ["INSECURE_OPTION", "entrust", "require_secret", "unsigned_refusal"]

log = logging.getLogger(__name__)

#: The URL option that opens a shared store without a secret, on purpose.
INSECURE_OPTION = "insecure"

_warned: weakref.WeakSet[Backend] = weakref.WeakSet()
_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_lock")


def require_secret(backend: Backend, signed: bool, insecure: bool = False) -> None:
    """Refuse a shared ``backend`` without a secret; warn once when it is opened unsigned
    on purpose. Raises :class:`~runtime_cache.errors.InsecureStoreError`."""
    if signed or not backend.shared:
        return
    if not (insecure or backend.insecure):
        tiers = [t for t in getattr(backend, "tiers", ()) if t.shared]  # (a tiered store's)
        raise unsigned_refusal(list(map(repr, tiers or [backend])))
    with _lock:
        try:
            first = backend not in _warned
            _warned.add(backend)
        except TypeError:  # a backend that cannot be weakly referenced: warn each time
            first = True
    if first:
        log.warning(
            "runtime-cache: %r is shared and unsigned (insecure=1): anyone who can write it "
            "can plant binaries; set RUNTIME_CACHE_SECRET to sign it",
            backend,
        )


def unsigned_refusal(stores: list[str]) -> InsecureStoreError:
    """The error refusing ``stores`` (shared ones, named for the message) to a cache
    without a secret, with how to give one."""
    if any(os.environ.get(name, "").strip() for name in (ENV_SECRET, ENV_SECRET_FILE)):
        # The variable is set, so this Cache was made in code without secret=.
        how = (
            f"{ENV_SECRET} is set, but Cache(backend) does not read it (get_cache() and "
            "the command line do): pass Cache(backend, secret=...)"
        )
    else:
        how = (
            f"Set {ENV_SECRET} (or {ENV_SECRET_FILE}; --secret or --secret-file on the "
            "command line; Cache(backend, secret=...) in code)"
        )
    return InsecureStoreError(
        f"refusing to use {' and '.join(stores)} without a secret: others can write it, so "
        f"they could plant binaries that this process would run. {how}, or add insecure=1 "
        "to the URL to use it unsigned on purpose"
    )


def entrust(
    backend: Backend, secret: SecretKeys | None, limits: Limits
) -> Callable[[str, bytes], bool]:
    """Give ``backend`` what a cache with ``secret`` and ``limits`` trusts; return the
    promotion check, which the cache keeps (the backend holds it weakly, so it goes with
    the cache: a cache opened again with a rotated secret is not held to the old one's).

    * It copies an entry up from a store others can write (a tier's promotion) only once
      it passes :func:`~runtime_cache.check.check_entry` with them: unchecked, a planted
      entry read once by a signed cache landed in its private tier, where a cache of the
      same user that needs no secret then served it, and where it hid the good entry
      stored later.
    * With a secret, it signs its build leases (:meth:`~runtime_cache.api.Backend.sign_leases`),
      so a lease planted without the secret holds no build off.
    """
    if secret is not None:
        backend.sign_leases(secret)

    def check(key: str, blob: bytes) -> bool:
        try:
            check_entry(key, blob, secret=secret, limits=limits)
        except CorruptEntryError:
            return False
        return True

    backend.check_promotions(check)
    return check
