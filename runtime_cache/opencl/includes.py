"""Build options and ``#include`` handling for cache keys.

An ``#include``d header changes the binary without changing the source text,
so every header a build may read goes into the key: for each ``#include``, the
content digest of *every* file of that name in the search path (the including
file's folder for quoted includes, then each ``-I`` folder in order, then the
working folder), recursively. Hashing every candidate, not only the first,
means the key changes even if the driver searches the folders in another
order.

An include that matches no file there is looked for in the host's system
folders (``/usr/local/include``, ``/usr/include``: a driver whose compiler
searches them would read it there), and hashed if found. A name found nowhere
goes into the key as ``[name, -1, "absent"]``. That is deterministic and
sound: such an include is either inactive (under an ``#if``: pyopencl's
random123 headers include C++ headers for host builds) or a driver's built-in
header, which the driver version in the device fingerprint covers; the build
fails otherwise. The key is recomputed at every build, so a header that
appears later in any folder searched changes the key. The ``-I`` folders are
in the key through the option string; the working folder is not: the key
records what each folder held, not where it was. Only a search past the limit
on files (``_MAX_FILES``) makes a build uncacheable: it is built from source
and counted in ``opencl_stats().uncacheable``, never served stale.

Directives are found as the preprocessor finds them, and more. Lines are read
as C reads them (any line end, a byte-order mark dropped, trigraphs, splices
joined); the text is read with each comment as one space (string literals
kept, so a ``"/*"`` in one hides nothing) and as written; ``include``,
``include_next`` and ``import`` count, and so does the operand of
``__has_include`` (whether a header exists decides what an ``#if`` compiles); ``#``
may be ``%:`` or ``??=``, and blanks are space, tab, form feed and vertical tab. A
header's quoted includes are looked for beside it as the compiler found it (a
link's folder) and beside the file the link names. Finding a directive that is
not one is harmless (its file is hashed, or recorded absent); missing one would
serve a stale binary. An include whose name is not written out (``#include
HEADER``, ``__has_include(HEADER)``, a macro) anywhere it reads as one (in the
preprocessor's view, as written, or with the comments within a line taken out: a comment
opener the compiler reads as text, in a ``#warning`` or after a quote left open, must hide
nothing), a header that exists but cannot be read whole (over ``MAX_FILE_SIZE``,
unreadable; a device or a FIFO), a text with a NUL byte (a blank to the compiler), a
name that is not UTF-8, a directive split by a comment to a later line (``#/*``), or a
text naming the build's time or file (:mod:`.build_time`), makes the build uncacheable
too. A header name is read as one token (``<a/*b.h>`` opens no comment). The ``-I``
folders of ``POCL_EXTRA_BUILD_FLAGS`` are searched after the options' own, the options
read as :mod:`.include_paths` says, and the main source's quoted includes are looked for
where PoCL writes its copy too. Each text is scanned once a process.

Relative names resolve from one folder for the whole scan (:class:`HeaderReads`), which
also records each file's identity and times, so that a look after a build tells a header
changed and changed back from one left alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import xxhash

from .. import environment
from .build_time import BUILD_TIME, OWN_FILE, names_build_time
from .header_reads import HeaderReads, Stamp, Unreadable, read_header
from .include_paths import (
    Options,
    include_dirs,
    normalize_options,
    pocl_source_folders,
    search_folders,
)

__all__ = [
    "ABSENT",
    "SYSTEM_DIRS",
    "HeaderReads",
    "Options",
    "Stamp",
    "as_c_reads",
    "include_digests",
    "include_dirs",
    "normalize_options",
    "preprocessor_view",
]

#: A directive that reads a file: its name, or (a macro) whatever follows it. Blanks are
#: C's: space, tab, form feed, vertical tab.
_DIRECTIVE = re.compile(
    rb"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(?:include_next|include|import)(?![A-Za-z0-9_])"
    rb"[ \t\f\v]*([^\n]*)",
    re.MULTILINE,
)
_SPLICE = re.compile(rb"\\[ \t\f\v]*\n")  # compilers take blanks after the backslash too
#: A header name where one is read (``<a/*b.h>`` after ``__has_include(`` or ``#include``:
#: no comment or literal opens in it), a string or character literal (group 1: kept as it
#: is), or a comment (one space).
_TOKENS = re.compile(
    rb"(__has_include(?:_next)?[ \t\f\v]*\([ \t\f\v]*<[^>\n]*>"
    rb"|^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(?:include_next|include|import)[ \t\f\v]*<[^>\n]*>"
    rb'|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')|/\*(?:.*?\*/|.*)|//[^\n]*',
    re.DOTALL | re.MULTILINE,
)
#: ``__has_include("name")`` (or ``<name>``, or ``_next``) in an ``#if``: whether a header
#: exists decides what compiles, so its name goes into the key as an include's does
#: (group 1: the operand written out; none: a macro).
_HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?[ \t\f\v]*\([ \t\f\v]*("[^"\n]+"|<[^>\n]+>)?')
#: ``__has_include`` not called where it stands (``#define HAS __has_include``): a macro
#: stands for it, called with what the key cannot see. Asking whether it exists
#: (``defined(__has_include)``, ``#ifdef __has_include``) reads no file.
_HAS_INCLUDE_BARE = re.compile(
    rb"(?<![A-Za-z0-9_])__has_include(?:_next)?(?![A-Za-z0-9_])(?![ \t\f\v]*\()"
)
#: What may stand before a bare ``__has_include`` on its line that only asks whether it is
#: defined: the ``defined`` operator (a whole word), or ``#ifdef``, ``#ifndef``,
#: ``#elifdef``, ``#elifndef``, ``#undef``. (Never a ``#define``'s body.)
_ASKS_IF_DEFINED = re.compile(
    rb"(?:^[ \t\f\v]*#[ \t\f\v]*(?:if|elif)\b.*(?<![A-Za-z0-9_])defined[ \t\f\v]*\(?"
    rb"|^[ \t\f\v]*#[ \t\f\v]*(?:ifn?def|elifn?def|undef))[ \t\f\v]*$"
)
#: A comment within one line, or a line's start up to the first ``*/`` (the end of a
#: comment begun on a line before).
_LINE_COMMENTS = re.compile(rb"^[^\n]*?\*/|/\*(?:[^\n]*?\*/|(?P<open>[^\n]*))", re.MULTILINE)
#: A directive whose ``#`` a comment follows that ends on a later line (after any that
#: end on its own): its name (and the rest) come after the ``*/``.
_SPLIT_DIRECTIVE = re.compile(
    rb"^[ \t\f\v]*(?:#|%:)[ \t\f\v]*(?:/\*(?:(?!\*/)[^\n])*\*/[ \t\f\v]*)*"
    rb"/\*(?:(?!\*/)[^\n])*$",
    re.MULTILINE,
)
_BOM = b"\xef\xbb\xbf"
#: C's trigraphs (what they stand for holds no ``?``: the order of the replacements is free).
_TRIGRAPHS = tuple(
    (b"??" + k, v)
    for k, v in (
        (b"=", b"#"),
        (b"'", b"^"),
        (b"(", b"["),
        (b")", b"]"),
        (b"!", b"|"),
        (b"<", b"{"),
        (b">", b"}"),
        (b"-", b"~"),
        (b"/", b"\\"),
    )
)
_WORDS = re.compile(rb"include|import")
#: The macros the main source may not name (see :mod:`.build_time`).
_SOURCE_NAMES = BUILD_TIME + OWN_FILE
#: A name a directive reads: ``"name"`` or ``<name>``.
_NAMED = re.compile(rb'^("([^"\n]+)"|<([^>\n]+)>)')
_MAX_FILES = 512
#: Folders a C compiler searches by default; a driver's compiler may too.
SYSTEM_DIRS: tuple[str, ...] = ("/usr/local/include", "/usr/include")
ABSENT = "absent"

#: The directives of texts seen, by their xxh3-128: a module's programs include the same
#: headers, each scanned once a process. Cleared when full.
_SCANNED: dict[int, list[tuple[bool, str] | None]] = {}
_SCANNED_MAX = 4096


def _directives(text: bytes, mark: int) -> list[tuple[bool, str] | None]:
    """``(quoted, name)`` of each directive of ``text`` (whose xxh3-128 is ``mark``) that
    reads a file; ``None`` for one whose name is not written out (a macro). See the
    module's notes."""
    found = _SCANNED.get(mark)
    if found is None:
        if len(_SCANNED) >= _SCANNED_MAX:
            _SCANNED.clear()
        found = _SCANNED[mark] = _scan(text)
    return found


def _lines_with_directives(text: bytes) -> Iterable[re.Match[bytes]]:
    """:data:`_DIRECTIVE` on each line that holds ``include`` or ``import``: a directive
    needs one, and matching there alone is 10x faster than over every byte."""
    starts = set()
    for word in _WORDS.finditer(text):
        starts.add(text.rfind(b"\n", 0, word.start()) + 1)
    for start in sorted(starts):
        match = _DIRECTIVE.match(text, start)
        if match is not None:
            yield match


def as_c_reads(text: bytes, *, trigraphs: bool = True, bom: bytes = b"") -> bytes:
    """``text`` in lines as C reads them: any line end, a byte-order mark at the start
    dropped (one further on as ``bom``: dropped by default), trigraphs read (unless
    ``trigraphs`` is false), splices joined."""
    if _BOM in text:
        text = text[len(_BOM) :] if text.startswith(_BOM) else text
        text = text.replace(_BOM, bom)
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if trigraphs and b"??" in text:
        for trigraph, char in _TRIGRAPHS:
            text = text.replace(trigraph, char)
    if b"\\" in text:
        text = text.replace(b"\\\n", b"")  # the usual splice, at C speed; then the rest
        if b"\\" in text:
            text = _SPLICE.sub(b"", text)
    return text


def _readings(text: bytes) -> list[bytes]:
    """``text`` as each compiler may read its lines (:func:`as_c_reads`): with trigraphs
    and without (some compilers leave them off), and a byte-order mark past the start
    dropped or standing as a character of its own (it then joins no splice). The scan
    keys what any reading finds."""
    boms = (b"", b"\x01") if _BOM in text[len(_BOM) :] else (b"",)
    both = (True, False) if b"??" in text else (True,)
    return list(dict.fromkeys(as_c_reads(text, trigraphs=t, bom=b) for t in both for b in boms))


def preprocessor_view(text: bytes) -> bytes:
    """``text`` as the preprocessor reads its lines (:func:`as_c_reads`), each comment one
    space (string literals kept), ``%:`` as ``#``."""
    text = as_c_reads(text)
    if b"/" in text:
        text = _TOKENS.sub(rb"\1 ", text)
    return text.replace(b"%:", b"#") if b"%:" in text else text


def _scan(text: bytes) -> list[tuple[bool, str] | None]:
    readings = _readings(text)
    if b"\0" in text or any(names_build_time(reading) for reading in readings):
        return [None]  # (a NUL reads as a blank to the compiler, not to the scan)
    found: set[tuple[bool, str] | None] = set()
    for reading in readings:
        found.update(_scan_reading(reading))
    return sorted(found, key=repr)


def _one_space(comment: re.Match[bytes]) -> bytes:
    """A comment within a line as one space; an opener it does not close there as it is
    (matched to the line's end, so that the next openers are not tried again: 40,000 of
    them on one line took 20 s)."""
    return comment.group(0) if comment.group("open") is not None else b" "


def _scan_reading(text: bytes) -> set[tuple[bool, str] | None]:
    if b"include" not in text and b"import" not in text:
        return set()
    # Three views, and what any of them finds counts, a name not written out too (the build
    # is then uncacheable): the preprocessor's (each comment one space, literals and header
    # names kept), the text as written, and the text with only the comments that stand
    # within a line taken out (and a line's start up to a "*/", the end of one before).
    # Where the compiler reads a comment opener as text (a #warning's words, a quote left
    # open in an #if 0 block), the first view hides lines it reads; the other two do not.
    spellings = [text]
    found: set[tuple[bool, str] | None] = set()
    if b"/" in text:
        spellings += [_TOKENS.sub(rb"\1 ", text), _LINE_COMMENTS.sub(_one_space, text)]
        if b"/*" in text and _SPLIT_DIRECTIVE.search(text):
            found.add(None)  # "#/*" to a later line: the directive goes on past "*/"
    for spelling in spellings:
        operands = [m.group(1).strip() for m in _lines_with_directives(spelling)]
        if b"__has_include" in spelling:
            operands += [m.group(1) or b"" for m in _HAS_INCLUDE.finditer(spelling)]
        if b"##" in spelling and b"__has_" in spelling:
            operands.append(b"")  # a pasted __has_include (CAT(__has_, include)): a macro
        for bare in _HAS_INCLUDE_BARE.finditer(spelling):
            line = spelling[spelling.rfind(b"\n", 0, bare.start()) + 1 : bare.start()]
            if not _ASKS_IF_DEFINED.match(line.replace(b"%:", b"#")):
                operands.append(b"")  # (#define HAS __has_include)
        for operand in operands:
            named = _NAMED.match(operand)
            if named is None:
                found.add(None)  # #include MACRO, __has_include(MACRO)
                continue
            quoted = named.group(2) is not None
            try:
                name = (named.group(2) if quoted else named.group(3)).decode("utf-8")
            except UnicodeDecodeError:  # the compiler opens the bytes; probed, another name
                found.add(None)
                continue
            found.add((quoted, name))  # blanks kept: the compiler looks for " x.h" as is
    return found


def include_digests(
    source: str | bytes,
    tokens: str | Sequence[str] | Callable[[], str | Sequence[str]],
    reads: HeaderReads | None = None,
) -> list[Any] | None:
    """Return ``[[name, folder index, digest], ...]`` for every header a build may read.

    Returns ``[]`` when the source includes nothing. A name that matches no
    readable file in the search path nor in :data:`SYSTEM_DIRS` is recorded
    as ``[name, -1, "absent"]``. Returns ``None`` (the build must not be
    cached) past the limit on files, when relative names cannot be resolved (a working
    folder removed), and where the module's notes say. ``tokens``, the build options (an
    option string, read as :func:`.include_paths.search_folders` says, or a token list),
    may be given as a callable: called only for a source that reads a file. ``reads``,
    when given, says where relative names resolve from and gets what was read
    (:class:`HeaderReads`).
    """
    data = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    if names_build_time(data, _SOURCE_NAMES):
        return None
    spelled = b"\\" in data or b"??" in data  # (spliced or trigraph spellings of those)
    if spelled and any(names_build_time(r, _SOURCE_NAMES) for r in _readings(data)):
        return None
    if not spelled and _WORDS.search(data) is None:
        return []  # (a splice or a trigraph could spell one)
    first = xxhash.xxh3_128_intdigest(data)
    if reads is not None:
        reads.source_mark = first
    if not _directives(data, first):
        return []  # (before the options are split: that costs more than the scan)
    reads = reads if reads is not None else HeaderReads()
    if reads.root is None:
        reads.root = environment.working_folder()
        if reads.root is None:  # (a working folder removed since: nothing here can be told)
            return None
    root = reads.root
    named = search_folders(tokens() if callable(tokens) else tokens)
    # PoCL adds POCL_EXTRA_BUILD_FLAGS after the options: its -I folders are searched too.
    named += search_folders(os.environ.get("POCL_EXTRA_BUILD_FLAGS", ""))
    search = [os.path.join(root, folder) for folder in (*named, ".")]
    result: list[Any] = []
    seen: set[tuple[str, str, int]] = set()
    queued: set[tuple[str, tuple[str, ...]]] = set()
    marks: dict[str, int] = {}
    absent: set[str] = set()
    # Each text with its xxh3-128 (a header's is its digest in the key) and the folders its
    # quoted includes are looked for in first.
    pending: list[tuple[bytes, int, tuple[str, ...]]] = [(data, first, ())]

    def probe(name: str, numbered: Iterable[tuple[int, str]]) -> int | None:
        """Hash every readable file ``name`` in ``numbered``; how many; ``None`` past the limit."""
        hits = 0
        for index, base in numbered:
            joined = os.path.join(base, name)
            try:
                path = os.path.realpath(joined)
            except (OSError, ValueError):  # (ValueError: a NUL in the name)
                return None
            content, stamp = read_header(path)
            if stamp is not None:
                reads.stamps[path] = stamp
            if content is None and path != os.path.abspath(joined) and os.path.exists(joined):
                return None  # a link no path names (/proc/PID/fd/N): the compiler reads it
            if content is None:
                continue
            if isinstance(content, Unreadable):
                return None  # a header the build may read, that cannot go into the key
            hits += 1
            mark = marks.get(path)
            if mark is None:
                mark = marks[path] = xxhash.xxh3_128_intdigest(content)
            # Every name and where it was found: a file hashed under one name already may be
            # what another name (a link) resolves to now, and another file later.
            if (path, name, index) not in seen:
                seen.add((path, name, index))
                result.append([name, index, f"{mark:032x}"])  # xxh3_128_hexdigest, once
            # A compiler looks for a header's quoted includes beside it as it was found
            # (a link's folder), where this one resolved the link: both are searched.
            folders = tuple(dict.fromkeys((os.path.dirname(joined), os.path.dirname(path))))
            if (path, folders) in queued:
                continue
            queued.add((path, folders))
            if len(queued) > _MAX_FILES or len(seen) > 4 * _MAX_FILES:
                return None
            if reads.texts is not None:
                reads.texts.append(content)
            pending.append((content, mark, folders))
        return hits

    while pending:
        text, mark, beside = pending.pop()
        for directive in _directives(text, mark):
            if directive is None:
                return None  # #include MACRO: which file it reads is the preprocessor's to say
            quoted, name = directive
            folders = (list(beside) if quoted else []) + search
            if quoted and text is data:  # (last: every file of the name is hashed anyway)
                folders += pocl_source_folders(root)  # where PoCL writes the source it builds
            hits = probe(name, enumerate(folders))
            if hits == 0:  # not on the search path: where a driver's compiler may look next
                hits = probe(name, enumerate(SYSTEM_DIRS, len(folders)))
            if hits is None or (hits == 0 and name not in absent and len(absent) >= _MAX_FILES):
                return None
            if hits == 0 and name not in absent:
                absent.add(name)
                result.append([name, -1, ABSENT])
    result.sort()
    return result
