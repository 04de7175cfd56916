"""lint-patches: every rule reports, and a good series is clean."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.tool.helpers.repos import (
    BODY,
    FORWARDED,
    MAINTAINER,
    MAINTAINERS_TOML,
    change_core_line,
    change_line_20,
    replace_line,
)
from vllm_overlay import cli, lint


def problems(project):
    return lint.lint(project, project / "patches")


def test_good_series_is_clean(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert problems(project) == []


def test_missing_headers_and_test_files(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text().replace(FORWARDED + "\n", "").replace("Targets: vllm.core:value\n", "")
    path.write_text(text)
    (project / "tests" / "patches" / "demo" / "test_demo.py").unlink()
    found = "\n".join(problems(project))
    assert "missing header 'Targets:'" in found
    assert "needs one of the headers Bug:, Forwarded:" in found
    assert "Tests names tests/patches/demo/test_demo.py, which does not exist" in found


def test_series_listing_rules(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    series = project / "patches" / "series"
    series.write_text(series.read_text() * 2)
    (project / "patches" / "demo" / "stray.patch").write_text(path.read_text())
    found = "\n".join(problems(project))
    assert "listed 2 times in series" in found
    assert "stray.patch: not listed in series" in found


def test_unsafe_paths(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    path.write_text(text.replace("a/vllm/core.py", "a/../evil.py").replace("b/vllm/core.py", "b/../evil.py"))
    assert any("'..' component" in p for p in problems(project))
    path.write_text(text.replace(" a/vllm/core.py", " /etc/passwd").replace("--- a/vllm/core.py", "--- /etc/passwd"))
    assert any("absolute path" in p for p in problems(project))


def test_symlink_leaving_the_tree(project, make_patch, upstream_dir, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    tree = tmp_path / "linked"
    (tree).mkdir()
    os.symlink(tmp_path, tree / "vllm")
    found = lint.lint(project, project / "patches", tree)
    assert any("outside the tree through a symlink" in p for p in found)


def test_symlink_and_binary_patches(project, make_patch, upstream_dir):
    def add_link(tree):
        os.symlink("/etc/passwd", tree / "vllm" / "link")

    make_patch(upstream_dir, add_link, "add a link")
    assert any("creates or changes a symlink" in p for p in problems(project))


def test_bracketed_subject_is_reported(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(path.read_text().replace("Subject: [PATCH] core:", "Subject: [PATCH] [Core] core:"))
    assert any("git am strips" in p for p in problems(project))


@pytest.mark.parametrize(
    "entry",
    [
        "/etc/hostname",
        "../outside/test_x.py",
        "tests/patches/demo/../../../outside/test_x.py",
        "tests/patches/other/test_demo.py",
        "tests/tool/test_lint.py",
    ],
)
def test_tests_entries_stay_inside_their_series_folder(project, make_patch, upstream_dir, capsys, entry, store_env):
    """Tests: is data from a patch file: lint and test-patches refuse paths outside tests/patches/<series>/."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    outside = project.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "test_x.py").write_text("def test_x():\n    assert True\n")
    (project / "tests" / "patches" / "other").mkdir(parents=True, exist_ok=True)
    (project / "tests" / "patches" / "other" / "test_demo.py").write_text("def test_x():\n    assert True\n")
    path.write_text(path.read_text().replace("Tests: tests/patches/demo/test_demo.py", f"Tests: {entry}"))
    assert any(
        f"Tests names {entry.split('::')[0]}, which is not inside tests/patches/demo/" in p for p in problems(project)
    )
    assert cli.main(["test-patches", "--project", str(project), "--env", str(project / "no-env")]) == 2
    assert "which is not inside tests/patches/demo/" in capsys.readouterr().err
    assert not (store_env / "downloads").exists()  # refused before the upstream was fetched


def test_tests_entry_through_a_symlink_out_of_its_folder(project, make_patch, upstream_dir, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("def test_x():\n    assert True\n")
    test_file = project / "tests" / "patches" / "demo" / "test_demo.py"
    test_file.unlink()
    test_file.symlink_to(elsewhere)
    assert any("leads out of tests/patches/demo/" in p for p in problems(project))


def test_patch_tests_carry_both_spdx_lines(project, make_patch, upstream_dir):
    """vLLM's pre-commit requires both SPDX lines; the regression tests go upstream with their patches."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    test_file = project / "tests" / "patches" / "demo" / "test_demo.py"
    test_file.write_text("# SPDX-License-Identifier: Apache-2.0\ndef test_x():\n    assert True\n")
    assert problems(project) == [
        "tests/patches/demo/test_demo.py: lacks the SPDX header line '# SPDX-FileCopyrightText: Copyright "
        "contributors to the vLLM project' (vLLM's pre-commit requires both)"
    ]
    test_file.write_text("\n".join(lint.SPDX_LINES) + "\ndef test_x():\n    assert True\n")
    assert problems(project) == []


def test_a_dot_component_is_named_not_left_to_fail_as_a_conflict(project, make_patch, upstream_dir, capsys):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(
        path.read_text().replace("a/vllm/core.py", "a/vllm/./core.py").replace("b/vllm/core.py", "b/vllm/./core.py")
    )
    assert any("'.' or empty component 'vllm/./core.py' (write it as 'vllm/core.py')" in p for p in problems(project))
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", str(upstream_dir)])
    assert code == 2 and "write it as 'vllm/core.py'" in capsys.readouterr().err


def _with_body(path, body):
    path.write_text(path.read_text().replace(BODY, body, 1))


def _heading_problems(project):
    return [p for p in problems(project) if "heading" in p]


def test_the_five_headings_pass(project, make_patch, upstream_dir):
    """The fixture's body is the good form: five headings alone on their lines, each with text."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert "\nWhy\n\nWhy and how.\n\nHow\n" in path.read_text()
    assert problems(project) == []
    # Several paragraphs under a heading are fine, and git does not take a heading for a trailer.
    _with_body(path, BODY.replace("The change.\n", "The change.\n\nA second paragraph.\n"))
    assert problems(project) == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("Configurations covered\n\nEvery configuration.\n\n", "", "lacks the heading 'Configurations covered'"),
        ("\nTests\n", "\nTests:\n", "lacks the heading 'Tests' (each alone on its line"),
        ("\nTests\n", "\n## Tests\n", "write '## Tests' as 'Tests'"),
        ("How\n\nThe change.", "How\nThe change.", "lacks the heading 'How' (each alone on its line"),
        ("Not forwarded.\n", "Not forwarded.\n\nHow\n\nAgain.\n", "has the heading 'How' 2 times"),
        ("The demo test.\n\n", "", "the heading 'Tests' has no text under it"),
        ("\nUpstream status\n\nNot forwarded.\n", "\nUpstream status\n", "'Upstream status' has no text under it"),
        (
            "Why\n\nWhy and how.\n\nHow\n\nThe change.",
            "How\n\nThe change.\n\nWhy\n\nWhy and how.",
            "out of order: How, Why",
        ),
        ("Why\n\n", "A lead paragraph.\n\nWhy\n\n", "text before its first heading 'Why'"),
    ],
)
def test_a_message_without_the_five_headings_is_reported(project, make_patch, upstream_dir, old, new, expected):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert old in BODY
    _with_body(path, BODY.replace(old, new, 1))
    found = _heading_problems(project)
    assert any(expected in p for p in found), found
    assert all(p.startswith("patches/demo/core-change-line-20.patch: ") for p in found)


def test_an_old_style_message_is_reported_once_per_heading(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    _with_body(path, "Why and how.\n\n")
    assert _heading_problems(project) == [
        f"patches/demo/core-change-line-20.patch: the message lacks the heading {heading!r} (each alone on its line "
        "between blank lines, in the order Why, How, Configurations covered, Tests, Upstream status)"
        for heading in ("Why", "How", "Configurations covered", "Tests", "Upstream status")
    ]


@pytest.mark.parametrize(
    "value",
    [
        "no (reason: not filed yet; drop when: upstream checks the width)",
        "not-needed (reason: only this project's CI uses it; drop when: the CI job goes)",
        "https://github.com/vllm-project/vllm/issues/1",
        "no (reason: a (nested) reason; drop when: upstream's f(x) returns y)",
    ],
)
def test_forwarded_with_a_url_or_a_reason_and_a_drop_condition_passes(project, make_patch, upstream_dir, value):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(path.read_text().replace(FORWARDED, f"Forwarded: {value}"))
    assert problems(project) == []


@pytest.mark.parametrize(
    "value",
    [
        "no",
        "not-needed",
        "yes",
        "no (reason: not filed yet)",
        "no (drop when: upstream checks the width)",
        "no (reason: ; drop when: upstream checks the width)",
        "no (reason: not filed yet; drop when: )",
        "no, not filed yet; drop when upstream checks the width",
        "github.com/vllm-project/vllm/issues/1",
    ],
)
def test_forwarded_without_a_url_or_a_reason_and_a_drop_condition_is_reported(project, make_patch, upstream_dir, value):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(path.read_text().replace(FORWARDED, f"Forwarded: {value}"))
    assert problems(project) == [
        f"patches/demo/core-change-line-20.patch: Forwarded: {value!r} is neither the upstream issue's or PR's URL "
        "nor 'no (reason: WHY; drop when: CONDITION)'"
    ]


def test_a_folded_forwarded_value_is_read_as_git_unfolds_it(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(
        path.read_text().replace(FORWARDED, "Forwarded: no (reason: not filed\n yet; drop when: upstream\n checks it)")
    )
    assert problems(project) == []


def test_a_case_variant_of_git_and_a_gitattributes_file_are_flagged(project, make_patch, upstream_dir):
    """On a case-insensitive file system ``.GIT`` is ``.git``; attributes steer git's conversions."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    path.write_text(text.replace("vllm/core.py", ".GIT/config"))
    assert any("path inside .git '.GIT/config'" in p for p in problems(project)), problems(project)
    path.write_text(text.replace("vllm/core.py", "vllm/.gitattributes"))
    assert any(
        "writes vllm/.gitattributes, which steers how git converts, diffs and merges files" in p
        for p in problems(project)
    ), problems(project)


def test_lint_into_a_closed_pipe_ends_quietly(project, make_patch, upstream_dir):
    """Before: ``lint-patches | head -1`` died with a BrokenPipeError traceback."""
    import subprocess
    import sys

    from tests.tool.helpers.repos import REPO_ROOT

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    for number in range(3000):  # more problem lines than a pipe holds: the writer is still writing
        (project / "patches" / "demo" / f"stray-{number:04}.patch").write_text("")
    argv = [sys.executable, "-m", "vllm_overlay.cli", "lint-patches", "--project", str(project)]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline()  # what `head -1` reads; then it exits
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, err  # as a command SIGPIPE killed
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# The maintainer of every series (maintainers.toml): each patch's author and sign-off, and a message
# that fits one screen.
ADA = "Ada Lovelace <ada@example.org>"
SIGNED_OFF = f"Signed-off-by: {MAINTAINER}\n"


def test_an_author_other_than_the_series_maintainer_is_named_with_both(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, f"From: {MAINTAINER}\n", f"From: {ADA}\n")
    assert problems(project) == [
        f"patches/demo/core-change-line-20.patch: From: {ADA} is not its series' maintainer (demo in "
        f"maintainers.toml), {MAINTAINER}: commit it with --author='{MAINTAINER}' (git commit --amend in "
        f"build/patched, then export-patches), or name {ADA} for demo in maintainers.toml"
    ]


def test_a_patch_without_the_maintainers_sign_off_is_reported(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, SIGNED_OFF, "")
    assert problems(project) == [
        f"patches/demo/core-change-line-20.patch: no 'Signed-off-by: {MAINTAINER}' in its trailer block (its "
        "series' maintainer (demo in maintainers.toml)): end the block with that line (git commit -s under that "
        "identity writes it)"
    ]


def test_a_sign_off_of_someone_else_names_both(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, SIGNED_OFF, f"Signed-off-by: {ADA}\n")
    assert problems(project) == [
        f"patches/demo/core-change-line-20.patch: signed off by {ADA}, not by its series' maintainer (demo in "
        f"maintainers.toml), {MAINTAINER}: make that line 'Signed-off-by: {MAINTAINER}', or name {ADA} for demo "
        "in maintainers.toml"
    ]
    replace_line(path, f"Signed-off-by: {ADA}\n", SIGNED_OFF + f"Signed-off-by: {ADA}\n")
    assert [p for p in problems(project) if "signed off by" in p] == [
        f"patches/demo/core-change-line-20.patch: signed off by {ADA}, not by its series' maintainer (demo in "
        f"maintainers.toml), {MAINTAINER}: make that line 'Signed-off-by: {MAINTAINER}', or name {ADA} for demo "
        "in maintainers.toml"
    ]


def test_the_maintainers_sign_off_twice_is_reported(project, make_patch, upstream_dir):
    """What `git commit --amend -s` leaves in build/patched: a second sign-off after Patch-File."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, SIGNED_OFF, SIGNED_OFF * 2)
    assert [p for p in problems(project) if "2 times" in p] == [
        f"patches/demo/core-change-line-20.patch: signed off by {MAINTAINER} 2 times: keep one 'Signed-off-by:' "
        "line (git commit --amend -s adds a second after the Patch-File trailer; amend without -s)"
    ]


def test_a_sign_off_outside_the_trailer_block_is_not_one(project, make_patch, upstream_dir):
    """git's trailer parsing decides: a Signed-off-by line in the prose does not sign the patch off."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    replace_line(path, SIGNED_OFF, "")
    replace_line(path, "Not forwarded.\n", "Not forwarded.\n" + SIGNED_OFF)
    assert any("no 'Signed-off-by:" in p for p in problems(project))


def test_a_series_override_is_honoured_and_the_default_kept_for_the_rest(project, make_patch, upstream_dir):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    other = make_patch(upstream_dir, change_core_line(5, 50), "core: change line 5", series="beta")
    (project / "maintainers.toml").write_text(MAINTAINERS_TOML + f'\n[series]\nbeta = "{ADA}"\n')
    found = problems(project)
    assert len(found) == 2 and all(p.startswith("patches/beta/core-change-line-5.patch: ") for p in found)
    assert f"From: {MAINTAINER} is not its series' maintainer (beta in maintainers.toml), {ADA}" in found[0]
    replace_line(other, f"From: {MAINTAINER}\n", f"From: {ADA}\n")
    replace_line(other, SIGNED_OFF, f"Signed-off-by: {ADA}\n")
    assert problems(project) == []


def test_maintainers_toml_is_checked_before_any_patch(project, make_patch, upstream_dir):
    """An override of a series patches/series does not list, or no file: said once, naming what to write."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    toml = project / "maintainers.toml"
    toml.write_text(MAINTAINERS_TOML + f'[series]\nroute-sanitisation = "{ADA}"\n')
    assert problems(project) == [
        f"{toml}: [series] 'route-sanitisation' is no series of patches/series (its series: demo): correct "
        "the name or remove the line"
    ]
    toml.unlink()
    assert problems(project) == [
        f"{toml}: not found: it names who authors and signs off each series' patches; write "
        '`default = "Ada Lovelace <ada@example.org>"` there (README.md, Patch format)'
    ]


def test_a_carried_series_is_checked_against_the_projects_maintainers(project, make_patch, upstream_dir):
    """cpu/patches is carried from patches/: the same maintainers, overrides checked against patches/series."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    carried = project / "cpu" / "patches"
    shutil.copytree(project / "patches", carried)
    (project / "maintainers.toml").write_text(MAINTAINERS_TOML + f'[series]\ndemo = "{ADA}"\n')
    (project / "patches" / "series").write_text("")
    path.unlink()  # patches/ no longer has the series: the override names none
    assert [p.split(": ", 1)[1] for p in lint.lint(project, carried)] == [
        "[series] 'demo' is no series of patches/series (its series: none): correct the name or remove the line"
    ]
    (project / "maintainers.toml").write_text(MAINTAINERS_TOML)
    assert lint.lint(project, carried) == []


def _prose_lines(count):
    """Lines for the message's last section that bring its prose (21 lines in BODY's form) to ``count``."""
    return "".join(f"More evidence, line {number}.\n" for number in range(count - 21))


def test_a_message_longer_than_60_lines_is_reported_with_its_count(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    path.write_text(text.replace("Not forwarded.\n", "Not forwarded.\n" + _prose_lines(60)))
    assert problems(project) == []
    path.write_text(text.replace("Not forwarded.\n", "Not forwarded.\n" + _prose_lines(61)))
    assert problems(project) == [
        "patches/demo/core-change-line-20.patch: the message is 61 lines from its subject to the trailer block, "
        "blank lines counted (at most 60): move long evidence to docs/patches/demo/core-change-line-20.md and "
        "link it from the message on one line"
    ]


def test_a_line_wider_than_72_is_reported_with_its_line_in_the_file(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    path.write_text(text.replace("The change.\n", "x" * 72 + "\n"))
    assert problems(project) == []
    path.write_text(text.replace("The change.\n", "x" * 73 + "\n"))
    assert path.read_text().splitlines()[11] == "x" * 73
    assert problems(project) == [
        "patches/demo/core-change-line-20.patch: message line 9 (line 12 of the file) is 73 characters wide "
        "(at most 72): wrap it"
    ]
    path.write_text(text.replace("core: change line 20\n", "core: change line 20" + "0" * 53 + "\n", 1))
    assert [p for p in problems(project) if "wide" in p] == [
        "patches/demo/core-change-line-20.patch: the subject (line 4 of the file) is 73 characters wide "
        "(at most 72): shorten it"
    ]


def test_a_path_alone_on_its_line_may_be_wider_than_72(project, make_patch, upstream_dir):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    link = "docs/patches/demo/" + "a-long-name-of-the-evidence-page-for-this-patch-" * 2 + ".md"
    assert len(link) > 72
    path.write_text(text.replace("The change.\n", f"Every case:\n{link}\n"))
    assert problems(project) == []
    path.write_text(text.replace("The change.\n", f"Every case: {link}\n"))
    assert [p for p in problems(project) if "wide" in p] == [
        f"patches/demo/core-change-line-20.patch: message line 9 (line 12 of the file) is {len(link) + 12} "
        "characters wide (at most 72): wrap it"
    ]
