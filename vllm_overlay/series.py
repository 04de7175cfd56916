"""The patch data: ``patches/series`` (quilt syntax) and the git-format-patch files it lists.

A patch file is an mbox message as ``git format-patch`` writes it. Its commit message ends in a
block of git trailers carrying the DEP-3 headers and the project's own (Series, Tests,
Upstream-Tests, Targets); git itself parses that block, and the mail's headers (``git mailinfo``).
The diff is parsed with unidiff.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from vllm_overlay import git as gitcmd
from vllm_overlay.errors import InputError

if TYPE_CHECKING:  # imported where a patch is parsed: a run that only compares bytes never needs them
    import unidiff

SERIES_FILE = "series"
# DEP-3 fields we require, plus the project's own.
REQUIRED_FIELDS = ("Description", "Origin", "Last-Update", "Series", "Tests", "Upstream-Tests", "Targets")
ONE_OF_FIELDS = (("Bug", "Forwarded"),)
MULTI_VALUE_FIELDS = ("Tests", "Upstream-Tests", "Targets")
# The message body's headings, in this order, each alone on its line between blank lines. No colon:
# "Tests:" would read as a trailer or a DEP-3 field, and "## Tests" as a comment to git commit.
MESSAGE_HEADINGS = ("Why", "How", "Configurations covered", "Tests", "Upstream status")
# A Forwarded value that is not a URL says why and until when: DEP-3's "no" or "not-needed", then
# "(reason: WHY; drop when: CONDITION)".
FORWARDED_URL_RE = re.compile(r"^https?://\S+$")
FORWARDED_NOT_RE = re.compile(r"^(?:no|not-needed) \(reason: (?P<reason>.+?); drop when: (?P<drop>.+)\)$")
SERIES_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class SeriesError(InputError, ValueError):
    """The series file or a patch file is malformed."""


@dataclass(frozen=True)
class SeriesEntry:
    """One line of patches/series."""

    path: str  # relative to patches/, e.g. "loader-layouts/full-table-layouts.patch"
    line: int

    @property
    def series(self) -> str:
        return self.path.split("/", 1)[0] if "/" in self.path else ""


@dataclass(frozen=True)
class ParsedMail:
    """What a patch file says, as this tool reads it (``parse_patch_bytes``)."""

    subject: str
    author_name: str  # the author as git am commits it (git mailinfo reads the headers)
    author_email: str
    date: str
    message: str  # subject line + body, as the commit message
    diff: unidiff.PatchSet

    @property
    def author(self) -> str:
        return f"{self.author_name} <{self.author_email}>"


@dataclass
class Patch:
    """A patch file: its bytes, and what they say (parsed when the patch is loaded, or on first use
    for bytes an apply record proves this engine parsed before: ``patches_from_bytes``)."""

    path: Path
    name: str  # path relative to patches/
    raw: bytes = field(repr=False)
    _parsed: ParsedMail | None = field(default=None, repr=False, compare=False)
    _trailers: list[tuple[str, str]] | None = field(default=None, repr=False, compare=False)

    def parsed(self) -> ParsedMail:
        """The parsed mail (SeriesError when the bytes do not parse)."""
        if self._parsed is None:
            self._parsed = parse_mail(self.raw, self.name)
        return self._parsed

    @property
    def subject(self) -> str:
        return self.parsed().subject

    @property
    def author(self) -> str:
        return self.parsed().author

    @property
    def date(self) -> str:
        return self.parsed().date

    @property
    def message(self) -> str:
        return self.parsed().message

    @property
    def diff(self) -> unidiff.PatchSet:
        return self.parsed().diff

    @property
    def trailers(self) -> list[tuple[str, str]]:
        """The message's trailers, parsed by git on first use (a run that only compares bytes never starts it)."""
        if self._trailers is None:
            self._trailers = parse_trailers(self.message)
        return self._trailers

    def values(self, key: str) -> list[str]:
        """All values of a trailer (case-insensitive key); comma/space separated lists are split."""
        found: list[str] = []
        for name, value in self.trailers:
            if name.lower() == key.lower():
                if key in MULTI_VALUE_FIELDS:
                    found.extend(v for v in re.split(r"[,\s]+", value) if v)
                else:
                    found.append(value)
        return found

    def value(self, key: str) -> str | None:
        values = self.values(key)
        return values[0] if values else None

    @property
    def series(self) -> str:
        return self.value("Series") or ""

    @property
    def tests(self) -> list[str]:
        return self.values("Tests")

    @property
    def upstream_tests(self) -> list[str]:
        return self.values("Upstream-Tests")

    @property
    def targets(self) -> list[str]:
        return self.values("Targets")

    @property
    def touched_files(self) -> list[str]:
        """Paths (relative to the tree) the patch modifies, adds or removes."""
        names: list[str] = []
        for patched in self.diff:
            for candidate in (patched.source_file, patched.target_file):
                if candidate and candidate != "/dev/null":
                    stripped = candidate[2:] if candidate[:2] in ("a/", "b/") else candidate
                    if stripped not in names:
                        names.append(stripped)
        return names


def read_series(patches_dir: Path) -> list[SeriesEntry]:
    """Parse patches/series: one patch path per line, ``#`` comments, optional ``-p1``."""
    path = patches_dir / SERIES_FILE
    if not path.exists():
        raise SeriesError(f"{path}: not found")
    entries: list[SeriesEntry] = []
    # utf-8-sig: an editor's byte-order mark is not part of the first entry's name.
    for number, raw_line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if len(words) > 2 or (len(words) == 2 and words[1] != "-p1"):
            raise SeriesError(f"{path}:{number}: expected 'PATCH [-p1]', got {raw_line!r}")
        outside = _outside_patches(words[0])
        if outside:
            raise SeriesError(f"{path}:{number}: {words[0]!r} is outside patches/ ({outside})")
        unclear = name_problem(words[0])
        if unclear:
            raise SeriesError(f"{path}:{number}: {unclear}")
        # One spelling per file: ``./NAME`` and ``dir//NAME`` are ``NAME`` and ``dir/NAME``, so a
        # patch listed twice under two spellings is a duplicate, not two patches.
        entries.append(SeriesEntry(PurePosixPath(words[0]).as_posix(), number))
    return entries


# Characters that print as nothing or steer how the rest prints: format (zero-width space, RTL and
# LTR marks and overrides), control, private-use, unassigned, and every separator but the space.
_UNSEEN_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}


def _unseen(char: str) -> bool:
    category = unicodedata.category(char)
    return category in _UNSEEN_CATEGORIES or (category == "Zs" and char != " ")


def shown(name: str) -> str:
    """``name`` as a message shows it: plain where it prints as itself, else escaped (``ascii``), so a
    name with a zero-width space or decomposed accents never looks identical to another one."""
    if any(_unseen(char) for char in name) or unicodedata.normalize("NFC", name) != name:
        return ascii(name)
    return name


def name_problem(name: str) -> str | None:
    """Why a patch's name cannot be told from another one by reading it (None: it can).

    A series entry and a file name must hold no invisible character and be in NFC form: names are
    compared byte for byte, so an NFD ``café.patch`` or one with a zero-width space is another file
    than the one that looks the same, and every message would name a file that seems to exist.
    """
    for char in name:
        if _unseen(char):
            what = unicodedata.name(char, "unnamed")
            return f"{shown(name)} holds U+{ord(char):04X} ({what}), which does not show: write the name without it"
    composed = unicodedata.normalize("NFC", name)
    if composed != name:
        return (
            f"{shown(name)} is not in Unicode NFC form (an accent is a character of its own): "
            f"write it as {composed!r}, and name the file so"
        )
    return None


def _outside_patches(entry: str) -> str | None:
    """Why a series entry would name a file outside patches/, or None: entries are relative paths."""
    pure = PurePosixPath(entry)
    if pure.is_absolute():
        return "an absolute path"
    if ".." in pure.parts:
        return "a '..' component"
    return None


def tests_path_problems(patch: Patch, project_root: Path) -> list[str]:
    """Why a ``Tests:`` entry of ``patch`` is not a file inside tests/patches/<its series>/ (empty: all are).

    Tests entries are data from a patch file: an absolute path or one leaving that folder would make
    test-patches walk or run files from anywhere (``Tests: /etc/hostname``, ``../outside/test_x.py``).
    """
    problems = []
    folder = (project_root / "tests" / "patches" / patch.series).resolve()
    for spec in patch.tests:
        name = spec.split("::", 1)[0]
        pure = PurePosixPath(name)
        expected = f"tests/patches/{patch.series}/"
        if pure.is_absolute() or ".." in pure.parts or not name.startswith(expected):
            problems.append(f"Tests names {name}, which is not inside {expected}")
            continue
        resolved = (project_root / name).resolve()
        if not resolved.is_relative_to(folder):
            problems.append(f"Tests names {name}, which leads out of {expected} (a symbolic link)")
        elif pure.suffix != ".py":
            problems.append(f"Tests names {name}, which is not a Python test file")
    return problems


def render_series(names: list[str]) -> str:
    """The series file's text for ``names`` in order, grouped under one comment per series."""
    lines = ["# Patch order (quilt syntax). Grouped by series; edit with scripts/export-patches."]
    current = None
    for name in names:
        series = name.split("/", 1)[0]
        if series != current:
            lines += ["", f"# {series}"]
            current = series
        lines.append(name)
    return "\n".join(lines) + "\n"


PARSE_TRAILERS = ("interpret-trailers", "--parse", "--no-divider")


def parse_trailers(message: str) -> list[tuple[str, str]]:
    """Trailers of a commit message, parsed by git itself."""
    result = gitcmd.process(*PARSE_TRAILERS, input=message.encode("utf-8"), capture_output=True, check=True)
    return _trailer_pairs(result.stdout.decode("utf-8"))


def parse_all_trailers(patches: Sequence[Patch], scratch: Path | None = None) -> None:
    """Parse the trailers of every patch in ``patches`` not parsed yet, with one git process.

    The same parser ``Patch.trailers`` runs on one message, given every message as a file of its
    own (``--in-place``: each file then holds its own trailers); a series costs one process, not
    one a patch. The files (``trailers-N``) go into ``scratch``, a directory of the caller's that
    it removes (a new temporary one where None).
    """
    unparsed = [patch for patch in patches if patch._trailers is None]
    if len(unparsed) < 2:
        return  # Patch.trailers parses one on first use
    if scratch is None:
        import tempfile  # here: an apply gives its staging area, and a re-apply of one patch needs none

        with tempfile.TemporaryDirectory(prefix="vllm-overlay-trailers-") as tmp:
            parse_all_trailers(unparsed, Path(tmp))
        return
    files = [scratch / f"trailers-{number}" for number in range(len(unparsed))]
    for patch, file in zip(unparsed, files, strict=True):
        file.write_bytes(patch.message.encode("utf-8"))
    gitcmd.process(*PARSE_TRAILERS, "--in-place", *map(str, files), capture_output=True, check=True)
    for patch, file in zip(unparsed, files, strict=True):
        patch._trailers = _trailer_pairs(file.read_bytes().decode("utf-8"))


def _trailer_pairs(parsed: str) -> list[tuple[str, str]]:
    """(key, value) of each line ``git interpret-trailers --parse`` printed."""
    pairs: list[tuple[str, str]] = []
    for line in parsed.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


IN_BODY_HEADERS = ("from:", "subject:", "date:")


def ends_git_message(line: str) -> bool:
    """True for a line git mailinfo takes for the start of the diff (mailinfo.c patchbreak):
    ``diff -``, ``Index: ``, ``--- NAME`` or ``---`` followed by nothing but blanks."""
    if line.startswith(("diff -", "Index: ")):
        return True
    if not line.startswith("---") or len(line) < 4:
        return line == "---"
    if line[3] == " " and len(line) > 4 and not line[4].isspace():
        return True
    return line[3:].strip() == ""


def message_problem(body: str) -> str | None:
    """Why ``git am`` would read a commit message body otherwise than this tool (None: it reads it the same).

    A line that ends git's message loses every line after it (the trailers with them); an in-body
    ``From:``/``Subject:``/``Date:`` at the start of the body replaces the commit's author, subject
    or date, while the report, manifest and SBOM read the mail's headers: one truth or none.
    """
    lines = body.split("\n")
    first = next((line for line in lines if line.strip()), "")
    if first.lower().startswith(IN_BODY_HEADERS):
        return (
            f"the message body starts with {first!r}: git am would take it as the commit's "
            f"{first.split(':', 1)[0].lower()} instead of the mail's header; reword or indent that line"
        )
    for number, line in enumerate(lines, start=1):
        if ends_git_message(line):
            return (
                f"message line {number} ({line!r}) would end the commit message for git am "
                "(a line starting with '--- ', 'diff -' or 'Index: '): every line after it, the trailers "
                "with them, would be lost; indent or reword it"
            )
    return None


def as_git_am_reads(raw: bytes) -> bytes:
    """The mail as ``git am`` reads it, the bytes every step (parse, classify, commit) works on.

    A mail saved with CRLF line endings (by a mail client or an editor on another system; its
    first line, format-patch's "From <commit> <date>", ends in CRLF) gets every CRLF turned into
    LF, as ``git mailsplit`` does for plain ``git am``. A mail in format-patch's own LF form is
    left byte for byte: a carriage return there is file content (the diff of a CRLF file), which
    the commit step keeps with ``git am --keep-cr``.
    """
    first_line = raw.split(b"\n", 1)[0]
    return raw.replace(b"\r\n", b"\n") if first_line.endswith(b"\r") else raw


def parse_patch_bytes(raw: bytes, path: Path, name: str) -> Patch:
    """Parse one git-format-patch file (SeriesError, naming it, when it is not one this tool reads)."""
    patch = Patch(path=path, name=name, raw=raw)
    patch.parsed()
    return patch


def parse_mail(raw: bytes, name: str) -> ParsedMail:
    """What the git-format-patch file ``name`` (its bytes: ``raw``) says.

    The headers are read by ``git mailinfo``, the parser ``git am`` runs (folded lines joined,
    encoded words decoded), with ``-b``: only the ``[PATCH ...]`` prefix leaves the subject, so
    lint still sees a bracket git am would strip. The body is the text between the header block
    and the ``---`` line, as written (``message_problem`` checks it is what git am commits).
    """
    import unidiff

    if not raw.strip():
        raise SeriesError(f"patch is empty: {name}")
    mail = as_git_am_reads(raw)
    try:
        text = mail.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SeriesError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    head, sep, _ = text.partition("\n---\n")
    if not sep:
        raise SeriesError(f"{name}: no '---' line separating the commit message from the diff")
    message_part = head.split("\n", 1)[1] if head.startswith("From ") else head
    header_block, _, body = message_part.partition("\n\n")
    if any(line.lower().startswith("content-type: multipart/") for line in header_block.split("\n")):
        raise SeriesError(f"{name}: multipart message; expected a plain git-format-patch file")
    headers = mail_headers(mail, name)
    subject = headers.get("Subject", "")
    if not subject:
        raise SeriesError(f"{name}: no Subject header (is it a git-format-patch file?)")
    problem = message_problem(body)
    if problem:
        raise SeriesError(f"{name}: {problem}")
    message = subject + "\n\n" + body.strip("\n") + "\n"
    try:
        diff = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise SeriesError(f"{name}: the diff does not parse: {exc}") from exc
    if not len(diff):
        raise SeriesError(f"{name}: contains no diff")
    return ParsedMail(
        subject=subject,
        author_name=headers.get("Author", ""),
        author_email=headers.get("Email", ""),
        date=headers.get("Date", ""),
        message=message,
        diff=diff,
    )


def mail_headers(mail: bytes, name: str) -> dict[str, str]:
    """Author, Email, Subject and Date of the mail ``name`` as ``git mailinfo -b`` reads them (absent: not given)."""
    result = gitcmd.process("mailinfo", "-b", os.devnull, os.devnull, input=mail, capture_output=True)
    if result.returncode != 0:
        reason = result.stderr.decode("utf-8", errors="replace").strip() or f"exit status {result.returncode}"
        raise SeriesError(f"{name}: git mailinfo cannot read its headers: {reason}")
    fields: dict[str, str] = {}
    for line in result.stdout.decode("utf-8", errors="replace").split("\n"):
        key, sep, value = line.partition(": ")
        if sep and value.strip():
            fields[key] = value.strip()
    return fields


def load_patch(patches_dir: Path, name: str) -> Patch:
    return parse_patch_bytes(read_patch(patches_dir, name), patches_dir / name, name)


def read_patch(patches_dir: Path, name: str) -> bytes:
    """The bytes of the patch file ``name`` lists, refused when it lies outside patches/ or is missing."""
    path = patches_dir / name
    outside = _outside_patches(name)
    if outside is None and path.exists() and not path.resolve().is_relative_to(patches_dir.resolve()):
        outside = "a symlink that leads out of patches/"
    if outside:
        raise SeriesError(f"{shown(name)}: outside patches/ ({outside})")
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise SeriesError(f"{shown(name)}: listed in series but the file does not exist") from exc
    except OSError as exc:
        raise SeriesError(f"{shown(name)}: cannot be read: {exc.strerror}") from exc
    return raw


def load_series(patches_dir: Path, *, allow_empty: bool = True) -> list[Patch]:
    """All patches in series order. Raises on the first malformed entry (lint reports them all).

    With ``allow_empty=False`` a series that lists no patch (nothing, or only comments) is an error.
    """
    return [load_patch(patches_dir, name) for name in _listed_names(patches_dir, allow_empty)]


def read_series_bytes(patches_dir: Path, *, allow_empty: bool = True) -> list[tuple[str, bytes]]:
    """(name, bytes) of every patch in series order, unparsed: all a run needs to compare them with
    what a tree recorded (``apply_record``), without the cost of parsing them."""
    return [(name, read_patch(patches_dir, name)) for name in _listed_names(patches_dir, allow_empty)]


def patches_from_bytes(patches_dir: Path, mails: list[tuple[str, bytes]], parsed_before: int = 0) -> list[Patch]:
    """The patches ``read_series_bytes`` read, parsed now, except the first ``parsed_before``.

    Those are bytes an apply record names, from a run of this engine (whose sources include this
    module) that parsed them: they parse again, and are parsed only if something reads them (a
    re-apply on the spare reads only their names and bytes). The file is not read a second time.
    """
    patches = [Patch(path=patches_dir / name, name=name, raw=raw) for name, raw in mails]
    for patch in patches[parsed_before:]:
        patch.parsed()
    return patches


def _listed_names(patches_dir: Path, allow_empty: bool) -> list[str]:
    entries = read_series(patches_dir)
    if not entries and not allow_empty:
        raise SeriesError(f"{patches_dir / SERIES_FILE}: series is empty: it lists no patch")
    duplicates = [name for name, count in Counter(e.path for e in entries).items() if count > 1]
    if duplicates:
        raise SeriesError(f"listed more than once in series: {', '.join(shown(name) for name in duplicates)}")
    same = same_files(patches_dir, [entry.path for entry in entries])
    if same:
        raise SeriesError(same[0])
    return [entry.path for entry in entries]


def same_files(patches_dir: Path, names: list[str]) -> list[str]:
    """One line for each listed name that is the same file as an earlier one (a symlink, a hard link):
    applied twice, its second listing would reverse-apply and pass for "already-upstream"."""
    first: dict[tuple[int, int], str] = {}
    found = []
    for name in dict.fromkeys(names):
        try:
            stat = (patches_dir / name).stat()
        except OSError:
            continue  # missing or unreadable: said where it is read
        key = (stat.st_dev, stat.st_ino)
        if key in first:
            found.append(
                f"{shown(name)}: the same file as {shown(first[key])}, listed before it in series "
                "(a link): the patch would be applied twice"
            )
        else:
            first[key] = name
    return found


def series_names(patches: list[Patch]) -> list[str]:
    """Series in the order their first patch appears."""
    seen: list[str] = []
    for patch in patches:
        if patch.series not in seen:
            seen.append(patch.series)
    return seen


def select(patches: list[Patch], only: str | Sequence[str] | None) -> list[Patch]:
    """Patches named by ``--only`` (repeatable): series names or patch names (with or without .patch).

    The result keeps the series order whatever order the names were given in.
    """
    if not only:
        return patches
    names = [only] if isinstance(only, str) else list(only)
    for name in names:
        if not any(_names(p, name) for p in patches):
            raise SeriesError(f"--only {name!r} names no series or patch in patches/series")
    return [p for p in patches if any(_names(p, name) for name in names)]


def _names(patch: Patch, name: str) -> bool:
    return name in (patch.series, patch.name, patch.name.removesuffix(".patch"), Path(patch.name).stem)
