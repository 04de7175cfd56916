"""The repository speaks of the project alone: no tracked text names an issue tracker's number.

A reader of the code, the docs or a benchmark has no tracker to look a bare number up in; the
sentence must say what it meant (the speed target, the defect, the round). Another project's
numbers (``vllm-project/vllm#12345``, vLLM's issue of that number, its URL) are references a
reader can follow, so they stay.
"""

from __future__ import annotations

import re

import git
import pytest

from tests.tool.helpers.repos import REPO_ROOT

# The word issue (or issues) and a number, "#" before it or a line break between; "item N of" the word.
TRACKER_NUMBER = re.compile(r"\bissues?(?:\s+#?|\s*#)\d+|\bitems?\s+\d+(?:-\d+)?\s+of\s+issue", re.IGNORECASE)

# Just before the match, on its line: another project's name (vLLM, upstream, flashinfer, ...) or an
# owner/name pair (vllm-project/vllm).
UPSTREAM_BEFORE = re.compile(
    r"(?:\b(?:upstream|vllm|flashinfer|pytorch|torch|triton|cpython|python|pip|git|github)(?:'s)?"
    r"|[\w.-]+/[\w.-]+)\s+$",
    re.IGNORECASE,
)


def tracker_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) of each reference to a tracker number not another project's."""
    found = []
    for match in TRACKER_NUMBER.finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if UPSTREAM_BEFORE.search(text[line_start : match.start()]):
            continue
        found.append((text.count("\n", 0, match.start()) + 1, " ".join(match.group().split())))
    return found


def _said(text: str) -> str:
    """An example with the word spelled out: this file spells it <i> so that its own scan passes."""
    return text.replace("<I>", "Issue").replace("<i>", "issue")


@pytest.mark.parametrize(
    "text",
    [
        "(<i> 24: under 0.3 s CPU)",
        "<I> 51 item 9: the second listing reverse-applied",
        "the carry of <i> 49's fix",
        "see <i> #8",
        "<i>s 13 and 21",
        "which fix <i>\n49 item 1",
        "item 5 of <i> 21",
        "items 5-8 of <i> 13",
    ],
)
def test_a_tracker_number_is_found(text):
    assert tracker_numbers(_said(text)), text


@pytest.mark.parametrize(
    "text",
    [
        "fixed upstream in vllm-project/vllm#12345",
        "vLLM <i> 12345 reports the same hang",
        "vLLM's <i> 9876",
        "flashinfer <i> 2101",
        "vllm-project/vllm <i> 4321",
        "https://github.com/vllm-project/vllm/<i>s/12345",
        "no <i> here; 24 files",
        "the case at <i>",
        "t<i> 5",
    ],
)
def test_another_projects_reference_or_plain_words_are_not(text):
    assert tracker_numbers(_said(text)) == [], text


def test_the_line_of_a_match_is_named():
    assert tracker_numbers(_said("one\ntwo (<i> 24)\nthree\nfix <i>\n49 item 1\n")) == [
        (2, _said("<i> 24")),
        (4, _said("<i> 49")),
    ]


def test_no_tracked_text_names_a_tracker_number():
    """Every tracked file git would show as text (no NUL byte in it), the whole of it."""
    repo = git.Repo(REPO_ROOT)
    names = [name for name in repo.git.ls_files("-z").split("\0") if name]
    found = []
    for name in names:
        path = REPO_ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        text = data.decode("utf-8", errors="replace")
        found += [f"{name}:{line}: {words}" for line, words in tracker_numbers(text)]
    assert names and not found, "\n".join(found)
