"""Fuzz targets shared by the short CI tests (tests/test_fuzz_*.py) and the long run (run_fuzz.py).

Each ``check_*`` function feeds one input to one decoder or parser and raises
:class:`ContractViolation` when the outcome breaks the contract:

* the only exceptions allowed are the typed ones the API documents
  (:class:`runtime_cache.errors.RuntimeCacheError` subclasses, plus ``TypeError``
  and ``ValueError`` where documented);
* a value served from a mutated entry is the original value, never another one;
* counters stay consistent (every lookup is a hit or a miss);
* nothing the decoders accept leaves a bad entry behind in the cache.

Inputs come from :mod:`hypothesis` in the tests and from :func:`mutate` (a plain
seeded mutator over a corpus of valid blobs) in the long run.
"""

from __future__ import annotations

import atexit
import random
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import (
    CorruptEntryError,
    InvalidBundleError,
    InvalidURLError,
    InvalidValueError,
    MissingDependencyError,
    NewerFormatError,
    RuntimeCacheError,
    UnknownBackendError,
)
from runtime_cache.maintenance import verify
from runtime_cache.tuning import TuningCache
from runtime_cache.units import parse_duration, parse_size
from runtime_cache.urls import BackendURL

SECRET = b"fuzz-secret"
DEVICE = {"vendor": "FuzzCo", "name": "Fuzz GPU", "driver": "1.0"}
_HEADER = struct.Struct("<4sBBHIQQQ")


class ContractViolation(AssertionError):
    """An input made a target break its contract (the message says how)."""


def _allowed(exc: BaseException, allowed: tuple[type[BaseException], ...], what: str) -> None:
    if not isinstance(exc, allowed):
        raise ContractViolation(f"{what} raised {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------- the corpus
def sample_key(i: int = 0) -> rc.CacheKey:
    """A key with a device fingerprint, as a consumer makes it."""
    return rc.make_key(
        module_id=f"fuzz@{i}", runtime="opencl", purpose="program-binary", device=DEVICE, i=i
    )


def sample_entry(value: bytes = b"binary", i: int = 0, secret: bytes | None = None) -> bytes:
    """A valid encoded entry for :func:`sample_key`."""
    key = sample_key(i)
    return codec.encode_entry(
        str(key), key.parts, value, created_at=1.0, build_seconds=0.5, producer="fuzz",
        secret=secret,
    )  # fmt: skip


def sample_bundle(n: int = 3, secret: bytes | None = None) -> bytes:
    """A valid bundle of ``n`` entries."""
    cache = rc.Cache(MemoryBackend(), secret=secret)
    for i in range(n):
        cache.put(sample_key(i), bytes([i]) * (i + 1) * 7)
    return cache.dumps()


def sample_tuning_bundle() -> bytes:
    """A valid TuningCache bundle with two records."""
    tuning = TuningCache("fuzz-model@1", "opencl", DEVICE, cache=rc.Cache(MemoryBackend()))
    tuning.put("conv_1", {"local": [8, 8], "tile": 4, "t": 0.25})
    tuning.put("gemm_2", {"local": [16, 1], "vec": True, "name": "x" * 40})
    return tuning.dumps()


def rechecksum(blob: bytes) -> bytes:
    """Recompute an entry's two checksums so a mutated body passes the codec's checks."""
    if len(blob) < codec.HEADER_SIZE:
        return blob
    fields = list(_HEADER.unpack_from(blob))
    meta_len, value_len = fields[4], fields[5]
    end_meta = codec.HEADER_SIZE + meta_len
    if end_meta + value_len > len(blob):
        return blob
    fields[6] = xxhash.xxh3_64_intdigest(blob[codec.HEADER_SIZE : end_meta])
    fields[7] = xxhash.xxh3_64_intdigest(blob[end_meta : end_meta + value_len])
    return _HEADER.pack(*fields) + blob[codec.HEADER_SIZE :]


def rechecksum_bundle(data: bytes) -> bytes:
    """Recompute an unsigned bundle's checksum, so a mutated body reaches the parser."""
    if len(data) < 8:
        return data
    body = data[:-8]
    return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))


_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random edits: bit flips, byte sets, cuts, inserts, length-field rewrites."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        pos = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(pos, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif op == 2:
            del out[pos : pos + rng.randint(1, 64)]
        elif op == 3:
            out[pos:pos] = rng.randbytes(rng.randint(1, 64))
        elif op == 4:
            out = out[:pos]
        elif op == 5 and len(out) >= 8:
            at = rng.randrange(len(out) - 7)
            out[at : at + 8] = struct.pack("<Q", rng.choice(_INTERESTING))
        elif op == 6 and len(out) >= 4:
            at = rng.randrange(len(out) - 3)
            out[at : at + 4] = struct.pack("<I", rng.choice(_INTERESTING) & 0xFFFFFFFF)
    return bytes(out)


# ---------------------------------------------------------------- the targets
def check_entry(blob: bytes, original: bytes | None = None) -> None:
    """Decode ``blob`` directly and through a :class:`~runtime_cache.Cache`.

    ``original`` is the value the blob held before it was mutated; whatever is
    served must equal it. Only :class:`CorruptEntryError` may escape the codec.
    """
    for secret in (None, SECRET):
        try:
            entry = codec.decode_entry(blob, secret=secret)
        except Exception as exc:
            _allowed(exc, (CorruptEntryError,), "decode_entry")
        else:
            if original is not None and entry.value != original:
                raise ContractViolation("a mutated entry decoded to another value")
    try:
        codec.decode_meta(blob[:4096])
    except Exception as exc:
        _allowed(exc, (CorruptEntryError,), "decode_meta")
    key = sample_key(0)
    backend = MemoryBackend()
    backend.set(str(key), blob)
    cache = rc.Cache(backend, producer="fuzz")  # the sample's: its own entries' quick check
    try:
        value = cache.get(key)
        infos = list(cache.entries())
    except Exception as exc:
        raise ContractViolation(f"Cache.get raised {type(exc).__name__}: {exc}") from exc
    stats = cache.stats()
    if stats.hits + stats.misses != 1 or stats.hits != (value is not None):
        raise ContractViolation(f"inconsistent counters for one lookup: {stats}")
    if value is None:
        # Damage is counted corrupt and removed; an entry that is not this key's (it
        # decodes, but its key or parts differ) is rejected and kept, as is a newer format.
        kept = backend.get(str(key)) is not None
        if stats.corrupt == 1 and kept:
            raise ContractViolation("a corrupt entry was not deleted")
        if stats.corrupt == 0 and not kept:
            raise ContractViolation("an entry that was not corrupt was deleted")
        if stats.corrupt + stats.rejected == 0 and not _newer(blob):
            raise ContractViolation("a bad entry was counted neither corrupt nor rejected")
    if original is not None and value is not None and value != original:
        raise ContractViolation("the cache served a value other than the one stored")
    if value is not None and len(infos) > 1:
        raise ContractViolation("one stored blob was listed as several entries")
    # A cache that has read this key's sample entry remembers its header (the quick check
    # then checks the value alone when the same header comes back): the same answer.
    backend.set(str(key), sample_entry())
    if cache.get(key) != b"binary":
        raise ContractViolation("the sample entry was not served")
    backend.set(str(key), blob)
    cache.reset_stats()
    try:
        again = cache.get(key)
    except Exception as exc:
        raise ContractViolation(f"Cache.get raised {type(exc).__name__}: {exc}") from exc
    seen = cache.stats()
    if again != value or (seen.hits, seen.corrupt, seen.rejected) != (
        stats.hits,
        stats.corrupt,
        stats.rejected,
    ):
        raise ContractViolation("a cache that had read the key's entry judged it otherwise")


def _newer(blob: bytes) -> bool:
    try:
        codec.decode_entry(blob)
    except NewerFormatError:
        return True
    except CorruptEntryError:
        return False
    return False


def check_bundle(data: bytes, secret: bytes | None = None) -> int:
    """Split ``data`` as a bundle and merge it into an empty cache; return how many were accepted.

    Only :class:`InvalidBundleError` may escape; every accepted entry must then
    verify, so a bundle can never plant a bad entry.
    """
    try:
        codec.decode_bundle(data, secret=secret)
    except Exception as exc:
        _allowed(exc, (InvalidBundleError,), "decode_bundle")
    cache = rc.Cache(MemoryBackend(), secret=secret)
    try:
        accepted = cache.loads(data)
    except Exception as exc:
        _allowed(exc, (InvalidBundleError,), "Cache.loads")
        return 0
    report = verify(cache)
    if not report.ok:
        raise ContractViolation(f"Cache.loads accepted entries that do not verify: {report.bad}")
    if report.checked != accepted:
        raise ContractViolation(f"loads said {accepted} accepted, but {report.checked} are stored")
    return accepted


def check_tuning(data: bytes) -> int:
    """Merge ``data`` with :meth:`TuningCache.loads`; only InvalidBundleError may escape."""
    tuning = TuningCache("fuzz-model@1", "opencl", DEVICE, cache=rc.Cache(MemoryBackend()))
    try:
        accepted = tuning.loads(data)
    except Exception as exc:
        _allowed(exc, (InvalidBundleError,), "TuningCache.loads")
        return 0
    try:
        records = tuning.records()
    except Exception as exc:
        raise ContractViolation(f"records() after loads raised {type(exc).__name__}") from exc
    if len(records) != accepted or not all(isinstance(r, dict) for r in records.values()):
        raise ContractViolation(f"loads said {accepted}, records() has {len(records)}")
    return accepted


_URL_ERRORS = (InvalidURLError, UnknownBackendError, MissingDependencyError)
_scratch: Path | None = None


def scratch_dir() -> Path:
    """A private folder under which dir:// URLs from the fuzzer create their trees."""
    global _scratch
    if _scratch is None:
        _scratch = Path(tempfile.mkdtemp(prefix="rc-fuzz-url-"))
        atexit.register(shutil.rmtree, _scratch, ignore_errors=True)  # one run left one each
    return _scratch


def dir_url(suffix: str) -> str:
    """A dir:// URL rooted in :func:`scratch_dir`, so fuzzed paths never leave it."""
    return f"dir://{scratch_dir()}/d{suffix}"


def check_url(url: str) -> None:
    """Parse ``url`` and open a backend from it without touching any server.

    Allowed outcomes: a backend, :class:`InvalidURLError`,
    :class:`UnknownBackendError`, or :class:`MissingDependencyError`. A
    directory URL that names a path the OS refuses may also give
    :class:`~runtime_cache.errors.BackendError`.
    """
    try:
        BackendURL.parse(url)
    except Exception as exc:
        _allowed(exc, (InvalidURLError,), "BackendURL.parse")
    if url.lower().startswith("dir:") and not url.startswith(f"dir://{scratch_dir()}/"):
        return  # never let a fuzzed URL create folders outside the scratch area
    if "," in url and "dir:" in url.lower():
        return
    try:
        backend = rc.open_backend(url)
    except Exception as exc:
        _allowed(exc, (*_URL_ERRORS, RuntimeCacheError), "open_backend")
        return
    backend.close()


def check_size_and_duration(text: str) -> None:
    """:func:`parse_size` and :func:`parse_duration` give a finite number or InvalidValueError."""
    for parse in (parse_size, parse_duration):
        try:
            value = parse(text)
        except Exception as exc:
            _allowed(exc, (InvalidValueError,), parse.__name__)
            continue
        if not (value >= 0 and value < float("inf")):
            raise ContractViolation(f"{parse.__name__}({text!r}) gave {value!r}")


TARGETS: dict[str, Callable[..., Any]] = {
    "entry": check_entry,
    "bundle": check_bundle,
    "tuning": check_tuning,
    "url": check_url,
    "size": check_size_and_duration,
}


# ------------------------------------------------------------ input generators
_URL_SCHEMES = ["memory://", "redis://", "rediss://", "redis+cluster://", "tiered://", "x://", ""]
_URL_CHARS = "abc:/@?=&%,.0123456789[]#\x00 \t\nMBkKiGgsmhd-_+~\u00e9\u2603"
_URL_OPTIONS = [
    "max_size", "ttl", "timeout", "connect_timeout", "prefix", "namespace", "backoff",
    "max_backoff", "max_connections", "fsync", "track_access", "shared", "ssl_ca_certs",
    "ssl_cert_reqs",
]  # fmt: skip


def random_url(rng: random.Random) -> str:
    """A random backend URL: a known or unknown scheme, a fuzzed body and options, maybe tiers."""

    def text(n: int) -> str:
        return "".join(rng.choice(_URL_CHARS) for _ in range(rng.randint(0, n)))

    if rng.random() < 0.2:
        url = dir_url(text(12).replace("/", "_").replace("?", "_"))
    else:
        url = rng.choice(_URL_SCHEMES) + text(30)
    if rng.random() < 0.6:
        options = [f"{rng.choice(_URL_OPTIONS)}={text(8)}" for _ in range(rng.randint(1, 3))]
        url += "?" + "&".join(options)
    if rng.random() < 0.2:
        url += "," + rng.choice(["memory://", "redis://127.0.0.1:1/0", ""])
    return url


def mutated_bundle_of_mutated_entries(bundle: bytes, rng: random.Random) -> bytes:
    """Re-pack a bundle after mutating and re-checksumming some of its entries."""
    try:
        blobs = codec.decode_bundle(bundle)
    except InvalidBundleError:
        return bundle
    inner = [rechecksum(mutate(b, rng)) if rng.random() < 0.7 else b for b in blobs]
    return codec.encode_bundle(inner)
