"""Trust on real PoCL (issue 13): substitution, transplant, another kernel's binary,
unsigned bundles, and a full scratch folder under a shared cache.

An attacker here uses the public API only: they can write the shared store, and
compute the victim's keys from the same inputs, but do not know the secret.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from opencl_kernels import SCALE_SRC, SHIFT_SRC, run_kernel
from opencl_support import fresh_guard

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.errors import InsecureStoreError, InvalidBundleError

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytestmark = pytest.mark.opencl
pytest_plugins = ["redis_servers"]

#: Same kernel name as SCALE_SRC, another result: what a substitution plants.
EVIL_SRC = SCALE_SRC.replace("a[i] * f;", "a[i] * f + 1000.0f;")
BIAS_SRC = """
__kernel void scale(__global float *a, const float f) {
    int i = get_global_id(0);
    a[i] = a[i] * f + BIAS;
}
"""
SECRET = "fleet secret"


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    monkeypatch.setenv("RUNTIME_CACHE_GUARD_DIR", str(tmp_path / "guard-victim"))
    yield from fresh_guard(tmp_path / "guard-victim")


@pytest.fixture
def driver_inputs(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every binary this process hands to the driver (the real call runs)."""
    from runtime_cache.opencl import program as program_module

    seen: list[bytes] = []
    real = program_module.create_and_build

    def spy(cl: Any, context: Any, devices: Any, binaries: Any, *rest: Any) -> Any:
        seen.extend(bytes(b) for b in binaries)
        return real(cl, context, devices, binaries, *rest)

    monkeypatch.setattr(program_module, "create_and_build", spy)
    return seen


def _binary(ctx: Any, source: str, options: str = "") -> bytes:
    import pyopencl as cl

    program = cl.Program(ctx, source).build(options=options)
    return bytes(program.get_info(cl.program_info.BINARIES)[0])


def _scale(ctx: Any, module: Any) -> np.ndarray:
    data = np.arange(8, dtype=np.float32)
    return run_kernel(ctx, module.kernel("scale"), data, np.float32(2))


EXPECTED = np.arange(8, dtype=np.float32) * 2


def _victim_key(ctx: Any, module: Any, name: str = "scale") -> rc.CacheKey:
    from runtime_cache.opencl.program import plan_program

    source = module.sources[name]
    plan = plan_program(ctx, source, module.options, module_id=module.module_id, program=name)
    assert plan.keys is not None
    return plan.keys[0]


def _plant(backend: rc.Backend, key: rc.CacheKey, binary: bytes) -> bytes:
    blob = codec.encode_entry(str(key), key.parts, binary, created_at=0.0)
    backend.set(str(key), blob)
    return blob


def _substitution(ctx: Any, url: str, driver_inputs: list[bytes]) -> None:
    from runtime_cache.opencl import OpenCLModule

    backend = rc.open_backend(url)
    victim = rc.Cache(backend, secret=SECRET)
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=victim)
    evil = _binary(ctx, EVIL_SRC)
    _plant(backend, _victim_key(ctx, module), evil)
    assert np.array_equal(_scale(ctx, module), EXPECTED)
    assert victim.stats().rejected == 1
    assert evil not in driver_inputs  # refused before any byte reached the driver
    fresh = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=victim)
    assert np.array_equal(_scale(ctx, fresh), EXPECTED)


def test_substitution_through_redis(
    ctx: Any, redis_server: RedisProcess, unique_prefix: str, driver_inputs: list[bytes]
) -> None:
    url = f"{redis_server.url}?prefix={unique_prefix}"
    with pytest.raises(InsecureStoreError):  # unsigned, it would run the planted binary
        rc.Cache(rc.open_backend(url))
    _substitution(ctx, url, driver_inputs)


def test_substitution_through_a_shared_folder(
    ctx: Any, tmp_path: Path, driver_inputs: list[bytes]
) -> None:
    url = f"dir://{tmp_path / 'team'}?shared=1"
    with pytest.raises(InsecureStoreError):
        rc.Cache(rc.open_backend(url))
    _substitution(ctx, url, driver_inputs)


@pytest.mark.parametrize("where", ["redis", "private folder"])
def test_a_signed_cache_refuses_an_unsigned_bundle(
    ctx: Any,
    redis_server: RedisProcess,
    unique_prefix: str,
    tmp_path: Path,
    driver_inputs: list[bytes],
    where: str,
) -> None:
    """Loaded, it would then be stored signed with the secret: a forgery made trusted."""
    from runtime_cache.opencl import OpenCLModule
    from runtime_cache.opencl.bundle import pack_programs

    shared = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.open_backend(shared if where == "redis" else f"dir://{tmp_path / 'own'}")
    victim = rc.Cache(backend, secret=SECRET)
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=victim)
    evil = _binary(ctx, EVIL_SRC)
    bundle = pack_programs([(_victim_key(ctx, module), evil, 0.1)])
    with pytest.raises(InvalidBundleError):  # as victim.loads(bundle) raises
        module.set_precompiled_programs(bundle)
    assert list(backend.keys()) == []  # nothing stored, so nothing signed
    assert evil not in driver_inputs
    assert np.array_equal(_scale(ctx, module), EXPECTED)


def test_an_unsigned_bundle_is_used_but_never_stored_in_an_unsigned_shared_cache(
    ctx: Any, redis_server: RedisProcess, unique_prefix: str
) -> None:
    """With no secret (a shared store opened with insecure=1 on purpose), the app may load
    a bundle it chose; others, who would run it, never find it in the store."""
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.opencl import OpenCLModule

    maker = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=rc.Cache(MemoryBackend()))
    bundle = maker.get_precompiled_programs()
    backend = rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}&insecure=1")
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=rc.Cache(backend))
    result = module.set_precompiled_programs(bundle)
    assert (result, result.unsigned, result.withheld) == (1, 1, 1)
    assert list(backend.keys()) == []
    assert np.array_equal(_scale(ctx, module), EXPECTED)


def test_an_unsigned_entry_in_a_signed_bundle_is_refused(
    ctx: Any, tmp_path: Path, driver_inputs: list[bytes]
) -> None:
    from runtime_cache.opencl import OpenCLModule

    backend = rc.open_backend(f"dir://{tmp_path / 'own'}")
    victim = rc.Cache(backend, secret=SECRET)
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=victim)
    evil = _binary(ctx, EVIL_SRC)
    key = _victim_key(ctx, module)
    entry = codec.encode_entry(str(key), key.parts, evil, created_at=0.0)  # no secret
    result = module.set_precompiled_programs(codec.encode_bundle([entry], secret=SECRET.encode()))
    assert (result, result.rejected, result.unsigned) == (0, 1, 0)
    assert list(backend.keys()) == [] and evil not in driver_inputs
    assert np.array_equal(_scale(ctx, module), EXPECTED)


def test_a_signed_caches_bundle_loads_signed_where_the_secret_is_the_same(
    ctx: Any, tmp_path: Path
) -> None:
    from runtime_cache.opencl import OpenCLModule, opencl_stats, reset_opencl_stats

    maker = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'maker'}"), secret=SECRET)
    bundle = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=maker).get_precompiled_programs()
    backend = rc.open_backend(f"dir://{tmp_path / 'taker'}")
    taker = rc.Cache(backend, secret=SECRET)
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=taker)
    reset_opencl_stats()
    result = module.set_precompiled_programs(bundle)
    assert (result, result.unsigned, result.rejected) == (1, 0, 0)
    assert opencl_stats().vetted == 0  # signed: loaded without a vetting child
    assert np.array_equal(_scale(ctx, module), EXPECTED)
    [stored] = backend.keys()
    blob = backend.get(stored)
    assert blob is not None and taker.check(stored, blob) is not None  # stored signed
    other = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'other'}"), secret="another secret!!")
    with pytest.raises(InvalidBundleError):
        OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=other).set_precompiled_programs(bundle)


def _transplant(blob: bytes, key: rc.CacheKey, *, rewrite_parts: bool) -> bytes:
    entry = codec.decode_entry(blob)
    parts = key.parts if rewrite_parts else entry.parts
    return codec.encode_entry(str(key), parts, entry.value, created_at=entry.created_at)


@pytest.mark.parametrize("rewrite_parts", [False, True])
def test_transplant_of_the_victims_own_entry(
    ctx: Any, tmp_path: Path, rewrite_parts: bool, driver_inputs: list[bytes]
) -> None:
    """The -DBIAS=1000 build copied under the -DBIAS=0 key, with or without its parts."""
    from runtime_cache.opencl import OpenCLModule

    def modules(cache: rc.Cache) -> tuple[Any, Any]:
        return (
            OpenCLModule(ctx, {"scale": BIAS_SRC}, options=["-DBIAS=1000"], cache=cache),
            OpenCLModule(ctx, {"scale": BIAS_SRC}, options=["-DBIAS=0"], cache=cache),
        )

    # A private folder: without rewritten parts, the parts check alone refuses it.
    store = rc.open_backend(f"dir://{tmp_path / 'own'}")
    private = rc.Cache(store)
    biased, plain = modules(private)
    biased.build_all()
    source = store.get(str(_victim_key(ctx, biased)))
    assert source is not None
    if not rewrite_parts:
        store.set(
            str(_victim_key(ctx, plain)),
            _transplant(source, _victim_key(ctx, plain), rewrite_parts=False),
        )
        assert np.array_equal(_scale(ctx, plain), EXPECTED)
        assert private.stats().rejected == 1
    # A shared store: unsigned it does not open; signed, the transplant is refused.
    shared_backend = rc.open_backend(f"dir://{tmp_path / 'team'}?shared=1")
    with pytest.raises(InsecureStoreError):
        rc.Cache(shared_backend)
    signed = rc.Cache(shared_backend, secret=SECRET)
    biased, plain = modules(signed)
    biased.build_all()
    blob = shared_backend.get(str(_victim_key(ctx, biased)))
    assert blob is not None
    target = _victim_key(ctx, plain)
    moved = _transplant(blob, target, rewrite_parts=rewrite_parts)
    shared_backend.set(str(target), moved)
    before = len(driver_inputs)
    assert np.array_equal(_scale(ctx, plain), EXPECTED)
    assert signed.stats().rejected == 1
    assert codec.decode_entry(moved).value not in driver_inputs[before:]


def _shift_under_scale(ctx: Any, tmp_path: Path) -> Any:
    """A new module over a private folder where the shift program's entry was copied under
    the scale key, parts and all: the binary is known, but not under this key."""
    from runtime_cache.opencl import OpenCLModule

    store = rc.open_backend(f"dir://{tmp_path / 'own'}")
    cache = rc.Cache(store)
    module = OpenCLModule(ctx, {"scale": SCALE_SRC, "shift": SHIFT_SRC}, cache=cache)
    module.build_all()
    shift = store.get(str(_victim_key(ctx, module, "shift")))
    assert shift is not None
    target = _victim_key(ctx, module, "scale")
    store.set(str(target), _transplant(shift, target, rewrite_parts=True))
    return OpenCLModule(ctx, {"scale": SCALE_SRC, "shift": SHIFT_SRC}, cache=cache)


def test_another_kernels_binary_is_rejected_never_raised(ctx: Any, tmp_path: Path) -> None:
    """The copied binary lacks the kernel asked for: rejected, never INVALID_KERNEL_NAME."""
    from runtime_cache.opencl import opencl_stats

    again = _shift_under_scale(ctx, tmp_path)
    assert np.array_equal(_scale(ctx, again), EXPECTED)
    assert opencl_stats().rejected_binaries == 1


def test_program_never_returns_another_kernels_program(ctx: Any, tmp_path: Path) -> None:
    """As above, asked through ``program()`` (no kernel made): the binary loads cleanly, so
    only the kernels it holds tell; it is evicted and the program built from source."""
    import pyopencl as cl

    from runtime_cache.opencl import opencl_stats

    again = _shift_under_scale(ctx, tmp_path)
    program = again.program("scale")
    assert program.get_info(cl.program_info.KERNEL_NAMES).split(";") == ["scale"]
    assert again.program("scale") is program  # checked once
    assert opencl_stats().rejected_binaries == 1
    assert opencl_stats().source_builds == 3  # the first module's two, and this one
    assert np.array_equal(_scale(ctx, again), EXPECTED)


def test_build_program_never_returns_a_program_without_its_kernels(
    ctx: Any, tmp_path: Path
) -> None:
    """build_program() (and install(), through the same check) is asked for no kernel: a
    program that holds none of its source's kernels is evicted and built from source (it was
    served, and marked known, on every run)."""
    import pyopencl as cl

    from runtime_cache.opencl import build_program, opencl_stats
    from runtime_cache.opencl.program import plan_program

    store = rc.open_backend(f"dir://{tmp_path / 'own'}")
    cache = rc.Cache(store)
    for source in (SCALE_SRC, SHIFT_SRC):
        build_program(ctx, source, cache=cache, module_id="m")
    scale_keys = plan_program(ctx, SCALE_SRC, module_id="m").keys
    shift_keys = plan_program(ctx, SHIFT_SRC, module_id="m").keys
    assert scale_keys is not None and shift_keys is not None
    shift = store.get(str(shift_keys[0]))
    assert shift is not None
    store.set(str(scale_keys[0]), _transplant(shift, scale_keys[0], rewrite_parts=True))
    for _ in range(2):  # the second run loads the rebuilt program from the cache
        program = build_program(ctx, SCALE_SRC, cache=cache, module_id="m")
        assert program.get_info(cl.program_info.KERNEL_NAMES).split(";") == ["scale"]
    stats = opencl_stats()
    assert (stats.rejected_binaries, stats.source_builds, stats.binary_loads) == (1, 3, 2)


def test_a_source_the_preprocessor_shapes_is_never_rejected_for_its_kernels(
    ctx: Any, tmp_path: Path
) -> None:
    """Kernels inside an #if not taken, or made by a macro, are not the ones compiled: the
    check must not evict and rebuild such a program on every run."""
    from runtime_cache.opencl import build_program, opencl_stats

    source = (
        "#ifdef NOT_SET\n__kernel void never(__global float *a) { a[0] = 1.0f; }\n#endif\n"
        "#define KERNEL(T) __kernel void scale_##T(__global T *a) { a[get_global_id(0)] *= 2; }\n"
        "KERNEL(float)\n"
    )
    cache = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'own'}"))
    for _ in range(3):
        build_program(ctx, source, cache=cache, module_id="shaped")
    stats = opencl_stats()
    assert (stats.rejected_binaries, stats.source_builds, stats.binary_loads) == (0, 1, 2)


def test_program_from_two_threads_at_once_is_the_rebuilt_one(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both threads get the loaded program before either has checked it; the check is
    slowed so that they overlap. Both must end with the rebuilt program."""
    import time

    import pyopencl as cl

    from runtime_cache.opencl import module as module_code

    real, real_evict = module_code.kernel_names, module_code.evict

    def slow(program: Any) -> Any:
        time.sleep(0.2)
        return real(program)

    def slow_evict(*args: Any, **kwargs: Any) -> Any:  # a wide window before the eviction
        time.sleep(0.5)
        return real_evict(*args, **kwargs)

    monkeypatch.setattr(module_code, "kernel_names", slow)
    monkeypatch.setattr(module_code, "evict", slow_evict)
    again = _shift_under_scale(ctx, tmp_path)
    out: dict[int, Any] = {}
    threads = [
        threading.Thread(target=lambda i=i: out.__setitem__(i, again.program("scale")))
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    names = [out[i].get_info(cl.program_info.KERNEL_NAMES) for i in range(2)]
    assert names == ["scale", "scale"]


@pytest.fixture
def full_scratch() -> Iterator[Path]:
    """A real full disk: a tiny tmpfs, filled (needs root to mount)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="rc-full-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)])
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip("cannot mount a tmpfs here")
    try:
        (where / "fill").write_bytes(b"")
        with open(where / "fill", "wb") as handle:
            try:
                handle.write(bytes(1 << 20))
            except OSError:
                pass
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
        where.rmdir()


def test_a_full_scratch_disk_deletes_nothing_from_the_shared_cache(
    ctx: Any,
    tmp_path: Path,
    redis_server: RedisProcess,
    unique_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    full_scratch: Path,
) -> None:
    from runtime_cache.opencl import OpenCLModule, opencl_stats
    from runtime_cache.opencl.guard import guard
    from runtime_cache.opencl.vetting import Vetter

    # Unsigned on purpose, so binaries from elsewhere are vetted in a child.
    backend = rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}&insecure=1")
    cache = rc.Cache(backend)
    OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=cache).build_all()  # "another machine"
    stored = set(backend.keys(""))
    assert len(stored) == 1
    monkeypatch.setenv("RUNTIME_CACHE_GUARD_DIR", str(tmp_path / "guard-full-machine"))
    guard.reset()
    monkeypatch.setattr(tempfile, "tempdir", str(full_scratch))  # this machine's TMPDIR
    monkeypatch.setattr("runtime_cache.opencl.vetting.vetter", Vetter())
    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=cache)
    assert np.array_equal(_scale(ctx, module), EXPECTED)  # built from source: a local miss
    assert opencl_stats().vet_failures == 0 and opencl_stats().vet_local == 1
    assert set(backend.keys("")) == stored  # nothing evicted (a rebuild may re-store it)
    assert all(cache.get(k) is not None for k in stored)
    blocklist = tmp_path / "guard-full-machine" / "blocklist"
    assert not blocklist.exists() or blocklist.read_text() == ""
