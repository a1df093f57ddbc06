"""KeyTemplate makes exactly make_key's keys, parts and metadata bytes, faster."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime_cache.key_template import MAX_LAYOUTS, KeyTemplate
from runtime_cache.keys import canonical_bytes, encode_parts, encoded_part, make_key

DEVICE = {"vendor": "V", "name": "N", "driver": "1.0", "limits": [1, 2.5, {"a": None}]}
SHARED: dict[str, Any] = {
    "module_id": "m@1",
    "runtime": "opencl",
    "purpose": "program-binary",
    "device": DEVICE,
    "options": "-cl-fast-relaxed-math",
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(
    st.one_of(scalars, st.floats()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _same(a: Any, b: Any) -> None:
    assert str(a) == str(b)
    assert a.parts == b.parts
    assert a.packed_parts == b.packed_parts  # what an entry's metadata holds, byte for byte


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), values, min_size=1, max_size=4))
def test_template_keys_are_make_keys(extra: dict[str, Any]) -> None:
    extra = {k: v for k, v in extra.items() if k not in SHARED}
    _same(KeyTemplate(**SHARED).key(**extra), make_key(**SHARED, **extra))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "includes", "program", "source", "zz"]), values),
        max_size=6,
    )
)
def test_one_template_makes_make_keys_key_after_key(extras: list[dict[str, Any]]) -> None:
    # One template keeps a layout per set of part names: the same names come back with
    # values of other types, in another order, and as text (the fast path).
    template = KeyTemplate(**SHARED)
    for extra in extras:
        _same(template.key(**extra), make_key(**SHARED, **extra))
        text = {name: f"{name}:{len(extras)}" for name in reversed(list(extra))}
        _same(template.key(**text), make_key(**SHARED, **text))


def test_a_template_keeps_a_bounded_number_of_layouts() -> None:
    template = KeyTemplate(**SHARED)
    for i in range(3 * MAX_LAYOUTS):  # a new part name each time
        _same(template.key(**{f"p{i}": "v"}), make_key(**SHARED, **{f"p{i}": "v"}))
    _same(template.key(program="k"), make_key(**SHARED, program="k"))
    assert len(template._layouts) == MAX_LAYOUTS


def test_program_keys_and_overrides() -> None:
    template = KeyTemplate(**SHARED)
    for name in ("scale", "", "é", "z" * 300):
        _same(
            template.key(program=name, source="ab" * 16),
            make_key(**SHARED, program=name, source="ab" * 16),
        )
    _same(template.key(includes=[["a.h", "d1"]]), make_key(**SHARED, includes=[["a.h", "d1"]]))
    # A part that overrides a shared one gives make_key's key of the override.
    _same(template.key(options="-O0"), make_key(**{**SHARED, "options": "-O0"}))
    _same(template.key(), make_key(**SHARED))


def test_bad_parts_are_refused_as_make_key_refuses_them() -> None:
    template = KeyTemplate(**SHARED)
    with pytest.raises(TypeError, match=r"parts\.bad"):
        template.key(bad=object())
    with pytest.raises(TypeError, match="64 bits"):
        template.key(big=2**70)
    with pytest.raises(ValueError):
        KeyTemplate(**{**SHARED, "runtime": "bad name"})
    with pytest.raises(TypeError):
        KeyTemplate(**{**SHARED, "module_id": ""})


def test_encoded_parts_splice_into_the_canonical_bytes() -> None:
    parts = {**SHARED, "program": "k", "nan": float("nan"), "nested": {"b": 1, "a": [b"x"]}}
    pairs = {name: encoded_part(name, value)[0] for name, value in parts.items()}
    assert encode_parts(pairs) == canonical_bytes(parts)
