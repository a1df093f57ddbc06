"""What kind of value each kernel argument takes, read from the program's source.

A vetting child launches every kernel of an unknown binary once, on harmless arguments
(:mod:`.worker`). A binary carries no argument information on most drivers
(``CL_KERNEL_ARG_INFO_NOT_AVAILABLE``), and a driver may take a buffer for an 8-byte
by-value argument (PoCL does): a ``long n`` loop bound then holds a buffer's handle,
and a good kernel overruns its buffer or loops until the watchdog. So the kinds are read
from the source the binary was built from: a pointer in global or constant memory gets
the buffer, a pointer in local memory gets local memory, anything else zero bytes.

>>> argument_kinds("__kernel void f(__global float *a, const long n, __local int *t) {}")
{'f': ['buffer', 'value', 'local']}
"""

from __future__ import annotations

import re

__all__ = ["BUFFER", "LOCAL", "OTHER", "VALUE", "argument_kinds"]

BUFFER = "buffer"
LOCAL = "local"
VALUE = "value"
#: An image, a sampler, a pipe, or a parameter not understood: not launched.
OTHER = "other"

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_KERNEL = re.compile(
    r"\b(?:__kernel|kernel)\s+"
    r"(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)*"
    r"void\s+([A-Za-z_]\w*)\s*\(([^()]*)\)"
)
_LOCAL = re.compile(r"\b(?:__local|local)\b")
_NOT_PLAIN = re.compile(r"\b(?:image\w*_t|sampler_t|pipe|queue_t|clk_event_t)\b")
#: A by-value parameter of a type the language names: a scalar or a vector of one, with
#: qualifiers. Anything else (a typedef, a macro, a struct) is not known for sure.
_SCALAR = re.compile(
    r"(?:(?:const|volatile|__private|private|unsigned|signed)\s+)*"
    r"(?:bool|char|uchar|short|ushort|int|uint|long|ulong|half|float|double|size_t|ptrdiff_t"
    r"|intptr_t|uintptr_t)(?:2|3|4|8|16)?"
    r"(?:\s+(?:const|volatile))*\s+[A-Za-z_]\w*"
)
_UNKNOWN = "unknown"


def _kind(parameter: str) -> str:
    text = " ".join(parameter.split())
    if _NOT_PLAIN.search(text):
        return OTHER
    if "*" in text or "[" in text:  # a pointer, or an array parameter (a pointer too)
        return LOCAL if _LOCAL.search(text) else BUFFER
    return VALUE if _SCALAR.fullmatch(text) else _UNKNOWN


def argument_kinds(source: str) -> dict[str, list[str]]:
    """Each kernel's argument kinds (:data:`BUFFER`, :data:`LOCAL`, :data:`VALUE`,
    :data:`OTHER`), by kernel name, as far as the source says them plainly; a kernel
    declared through a macro, or twice, or with a parameter of a type it does not name
    plainly (a typedef, a macro, a struct), is left out (its caller guesses)."""
    text = _COMMENTS.sub(" ", source)
    found: dict[str, list[str]] = {}
    seen: set[str] = set()
    for match in _KERNEL.finditer(text):
        name, parameters = match.group(1), match.group(2).strip()
        kinds = [] if parameters in ("", "void") else [_kind(p) for p in parameters.split(",")]
        if name in seen:
            found.pop(name, None)  # declared twice (#if branches): not sure which
            continue
        seen.add(name)
        if _UNKNOWN not in kinds:
            found[name] = kinds
    return found
