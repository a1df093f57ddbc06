"""The one place that reads the process environment and the platform's cache folder.

Kept apart from the core so that the core stays free of ``os``.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import sys
import tempfile
import threading

import platformdirs

from .errors import BackendError, InvalidSecretError, InvalidURLError, InvalidValueError

__all__ = [
    "ENV_CACHE",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "MIN_LISTED_KEY",
    "cache_folder",
    "default_directory",
    "default_folder_named",
    "fallback_directory",
    "fallback_name",
    "private_fallback",
    "read",
    "read_secret",
    "read_secret_file",
    "split_secret",
    "state_directory",
    "warn_no_home",
    "working_folder",
]

log = logging.getLogger(__name__)
_warned = threading.Event()

#: A backend URL, a comma-separated list of tiers, or ``off``.
ENV_CACHE = "RUNTIME_CACHE"
#: A shared secret; when set, entries are signed and unsigned ones rejected.
ENV_SECRET = "RUNTIME_CACHE_SECRET"
#: A file holding the secret (one key a line; the first signs), for secrets kept off
#: command lines and out of the environment.
ENV_SECRET_FILE = "RUNTIME_CACHE_SECRET_FILE"


try:  # the folder the process was in when runtime-cache was imported
    _START_FOLDER: str | None = os.getcwd()
except OSError:  # (it was removed)
    _START_FOLDER = None


def from_start(path: str) -> str:
    """``path`` made absolute against the folder the process was in when runtime-cache was
    imported, not the one it is in now (an app's ``chdir`` before its first load moved a
    relative ``RUNTIME_CACHE_GUARD_DIR`` with it)."""
    if os.path.isabs(path) or _START_FOLDER is None:
        return os.path.abspath(path)
    return os.path.normpath(os.path.join(_START_FOLDER, path))


def working_folder() -> str | None:
    """The process's working folder now, or ``None`` when it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def read(name: str) -> str | None:
    """Return the environment variable ``name``, or ``None`` when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def fallback_name(kind: str) -> str:
    """The name of :func:`fallback_directory`'s folder, ``runtime-cache-<uid>-<kind>``
    (no file system access, unlike finding the temporary folder)."""
    getuid = getattr(os, "getuid", None)
    user = getuid() if getuid is not None else os.getpid()
    return f"runtime-cache-{user}-{kind}"


def fallback_directory(kind: str) -> str:
    """Where ``kind`` (``"cache"`` or ``"state"``) goes when the home folder is unusable:
    ``<temporary folder>/runtime-cache-<uid>-<kind>``, private to this user."""
    return os.path.join(tempfile.gettempdir(), fallback_name(kind))


def private_fallback(kind: str) -> str:
    """:func:`fallback_directory` of ``kind``, made (``0700``) if missing, after checking
    that it is this user's own real folder: the temporary folder is everyone's, so another
    user may have put a link, or a folder of theirs, at that name first. Raises
    ``OSError`` when it is not (the caller then uses no folder at all)."""
    path = fallback_directory(kind)
    try:
        os.mkdir(path, 0o700)  # never follows a link at that name
    except FileExistsError:
        pass
    info = os.lstat(path)
    geteuid = getattr(os, "geteuid", None)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is a link or a file, not a folder of this user's")
    if geteuid is not None and (info.st_uid != geteuid() or info.st_mode & 0o077):
        raise OSError(f"{path} is not this user's private folder")
    return path


@functools.lru_cache(maxsize=64)
def group_of_one(gid: int, uid: int) -> bool:
    """Whether the group ``gid`` has user ``uid`` alone: its primary group, named as the
    user is, no other member listed, and no other listed user's primary group (a user's
    private group, where ``umask 002`` makes folders 0775). The name matters where users
    are not all listed (LDAP, SSSD without enumeration): a shared group is not named after
    one of its users."""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
        others = any(p.pw_gid == gid and p.pw_uid != uid for p in pwd.getpwall())
    except (KeyError, OSError):
        return False
    private = user.pw_gid == gid and group.gr_name == user.pw_name
    return private and set(group.gr_mem) <= {user.pw_name} and not others


def _others_write(info: os.stat_result) -> bool:
    """Whether a user other than the owner can write the folder ``info`` describes (its
    group counts only where it is not the owner's private group: ``umask 002``)."""
    if info.st_mode & 0o002:
        return True
    return bool(info.st_mode & 0o020) and not group_of_one(info.st_gid, info.st_uid)


def check_private(folder: str, *, whole_path: bool = False) -> None:
    """Raise ``OSError`` unless ``folder`` is this user's own real folder (not a link) that
    neither its group nor others can write (the user's own private group aside:
    ``umask 002``), in a folder that only this user or root can rename it out of
    (theirs, or sticky, as ``/tmp`` is). Where a folder holds what a
    later step trusts (the jobs a detached process builds and stores, its records), a
    folder someone else can swap could point those writes and removals anywhere.

    ``whole_path``: every folder above it too, up to the root (as the path is written,
    and as links resolve it), since another user who can move any of them can move the
    whole subtree and swap it for theirs."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # not POSIX: no owners to check
        return
    me = geteuid()
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != me or _others_write(info):
        raise OSError(f"{folder} is not a private folder of this user (a link, or not theirs)")
    parents = [os.path.dirname(os.path.abspath(folder))]
    if whole_path:
        for start in (os.path.abspath(folder), os.path.realpath(folder)):
            while (up := os.path.dirname(start)) != start:
                parents.append(up)
                start = up
    for parent in dict.fromkeys(parents):
        above = os.stat(parent)
        swappable = _others_write(above) and not above.st_mode & stat.S_ISVTX
        if above.st_uid not in (me, 0) or swappable:
            raise OSError(f"{parent} is another user's, or others can move {folder} out of it")


def warn_no_home(reason: str) -> None:
    """Warn, once per process, that the home folder is unusable and temporary folders serve."""
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "runtime-cache: no usable home folder (%s); using private folders %s-* instead "
            "(set RUNTIME_CACHE to choose the cache)",
            reason,
            fallback_directory("")[:-1],
        )


def default_folder_named() -> str:
    """The folder :func:`default_directory` would give, found without touching the file
    system (nothing made, nothing checked): for a command that must not create it."""
    try:
        return platformdirs.user_cache_dir("runtime-cache", appauthor=False)
    except RuntimeError:  # no HOME and no passwd entry
        return fallback_directory("cache")


def default_directory() -> str:
    """The embedded default cache folder: ``platformdirs.user_cache_dir("runtime-cache")``,
    or :func:`private_fallback` when there is no home folder (no ``HOME``, no passwd entry);
    :class:`~runtime_cache.errors.BackendError` when that is not this user's own either."""
    try:
        return platformdirs.user_cache_dir("runtime-cache", appauthor=False)
    except RuntimeError as exc:  # no HOME and no passwd entry
        warn_no_home(str(exc))
    try:
        return private_fallback("cache")
    except OSError as exc:
        raise BackendError(f"no cache folder of this user's own: {exc}") from None


def cache_folder(path: str | os.PathLike[str] | None) -> str:
    """The absolute folder a ``dir://`` cache at ``path`` opens: ``~`` expanded, and
    :func:`default_directory` for ``None``. Fixed once, at the open, so that a later
    ``os.chdir`` does not move the cache."""
    root = os.path.expanduser(os.fspath(path)) if path else default_directory()
    if not isinstance(root, str):
        raise TypeError(f"a cache folder's path must be text, not {type(path).__name__}")
    if root.startswith("~"):  # ~user of no user here: not a folder named so, by surprise
        user = root[1:].split("/", 1)[0]
        whose = f"no user {user!r} here" if user else "no home folder known here"
        raise InvalidValueError(f"cache folder {root!r}: {whose} (a folder so named is ./{root})")
    try:
        root = os.path.abspath(root)
    except OSError as exc:  # a relative path, and the current folder removed
        raise BackendError(
            f"cache folder {root!r} is relative, and the current folder is gone "
            f"({exc.strerror or exc}): give an absolute path"
        ) from None
    if os.path.dirname(root) == root:  # "/": a URL made from an unset variable, dir://$DIR
        raise InvalidURLError(
            f"a cache folder cannot be the file system's root {root!r} (a path made from "
            "an unset variable?): every command would walk, and write marks into, all of it"
        )
    return root


def state_directory() -> str:
    """The folder for state such as the OpenCL crash guard's:
    ``platformdirs.user_state_dir("runtime-cache")``, or :func:`fallback_directory`
    (with :func:`warn_no_home`) when there is no home folder."""
    linux = sys.platform == "linux" and not hasattr(sys, "getandroidapilevel")  # not Android
    if linux and not os.environ.get("XDG_STATE_HOME", "").strip():
        # The XDG default that platformdirs gives here, without its classes: this runs in
        # every process's first OpenCL load, where platformdirs took 0.15 ms (2-core box).
        home = os.path.expanduser("~")
        if os.path.isabs(home) and home != "/":
            return os.path.join(home, ".local", "state", "runtime-cache")
    try:
        return platformdirs.user_state_dir("runtime-cache", appauthor=False)
    except RuntimeError as exc:
        warn_no_home(str(exc))
        return fallback_directory("state")


#: The largest secret file read: a FIFO nobody writes, or ``/dev/zero``, hung every process
#: that read the secret (an app's first get_cache(), the command line).
MAX_SECRET_FILE = 64 * 1024


_WARNED_MODES: set[str] = set()  # (secret files warned about, once a process)


def _other_writers(info: os.stat_result) -> str:
    """Who besides this user (and root) can write a file of ``info``: "" for nobody."""
    if info.st_mode & stat.S_IWOTH:
        return "anyone"
    if info.st_uid not in (0, os.geteuid()):
        return "its owner, another user"
    return "its group" if info.st_mode & stat.S_IWGRP else ""


def _path_writers(path: str) -> str:
    """Who besides this user (and root) can put another file at ``path``: the owner of a
    link there, or of the folder that holds it, or anyone where that folder is writable
    by its group or others without the sticky bit ("" for nobody). The folder that names
    the file, the link itself (the last hop), and, where links lead elsewhere, the folder
    of the file they lead to: the folders above these are not looked at."""
    mine = (0, os.geteuid())
    try:
        link = os.lstat(path)
    except OSError:
        return ""
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in mine:
        return "another user, who made the link"
    named = os.path.dirname(os.path.abspath(path))
    real = os.path.dirname(os.path.realpath(path))
    for folder in dict.fromkeys((named, real)):  # (one look where no link leads away)
        writers = _folder_writers(folder, mine)
        if writers:
            return writers if folder == named else f"{writers} (where the link leads)"
    return ""


def _folder_writers(path: str, mine: tuple[int, int]) -> str:
    try:
        folder = os.stat(path)
    except OSError:
        return ""
    if folder.st_uid not in mine:
        return "another user, who owns its folder"
    loose = folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return "others, who can write its folder" if loose and not folder.st_mode & stat.S_ISVTX else ""


def _read_small_file(path: str, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them; ``OSError`` for anything else
    (a FIFO or a device is never waited on: it is opened without blocking). A file that
    another user could write or swap is warned about (it holds a secret)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        writers = _other_writers(info) or _path_writers(path)
        if writers and path not in _WARNED_MODES:
            _WARNED_MODES.add(path)
            # Taken (a mounted secret's modes are not always the app's to set), but said:
            # whoever can write the file can put in a key of their own and sign with it.
            log.warning(
                "runtime-cache: the secret file %r can be written or swapped by %s (mode %o, "
                "owner uid %d): whoever can write it can choose the key",
                path,
                writers,
                stat.S_IMODE(info.st_mode),
                info.st_uid,
            )
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def read_secret_file(path: str) -> list[str]:
    """The keys in a secret file: one a line, blank lines skipped; the first one signs.

    Raises :class:`~runtime_cache.errors.InvalidSecretError` when the file cannot
    be read or holds no key.
    """
    try:
        # utf-8-sig: a byte-order mark (PowerShell 5's -Encoding UTF8 writes one) is no
        # part of the first key; kept, it signed with another key than the one in view.
        text = _read_small_file(path, MAX_SECRET_FILE).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSecretError(f"cannot read the secret file {path!r}: {exc}") from exc
    # Lines end at \n, \r or \r\n alone (str.splitlines also splits at \f, \v, U+2028...:
    # a key holding one became fragments, each of which verified).
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    keys = [line.strip() for line in lines if line.strip()]
    if not keys:
        raise InvalidSecretError(f"the secret file {path!r} holds no secret")
    return keys


def read_secret() -> list[str] | None:
    """The secret from the environment: ``RUNTIME_CACHE_SECRET_FILE`` (a file, one key a
    line), else ``RUNTIME_CACHE_SECRET`` (keys separated by commas, the first one signs:
    ``new,old`` while a fleet rotates keys), else ``None``."""
    path = read(ENV_SECRET_FILE)
    if path is not None:
        return read_secret_file(path)
    text = read(ENV_SECRET)
    if text is None:
        return None
    return split_secret(text, ENV_SECRET)


#: Characters each key of a comma-separated list must have: a comma inside one secret
#: would otherwise split it into fragments, each of which verifies (``"x,Zq9#..."`` made
#: a one-byte key that signs entries the cache then accepts).
MIN_LISTED_KEY = 16


def split_secret(text: str, source: str) -> list[str]:
    """The keys of a secret given as text (``new,old`` while a fleet rotates keys: the first
    signs). When there are several, each must have :data:`MIN_LISTED_KEY` characters or
    more; raises :class:`InvalidSecretError` naming ``source`` otherwise."""
    keys = [key.strip() for key in text.split(",")]
    if len(keys) > 1:
        for number, key in enumerate(keys, 1):
            if len(key) < MIN_LISTED_KEY:
                raise InvalidSecretError(
                    f"{source} holds a comma, so it is read as {len(keys)} keys (new,old while "
                    f"keys rotate), and key {number} has {len(key)} characters: each key of a "
                    f"list needs {MIN_LISTED_KEY} or more. A secret with a comma in it goes in "
                    "a secret file (one key a line)"
                )
    return keys
