"""msgpack encoding on one reused packer per thread: :func:`packb`.

``msgpack.packb`` makes a new ``Packer`` for every call, and each new packer
allocates its buffer (256 KiB in msgpack 1.1 and later). The allocator hands a
block that large out of a fresh mapping the first time, so a process's first
``packb`` costs a map and an unmap of memory (30-140 µs on the project's 2-core
box, where the rest of that call takes a few µs). Key building encodes many
small values per key, on the path of a process's first cached load: one packer
per thread keeps one buffer for all of them.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

__all__ = ["KEEP_BELOW", "packb"]

_local = threading.local()
#: A value whose encoding is larger than this grew its packer's buffer: the packer is
#: dropped afterwards, so that no thread keeps a large buffer for the rest of its life.
KEEP_BELOW = 1 << 20


def packb(value: Any) -> bytes:
    """``msgpack.packb(value, use_bin_type=True)``, on this thread's packer.

    >>> packb({"a": [1, b"x"]}) == msgpack.packb({"a": [1, b"x"]}, use_bin_type=True)
    True
    """
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = msgpack.Packer(use_bin_type=True)
    # Taken out while it packs: a call made from inside this one (a dict subclass's items()
    # that makes a key) gets a packer of its own. Put back only after a success that left
    # its buffer small; one that raised or grew large is dropped.
    _local.packer = None
    packed: bytes = packer.pack(value)
    if len(packed) <= KEEP_BELOW:
        _local.packer = packer
    return packed
