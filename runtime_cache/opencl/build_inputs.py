"""What a build reads besides its source, checked where the key cannot say it.

* :func:`settle`: a build's headers read again just after it, so that a header changed
  since the keys were made (a checkout during a long build) stores the binary under no
  key (:data:`unkeyed`), and a store made later reads nothing.
* :func:`macro_named`: whether a kernel name the source declares is a macro that a ``-D``
  option or a header defines, so that a binary whose kernels bear other names is no
  foreign one (see :func:`~runtime_cache.opencl.program.holds_its_kernels`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .counters import counters
from .includes import HeaderReads, include_digests, normalize_options, preprocessor_view
from .plan import ProgramPlan

__all__ = ["macro_named", "settle", "unkeyed"]

log = logging.getLogger(__name__)

#: Programs built while a header they read changed since their keys were made: their
#: binaries match neither key, so nothing stores or bundles them (held weakly).
unkeyed: weakref.WeakSet[Any] = weakref.WeakSet()


def settle(plan: ProgramPlan, program: Any = None, root: str | None = None) -> ProgramPlan:
    """``plan`` as it holds for a build just made from it, its headers read again in the
    build's folder (``root``; the working folder now when ``None``). A header that changed
    since the keys were made (a checkout during a long build), even one changed back since
    (its file's times moved), leaves no key (``keys`` ``None``; ``program`` noted in
    :data:`unkeyed`): the binary may hold either version. Otherwise ``includes`` is
    dropped: nothing is left to check, so a store made later (in the background, after a
    ``chdir``) reads nothing."""
    if not plan.includes or plan.keys is None:
        return plan
    text = plan.options_text
    reads = HeaderReads(root=root)
    now = include_digests(plan.source, text, reads)
    if now == plan.includes and reads.stamps == plan.stamps:
        return replace(plan, includes=None, stamps=None)
    counters.add(uncacheable=1)
    log.warning(
        "runtime-cache: a header changed during the build of %s; not storing it", plan.keys[0]
    )
    if program is not None:
        with contextlib.suppress(TypeError):  # (an object no weak reference can hold)
            unkeyed.add(program)
    return replace(plan, keys=None, includes=None, stamps=None)


def macro_named(declared: Sequence[str], plan: ProgramPlan) -> bool:
    """Whether a kernel name the source declares is a macro that a ``-D`` option or a header
    defines: the compiled kernel then has another name (``-DKNAME=scale``)."""
    names = set(declared)
    tokens = normalize_options(plan.options_text)
    for at, token in enumerate(tokens):
        if token in ("-D", "/D") and at + 1 < len(tokens):
            token = "-D" + tokens[at + 1]
        if token.startswith(("-D", "/D")) and token[2:].partition("=")[0].strip() in names:
            return True
    if not plan.includes:
        return False
    texts: list[bytes] = []
    reads = HeaderReads(plan.folder, texts=texts)
    if include_digests(plan.source, plan.options_text, reads) is None:
        return True  # (cannot be read now: not evicted for a name it cannot tell)
    pattern = rb"^\s*#\s*define\s+(?:%s)\b" % b"|".join(re.escape(n.encode()) for n in names)
    found = re.compile(pattern, re.MULTILINE)
    return any(found.search(preprocessor_view(t)) for t in texts)
