"""Where a build looks for headers: the build options' ``-I`` folders, and PoCL's own.

:func:`search_folders` reads the ``-I`` folders out of a driver's option string each way
a driver may split it: at blanks (PoCL does, keeping quotes and backslashes: ``-I
o'neil/inc`` names a folder with a quote in it) and as a shell would (where the string
parses as one). Both are searched, so a key never misses the folder a driver read.
:func:`pocl_source_folders` names the folders PoCL writes a program's source to before
it compiles it: the compiler looks for the source's quoted includes there first.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

__all__ = ["Options", "include_dirs", "normalize_options", "pocl_source_folders", "search_folders"]

Options = str | bytes | Sequence[str | bytes] | None


def normalize_options(options: Options) -> list[str]:
    """Split build options into a list of tokens (a string is split like a shell would;
    one that does not parse as one, an unclosed quote, at blanks)."""
    if options is None:
        return []
    if isinstance(options, bytes):
        options = options.decode("utf-8")
    if isinstance(options, str):
        try:
            return shlex.split(options)
        except ValueError:  # (an -I folder named with one quote: the driver takes it)
            return options.split()
    tokens: list[str] = []
    for item in options:
        text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        tokens.append(text)
    return tokens


def include_dirs(tokens: Sequence[str]) -> list[str]:
    """Return the ``-I`` folders named in ``tokens``, in order (``-I dir`` and ``-Idir``)."""
    found: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index].strip()
        if token in ("-I", "/I"):
            if index + 1 < len(tokens):
                found.append(tokens[index + 1].strip().strip('"'))
            index += 2
            continue
        if token.startswith(("-I", "/I")):
            found.append(token[2:].strip().strip('"'))
        index += 1
    return found


def search_folders(options: str | Sequence[str]) -> list[str]:
    """The ``-I`` folders of ``options``: of a token list as given; of an option string,
    those of each splitting (at blanks, and as a shell would where it parses), in order."""
    if not isinstance(options, str):
        return include_dirs(options)
    found = include_dirs(options.split())
    if any(char in options for char in "'\"\\"):
        try:
            found += include_dirs(shlex.split(options))
        except ValueError:  # an unclosed quote: only the split at blanks
            pass
    return list(dict.fromkeys(found))


def pocl_source_folders(root: str) -> tuple[str, ...]:
    """The folders PoCL may write a program's source file to, where the compiler looks
    for the source's quoted includes first: its cache folder (``POCL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/pocl``, ``$HOME/.cache/pocl``, ``/tmp/pocl`` without a home), and
    ``uncached`` and ``kcache`` under it, for every value the variables had in this
    process (PoCL reads them once), as set and stripped; relative ones under ``root``."""
    from .pocl_flags import values_seen

    def spellings(name: str) -> list[str]:
        return [v for value in values_seen(name) for v in (value, value.strip()) if v]

    tops = [*spellings("POCL_CACHE_DIR")]
    tops += [os.path.join(value, "pocl") for value in spellings("XDG_CACHE_HOME")]
    tops += [os.path.join(value, ".cache", "pocl") for value in spellings("HOME")]
    if not all(value.strip() for value in values_seen("HOME") or [""]):  # no home at a time
        tops += ["/tmp/pocl"]
    found = (os.path.join(root, top, sub) for top in tops for sub in ("", "uncached", "kcache"))
    return tuple(dict.fromkeys(os.path.normpath(folder) for folder in found))
