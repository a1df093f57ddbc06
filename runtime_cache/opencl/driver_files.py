"""The files of a driver's own cache folder: list them, pack them, and put them back safely.

A driver cache entry's value is a msgpack list of ``[relative path, executable, bytes]``.
Restoring never overwrites a file and never leaves a half-written one where the
driver looks: each file is written to a temporary name beside its target and then
hard-linked into place (a link fails if the target exists), or, for a driver whose
folder has an index naming its files (NVIDIA), the data files are added first and the
index is replaced last, in one rename.
A process killed at any moment leaves only temporary names behind, which the driver
ignores and the next restore removes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping, Sequence

import msgpack

from ..errors import CorruptEntryError

__all__ = [
    "INDEX",
    "WORKER_ENV",
    "DriverFile",
    "add_missing",
    "capture_build",
    "pack_files",
    "private_folder",
    "remove_files",
    "restore_indexed",
    "snapshot",
    "sweep_temporaries",
    "unpack_files",
]

#: ``(relative path, executable, contents)``
DriverFile = tuple[str, bool, bytes]

#: Names that mark our temporary files and folders; the drivers look for other names.
TEMP_MARK = ".rc-tmp-"
#: Files a driver rewrites on every use, or its own temporaries: never captured.
_SKIPPED = ("last_accessed",)
_SKIPPED_PREFIXES = ("tempfile_", TEMP_MARK)
MAX_FILES = 100_000
MAX_DEPTH = 12
MAX_TOTAL = 1 << 30
#: Set in a build worker's environment: its private driver folder, captured per build
#: (see :mod:`runtime_cache.opencl.program_files`).
WORKER_ENV = "RUNTIME_CACHE_WORKER_DRIVER_DIR"
#: A folder-wide index (NVIDIA's): never part of one program's files.
INDEX = "index"
#: A temporary older than this is left by a dead process (restores take milliseconds).
STALE_SECONDS = 600.0


def _skipped(name: str) -> bool:
    return name in _SKIPPED or name.startswith(_SKIPPED_PREFIXES) or TEMP_MARK in name


def snapshot(folder: str) -> dict[str, tuple[int, int]]:
    """Map each file under ``folder`` (relative path) to ``(size, mtime_ns)``; ``{}`` if absent."""
    found: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if TEMP_MARK not in d]
        for name in files:
            if _skipped(name):
                continue
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # removed while we looked
            if stat.S_ISREG(st.st_mode):
                found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


def pack_files(folder: str, names: Iterable[str]) -> bytes | None:
    """Pack the files ``names`` (relative to ``folder``); ``None`` when none could be read."""
    files: list[list[object]] = []
    total = 0
    for name in sorted(set(names)):
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as handle:
                data = handle.read()
                executable = bool(os.fstat(handle.fileno()).st_mode & stat.S_IXUSR)
        except OSError:
            continue  # the driver replaced or removed it meanwhile
        total += len(data)
        if total > MAX_TOTAL or len(files) >= MAX_FILES:
            break
        files.append([name, executable, data])
    if not files:
        return None
    return msgpack.packb(files, use_bin_type=True)  # type: ignore[no-any-return]


def capture_build(
    folder: str, before: Mapping[str, tuple[int, int]], exclude: frozenset[str] = frozenset()
) -> bytes | None:
    """Pack the files ``folder`` gained (or that changed size) since ``before``; ``None``: none.

    A build worker calls it after each build, with the :func:`snapshot` taken
    before it; the folder-wide ``index`` and the names in ``exclude`` are left out.
    """
    now = snapshot(folder)
    names = [
        n
        for n, st in now.items()
        if n != INDEX and n not in exclude and before.get(n, (-1,))[0] != st[0]
    ]
    return pack_files(folder, names) if names else None


def _safe_name(name: object) -> str:
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise CorruptEntryError("a driver-cache file has an invalid name")
    parts = name.split("/")
    if len(parts) > MAX_DEPTH or name.startswith("/"):
        raise CorruptEntryError(f"a driver-cache file name is not a relative path: {name[:80]!r}")
    for part in parts:
        if part in ("", ".", "..") or _skipped(part) or not part.isprintable():
            raise CorruptEntryError(f"a driver-cache file name is unsafe: {name[:80]!r}")
    return name


def unpack_files(value: bytes | memoryview) -> list[DriverFile]:
    """Decode a packed value; raise :class:`CorruptEntryError` on anything malformed or unsafe."""
    try:
        items = msgpack.unpackb(value, raw=False, max_bin_len=MAX_TOTAL, max_array_len=MAX_FILES)
    except Exception as exc:  # msgpack raises several types on bad input
        raise CorruptEntryError(f"driver-cache files do not decode: {exc}") from exc
    if not isinstance(items, list):
        raise CorruptEntryError("driver-cache files are not a list")
    files: list[DriverFile] = []
    seen: set[str] = set()
    for item in items:
        if not (isinstance(item, list) and len(item) == 3):
            raise CorruptEntryError("a driver-cache file is not [name, executable, bytes]")
        name, executable, data = item
        if not isinstance(executable, bool) or not isinstance(data, bytes):
            raise CorruptEntryError("a driver-cache file is not [name, executable, bytes]")
        name = _safe_name(name)
        if name in seen:
            raise CorruptEntryError(f"a driver-cache file appears twice: {name[:80]!r}")
        seen.add(name)
        files.append((name, executable, data))
    for name in seen:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in seen:
                raise CorruptEntryError(f"a driver-cache file is also a folder: {name[:80]!r}")
    return files


def _temp_name(path: str) -> str:
    return f"{path}{TEMP_MARK}{os.getpid()}-{time.monotonic_ns()}"


def _write_new(path: str, executable: bool, data: bytes) -> None:
    mode = 0o700 if executable else 0o600
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write(path: str, executable: bool, data: bytes) -> str:
    temp = _temp_name(path)
    _write_new(temp, executable, data)
    return temp


def add_missing(folder: str, files: Sequence[DriverFile]) -> int:
    """Add each file that ``folder`` lacks; never overwrite one. Return how many were added."""
    added = 0
    for name, executable, data in files:
        target = os.path.join(folder, name)
        if os.path.lexists(target):
            continue
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        temp = _write(target, executable, data)
        try:
            os.link(temp, target)  # fails if another process put it there first
            added += 1
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
    return added


def restore_indexed(folder: str, files: Sequence[DriverFile], index: str = "index") -> int:
    """Add the missing data files, then put the set's ``index`` in place; return files added.

    For a driver whose folder has one index naming its data files (NVIDIA). The
    data files are named by their contents' hash, so adding the missing ones
    changes nothing the driver knows; the index is replaced last, in one rename,
    and only when files were added or it is missing. The driver then sees the
    old index with its files or the new one with all of its files, never a part.
    """
    data = [f for f in files if f[0] != index]
    added = add_missing(folder, data)
    entry = next((f for f in files if f[0] == index), None)
    target = os.path.join(folder, index)
    if entry is not None and (added or not os.path.lexists(target)):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        temp = _write(target, entry[1], entry[2])
        try:
            os.replace(temp, target)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        added += 1
    return added


def _dead_or_stale(name: str, now: float, st: os.stat_result) -> bool:
    pid_text = name.rsplit(TEMP_MARK, 1)[-1].split("-", 1)[0]
    if now - st.st_mtime > STALE_SECONDS:
        return True
    if not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def sweep_temporaries(folders: Mapping[str, bool]) -> int:
    """Remove temporaries that dead processes left in these folders; return a count.

    ``folders`` maps each folder to whether to walk into its subfolders too.
    """
    removed = 0
    now = time.time()
    for folder, walk in folders.items():
        places = [top for top, _, _ in os.walk(folder)] if walk else [folder]
        for place in places:
            try:
                names = [n for n in os.listdir(place) if TEMP_MARK in n]
            except OSError:
                continue
            for name in names:
                path = os.path.join(place, name)
                try:
                    st = os.lstat(path)
                    if not _dead_or_stale(name, now, st):
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
                    removed += 1
                except OSError:
                    continue
    return removed


def private_folder(folder: str) -> bool:
    """Whether ``folder`` and the folder above it are this user's own and writable by no
    one else (or not made yet): only then are a driver's files restored into it or
    packed from it, since anyone who could write there could plant links or libraries."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # not POSIX: no owners to check
        return True
    for path in (folder, os.path.dirname(folder)):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            try:
                info = os.stat(path)  # a link the user made to their own folder is theirs
            except OSError:
                return False
            if os.lstat(path).st_uid not in (geteuid(), 0):
                return False  # a link someone else put there
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != geteuid() or info.st_mode & 0o022:
            return False
    return True


def remove_files(folder: str, files: Sequence[DriverFile]) -> None:
    """Remove ``files`` (as :func:`unpack_files` gives them) from ``folder``, where they are;
    never through a link: a file whose folder resolves outside ``folder`` is left alone."""
    top = os.path.realpath(folder)
    for name, _, _ in files:
        path = os.path.join(folder, name)
        where = os.path.realpath(os.path.dirname(path))
        if where == top or where.startswith(top + os.sep):
            with contextlib.suppress(OSError):
                os.unlink(path)
