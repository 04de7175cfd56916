"""lint-patches: every rule reports, and a good series is clean."""

from __future__ import annotations

import os

import pytest

from tests.tool.helpers.repos import BODY, FORWARDED, change_line_20
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
    """Issue 51 items 10 and 13."""
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
    """Issue 51 item 4: ``lint-patches | head -1`` died with a BrokenPipeError traceback."""
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
