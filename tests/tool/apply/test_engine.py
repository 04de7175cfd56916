"""apply-patches: one status per patch, strict acceptance, nothing half-applied."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import git
import pytest

from tests.tool.helpers.apply_runs import run_apply, statuses
from tests.tool.helpers.repos import MAINTAINER, change_line_20, replace_line, write_upstream
from vllm_overlay import cli, series
from vllm_overlay import git as gitcmd
from vllm_overlay.apply import engine as apply


def variant(tmp_path: Path, name: str, edit) -> Path:
    tree = write_upstream(tmp_path / name)
    edit(tree)
    return tree


def test_clean_apply_builds_one_commit_per_patch(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")
    code, report = run_apply(project, upstream_dir)
    assert code == 0
    assert statuses(report) == ["clean", "clean"]
    repo = git.Repo(project / "build" / "patched")
    subjects = [c.summary for c in repo.iter_commits()]
    assert subjects[:2] == ["b", "core: change line 20"]
    assert len(subjects) == 3  # upstream + two patches
    assert "line_20 = 200" in (project / "build" / "patched" / "vllm" / "core.py").read_text()
    assert any(t.name.startswith("upstream/") for t in repo.tags)


def test_same_series_gives_same_commit_ids(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    run_apply(project, upstream_dir)
    first = git.Repo(project / "build" / "patched").head.commit.hexsha
    run_apply(project, upstream_dir)
    assert git.Repo(project / "build" / "patched").head.commit.hexsha == first


def test_offset_is_refused_unless_allowed(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    shifted = variant(
        tmp_path,
        "shifted",
        lambda t: (t / "vllm" / "core.py").write_text(
            "extra_1 = 1\nextra_2 = 2\n" + (t / "vllm" / "core.py").read_text()
        ),
    )
    code, report = run_apply(project, shifted)
    assert code == 1 and statuses(report) == ["offset"]
    assert report["patches"][0]["hunks"][0]["note"] == "offset +2"
    assert not (project / "build" / "patched").exists()
    code, report = run_apply(project, shifted, "--allow-offset")
    assert code == 0 and statuses(report) == ["offset"]


def test_merged_3way_when_context_changed(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    drifted = variant(tmp_path, "drifted", lambda t: replace_line(t / "vllm" / "core.py", "line_17 = 17\n", "x = 17\n"))
    code, report = run_apply(project, drifted, base=upstream_dir)
    assert code == 1 and statuses(report) == ["merged-3way"]
    code, report = run_apply(project, drifted, "--3way", base=upstream_dir)
    assert code == 0 and statuses(report) == ["merged-3way"]
    text = (project / "build" / "patched" / "vllm" / "core.py").read_text()
    assert "x = 17\n" in text and "line_20 = 200\n" in text


def test_fuzz_when_no_3way_base_is_known(project, make_patch, tmp_path, store_env):
    # The patch is made on a tree that is never imported, so no 3-way merge can be built.
    private = write_upstream(tmp_path / "private")
    make_patch(private, change_line_20, "core: change line 20")
    drifted = variant(tmp_path, "drifted", lambda t: replace_line(t / "vllm" / "core.py", "line_17 = 17\n", "x = 17\n"))
    code, report = run_apply(project, drifted, "--3way")
    assert code == 1 and statuses(report) == ["fuzz"]
    assert "context reduced" in report["patches"][0]["hunks"][0]["note"]
    code, report = run_apply(project, drifted, "--allow-fuzz")
    assert code == 0


def test_conflict_names_the_hunk(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    run_apply(project, upstream_dir)
    clash = variant(
        tmp_path, "clash", lambda t: replace_line(t / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 21\n")
    )
    code, report = run_apply(project, clash, "--3way", "--allow-fuzz", "--allow-offset")
    assert code == 1 and statuses(report) == ["conflict"]
    hunk = report["patches"][0]["hunks"][0]
    assert hunk["file"] == "vllm/core.py" and hunk["hunk"] == 1 and hunk["note"] == "does not apply"


def test_already_upstream(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    merged = variant(tmp_path, "merged", change_line_20)
    code, report = run_apply(project, merged)
    assert code == 1 and statuses(report) == ["already-upstream"]


def test_target_missing(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    gone = variant(tmp_path, "gone", lambda t: (t / "vllm" / "core.py").unlink())
    code, report = run_apply(project, gone)
    assert code == 1 and statuses(report) == ["target-missing"]
    assert report["patches"][0]["hunks"][0]["file"] == "vllm/core.py"


def test_failed_run_leaves_previous_output_untouched(project, make_patch, upstream_dir, store_env, tmp_path):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    assert run_apply(project, upstream_dir)[0] == 0
    output = project / "build" / "patched"
    before = git.Repo(output).head.commit.hexsha
    clash = variant(
        tmp_path, "clash", lambda t: replace_line(t / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 21\n")
    )
    assert run_apply(project, clash)[0] == 1
    assert git.Repo(output).head.commit.hexsha == before
    assert "line_20 = 200" in (output / "vllm" / "core.py").read_text()
    assert not list(output.parent.glob(".patched.staging-*"))


def test_rerun_after_interrupted_run_starts_clean(project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, change_line_20, "core: change line 20")
    stale = project / "build" / ".patched.staging-99999"
    stale.mkdir(parents=True)
    (stale / "half-written").write_text("x")
    assert run_apply(project, upstream_dir)[0] == 0
    assert not stale.exists()


def test_unsafe_path_is_refused_before_anything_applies(project, make_patch, upstream_dir, store_env):
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    path.write_text(
        path.read_text().replace("a/vllm/core.py", "a/../outside.py").replace("b/vllm/core.py", "b/../outside.py")
    )
    code = cli.main(["apply-patches", "--project", str(project), "--upstream", str(upstream_dir)])
    assert code == 2
    assert not (project / "build" / "patched").exists()


def test_accepts_matrix():
    strict = apply.Options()
    assert strict.accepts(apply.Status.CLEAN)
    refused = [s for s in apply.Status if s is not apply.Status.CLEAN]
    assert not any(strict.accepts(s) for s in refused)
    wide = apply.Options(allow_offset=True, allow_fuzz=True, three_way=True)
    assert not wide.accepts(apply.Status.CONFLICT)
    assert not wide.accepts(apply.Status.ALREADY_UPSTREAM)
    assert not wide.accepts(apply.Status.TARGET_MISSING)


@pytest.fixture(autouse=True)
def _cleanup_build(project):
    yield
    shutil.rmtree(project / "build", ignore_errors=True)


def test_patches_committed_together_get_the_statuses_notes_and_commits_of_one_at_a_time(
    project, make_patch, upstream_dir, store_env, tmp_path, monkeypatch
):
    """A stretch of patches that apply in turn is decided on a private index and committed by one
    ``git am`` per author: the report and the commits must be those of one patch at a time."""

    def change(line: int):
        return lambda t: replace_line(t / "vllm" / "core.py", f"line_{line} = {line}\n", f"line_{line} = {line}0\n")

    made = [make_patch(upstream_dir, change(line), f"core: change line {line}") for line in (5, 10, 15, 20, 25, 30, 35)]
    third = made[2].read_text()
    made[2].write_text(re.sub(r"^From: .*$", "From: Other Author <other@example.invalid>", third, count=1, flags=re.M))
    made[4].write_text(made[4].read_text().replace("-line_25 = 25", "-line_25 = 99"))  # conflicts
    sixth = made[5].read_text()
    trailers = sixth[sixth.index("Description: ") : sixth.index("\n---\n")]
    made[5].write_text(sixth.replace(trailers, "No trailer block in this message."))  # committed alone, amended
    shifted = variant(
        tmp_path,
        "shifted",
        lambda t: (t / "vllm" / "core.py").write_text(
            "extra_1 = 1\nextra_2 = 2\n" + (t / "vllm" / "core.py").read_text()
        ),
    )
    runs: list[int] = []
    real_commit_run = apply.commit_run
    monkeypatch.setattr(apply, "commit_run", lambda *a: (runs.append(len(a[1])), real_commit_run(*a))[1])
    together = run_apply(project, shifted, "--allow-offset", "--output", str(tmp_path / "together"), base=upstream_dir)
    assert runs == [4, 1]  # 1-4 (two authors), then 7; 5 conflicts and 6 has no trailers: one at a time
    monkeypatch.setattr(apply, "_clean_run", lambda *args: [])
    alone = run_apply(project, shifted, "--allow-offset", "--output", str(tmp_path / "alone"), base=upstream_dir)
    assert statuses(together[1]) == ["offset", "offset", "offset", "offset", "conflict", "offset", "offset"]
    assert together[0] == alone[0] == 1
    for mine, reference in zip(together[1]["patches"], alone[1]["patches"], strict=True):
        assert mine == reference
    offsets = [[h["note"] for h in p["hunks"]] for p in together[1]["patches"] if p["status"] == "offset"]
    assert offsets == [["offset +2"]] * 6


def test_one_git_apply_of_a_stretch_gives_each_patch_its_own_hunk_notes(
    project, make_patch, store_env, tmp_path, monkeypatch
):
    """The stretch is checked by one ``git apply`` of all its mails; each patch's notes must be the
    ones of its own mail (two files, offsets in one and not the other, a clean patch in between)."""
    other = "".join(f"other_{i} = {i}\n" for i in range(1, 41))
    upstream = write_upstream(tmp_path / "upstream-two-files", extra={"vllm/other.py": other})

    def edit(*changes: tuple[str, int]):
        def apply_changes(tree: Path) -> None:
            for stem, line in changes:
                name = "core" if stem == "line" else "other"
                replace_line(tree / "vllm" / f"{name}.py", f"{stem}_{line} = {line}\n", f"{stem}_{line} = {line}0\n")

        return apply_changes

    make_patch(upstream, edit(("line", 5), ("other", 20)), "two files, the second shifted")
    make_patch(
        upstream,
        edit(
            ("line", 20),
        ),
        "core below the shift",
    )
    make_patch(
        upstream,
        edit(
            ("line", 3),
        ),
        "core above the shift",
    )
    make_patch(upstream, edit(("line", 30), ("other", 30)), "both shifted")

    def shift(tree: Path) -> None:
        replace_line(tree / "vllm" / "core.py", "line_10 = 10\n", "line_10 = 10\nextra_1 = 1\nextra_2 = 2\n")
        (tree / "vllm" / "other.py").write_text("top_1 = 1\ntop_2 = 2\ntop_3 = 3\n" + other)

    shifted = variant(
        tmp_path, "shifted-two-files", lambda t: (write_upstream(t, extra={"vllm/other.py": other}), shift(t))
    )

    def not_in_turn(*args):
        raise AssertionError("the stretch applied together: no patch is checked alone")

    with monkeypatch.context() as patched:  # undoes its own change alone (the test's cache stays set)
        patched.setattr(apply, "_apply_cached_in_turn", not_in_turn)
        together = run_apply(project, shifted, "--allow-offset", "--output", str(tmp_path / "together"), base=upstream)
    monkeypatch.setattr(apply, "_clean_run", lambda *args: [])
    alone = run_apply(project, shifted, "--allow-offset", "--output", str(tmp_path / "alone"), base=upstream)
    notes = [[str(h["file"]) + " " + h["note"] for h in p["hunks"]] for p in together[1]["patches"]]
    assert notes == [
        ["vllm/other.py offset +3"],
        ["vllm/core.py offset +2"],
        [],
        ["vllm/core.py offset +2", "vllm/other.py offset +3"],
    ]
    assert statuses(together[1]) == ["offset", "offset", "clean", "offset"]
    assert together[0] == alone[0] == 0
    assert together[1]["patches"] == alone[1]["patches"]


def test_headers_are_read_as_git_am_reads_them(project, make_patch, upstream_dir, store_env):
    """An encoded author name and a folded subject: the report, the author and the committer of the
    commit all say what git am read (git mailinfo decodes and unfolds; the mail's bytes do not)."""
    path = make_patch(upstream_dir, change_line_20, "core: change line 20")
    text = path.read_text()
    text = re.sub(r"^From: .*$", "From: =?UTF-8?q?J=C3=B6rg=20Test?= <jt@example.invalid>", text, count=1, flags=re.M)
    text = text.replace("Subject: [PATCH] core: change line 20", "Subject: [PATCH] core: change\n line 20", 1)
    path.write_text(text)
    (patch,) = series.load_series(project / "patches")
    assert (patch.subject, patch.author) == ("core: change line 20", "Jörg Test <jt@example.invalid>")
    code, report = run_apply(project, upstream_dir)
    assert code == 0 and report["patches"][0]["subject"] == "core: change line 20"
    commit = git.Repo(project / "build" / "patched").head.commit
    assert commit.summary == "core: change line 20"
    assert commit.author.name == commit.committer.name == "Jörg Test"
    assert commit.committed_datetime == commit.authored_datetime


def test_the_patch_file_trailers_of_a_stretch_are_the_ones_git_adds_to_each_mail_alone(
    make_patch, upstream_dir, tmp_path, monkeypatch
):
    """One ``interpret-trailers`` for a stretch gives each copy the bytes git gives that mail alone:
    among them a mail whose last trailer is already its own ``Patch-File`` (git adds none) and one
    whose last is another patch's (git adds one)."""
    made = make_patch(upstream_dir, change_line_20, "core: change line 20")
    raw = made.read_bytes()
    last = f"Signed-off-by: {MAINTAINER}\n".encode()  # the made patch's last trailer
    own = raw.replace(last, last + b"Patch-File: demo/p1.patch\n")
    other = raw.replace(last, last + b"Patch-File: demo/elsewhere.patch\n")
    patches = [series.Patch(path=made, name=f"demo/p{n}.patch", raw=r) for n, r in enumerate((raw, own, other, raw))]
    series.parse_all_trailers(patches)
    (tmp_path / "alone").mkdir()
    (tmp_path / "together").mkdir()
    alone = [
        apply._mail_with_trailer(tmp_path, patch, mail)
        for patch, mail in zip(patches, apply.write_mails(patches, tmp_path / "alone"), strict=True)
    ]
    mails = apply.write_mails(patches, tmp_path / "together")
    started: list[tuple[str, ...]] = []
    real_git = gitcmd.git

    def counted(tree: Path, *args: str, **kwargs: object) -> str:
        started.append(args)
        return real_git(tree, *args, **kwargs)

    monkeypatch.setattr(gitcmd, "git", counted)
    together = apply._mails_with_trailer(tmp_path, patches, mails)
    assert [mail.read_bytes() for mail in together] == [mail.read_bytes() for mail in alone]
    assert [args[0] for args in started] == ["interpret-trailers"] * 3  # p0 and p3 together, p1 and p2 alone
    assert alone[1].read_bytes().count(b"Patch-File: demo/p1.patch\n") == 1
    assert b"Patch-File: demo/elsewhere.patch\nPatch-File: demo/p2.patch\n" in alone[2].read_bytes()
