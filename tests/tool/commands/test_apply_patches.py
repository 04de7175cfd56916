"""Bad input is refused with exit 2 and a message naming it, before the output is touched."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import apply_code, patched_head
from vllm_overlay import cli, lint


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   # and another\n"])
def test_empty_series_is_refused_and_output_kept(built, upstream_dir, capsys, text):
    before = patched_head(built)
    (built / "patches" / "series").write_text(text)
    assert apply_code(built, upstream_dir) == 2
    assert "series is empty" in capsys.readouterr().err
    assert patched_head(built) == before
    assert "series is empty" in "\n".join(lint.lint(built, built / "patches"))


def test_empty_patch_file_is_named(built, upstream_dir, capsys):
    (built / "patches" / "demo" / "core-change-line-20.patch").write_bytes(b"")
    assert apply_code(built, upstream_dir) == 2
    assert "patch is empty: demo/core-change-line-20.patch" in capsys.readouterr().err
    assert "patch is empty: demo/core-change-line-20.patch" in "\n".join(lint.lint(built, built / "patches"))


@pytest.mark.parametrize("entry", ["/etc/hostname", "../upstream.lock", "demo/../../upstream.lock"])
def test_series_entries_stay_inside_patches(built, upstream_dir, capsys, entry):
    before = patched_head(built)
    (built / "patches" / "series").write_text(f"{entry}\n")
    assert apply_code(built, upstream_dir) == 2
    assert "outside patches/" in capsys.readouterr().err
    assert patched_head(built) == before
    assert "outside patches/" in "\n".join(lint.lint(built, built / "patches"))


def test_series_entry_through_a_symlink_out_of_patches_is_refused(built, upstream_dir, capsys):
    (built / "patches" / "escape.patch").symlink_to(built / "upstream.lock")
    (built / "patches" / "series").write_text("escape.patch\n")
    assert apply_code(built, upstream_dir) == 2
    assert "outside patches/" in capsys.readouterr().err


def _snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["user-dir", "project-root", "git-repo", "file"])
def test_output_the_tool_did_not_publish_is_refused_untouched(built, upstream_dir, tmp_path, capsys, kind):
    """-o pointed at the user's own data (a typo, `-o .`): exit 2, every byte and sibling as it was."""
    if kind == "project-root":
        target = built
    else:
        parent = tmp_path / "home"
        parent.mkdir()
        target = parent / "mine"
        if kind == "file":
            target.write_text("notes\n")
        else:
            target.mkdir()
            (target / "thesis.txt").write_text("four years of work\n")
            if kind == "git-repo":
                git.Repo.init(target)
    before = _snapshot(target) if target.is_dir() else {"": target.read_bytes()}
    siblings = sorted(p.name for p in target.parent.iterdir())
    where = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    assert cli.main(["apply-patches", *where, "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{target} " in err and "did not publish" in err and "nothing was touched" in err
    after = _snapshot(target) if target.is_dir() else {"": target.read_bytes()}
    assert after == before
    assert sorted(p.name for p in target.parent.iterdir()) == siblings  # no lock file, no staging area


def test_output_absent_empty_or_published_before_is_replaced(built, upstream_dir, tmp_path):
    where = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (tmp_path / "absent", empty):
        assert cli.main(["apply-patches", *where, "--output", str(target)]) == 0
        assert (target / ".git" / "vllm-overlay-published").is_file()
    # A tree an earlier run published, twice over (build/patched of the fixture, then again).
    assert cli.main(["apply-patches", *where]) == 0
    assert cli.main(["apply-patches", *where]) == 0


@pytest.mark.parametrize("spelling", ["./demo/core-change-line-20.patch", "demo//core-change-line-20.patch"])
def test_one_patch_under_two_spellings_is_a_duplicate(built, upstream_dir, capsys, spelling):
    before = patched_head(built)
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text() + spelling + "\n")
    assert apply_code(built, upstream_dir) == 2
    assert "listed more than once in series: demo/core-change-line-20.patch" in capsys.readouterr().err
    assert patched_head(built) == before
    assert "demo/core-change-line-20.patch: listed 2 times" in "\n".join(lint.lint(built, built / "patches"))


def test_a_series_saved_with_a_byte_order_mark_reads_as_without(built, upstream_dir):
    series_file = built / "patches" / "series"
    series_file.write_bytes(b"\xef\xbb\xbf" + series_file.read_bytes())
    assert apply_code(built, upstream_dir) == 0
    assert lint.lint(built, built / "patches") == []


@pytest.mark.parametrize("where", ["a-file-as-parent", "a-directory", "unwritable"])
def test_an_unwritable_report_path_is_refused_before_any_work(built, upstream_dir, tmp_path, capsys, where):
    """--json where nothing can be written: exit 2 and one line before the run, not a traceback after it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file\n")
    target = {
        "a-file-as-parent": blocker / "report.json",
        "a-directory": tmp_path,
        "unwritable": Path("/proc/report.json"),
    }[where]
    before = patched_head(built)
    where_args = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    assert cli.main(["apply-patches", *where_args, "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --json ") and "Traceback" not in err
    assert "applying" not in err  # refused before the series was touched
    assert patched_head(built) == before
    assert cli.main(["test-patches", "--project", str(built), "--junit", str(target)]) == 2
    assert capsys.readouterr().err.startswith("error: --junit ")


def test_one_patch_listed_twice_through_a_symlink_is_a_duplicate(built, upstream_dir, capsys):
    """The second listing reverse-applied and was reported as "already-upstream"."""
    before = patched_head(built)
    (built / "patches" / "demo" / "again.patch").symlink_to("core-change-line-20.patch")
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text() + "demo/again.patch\n")
    assert apply_code(built, upstream_dir) == 2
    said = (
        "demo/again.patch: the same file as demo/core-change-line-20.patch, listed before it in series (a link): "
        "the patch would be applied twice"
    )
    assert capsys.readouterr().err == f"error: {said}\n"
    assert patched_head(built) == before
    assert f"patches/{said}" in lint.lint(built, built / "patches")


@pytest.mark.parametrize(
    ("listed", "says"),
    [
        (
            "demo/core-change-line-20\u200b.patch",
            r"'demo/core-change-line-20\u200b.patch' holds U+200B (ZERO WIDTH SPACE)",
        ),
        (
            "demo/\u200fcore-change-line-20.patch",
            r"'demo/\u200fcore-change-line-20.patch' holds U+200F (RIGHT-TO-LEFT MARK)",
        ),
        ("demo/cafe\u0301.patch", r"'demo/cafe\u0301.patch' is not in Unicode NFC form"),
    ],
)
def test_a_name_that_looks_like_another_is_shown_escaped(built, upstream_dir, capsys, listed, says):
    """Before: "listed in series but the file does not exist" named, raw, a file that looks
    identical to one that exists. Such a name is refused where the series is read, shown escaped."""
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text().replace("demo/core-change-line-20.patch", listed))
    before = patched_head(built)
    assert apply_code(built, upstream_dir) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and listed not in err, err
    assert patched_head(built) == before
    assert any(says in line for line in lint.lint(built, built / "patches"))


def test_a_patch_file_whose_name_does_not_show_is_named_escaped_by_lint(built):
    (built / "patches" / "demo" / "caf\u00e9\u200b.patch").write_text("")
    found = lint.lint(built, built / "patches")
    assert r"patches/'demo/caf\xe9\u200b.patch': not listed in series" in found, found
    assert any(r"holds U+200B (ZERO WIDTH SPACE), which does not show" in line for line in found), found
