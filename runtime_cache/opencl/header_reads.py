"""Reading the headers a build may read: each file's bytes and what tells its versions apart.

:func:`read_header` opens a header once (a regular file only: a FIFO or a device at its
name is never opened, and makes the build uncacheable) and gives its bytes with its
:data:`Stamp`.
:class:`HeaderReads` gathers what one scan of
:func:`~runtime_cache.opencl.includes.include_digests` read, so that the look after a build
(:func:`~runtime_cache.opencl.build_inputs.settle`) compares the files, not only their
digests: a header changed and changed back between the two looks has the same digest and
another ``ctime``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

__all__ = ["MAX_FILE_SIZE", "UNREADABLE", "HeaderReads", "Stamp", "Unreadable", "read_header"]

#: The largest header read: one larger cannot go into a key (the build is uncacheable).
MAX_FILE_SIZE = 16 << 20

#: What tells one version of a file from another: its device and inode (a file put in its
#: place has another), its size, ``st_mtime_ns``, and ``st_ctime_ns``, which any write
#: moves and no user can set back.
Stamp = tuple[int, int, int, int, int]


class Unreadable:
    """A header that is there but cannot be read whole (too large, unreadable)."""


UNREADABLE = Unreadable()

_OPEN = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def read_header(path: str) -> tuple[bytes | Unreadable | None, Stamp | None]:
    """The file's bytes and its :data:`Stamp`; ``None`` where there is no file (or a
    folder or socket); :data:`UNREADABLE` where there is one that cannot be read whole, or
    a device or a FIFO. Only a regular file is opened, without waiting (a FIFO
    swapped in meanwhile blocks nothing), but for a file a lease holder answers
    ``EAGAIN`` for: that one waits for its lease to break, as any reader does."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            return _not_a_file(mode), None
        try:
            fd = os.open(path, _OPEN | os.O_NONBLOCK)
        except BlockingIOError:  # (a kernel lease: an SMB oplock, an NFS delegation)
            fd = os.open(path, _OPEN)
    except OSError:
        return (UNREADABLE if os.path.lexists(path) else None), None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return _not_a_file(info.st_mode), None
        stamp = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if info.st_size > MAX_FILE_SIZE:
            return UNREADABLE, stamp
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_FILE_SIZE + 1)
    except OSError:
        return UNREADABLE, None
    finally:
        os.close(fd)
    return (UNREADABLE if len(data) > MAX_FILE_SIZE else data), stamp


def _not_a_file(mode: int) -> Unreadable | None:
    """A folder at a header's name is none (compilers look on), nor is a socket (the build
    fails to open it); a device or a FIFO is one that cannot go into a key (a compiler
    reads it as a stream: ``/dev/null`` stubs a header out)."""
    return None if stat.S_ISDIR(mode) or stat.S_ISSOCK(mode) else UNREADABLE


@dataclass
class HeaderReads:
    """What one scan read, for a later look to compare with.

    ``root``: the folder relative names resolve from (the working folder when ``None``,
    set to it then). ``stamps``: each file's :data:`Stamp` by its real path. ``texts``,
    when a list, gets each header's content. ``source_mark``: the source's xxh3-128 where
    the scan took it (a source that may read a file), for the key to use again.
    """

    root: str | None = None
    stamps: dict[str, Stamp] = field(default_factory=dict)
    texts: list[bytes] | None = None
    source_mark: int | None = None
