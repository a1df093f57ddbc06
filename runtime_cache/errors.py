"""Every exception runtime-cache raises.

All of them derive from :class:`RuntimeCacheError`. Errors about bad input (a
corrupt blob, a bad URL, a bad key) also derive from :class:`ValueError`, so code
that already catches ``ValueError`` keeps working.

Backends raise these; the front (:class:`runtime_cache.Cache`) decides the
policy: count and carry on as a miss, or raise when ``strict=True``.
"""

from __future__ import annotations


class RuntimeCacheError(Exception):
    """Base class of every runtime-cache error."""


class CorruptEntryError(RuntimeCacheError, ValueError):
    """An entry blob failed to decode: bad magic, version, checksum, size or layout."""


class RejectedEntryError(CorruptEntryError):
    """An entry that must not be used here, though it may be good for someone else: it is
    not the one its key names, or it is larger than this reader's limits.

    The front counts it as ``rejected`` and keeps it (another fleet member, with
    another secret or larger limits, may own it); see :mod:`runtime_cache.check`.
    """


class OverLimitError(RejectedEntryError):
    """An entry whose metadata or value is larger than this reader's ``Limits`` allow:
    refused here, kept for the readers whose limits allow it."""


class SignatureError(RejectedEntryError):
    """An entry or bundle lacks a valid HMAC signature while a secret is set."""


class KeyMismatchError(RejectedEntryError):
    """An entry's key is not its storage key, or its key parts do not hash to its key."""


class NewerFormatError(CorruptEntryError):
    """An entry written in a newer format version: a miss here, kept for the newer readers."""


class InsecureStoreError(RuntimeCacheError, ValueError):
    """A store that others can write was opened without a secret (and without ``insecure=1``)."""


class InvalidSecretError(RuntimeCacheError, ValueError):
    """A secret that is empty, blank, or of the wrong type."""


class InvalidBundleError(RuntimeCacheError, ValueError):
    """A bundle blob (``Cache.dumps`` output) failed to decode."""


class InvalidRecordError(RuntimeCacheError, ValueError):
    """A tuning record that is not a small msgpack-able dict, or a bad subgraph symbol."""


class InvalidKeyError(RuntimeCacheError, ValueError):
    """A storage key that a backend refuses (for example ``..`` or a NUL byte)."""


class InvalidURLError(RuntimeCacheError, ValueError):
    """A backend URL that cannot be parsed, or holds an unknown option."""


class InvalidValueError(RuntimeCacheError, ValueError):
    """A size, duration or boolean that does not parse, such as ``--max-size 5XB``."""


class UnknownBackendError(RuntimeCacheError, ValueError):
    """No backend is registered under the requested name or URL scheme."""


class BackendConflictError(RuntimeCacheError, ValueError):
    """A backend name is already registered and ``replace=True`` was not given."""


class MissingDependencyError(RuntimeCacheError, ImportError):
    """An optional dependency is not installed; the message names what to install."""


# What to install for each optional part, as the messages say it. runtime-cache comes from
# a wheel or a clone, not from PyPI (where another package could take its name), so they
# name the packages of each extra in pyproject.toml; a clone can use ``pip install '.[redis]'``.
#: redis-py, for ``redis://``, ``rediss://``, ``redis+cluster://`` and ``redis+unix://`` (the
#: ``redis`` extra).
INSTALL_REDIS = "pip install 'redis>=5.0' 'hiredis>=2.0'"
#: pyopencl with pip's PoCL, for ``runtime_cache.opencl`` and the demo (the ``opencl`` extra).
INSTALL_OPENCL = "pip install 'pyopencl[pocl]>=2024.1' 'numpy>=1.24' 'mako>=1.2'"
#: Intel's CPU OpenCL runtime, x86-64 Linux (the ``intel`` extra).
INSTALL_INTEL = "pip install 'intel-opencl-rt>=2024.0' 'intel-cmplr-lib-rt>=2024.0'"


class BackendError(RuntimeCacheError):
    """A backend failed to do I/O: disk full, permission denied, server down."""


class BackendUnavailableError(BackendError):
    """The backend's server cannot be reached right now (or its breaker is open)."""


class ReadOnlyBackendError(BackendError):
    """The backend's storage is read-only; reads still work, writes are skipped."""


class EntryTooLargeError(BackendError):
    """A value larger than the backend stores (its ``max_entry_size``): not stored. Not an
    outage: the front counts it as an error and logs it once, and the backend goes on.
    ``refused`` names the keys not stored (the others of a ``set_many`` were)."""

    def __init__(self, message: str, refused: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.refused = refused


class PartialReadError(BackendError):
    """A batch read that failed on some keys (an unreadable file) and read the others:
    ``found`` holds what was read, ``failed`` names the keys that failed. The front
    serves ``found`` and counts an error for each failed key."""

    def __init__(self, message: str, found: dict[str, bytes], failed: frozenset[str]) -> None:
        super().__init__(message)
        self.found = found
        self.failed = failed


class PartialDeleteError(BackendError):
    """A delete that some tiers of a store made and others could not, since they are down
    (each failed with :class:`BackendUnavailableError`): ``failed`` names those tiers, where
    the entry may live on. The entry is gone from the others. A tier that refused (an
    immutable file) makes a plain :class:`BackendError`. ``removed``: whether a tier that
    was reached held the entry (what a non-strict ``Cache.delete`` returns)."""

    def __init__(self, message: str, failed: tuple[str, ...], removed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed
        self.removed = removed


class CallbackTypeError(BackendError, TypeError):
    """A user callback of :class:`CallbackBackend` returned a value of the wrong type."""


__all__ = [
    "INSTALL_INTEL",
    "INSTALL_OPENCL",
    "INSTALL_REDIS",
    "BackendConflictError",
    "BackendError",
    "BackendUnavailableError",
    "CallbackTypeError",
    "CorruptEntryError",
    "EntryTooLargeError",
    "InsecureStoreError",
    "InvalidBundleError",
    "InvalidKeyError",
    "InvalidRecordError",
    "InvalidSecretError",
    "InvalidURLError",
    "InvalidValueError",
    "KeyMismatchError",
    "MissingDependencyError",
    "NewerFormatError",
    "OverLimitError",
    "PartialDeleteError",
    "PartialReadError",
    "ReadOnlyBackendError",
    "RejectedEntryError",
    "RuntimeCacheError",
    "SignatureError",
    "UnknownBackendError",
]
