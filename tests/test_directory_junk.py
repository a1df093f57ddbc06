"""What a dir:// cache does with things it did not make: odd names, junk journals, deep trees.

From an adversarial review: each of these made ``get_cache()`` (or a CLI command) raise an
untyped error, or removed a user's own file. One user here; tests/test_hostile_group.py has
the two-user cases.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.dir_fs import own_leftover, remove_tree
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="junk", purpose="test")


def _filled(root: Path, n: int = 3) -> list[rc.CacheKey]:
    cache = rc.Cache(DirectoryBackend(root))
    keys = [_key(i) for i in range(n)]
    for i, k in enumerate(keys):
        cache.put(k, bytes([i]) * 64, build_seconds=1.5)
    cache.close()
    return keys


def _open_again(root: Path, monkeypatch: pytest.MonkeyPatch) -> rc.Cache:
    """The app's start-up: the default cache, with the hourly vacuum due."""
    (root / ".vacuumed").unlink(missing_ok=True)
    monkeypatch.setenv("RUNTIME_CACHE", f"dir://{root}")
    rc.reset_cache_provider()
    return rc.get_cache()


def test_a_folder_name_that_is_not_utf8_is_walked_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "c"
    keys = _filled(root)
    os.mkdir(os.fsencode(root) + b"/\xff")  # a name os.fsdecode gives as '\udcff'
    os.mkdir(os.fsencode(root) + b"/junk/\xfe")
    cache = _open_again(root, monkeypatch)
    assert cache.enabled and all(cache.get(k) == bytes([i]) * 64 for i, k in enumerate(keys))
    assert sorted(cache.backend.keys()) == sorted(map(str, keys))
    capsys.readouterr()
    assert main(["--cache", f"dir://{root}", "ls"]) == 0
    assert main(["--cache", f"dir://{root}", "verify"]) == 0
    assert "checked 3 entries" in capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [
        "\u00b2 1.0 {key}",  # str.isdigit() holds, int() refuses
        "9" * 5000 + " 1.0 {key}",  # past int()'s digit limit
        "9" * 400 + " 1.0 {key}",  # a float overflow in hits x build seconds
        "3 nan {key}",
        "3 inf {key}",
        "- x",
        "",
    ],
)
def test_junk_in_the_hits_journal_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    root = tmp_path / "c"
    keys = _filled(root)
    with open(root / ".hits", "a", encoding="utf-8") as journal:
        journal.write(line.format(key=keys[0]) + "\n" + "4 1.0 " + str(keys[1]) + "\n")
        journal.write("\n" * (1 << 20))  # past the size at which the journal is compacted
    cache = _open_again(root, monkeypatch)  # compacts: reads every line
    assert cache.enabled and cache.get(keys[0]) is not None
    capsys.readouterr()
    assert main(["--cache", f"dir://{root}", "stats", "--json"]) == 0
    overall = json.loads(capsys.readouterr().out)["overall"]
    assert overall["hits"] >= 4 and overall["seconds_saved"] < float("inf")
    assert os.path.getsize(root / ".hits") < 1 << 20  # compacted


def _nest(top: Path, depth: int) -> None:
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):  # relative to a descriptor: no path grows past PATH_MAX
            os.mkdir("d", dir_fd=fd)
            (child := os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), os.close(fd))
            fd = child
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture
def deep_clean(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, whatever a failing test left nested in it removed without recursion
    (pytest's own clean-up recurses, and would fail on it in a later session)."""
    yield tmp_path
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(fd):
            remove_tree(fd, name, ".junk-", time.monotonic() + 60)
    finally:
        os.close(fd)


def test_a_tree_nested_thousands_deep_is_removed_without_recursion(
    deep_clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = deep_clean / "c"
    keys = _filled(root)
    folder = next(root.rglob("*.rce")).parent
    _nest(folder / ".junk-0123456789abcdef", 3000)  # set aside by an earlier turn
    os.utime(folder / ".junk-0123456789abcdef", (1, 1))
    entry = next(folder.glob("*.rce"))
    entry.unlink()
    _nest(entry, 3000)  # a folder where an entry belongs
    cache = _open_again(root, monkeypatch)
    assert cache.enabled
    assert cache.get(keys[0]) is None or cache.get(keys[0]) == bytes(64)
    for _ in range(50):  # each vacuum removes what its time allows; the rest waits
        if not [p for p in folder.iterdir() if p.name.startswith(".junk-")]:
            break
        os.utime(folder, None)
        for junk in folder.glob(".junk-*"):
            os.utime(junk, (1, 1))
        cache.backend.vacuum()  # type: ignore[attr-defined]
    assert not [p for p in folder.iterdir() if p.name.startswith(".junk-")]
    cache.put(keys[0], b"again")
    assert cache.get(keys[0]) == b"again"


def test_remove_tree_stops_at_its_deadline_and_leaves_the_rest_named_as_its_own(
    deep_clean: Path,
) -> None:
    tmp_path = deep_clean
    _nest(tmp_path / "top", 50)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_tree(fd, "top", ".junk-", time.monotonic() - 1) is False
        left = [p.name for p in tmp_path.iterdir()]
        assert left and all(name == "top" or own_leftover(name) for name in left)
        for name in left:
            assert remove_tree(fd, name, ".junk-", time.monotonic() + 60)
    finally:
        os.close(fd)
    assert list(tmp_path.iterdir()) == []


def test_a_vacuum_stops_at_its_budget_and_later_ones_reach_the_rest(tmp_path: Path) -> None:
    """A tree larger than one vacuum's budget: each walks folders in a random order, so a
    leftover in any folder is removed by some later vacuum (each used to start over in the
    same order and never reach the last folders)."""
    backend = DirectoryBackend(tmp_path, max_size=None)
    for i in range(40):
        for j in range(30):
            (tmp_path / "junk" / f"f{i:02d}" / f"g{j:02d}").mkdir(parents=True)
    stale = tmp_path / "junk" / "f39" / "g29" / ".tmp-0123456789abcdef"
    stale.write_bytes(b"left by a dead writer")
    assert backend.vacuum(seconds=0.0) == 0 and stale.exists()  # out of time at once
    for _ in range(2000):  # each about a millisecond of walking
        if backend.vacuum(seconds=0.001):
            break
    assert not stale.exists()


def test_a_vacuum_reads_a_folder_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attacker review, session 37: the vacuum listed each folder whole before it looked at
    the clock, so a member of a shared folder who put a million names in one cost every
    process's open that listing (memory and seconds past the budget). Names are now read as
    the walk goes, the budget looked at between them, in the tree and in ``.locks``."""
    import runtime_cache.backends.dir_upkeep as upkeep

    backend = DirectoryBackend(tmp_path, max_size=None)
    for folder in (tmp_path, tmp_path / ".locks"):
        folder.mkdir(exist_ok=True)
        for i in range(2000):
            (folder / f".n{i}").touch()
    drawn = []
    real, listdir = os.scandir, os.listdir

    class Counting:
        def __init__(self, fd: int) -> None:
            self.inner = real(fd)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def __iter__(self) -> Counting:
            return self

        def __next__(self) -> os.DirEntry[str]:
            drawn.append(1)
            return next(self.inner)

    def counting_listdir(fd: int) -> list[str]:
        names = listdir(fd)
        drawn.extend([1] * len(names))
        return names

    monkeypatch.setattr(upkeep.os, "scandir", Counting)
    monkeypatch.setattr(upkeep.os, "listdir", counting_listdir)
    backend.vacuum(seconds=0.0)
    assert len(drawn) < 10  # out of time at once: not 4,000 names drawn first
    # A walk with a deadline (the keys listed for a compaction) stops within a folder, too.
    import time

    from runtime_cache.backends.dir_tree import WalkCutShort, _listed

    names = (tmp_path for _ in range(1_000_000))  # (a million names, as the walk's listing)
    with pytest.raises(WalkCutShort):
        _listed(names, time.monotonic())  # type: ignore[arg-type]
    assert len(list(names)) == 1_000_000 - 4096  # stopped after 4,096, not all drawn first


def test_a_large_journal_is_compacted_only_when_its_keys_can_be_listed_in_time(
    tmp_path: Path,
) -> None:
    backend = DirectoryBackend(tmp_path, max_size=None)
    backend.set("junk/test/" + "0" * 32, b"v")
    with open(tmp_path / ".hits", "a", encoding="ascii") as journal:
        journal.write(("1 1.0 junk/test/" + "f" * 32 + "\n") * 30000)  # a removed key's
    size = os.path.getsize(tmp_path / ".hits")
    backend.compact_hits(deadline=time.monotonic() - 1)  # no time to list the keys
    assert os.path.getsize(tmp_path / ".hits") == size
    backend.compact_hits(deadline=time.monotonic() + 60)
    assert os.path.getsize(tmp_path / ".hits") < 100


def test_remove_tree_keeps_its_deadline_and_says_what_it_left(deep_clean: Path) -> None:
    top = deep_clean / "top"
    for i in range(2000):
        (top / f"d{i}").mkdir(parents=True)
    fd = os.open(deep_clean, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert remove_tree(fd, "top", ".junk-", time.monotonic() - 1) is False
        assert top.is_dir()  # nothing done past the deadline
        (deep_clean / "link").symlink_to(deep_clean / "elsewhere")
        assert remove_tree(fd, "link", ".junk-", time.monotonic() + 60)  # unlinked, unfollowed
        assert not (deep_clean / "link").is_symlink()
    finally:
        os.close(fd)


def test_files_that_only_look_like_leftovers_are_never_removed(tmp_path: Path) -> None:
    """A cache opened on a folder that holds other files (``dir://~`` by mistake)."""
    backend = DirectoryBackend(tmp_path, max_size=None)
    backend.set("junk/test/" + "0" * 32, b"v")
    folder = next(tmp_path.rglob("*.rce")).parent
    theirs = [
        tmp_path / ".tmp-notes.txt",
        folder / ".tmp-draft",
        folder / ".junk-food",
        tmp_path / ".del-me",
    ]
    ours = [folder / ".tmp-0123456789abcdef", tmp_path / ".tmp-12-34-56"]
    for path in theirs + ours:
        path.write_text("x")
        os.utime(path, (1, 1))
    assert backend.vacuum() == len(ours)
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in ours)


def test_a_backend_that_raises_something_unexpected_turns_caching_off(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """get_cache() never raises: a bug of ours in an open is logged with its type."""

    def broken(cls: type, url: str) -> DirectoryBackend:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(DirectoryBackend, "from_url", classmethod(broken))
    monkeypatch.setenv("RUNTIME_CACHE", "dir:///nowhere")
    rc.reset_cache_provider()
    with caplog.at_level(logging.ERROR, logger="runtime_cache"):
        assert not rc.get_cache().enabled
    assert "RecursionError" in caplog.text and "caching is off" in caplog.text
    monkeypatch.delenv("RUNTIME_CACHE")
    rc.reset_cache_provider()
    fallback = rc.get_cache()  # the embedded default and its fallback broken too: memory
    assert fallback.enabled and type(fallback.backend).__name__ == "MemoryBackend"
    rc.reset_cache_provider()
    # The default folder is there (on a fresh machine it was not: "no cache", exit 1).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "runtime-cache").mkdir()
    assert main(["ls"]) == 2  # never an empty listing of a cache in memory
    assert "no cache folder could be opened" in capsys.readouterr().err


@pytest.mark.parametrize("planted", ["folder", "link", "fifo"])
def test_a_non_file_at_the_hits_journal_is_set_aside_and_uses_count_again(
    tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """New-user and operator review, session 38: a folder at `.hits` turned hit counting
    off for good, without a word (`ls` showed HITS 0); a `.locks` file was repaired."""
    journal = tmp_path / ".hits"
    if planted == "folder":
        journal.mkdir(parents=True)
        (journal / "inside").write_text("x")
    elif planted == "link":
        tmp_path.mkdir(exist_ok=True)
        journal.symlink_to(tmp_path / "elsewhere")
    else:
        tmp_path.mkdir(exist_ok=True)
        os.mkfifo(journal)
    backend = DirectoryBackend(tmp_path, hits_batch=1)
    cache = rc.Cache(backend)
    key = _key(0)
    assert cache.put(key, b"v")
    for _ in range(3):
        assert cache.get(key) == b"v"
    backend.flush_hits()
    assert journal.is_file() and not journal.is_symlink()
    assert "not a file" in caplog.text or planted != "folder"  # (the others went unread)
    assert not (tmp_path / "elsewhere").exists()  # never followed


@pytest.mark.parametrize("kind", ["socket", "fifo", "link", "file"])
def test_what_blocks_an_entrys_folder_is_named_as_it_is(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Review of session 42: a socket at an entry's folder name was logged as the entry
    itself, "a folder or a link", removed: the entry's file never existed."""
    import socket

    root = tmp_path / "c"
    backend = DirectoryBackend(root)
    cache = rc.Cache(backend)
    k = _key(0)
    entry = backend._rel(str(k))
    folder = root / entry.rpartition("/")[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    if kind == "socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(str(folder))
    elif kind == "fifo":
        os.mkfifo(folder)
    elif kind == "link":
        folder.symlink_to(tmp_path)
    else:
        folder.write_bytes(b"not a folder")
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert cache.put(k, b"value")
    said = {"socket": "a socket", "fifo": "a FIFO", "link": "a symbolic link", "file": "a file"}
    assert f"{folder} is {said[kind]}, not a cache folder; removed it" in caplog.text
    assert cache.get(k) == b"value" and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # (no write through the link)


def test_only_links_at_fan_out_folder_names_are_reported(tmp_path: Path) -> None:
    """A link at a two-character folder name (where a key's fan-out folder goes) hides the
    entries behind it: the listing names it, under a prefix that could reach it. A link at
    a longer name may be the user's own (a cache opened on ``~``): never named or removed."""
    root = tmp_path / "c"
    _filled(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "junk" / "test" / "zz").symlink_to(outside)
    (root / "lib64").symlink_to(outside)  # a venv's link, say
    backend = DirectoryBackend(root)
    assert len(list(backend.keys())) == 3 and backend.linked_folders == ["junk/test/zz"]
    assert list(backend.keys("junk/test/z")) == [] and backend.linked_folders == ["junk/test/zz"]
    list(backend.keys("junk/test/a"))
    assert backend.linked_folders == []
    assert backend.remove_linked_folder("junk/test/zz")
    assert (root / "lib64").is_symlink() and outside.is_dir()
    assert not os.path.lexists(root / "junk" / "test" / "zz")


def test_a_folder_of_the_users_own_keeps_its_short_links(tmp_path: Path) -> None:
    """Re-attack of session 43: opened as a cache by mistake (``dir://~``), a home folder's
    links with two-character names (``go``, ``js``, ``src/proj/vendor/db``) were named as
    links at fan-out folders, and ``verify --repair`` removed them. A link is named only
    beside a fan-out folder that holds an entry."""
    from runtime_cache.cli import main

    home = tmp_path / "home"
    (home / "gosrc").mkdir(parents=True)
    (home / "src" / "proj" / "vendor").mkdir(parents=True)
    (home / "go").symlink_to(home / "gosrc")
    (home / "js").symlink_to(tmp_path)
    (home / "src" / "proj" / "vendor" / "db").symlink_to(tmp_path)
    backend = DirectoryBackend(home)
    assert list(backend.keys()) == [] and backend.linked_folders == []
    assert main(["--cache", f"dir://{home}", "verify", "--repair"]) == 0
    for link in ("go", "js", "src/proj/vendor/db"):
        assert (home / link).is_symlink()
