"""Renaming a name within a folder only where the new name is free: ``renameat2`` with
``RENAME_NOREPLACE``, which Python's ``os`` does not offer, through ctypes.

``os.rename`` of a folder over an empty folder replaces it, and a link or a ``mkdir``
cannot stand in for it with folders: :func:`rename_noreplace` is how a folder made under a
random name, its mode set, takes its real name without ever replacing one that another
process made there meanwhile.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import cast

__all__ = ["rename_noreplace"]

#: ``renameat2``'s flag: fail with EEXIST where the new name is taken.
_RENAME_NOREPLACE = 1


def rename_noreplace(folder: int, old: str, new: str) -> bool | None:
    """Rename ``old`` to ``new`` in the open ``folder`` unless something is at ``new``
    (``renameat2`` with ``RENAME_NOREPLACE``, through ctypes): ``True``; ``False`` where
    something is there; ``None`` where this system cannot (not Linux, a C library without
    it, a file system that refuses the flag). Raises :class:`OSError` otherwise."""
    call = _renameat2()
    if call is None:
        return None
    if call(folder, os.fsencode(old), folder, os.fsencode(new), _RENAME_NOREPLACE) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return None
    raise OSError(err, os.strerror(err), new)


@functools.cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """The C library's ``renameat2`` (glibc 2.28 and later), or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return cast(Callable[[int, bytes, int, bytes, int], int], call)
