"""Keys: stable digests, pinned vectors, and typed errors for bad parts."""

from __future__ import annotations

import subprocess
import sys

import pytest

import runtime_cache as rc

DEVICE = {"vendor": "Qualcomm", "name": "Adreno 740", "driver": "512.615"}

# Pinned: a change to the key schema or canonical encoding must fail here loudly.
VECTORS = [
    (
        {
            "module_id": "resnet18@3f2a",
            "runtime": "opencl",
            "purpose": "program-binary",
            "device": DEVICE,
            "options": "-cl-fast-relaxed-math",
        },
        "opencl/program-binary/8704a60092a1f33e47aa5544c5a1f676",
    ),
    (
        {"module_id": "m", "runtime": "tuning", "purpose": "clml", "device": None},
        "tuning/clml/cb80c170af4257a682d764e86d9065f4",
    ),
    (
        {
            "module_id": "m",
            "runtime": "opencl",
            "purpose": "program-binary",
            "device": {"a": [1, 2.5, True, None, b"\x00\xff"], "b": {"c": -3}},
            "flags": ("x", "y"),
        },
        "opencl/program-binary/5cd82ea085be8a37878e5550378097d3",
    ),
]


@pytest.mark.parametrize(("parts", "expected"), VECTORS)
def test_pinned_vectors(parts: dict[str, object], expected: str) -> None:
    assert str(rc.make_key(**parts)) == expected  # type: ignore[arg-type]


def test_same_key_in_another_process() -> None:
    code = (
        "import runtime_cache as rc;"
        f"print(rc.make_key(module_id='resnet18@3f2a', runtime='opencl', purpose='program-binary',"
        f" device={DEVICE!r}, options='-cl-fast-relaxed-math'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == VECTORS[0][1]


def test_dict_order_does_not_matter() -> None:
    a = rc.make_key(module_id="m", runtime="r", purpose="p", device={"x": 1, "y": {"a": 1, "b": 2}})
    b = rc.make_key(module_id="m", runtime="r", purpose="p", device={"y": {"b": 2, "a": 1}, "x": 1})
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    "change",
    [
        {"module_id": "m2"},
        {"runtime": "cuda"},
        {"purpose": "tuning"},
        {"device": {**DEVICE, "driver": "512.616"}},
        {"options": "-O2"},
        {"extra_flag": True},
    ],
)
def test_any_change_changes_the_key(change: dict[str, object]) -> None:
    base = dict(VECTORS[0][0])
    assert str(rc.make_key(**{**base, **change})) != VECTORS[0][1]  # type: ignore[arg-type]


def test_types_are_distinguished() -> None:
    def k(v: object) -> str:
        return str(rc.make_key(module_id="m", runtime="r", purpose="p", device=v))

    values = [1, 1.0, True, "1", b"1", [1], {"1": 1}, None, [], {}]
    assert len({k(v) for v in values}) == len(values)
    assert k(0.0) == k(-0.0)


def test_key_shape_and_parts() -> None:
    key = rc.make_key(**VECTORS[0][0])  # type: ignore[arg-type]
    runtime, purpose, digest = str(key).split("/")
    assert (runtime, purpose) == ("opencl", "program-binary")
    assert len(digest) == 32 and int(digest, 16) >= 0
    assert key.digest == digest
    assert key.parts["device"] == DEVICE
    key.parts["device"]["driver"] = "changed"  # a copy: the key is immutable
    assert key.parts["device"] == DEVICE
    with pytest.raises(AttributeError):
        key.digest = "x"  # type: ignore[misc]
    assert rc.CacheKey.from_parts(key.parts) == key


@pytest.mark.parametrize(
    ("device", "name"),
    [
        (object(), "device"),
        ({"a": {1, 2}}, "device.a"),
        ({1: "x"}, "device"),
        ([1, 2**70], "device[1]"),
    ],
)
def test_bad_part_types_name_the_part(device: object, name: str) -> None:
    with pytest.raises(TypeError, match=name.replace("[", r"\[").replace("]", r"\]")):
        rc.make_key(module_id="m", runtime="r", purpose="p", device=device)


@pytest.mark.parametrize(
    "runtime", ["", "a/b", ".hidden", "x" * 65, "sp ace", "nul\x00", "opencl\n", "x\r\n"]
)
def test_bad_runtime_names_rejected(runtime: str) -> None:
    with pytest.raises(ValueError):
        rc.make_key(module_id="m", runtime=runtime, purpose="p")


def test_module_id_from_sources() -> None:
    a = rc.module_id_from_sources({"k1": "kernel void a(){}", "k2": "kernel void b(){}"}, "net")
    b = rc.module_id_from_sources({"k2": "kernel void b(){}", "k1": "kernel void a(){}"}, "net")
    c = rc.module_id_from_sources({"k1": "kernel void a(){ }", "k2": "kernel void b(){}"}, "net")
    assert a == b != c
    assert a.startswith("net@") and len(a) == 4 + 16
    assert rc.module_id_from_sources("src") != rc.module_id_from_sources(b"src")
    with pytest.raises(TypeError):
        rc.module_id_from_sources(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sources",
    [
        {"b": "kernel void b() {}", "a": b"kernel void a() {}", "": ""},
        {f"k{i}": f"kernel void k{i}() {{}}" * i for i in range(100)},
        {"only": "x"},
        {"n": 1},  # not a source: the general walk
    ],
)
def test_module_ids_hash_the_canonical_form(sources: dict[str, object]) -> None:
    """However a module id is computed, it is the digest of the canonical bytes."""
    import xxhash

    from runtime_cache.keys import canonical_bytes, module_id_from_sources

    expected = xxhash.xxh3_64_hexdigest(canonical_bytes({"sources": dict(sources)}))
    assert module_id_from_sources(sources) == f"module@{expected}"  # type: ignore[arg-type]


def test_the_reused_packer_encodes_as_msgpack_does_on_every_thread() -> None:
    """Keys encode on one packer per thread: the bytes are msgpack.packb's, a value the
    packer refuses leaves nothing behind for the next call, and threads do not mix."""
    import threading

    import msgpack

    from runtime_cache.packing import packb

    values = [{"a": [1, 2.5, None, True]}, "x" * 300_000, b"\x00\xff", [{"n": -(2**63)}]]
    assert [packb(v) for v in values] == [msgpack.packb(v, use_bin_type=True) for v in values]
    import runtime_cache.packing as packing

    big = "y" * (packing.KEEP_BELOW + 1)
    assert packb(big) == msgpack.packb(big, use_bin_type=True)
    assert getattr(packing._local, "packer", None) is None  # its grown buffer is let go
    with pytest.raises(TypeError):
        packb({"bad": object()})
    assert packb([1, "after"]) == msgpack.packb([1, "after"], use_bin_type=True)
    with pytest.raises(TypeError):
        packb(["y" * (packing.KEEP_BELOW + 1), object()])  # grew the buffer, then failed
    assert getattr(packing._local, "packer", None) is None

    class Nested(dict):  # type: ignore[type-arg]
        """A dict subclass: msgpack calls its items(), which packs too (makes a key)."""

        def items(self):  # type: ignore[no-untyped-def]
            packb({"inner": 1})
            return super().items()

    outer = {"outer": [1, 2, 3], "d": Nested(z=1)}
    assert packb(outer) == msgpack.packb(outer, use_bin_type=True)

    wrong: list[object] = []

    def encode(seed: int) -> None:
        for i in range(2000):
            value = {"seed": seed, "i": i, "text": "t" * (i % 50)}
            if packb(value) != msgpack.packb(value, use_bin_type=True):
                wrong.append(value)

    threads = [threading.Thread(target=encode, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
