"""Large entries planted in a store others write: what a reader that judges a batch holds.

The attacker review: a member of a shared folder's group planted, at a bundle's keys,
sparse files whose entry headers claimed 400 MiB values (each exactly that size, so the
junk rule took it for an entry, and 20-44 KiB of disk). ``import --keep-existing`` read
every entry already stored at a batch's keys whole, together (``peek_many``, up to 256
keys), to judge whether to keep it: four of them held 1.66 GB. A tier that failed a write
read what it held of the batch the same way, to tell which values had landed.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.tier import Tier
from runtime_cache.codec import encode_entry
from runtime_cache.errors import BackendError

MIB = 1 << 20
SECRET = "a-fleet-secret-of-16+"


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="opencl", purpose="program-binary")


def _plant(backend: DirectoryBackend, key: rc.CacheKey, size: int, signed: bool) -> None:
    """A forged entry at ``key``: a header claiming ``size`` bytes of value (flagged signed
    or not), in a sparse file of exactly the size it claims."""
    blob = bytearray(encode_entry(str(key), key.parts, b"v", created_at=0.0))
    blob[5] = int(signed)  # the flags
    meta_len = struct.unpack_from("<I", blob, 8)[0]
    struct.pack_into("<Q", blob, 12, size)  # the value's length
    head = bytes(blob[: 36 + meta_len])
    backend.set(str(key), head)
    (path,) = Path(backend.root).rglob(f"{str(key).rsplit('/', 1)[1]}.rce")
    os.truncate(path, len(head) + size + (32 if signed else 0))


#: The CLI in a child, which tells the peak of its own memory (VmHWM: ru_maxrss may hold
#: the parent's peak at the fork).
_MEASURE = (
    "import sys\n"
    "from runtime_cache.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "peak = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
    "print('peak_kib', peak[0], file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def _measured(folder: Path, argv: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """The CLI run with ``argv`` in a child (in ``folder``), and the peak of its memory
    in KiB."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", _MEASURE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    said = done.stderr.split("peak_kib")
    return done, int(said[1].split()[0]) if len(said) > 1 else -1


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
def test_keep_existing_judges_planted_entries_without_holding_them(tmp_path: Path) -> None:
    source = rc.Cache(DirectoryBackend(tmp_path / "source"), secret=SECRET)
    for i in range(6):
        source.put(_key(i), b"good value %d" % i)
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    target = DirectoryBackend(tmp_path / "target")
    for i in range(4):  # unsigned, where a secret is set: refused by the head, unread
        _plant(target, _key(i), 200 * MIB, signed=False)
    _plant(target, _key(4), 100 * MIB, signed=True)  # read whole (alone): a wrong checksum
    rc.Cache(target, secret=SECRET).put(_key(5), b"kept")  # good: stays
    planted = sum(p.stat().st_size for p in Path(target.root).rglob("*.rce"))
    assert planted > 900 * MIB
    url = f"dir://{target.root}"
    argv = ["--cache", url, "--secret", SECRET, "import", str(bundle), "--keep-existing"]
    done, peak_kib = _measured(tmp_path, argv)
    assert done.returncode == 0, done.stderr
    assert "imported 5 of 6" in done.stdout and "kept 1 entry" in done.stdout, done.stdout
    # Held together, the planted entries took 1 GB: now one at most (100 MiB) besides the
    # process (~40 MB).
    assert peak_kib < 300_000, done.stderr
    cache = rc.Cache(DirectoryBackend(tmp_path / "target"), secret=SECRET)
    values = [cache.get(_key(i)) for i in range(6)]
    assert values == [*(b"good value %d" % i for i in range(5)), b"kept"]


class _Reads(DirectoryBackend):
    """A folder that records how many bytes each read of a value brought."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int]] = []

    def head(self, key: str, size: int) -> bytes | None:
        found = super().head(key, size)
        self.reads.append(("head", len(found or b"")))
        return found

    def peek(self, key: str) -> bytes | None:
        found = super().peek(key)
        self.reads.append(("peek", len(found or b"")))
        return found

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        found = super().peek_many(keys)
        self.reads.append(("peek_many", sum(map(len, found.values()))))
        return found


def test_a_tier_that_failed_a_write_reads_what_it_holds_a_key_at_a_time(
    tmp_path: Path,
) -> None:
    """What landed is told by as many bytes as were written and one more; an older copy (a
    planted one) is read whole only to remove it, alone."""
    backend = _Reads(tmp_path / "c")
    keys = [_key(i) for i in range(4)]
    written = {str(k): b"new value %d" % i for i, k in enumerate(keys)}
    backend.set(str(keys[0]), written[str(keys[0])])  # landed
    for k in keys[1:3]:
        _plant(backend, k, 50 * MIB, signed=False)
    backend.set(str(keys[3]), b"older")
    backend.reads.clear()
    tier = Tier(backend, logging.getLogger(__name__))
    tier.unwritten(written, BackendError("disk full"))
    reads = backend.reads
    assert [how for how, _ in reads] == ["head"] * 4 + ["peek"] * 3, reads
    assert max(size for _, size in reads[:4]) <= len(written[str(keys[0])]) + 1, reads
    assert max(size for _, size in reads[4:]) <= 50 * MIB + 4096, reads  # one at a time
    assert (tier.not_written, tier.may_be_stale) == (3, 0)
    assert [backend.peek(str(k)) for k in keys] == [written[str(keys[0])], None, None, None]


def _plant_listed(backend: DirectoryBackend, key: rc.CacheKey, size: int) -> None:
    """As :func:`_plant`, with metadata that agrees with the header (the size it claims),
    so that a listing, which reads heads alone, takes it for an entry."""
    import xxhash

    from runtime_cache.entry_frame import ENTRY_HEADER, ENTRY_MAGIC, ENTRY_VERSION
    from runtime_cache.entry_meta import pack_meta

    meta = pack_meta(str(key), key.packed_parts, 1.0, 0.0, "", size, None)
    digest = xxhash.xxh3_64_intdigest(meta)
    head = ENTRY_HEADER.pack(ENTRY_MAGIC, ENTRY_VERSION, 0, 0, len(meta), size, digest, 0)
    backend.set(str(key), head + meta)
    (path,) = Path(backend.root).rglob(f"{str(key).rsplit('/', 1)[1]}.rce")
    os.truncate(path, len(head) + len(meta) + size)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
def test_export_reads_large_listed_entries_one_at_a_time(tmp_path: Path) -> None:
    """The same planted files in a folder exported (with no secret: each is listed, then
    read whole before its checksum fails): ``export`` read every entry of a batch of 256
    together. It reads no more than 64 MiB of listed entries at once now, a larger one
    alone, and leaves the planted ones out (exit code 1)."""
    target = DirectoryBackend(tmp_path / "target")
    for i in range(6):
        _plant_listed(target, _key(i), 100 * MIB)
    good = rc.Cache(target)
    for i in range(6, 10):
        good.put(_key(i), b"good value %d" % i)
    argv = ["--cache", f"dir://{target.root}", "export", str(tmp_path / "out.rcb")]
    done, peak_kib = _measured(tmp_path, argv)
    assert done.returncode == 1, done.stderr
    assert "exported 4 entries" in done.stdout, (done.stdout, done.stderr)
    # Together, 600 MiB and more; alone, one entry and its removal's second read of it.
    assert peak_kib < 400_000, done.stderr
    loaded = rc.Cache(rc.open_backend("memory://"))
    assert loaded.loads((tmp_path / "out.rcb").read_bytes()) == 4


def _dumped(url: str, keys: list[str] | None = None) -> tuple[int, int]:
    """``Cache(open_backend(url)).dumps(keys=...)`` in a child: the bundle's size, and the
    peak of the child's memory in KiB."""
    script = (
        "import json, sys\n"
        "import runtime_cache as rc\n"
        "cache = rc.Cache(rc.open_backend(sys.argv[1]))\n"
        "data = cache.dumps(keys=json.loads(sys.argv[2]))\n"
        "peak = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "print(len(data), peak[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, url, json.dumps(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    size, peak_kib = map(int, done.stdout.split())
    return size, peak_kib


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
def test_dumps_of_given_keys_reads_a_folder_a_key_at_a_time(tmp_path: Path) -> None:
    """The re-attack review of session 41: with keys given (no listing, so no sizes), a
    dump still read its batch of keys together: 520 MiB for five planted entries."""
    target = DirectoryBackend(tmp_path / "target")
    keys = [_key(i) for i in range(7)]
    for k in keys[:5]:
        _plant_listed(target, k, 100 * MIB)
    for k in keys[5:]:
        rc.Cache(target).put(k, b"good " + str(k).encode())
    size, peak_kib = _dumped(f"dir://{target.root}", [str(k) for k in keys])
    assert peak_kib < 300_000, peak_kib  # together, 500 MiB and more
    assert 0 < size < MIB  # the two good entries alone


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
def test_dumps_of_a_tiered_stack_reads_its_folder_tier_bounded(tmp_path: Path) -> None:
    """The last review of session 41: a tiered stack is read in batches (a round trip a
    batch to its remote tiers), and its folder tier read a batch's files whole together:
    the batch is cut at 64 MiB of listed bytes (a larger entry alone)."""
    target = DirectoryBackend(tmp_path / "target")
    for i in range(5):
        _plant_listed(target, _key(i), 100 * MIB)
    rc.Cache(target).put(_key(9), b"good")
    size, peak_kib = _dumped(f"memory://,dir://{target.root}")
    assert peak_kib < 400_000, peak_kib  # together, 500 MiB and more
    assert 0 < size < MIB


def test_a_head_that_claims_more_than_is_stored_is_listed_as_corrupt(tmp_path: Path) -> None:
    """The attack review: a planted head alone (190 bytes) claiming a 1 GiB value built in
    1,000 s was listed as such: ``ls`` showed 1024.0 MiB, ``stats`` added the time, both
    exited 0. A listing compares what is stored with what the head says (as a read does)."""
    from runtime_cache.cli import main

    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend)
    cache.put(_key(0), b"good", build_seconds=2.0)
    key = _key(1)
    blob = encode_entry(str(key), key.parts, bytes(MIB), created_at=1.7e9, build_seconds=1000)
    meta_len = struct.unpack_from("<I", blob, 8)[0]
    backend.set(str(key), blob[: 36 + meta_len])
    skipped: list[tuple[str, str]] = []
    listed = list(cache.entries(on_skip=lambda k, why: skipped.append((k, why))))
    assert [info.key for info in listed] == [str(_key(0))]
    assert skipped and skipped[0][0] == str(key) and "header says" in skipped[0][1], skipped
    assert main(["--cache", f"dir://{tmp_path}", "ls"]) == 1
    assert main(["--cache", f"dir://{tmp_path}", "stats"]) == 1


def test_an_entry_written_again_while_listed_is_not_called_corrupt() -> None:
    """The re-attack: the size a listing has is older than the head it reads after (an
    entry written again between, at another size); four of four `ls` runs over tuning
    records being re-tuned exited 1, calling good entries corrupt. The bytes there now
    tell."""
    from runtime_cache.api import StoredItem
    from runtime_cache.backends.memory import MemoryBackend

    class Stale(MemoryBackend):  # a listing taken before the entry was written again
        def scan(self, prefix: str = "") -> Iterable[StoredItem]:  # type: ignore[override]
            return [StoredItem(i.key, i.size - 7) for i in super().scan(prefix)]

    cache = rc.Cache(Stale())
    cache.put(_key(0), b"written again, 7 bytes longer")
    skipped: list[tuple[str, str]] = []
    listed = list(cache.entries(on_skip=lambda k, why: skipped.append((k, why))))
    assert [info.key for info in listed] == [str(_key(0))] and not skipped, skipped
    assert listed[0].stored_size == len(cache.backend.get(str(_key(0))) or b"")


def test_a_sparse_file_one_byte_longer_than_its_head_says_is_not_read(tmp_path: Path) -> None:
    """The second re-attack: a size mismatch was settled by reading the entry up to one
    past its declared length, so a sparse file of a forged 1 GiB entry plus one byte was
    read whole by every listing (2 of them: 5.3 s, 2.1 GB of memory). Its size now is
    asked of the store (a stat), and its head alone is read."""
    import xxhash

    from runtime_cache.entry_frame import ENTRY_HEADER, ENTRY_MAGIC
    from runtime_cache.entry_meta import pack_meta

    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend)
    key, size = _key(3), 64 * MIB
    meta = pack_meta(str(key), key.packed_parts, 1.7e9, 1000.0, "forged", size)
    digest = xxhash.xxh3_64_intdigest(meta)
    head = ENTRY_HEADER.pack(ENTRY_MAGIC, 1, 0, 0, len(meta), size, digest, 0) + meta
    backend.set(str(key), head)
    (path,) = Path(backend.root).rglob(f"{str(key).rsplit('/', 1)[1]}.rce")
    asked: list[int] = []
    real = backend.head

    def head_of(k: str, n: int) -> bytes | None:
        asked.append(n)
        return real(k, n)

    backend.head = head_of  # type: ignore[method-assign]
    for more in (1, -1):  # sparse: a byte more than the head says, then a byte less
        os.truncate(path, len(head) + size + more)
        skipped: list[tuple[str, str]] = []
        listed = list(cache.entries(on_skip=lambda k, why, out=skipped: out.append((k, why))))
        assert not listed and "its header says" in skipped[0][1], skipped
        assert max(asked) <= 64 * 1024, asked
