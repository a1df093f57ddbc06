"""Locks made anew in a forked child, so that one another thread held at the fork does
not stay held there for good.

A child of ``fork()`` has only the thread that forked. A lock that another thread of the
parent held at that moment (a count being added, a breaker's state being set: short
holds, but an app with threads that forks often meets them) is held in the child by a
thread that does not exist, and the child's first ``put`` or ``get`` waited on it for
ever (a re-attack of session 42: 47 of 60 children of a threaded app hung in
``Counters.add``). An object registers its locks with :func:`renew_in_child`; the hook
after a fork resets each to unlocked in the child (``_at_fork_reinit``, as the standard
library's ``logging`` and ``concurrent.futures`` do), and the parent is not touched.
Whatever the other thread was doing under the lock is as half done in the child as it
was at the fork: these locks guard counters, sizes and small maps, so the child may start
with a count off by a few, a memory store's size short by one value (it may then pass its
cap by one), or a remembered head forgotten; none of them makes a read serve a wrong
value, and each mends as the child goes on.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["renew_in_child"]

#: id(owner) -> (a weak reference to it, its locks' names). By id, not by the owner: an
#: owner need not be hashable (a dataclass), and its entry goes as it does.
_owners: dict[int, tuple[weakref.ref[Any], tuple[str, ...]]] = {}


def renew_in_child(owner: object, *names: str) -> None:
    """Have the locks (``threading.Lock``, ``RLock`` or ``Condition``) at ``owner``'s
    attributes ``names`` made unlocked in a forked child, and the dicts among them
    emptied (what the parent's other threads were doing: a build in flight, whose leader
    the child has not, would else be waited for by the child for ever). ``owner`` is held
    weakly: an object (or a module, for its module-level locks) that goes away is
    forgotten."""
    key = id(owner)
    _owners[key] = (weakref.ref(owner, lambda _ref: _owners.pop(key, None)), names)


def _after_fork_in_child() -> None:
    for ref, names in list(_owners.values()):
        owner = ref()
        for name in names:
            held = getattr(owner, name, None)
            reinit = getattr(held, "_at_fork_reinit", None)
            if reinit is not None:
                reinit()
            elif isinstance(held, dict):
                held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
