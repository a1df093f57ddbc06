"""The directory backend's layout: where a key lives, and a walk that never follows a link.

A key ``"opencl/program-binary/3f2a..."`` lives at
``opencl/program-binary/3f/3f2a....rce`` under the root: one folder per key
component, then a two-character fan-out folder. Names that begin with ``.``
belong to the backend (temp files, the hits journal, locks) and are never keys.

:func:`walk` lists entry files through directory descriptors, one folder at a
time, each opened ``O_DIRECTORY | O_NOFOLLOW`` relative to its parent: a link
planted in place of a folder is reported, never entered. Names that do not
parse as a key (``82 copy.rce``) are skipped.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from runtime_cache.errors import InvalidKeyError

from .dir_fs import open_folder

__all__ = ["SUFFIX", "Found", "key_of", "keys_until", "rel_path", "walk"]

SUFFIX = ".rce"
_COMPONENT = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}\Z")  # \Z: no trailing newline
_MAX_KEY = 1024
_MAX_DEPTH = 16


def rel_path(key: str) -> str:
    """The path of ``key``'s file relative to the root; raises :class:`InvalidKeyError`."""
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY:
        raise InvalidKeyError(f"a key must be a str of 1-{_MAX_KEY} characters")
    parts = key.split("/")
    if len(parts) > _MAX_DEPTH:
        raise InvalidKeyError(f"a key may have at most {_MAX_DEPTH} components: {key[:80]!r}")
    for part in parts:
        if not _COMPONENT.match(part) or part.endswith(SUFFIX):
            raise InvalidKeyError(
                f"key component {part[:80]!r} must be 1-128 letters, digits, '.', '_', '+' "
                f"or '-', not start with '.' and not end with {SUFFIX!r}"
            )
    last = parts[-1]
    return "/".join([*parts[:-1], last[:2], last + SUFFIX])


def key_of(names: list[str], filename: str, folders_ok: bool | None = None) -> str | None:
    """The key stored as ``filename`` in the folders ``names``, or ``None`` if it does not parse.

    ``folders_ok`` says the folder names were checked already (a walk checks
    them once per folder).
    """
    if not names or not filename.endswith(SUFFIX):
        return None
    name = filename[: -len(SUFFIX)]
    if names[-1] != name[:2] or len(names) > _MAX_DEPTH:
        return None
    if not name or name.startswith(".") or "/" in name:
        return None
    # A name that is no valid key ("82 copy.rce", a Finder copy) is still listed:
    # it takes disk, and the operator is told about it instead of never seeing it.
    if folders_ok is None:
        folders_ok = _folders_ok(names)
    return "/".join([*names[:-1], name]) if folders_ok else None


def _folders_ok(names: list[str]) -> bool:
    return all(_COMPONENT.match(p) and not p.endswith(SUFFIX) for p in names[:-1])


@dataclass(frozen=True)
class Found:
    """One name seen by :func:`walk`: an entry file, or junk where an entry could be."""

    key: str
    folder: str  # relative to the root, "/"-separated
    name: str
    stat: os.stat_result
    regular: bool


class WalkCutShort(Exception):
    """A :func:`walk` that reached its deadline before the end of the tree."""


def walk(
    root_fd: int,
    prefix: str = "",
    deadline: float | None = None,
    unreadable: list[tuple[str, str]] | None = None,
    inner_roots: bool = False,
    linked: list[str] | None = None,
) -> Iterator[Found]:
    """Yield every name under ``root_fd`` that parses as a key starting with ``prefix``.

    ``inner_roots``: a folder below the root that holds a cache's marks
    (:data:`CACHE_ROOT_FILES`) is another cache's, and is left out (noted in
    ``unreadable``). Only for a cache nobody else writes: in a shared one, any member
    could make any folder look so, and hide the entries in it from eviction and upkeep.

    Folders that cannot be opened or read are skipped; with ``unreadable``, those that
    are there but could not be read (no permission, an I/O error: entries may be
    behind them) are added to it as ``(folder, reason)``, not those gone meanwhile or
    a link at a folder's name (junk, never followed). ``regular`` is
    false for a link, a FIFO, a folder or anything else at an entry's name. With
    ``linked``, a symbolic link at a fan-out folder's name (two characters, as
    :func:`rel_path` names them) that could hold keys starting with ``prefix`` is added
    to it (its path from the root) once the walk is over, where a fan-out folder beside
    it held an entry: never followed, so the entries behind it are left out. Links at
    longer names, or with no such folder beside them, are not: a cache opened on a folder
    by mistake (``~``) holds the user's own links (``go``, ``js``), which are not the
    cache's to report or remove.
    Raises :class:`WalkCutShort` when it is past ``deadline`` (``time.monotonic()``)
    as it opens a folder: folders that hold no entry cost time too (a member can
    make 400,000 of them).
    """
    parts = prefix.split("/")
    lead = [p for p in parts[:-1] if p]
    if any(p.startswith(".") or not _COMPONENT.match(p) for p in lead):
        return
    if inner_roots:
        for depth in range(1, len(lead)):  # the folders above where a prefix starts
            above = "/".join(lead[:depth])
            if _holds_a_mark(root_fd, above):
                if unreadable is not None:
                    unreadable.append((above, "the folder of another cache"))
                return
    stack: list[list[str]] = [lead]
    # Links at fan-out names, and the folders where a fan-out folder held an entry: a link
    # is reported only beside such a one (a folder of the user's own, ~ opened as a cache
    # by mistake, has links named "go" or "js": verify --repair removed them).
    maybe: list[tuple[str, str]] = []
    fanned: set[str] = set()
    while stack:
        if deadline is not None and time.monotonic() > deadline:
            raise WalkCutShort
        names = stack.pop()
        rel = "/".join(names)
        try:
            fd = open_folder(root_fd, rel)  # no link followed at any level
        except OSError as exc:
            _note_unreadable(unreadable, rel, exc)
            continue
        try:
            try:
                with os.scandir(fd) as it:  # the deadline looked at as it reads, too
                    listing = _listed(it, deadline)
            except OSError as exc:
                _note_unreadable(unreadable, rel, exc)
                continue
            if inner_roots and names and _a_cache_root(listing):
                # Another cache inside this one (a cache opened one folder too high): its
                # entries are stored under other keys, and would read as another key's
                # entries, corrupt here, and go first to a prune or a repair.
                if unreadable is not None:
                    unreadable.append((rel, "the folder of another cache"))
                continue
            folders_ok = _folders_ok(names)
            for seen, entry in enumerate(listing):
                if deadline is not None and seen % 256 == 255 and time.monotonic() > deadline:
                    raise WalkCutShort  # a folder of 150,000 files takes a second too
                if entry.name.startswith("."):
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                key = key_of(names, entry.name, folders_ok)
                if key is None:
                    if is_dir and len(names) < _MAX_DEPTH:
                        stack.append([*names, entry.name])
                    elif linked is not None and _linked_shard(entry, rel, prefix):
                        maybe.append((rel, f"{rel}/{entry.name}" if rel else entry.name))
                    continue
                fanned.add("/".join(names[:-1]))
                if not key.startswith(prefix):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                yield Found(key, rel, entry.name, st, entry.is_file(follow_symlinks=False))
        finally:
            os.close(fd)
    if linked is not None:
        linked.extend(link for folder, link in maybe if folder in fanned)


def _linked_shard(entry: os.DirEntry[str], folder: str, prefix: str) -> bool:
    # A link at a fan-out folder's name, where keys starting with ``prefix`` may live.
    name = entry.name
    if len(name) != 2 or not _COMPONENT.match(name):
        return False
    path = f"{folder}/{name}" if folder else name
    if not (path.startswith(prefix) or prefix.startswith(path)):
        return False
    try:
        return entry.is_symlink()
    except OSError:
        return False


def _listed(names: Iterator[os.DirEntry[str]], deadline: float | None) -> list[os.DirEntry[str]]:
    # A folder's entries; WalkCutShort past ``deadline`` (a million names take seconds).
    listing = []
    for entry in names:
        listing.append(entry)
        if deadline is not None and len(listing) % 4096 == 0 and time.monotonic() > deadline:
            raise WalkCutShort
    return listing


#: Files every ``dir://`` cache that was written to has at its root (the vacuum's and the
#: eviction's marks: ``dir_upkeep``); a folder below the root that holds one is another cache.
CACHE_ROOT_FILES = frozenset({".vacuumed", ".evict.lock"})


def _a_cache_root(listing: list[os.DirEntry[str]]) -> bool:
    for entry in listing:
        if entry.name in CACHE_ROOT_FILES:
            try:
                if entry.is_file(follow_symlinks=False):
                    return True
            except OSError:
                continue
    return False


def _holds_a_mark(root_fd: int, folder: str) -> bool:
    try:
        fd = open_folder(root_fd, folder)
    except OSError:
        return False
    try:
        with os.scandir(fd) as it:
            return _a_cache_root(list(it))
    except OSError:
        return False
    finally:
        os.close(fd)


#: A folder gone meanwhile, replaced by a file, or a link at its name: nothing to report.
_GONE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def _note_unreadable(into: list[tuple[str, str]] | None, folder: str, exc: OSError) -> None:
    if into is not None and exc.errno not in _GONE:
        into.append((folder or ".", exc.strerror or str(exc)))


def keys_until(root_fd: int, deadline: float | None) -> set[str] | None:
    """Every key under ``root_fd``, or ``None`` when the walk would run past ``deadline``
    (``time.monotonic()``; ``None``: no bound)."""
    keys = set()
    try:
        for found in walk(root_fd, deadline=deadline):
            keys.add(found.key)
    except WalkCutShort:
        return None
    return keys
