"""What makes each build of a text differ: macros that name the time or PoCL's temporary file.

``__TIME__``, ``__DATE__`` and ``__TIMESTAMP__`` take the time of the build (or of a
header's last change, which the key does not hold); ``__BASE_FILE__`` and, in the main
source, ``__FILE__`` and ``__FILE_NAME__`` name the temporary file PoCL writes the
source to (a new name each build, in a folder the key does not hold). A build whose
source, headers or options name one is not cached: a binary loaded would not be what a
build now makes. Names pasted from pieces (``CAT(__TI, ME__)``) count where a text
pastes tokens; a paste of single letters is not seen.
"""

from __future__ import annotations

__all__ = ["BUILD_TIME", "OWN_FILE", "names_build_time"]

#: The macros any text may not name. (``__TIMESTAMP__`` holds ``__TIME``.)
BUILD_TIME = (b"__TIME", b"__DATE__", b"__BASE_FILE__")
#: Those the main source may not name either: its own file's name.
OWN_FILE = (b"__FILE",)
#: Pieces a pasted one is made of, looked for where a text pastes (``##``).
_PASTED = (b"__TI", b"__DA", b"ME__", b"TE__", b"MP__", b"__BASE")


def names_build_time(text: bytes, names: tuple[bytes, ...] = BUILD_TIME) -> bool:
    """Whether ``text`` (a source, a header, an option string) names one of ``names``
    (by default :data:`BUILD_TIME`), written out or, where it pastes tokens, in pieces."""
    if b"__" not in text:  # (every OpenCL source has them: __kernel, __global)
        return False
    for name in names:  # a plain loop: a generator costs more than the scans
        if name in text:
            return True
    if b"##" in text:
        for piece in _PASTED:
            if piece in text:
                return True
    return False
