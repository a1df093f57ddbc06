"""What identifies one program's binaries: :class:`ProgramPlan`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..keys import CacheKey
from .header_reads import Stamp

__all__ = ["ProgramPlan"]


@dataclass(frozen=True)
class ProgramPlan:
    """What identifies one program's binaries: its source, options, devices and keys.

    ``keys`` holds one key per device, in the order of ``devices``; it is
    ``None`` when the build cannot be cached (an unresolvable ``#include``).
    ``includes`` holds the headers that went into the keys
    (:func:`~runtime_cache.opencl.includes.include_digests`), ``None`` when none did;
    ``folder``, then, the working folder they were found from (relative ``-I`` folders
    resolve there: a build made for these keys in another process is made there), and
    ``stamps`` each file's identity and times as read then
    (:class:`~runtime_cache.opencl.includes.HeaderReads`).
    """

    source: str | bytes
    options: list[str]
    options_text: str
    devices: list[Any]
    keys: list[CacheKey] | None
    includes: list[Any] | None = None
    folder: str | None = None
    stamps: Mapping[str, Stamp] | None = None
