"""A build worker process: ``python -m runtime_cache.opencl.worker``.

Protocol over stdin/stdout, each message an 8-byte little-endian length and
a msgpack body (plain types only):

* parent -> worker, first: ``[fingerprints]``; worker -> parent: ``true``
  when it opened those devices, else ``false`` (and exits);
* then per job: ``[name, source, options]`` -> ``[name, binaries or nil,
  seconds, options text]``. A failed build answers ``nil`` binaries; the
  parent then builds that program itself, so the error is pyopencl's own.

The worker ends at end of input.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import IO, Any

import msgpack

__all__ = ["main", "read_message", "write_message"]

_LEN = struct.Struct("<Q")
_MAX_MESSAGE = 1 << 31


def write_message(stream: IO[bytes], value: Any) -> None:
    """Write one framed msgpack message and flush."""
    body = msgpack.packb(value, use_bin_type=True)
    stream.write(_LEN.pack(len(body)) + body)
    stream.flush()


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_message(stream: IO[bytes]) -> Any:
    """Read one framed message; raise ``EOFError`` at end of stream."""
    head = _read_exact(stream, _LEN.size)
    if head is None:
        raise EOFError
    (size,) = _LEN.unpack(head)
    if size > _MAX_MESSAGE:
        raise EOFError
    body = _read_exact(stream, size)
    if body is None:
        raise EOFError
    return msgpack.unpackb(body, raw=False, strict_map_key=True)


def _open(fingerprints: list[dict[str, Any]]) -> tuple[Any, list[Any]] | None:
    from ._driver import import_pyopencl
    from .fingerprint import device_fingerprint

    cl = import_pyopencl()
    available = [d for p in cl.get_platforms() for d in p.get_devices()]
    chosen = []
    for wanted in fingerprints:
        match = next((d for d in available if device_fingerprint(d) == wanted), None)
        if match is None:
            return None
        chosen.append(match)
    return cl.Context(chosen), chosen


def _build(context: Any, devices: list[Any], job: list[Any]) -> list[Any]:
    from ._driver import import_pyopencl
    from .program import _options_text, original_build, read_binaries

    cl = import_pyopencl()
    name, source, options = job
    started = time.perf_counter()
    try:
        program = cl.Program(context, source)
        original_build(cl)(program, options, devices, cache_dir=False)
        binaries = read_binaries(cl, program, devices)
    except Exception:
        return [name, None, 0.0, ""]
    return [name, binaries, time.perf_counter() - started, _options_text(cl, context, options)]


def main() -> int:
    """Serve build jobs from stdin until it closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # Driver chatter must not corrupt the protocol stream.
    sys.stdout = sys.stderr
    try:
        opened = _open(read_message(stdin))
    except EOFError:
        return 0
    write_message(stdout, opened is not None)
    if opened is None:
        return 1
    context, devices = opened
    while True:
        try:
            job = read_message(stdin)
        except EOFError:
            return 0
        write_message(stdout, _build(context, devices, job))


if __name__ == "__main__":
    os.environ.setdefault("PYOPENCL_NO_CACHE", "1")
    sys.exit(main())
