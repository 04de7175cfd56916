"""Bad input is refused with exit 2 and a message naming it, before the output is touched."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from tests.tool.helpers import IDENTITY, change_line_20, run_apply
from vllm_overlay import cli, lint


@pytest.fixture
def built(project, make_patch, upstream_dir, store_env):
    """A project whose build/patched holds the applied one-patch series."""
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    return project


def apply_code(project, upstream_dir) -> int:
    where = ["--project", str(project), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    return cli.main(["apply-patches", *where])


def head(project) -> str:
    return git.Repo(project / "build" / "patched").head.commit.hexsha


@pytest.mark.parametrize("text", ["", "# only a comment\n\n   # and another\n"])
def test_empty_series_is_refused_and_output_kept(built, upstream_dir, capsys, text):
    before = head(built)
    (built / "patches" / "series").write_text(text)
    assert apply_code(built, upstream_dir) == 2
    assert "series is empty" in capsys.readouterr().err
    assert head(built) == before
    assert "series is empty" in "\n".join(lint.lint(built, built / "patches"))


def test_empty_patch_file_is_named(built, upstream_dir, capsys):
    (built / "patches" / "demo" / "core-change-line-20.patch").write_bytes(b"")
    assert apply_code(built, upstream_dir) == 2
    assert "patch is empty: demo/core-change-line-20.patch" in capsys.readouterr().err
    assert "patch is empty: demo/core-change-line-20.patch" in "\n".join(lint.lint(built, built / "patches"))


@pytest.mark.parametrize("entry", ["/etc/hostname", "../upstream.lock", "demo/../../upstream.lock"])
def test_series_entries_stay_inside_patches(built, upstream_dir, capsys, entry):
    before = head(built)
    (built / "patches" / "series").write_text(f"{entry}\n")
    assert apply_code(built, upstream_dir) == 2
    assert "outside patches/" in capsys.readouterr().err
    assert head(built) == before
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
    before = head(built)
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text() + spelling + "\n")
    assert apply_code(built, upstream_dir) == 2
    assert "listed more than once in series: demo/core-change-line-20.patch" in capsys.readouterr().err
    assert head(built) == before
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
    before = head(built)
    where_args = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    assert cli.main(["apply-patches", *where_args, "--json", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --json ") and "Traceback" not in err
    assert "applying" not in err  # refused before the series was touched
    assert head(built) == before
    assert cli.main(["test-patches", "--project", str(built), "--junit", str(target)]) == 2
    assert capsys.readouterr().err.startswith("error: --junit ")


def test_unexported_work_in_the_output_is_never_thrown_away(built, upstream_dir, capsys):
    """A commit or an edit made in build/patched and not exported yet: refused until exported or discarded."""
    tree = built / "build" / "patched"
    repo = git.Repo(tree)
    core = tree / "vllm" / "core.py"
    core.write_text(core.read_text().replace("line_30 = 30\n", "line_30 = 300\n"))
    assert apply_code(built, upstream_dir) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes: vllm/core.py" in err and "--discard-unexported" in err
    assert "line_30 = 300" in core.read_text()
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-aqm", "core: change line 30\n\nWhy.\n\nSeries: demo\n")
    made = repo.head.commit.hexsha
    assert apply_code(built, upstream_dir) == 2
    assert "commits not exported to patches/" in capsys.readouterr().err
    assert head(built) == made
    # Exported: the work is in patches/ now, so the tree may be replaced (and gets it back from there).
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(built)]) == 0
    assert apply_code(built, upstream_dir) == 0
    assert "line_30 = 300" in core.read_text()


def test_discard_unexported_replaces_the_output_on_purpose(built, upstream_dir):
    tree = built / "build" / "patched"
    (tree / "scratch.txt").write_text("throw me away\n")
    where = ["--project", str(built), "--upstream", str(upstream_dir), "--base-upstream", str(upstream_dir)]
    assert cli.main(["apply-patches", *where]) == 2
    assert cli.main(["apply-patches", *where, "--discard-unexported"]) == 0
    assert not (tree / "scratch.txt").exists()


def test_a_tree_whose_commits_were_exported_is_replaced_after_patches_change(built, upstream_dir):
    """Rebased and exported, then patches/ moves on (a pull): the tree's work is in patches/, so no refusal."""
    tree = built / "build" / "patched"
    repo = git.Repo(tree)
    with repo.git.custom_environment(**IDENTITY):
        repo.git.commit("-q", "--amend", "-m", repo.head.commit.message.replace("Why and how.", "Why, and how."))
    assert cli.main(["export-patches", "--allow-other-upstream", "--project", str(built)]) == 0
    patch = built / "patches" / "demo" / "core-change-line-20.patch"
    patch.write_bytes(patch.read_bytes().replace(b"Why, and how.", b"Why, and how (pulled)."))
    assert apply_code(built, upstream_dir) == 0


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
print("held", flush=True)
import time
time.sleep(600)  # until the test ends it
"""


def _cache_lock_holder(store_env: Path):
    """Another process holding the cache's lock, as another run of the tool would (its pid written in it)."""
    import subprocess
    import sys

    store_env.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(store_env / ".lock")], stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"held\n"
    return holder


def _finish_within(process, seconds: float) -> tuple[int, str] | None:
    """The forked run's exit code and stderr, or None (it is killed) when it still runs after ``seconds``."""
    import os
    import signal
    import time

    deadline = time.monotonic() + seconds
    while True:
        pid, status = os.waitpid(process.pid, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status), process.stderr.read()
        if time.monotonic() > deadline:
            os.kill(process.pid, signal.SIGKILL)
            os.waitpid(process.pid, 0)
            return None
        time.sleep(0.05)


def test_no_wait_does_not_wait_for_the_cache_lock(project, make_patch, upstream_dir, store_env):
    """Issue 51 item 6: --no-wait while another run held the cache's lock waited silently (40 s and on)."""
    from tests.tool.helpers import Forked

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    holder = _cache_lock_holder(store_env)
    try:
        up = str(upstream_dir)
        argv = ["apply-patches", "--project", str(project), "--upstream", up, "--base-upstream", up, "--no-wait"]
        done = _finish_within(Forked(argv), 20)
    finally:
        holder.kill()  # the other run ends (a pipe to it would be inherited by the forked run: not that)
        holder.wait()
    assert done is not None, "apply-patches --no-wait was still waiting for the cache's lock after 20 s"
    code, err = done
    assert code == 2, err
    assert err == (
        f"error: the cache {store_env} is in use by pid {holder.pid} (its lock .lock); "
        "try again when that run is done (--no-wait gave up instead of waiting)\n"
    )
    assert not (project / "build").exists()


def test_a_wait_for_the_cache_lock_is_said_once(project, make_patch, upstream_dir, store_env):
    import time

    from tests.tool.helpers import Forked

    make_patch(upstream_dir, change_line_20, "core: change line 20")
    holder = _cache_lock_holder(store_env)
    try:
        up = str(upstream_dir)
        process = Forked(["apply-patches", "--project", str(project), "--upstream", up, "--base-upstream", up])
        time.sleep(2)
        assert os.waitpid(process.pid, os.WNOHANG)[0] == 0  # still waiting
    finally:
        holder.kill()  # the other run ends: this one goes on
        holder.wait()
    done = _finish_within(process, 60)
    assert done is not None
    code, err = done
    assert code == 0, err
    said = f"waiting for pid {holder.pid}, which holds the cache's lock {store_env / '.lock'}"
    assert err.count(said) == 1, err


def test_one_patch_listed_twice_through_a_symlink_is_a_duplicate(built, upstream_dir, capsys):
    """Issue 51 item 9: the second listing reverse-applied and was reported as "already-upstream"."""
    before = head(built)
    (built / "patches" / "demo" / "again.patch").symlink_to("core-change-line-20.patch")
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text() + "demo/again.patch\n")
    assert apply_code(built, upstream_dir) == 2
    said = (
        "demo/again.patch: the same file as demo/core-change-line-20.patch, listed before it in series (a link): "
        "the patch would be applied twice"
    )
    assert capsys.readouterr().err == f"error: {said}\n"
    assert head(built) == before
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
    """Issue 51 item 9: "listed in series but the file does not exist" named, raw, a file that looks
    identical to one that exists. Such a name is refused where the series is read, shown escaped."""
    series_file = built / "patches" / "series"
    series_file.write_text(series_file.read_text().replace("demo/core-change-line-20.patch", listed))
    before = head(built)
    assert apply_code(built, upstream_dir) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and listed not in err, err
    assert head(built) == before
    assert any(says in line for line in lint.lint(built, built / "patches"))


def test_a_patch_file_whose_name_does_not_show_is_named_escaped_by_lint(built):
    (built / "patches" / "demo" / "caf\u00e9\u200b.patch").write_text("")
    found = lint.lint(built, built / "patches")
    assert r"patches/'demo/caf\xe9\u200b.patch': not listed in series" in found, found
    assert any(r"holds U+200B (ZERO WIDTH SPACE), which does not show" in line for line in found), found
