"""A shared build's later looks count what they find once (session 39's reviews).

A program another process built while this one waited was counted as a miss at the first
look and then a hit at the load (hit rate 0.33 for 0.5 over two machines); the first fix
took back one miss per key found, which went wrong for a context of two identical devices
(one key looked up twice), for a program found in part at the first look (misses went
below zero) and for keys never missed. ``note_missed`` keeps, per program, the keys the
first look missed, as often as it counted them, and turns exactly those into hits.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import runtime_cache as rc
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.opencl.cached_load import note_missed


@dataclass
class _Plan:
    keys: list[rc.CacheKey]


def _key(name: str) -> rc.CacheKey:
    return rc.make_key(module_id="m", runtime="opencl", purpose="program-binary", k=name)


def _look(
    cache: rc.Cache, missed: dict[str, list[str]], plans: dict[str, _Plan], again: bool
) -> None:
    wanted = [k for plan in plans.values() for k in plan.keys]
    tally: dict[str, tuple[int, float]] | None = {} if again else None
    found = cache.get_many_views(wanted, count_misses=not again, defer_hits=tally)
    note_missed(cache, missed, plans, found, tally)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "before", "expected"),
    [
        (["a"], [], (1, 0)),  # built by another process while this one waited
        (["a", "a"], [], (2, 0)),  # two identical devices: one key, looked up twice
        (["a", "b"], ["a"], (2, 0)),  # one device's binary there at the first look
        (["a", "b"], ["a", "b"], (2, 0)),  # all there at once: the later look counts nothing
    ],
)
def test_a_later_look_turns_each_miss_into_one_hit(
    keys: list[str], before: list[str], expected: tuple[int, int]
) -> None:
    cache = rc.Cache(MemoryBackend())
    for name in before:
        assert cache.put(_key(name), b"binary " + name.encode())
    plans = {"prog": _Plan([_key(name) for name in keys])}
    missed: dict[str, list[str]] = {}
    _look(cache, missed, plans, again=False)
    first = cache.stats()
    assert first.hits + first.misses == len(keys)
    for name in keys:  # another process stores the rest meanwhile
        assert cache.put(_key(name), b"binary " + name.encode())
    _look(cache, missed, plans, again=True)
    _look(cache, missed, plans, again=True)  # and a third look changes nothing more
    stats = cache.stats()
    assert (stats.hits, stats.misses) == expected
    assert stats.hits + stats.misses == len(keys)


def test_a_key_still_missing_at_the_later_look_stays_missed() -> None:
    cache = rc.Cache(MemoryBackend())
    plans = {"prog": _Plan([_key("a"), _key("b")])}
    missed: dict[str, list[str]] = {}
    _look(cache, missed, plans, again=False)
    assert cache.put(_key("a"), b"binary a")
    _look(cache, missed, plans, again=True)
    assert (cache.stats().hits, cache.stats().misses) == (1, 1)
    assert missed == {"prog": [str(_key("b"))]}
    assert cache.put(_key("b"), b"binary b")
    _look(cache, missed, plans, again=True)
    assert (cache.stats().hits, cache.stats().misses) == (2, 0)
