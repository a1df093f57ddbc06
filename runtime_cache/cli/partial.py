"""What a command could not reach: tiers left out or unlisted, folders unread, junk.

Said after the command's own output, one line each, and exit code 1 (what was shown or
done is partial).
"""

from __future__ import annotations

from .context import CommandContext
from .fmt import clean, count

__all__ = ["partial_result"]


def partial_result(ctx: CommandContext, code: int, checks: bool = False) -> int:
    """Exit code 1, and a line naming them, when tiers could not be opened (left out of a
    tiered store: ``left_out``) or listed, or folders could not be listed (partial
    results), or junk stood at entry names or links at fan-out folder names and is still
    there (the directory backend's ``unlisted_folders``, ``listed_junk``,
    ``linked_folders``); junk removed (``junk``) is a line, and exit code 1 only for a
    command that ``checks`` the cache (verify)."""
    backend = ctx.opened.backend if ctx.opened is not None else None
    left = list(getattr(backend, "left_out", None) or ())
    for url, reason in left:
        print(
            f"runtime-cache: tier {clean(url)} could not be opened ({clean(reason)}) and was "
            "left out; what was shown or done is partial",
            file=ctx.err,
        )
    failed = list(getattr(backend, "failed_tiers", None) or ())
    unread = list(getattr(backend, "unlisted_folders", None) or ())
    listed = list(getattr(backend, "listed_junk", None) or ())
    linked = list(getattr(backend, "linked_folders", None) or ())
    junk = getattr(backend, "junk", 0)
    if failed:
        names = ", ".join(clean(name) for name in failed)
        print(f"runtime-cache: could not list tier {names}; what is shown is partial", file=ctx.err)
    for folder, reason in unread:
        print(
            f"runtime-cache: folder {clean(folder)} left out ({clean(reason)}); "
            "what is shown is partial",
            file=ctx.err,
        )
    for name in listed:
        print(
            f"runtime-cache: {clean(name)} is no entry (a link, FIFO, folder or oversized file "
            "at its entry's name); left out, and removed when the key is next read or by "
            "verify --repair",
            file=ctx.err,
        )
    for folder in linked:
        print(
            f"runtime-cache: folder {clean(folder)} is a symbolic link, never followed; the "
            "entries behind it are left out, and verify --repair removes the link",
            file=ctx.err,
        )
    if isinstance(junk, int) and junk:
        print(
            f"runtime-cache: found {count(junk, 'non-entry', 'non-entries')} at entry names "
            "(links, FIFOs, folders, "
            "oversized files); removed where this user may",
            file=ctx.err,
        )
    partial = left or failed or unread or listed or linked
    return max(code, 1) if partial or (junk and checks) else code
