# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A first apply on a staging tree narrowed to what the series touches: the same result as a whole checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import apply_json, run_apply, statuses
from tests.tool.helpers.repos import SPDX_HEADER, replace_line, reword, symlinked_upstream, write_upstream
from vllm_overlay import cli, series
from vllm_overlay.apply import narrow

EXTRA = {f"vllm/untouched/module_{i}.py": f"value = {i}\n" for i in range(6)}


def _files(tree: Path) -> set[str]:
    return {
        str(path.relative_to(tree))
        for path in tree.rglob("*")
        if ".git" not in path.relative_to(tree).parts and (path.is_file() or path.is_symlink())
    }


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=False).stdout


def _edits(tree: Path) -> None:
    replace_line(tree / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 200\n")
    (tree / "vllm" / "added").mkdir()
    (tree / "vllm" / "added" / "new.py").write_text(SPDX_HEADER + "x = 1\n")


@pytest.fixture
def seen_before_widening(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The files of each staging tree as the widening finds it, before the series is applied (the
    real widening starts after)."""
    seen: list[set[str]] = []
    real_start = narrow.start_widening

    def start_widening(tree: Path, owner_fd: int | None = None) -> narrow.Widening | None:
        seen.append(_files(tree))
        return real_start(tree, owner_fd)

    monkeypatch.setattr(narrow, "start_widening", start_widening)
    return seen


def test_a_first_apply_checks_out_the_touched_files_alone_and_publishes_the_whole_tree(
    project, make_patch, store_env, tmp_path, seen_before_widening, monkeypatch
):
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    make_patch(upstream, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "b")

    code, report = run_apply(project, upstream, "--output", str(tmp_path / "narrowed"))
    assert code == 0 and statuses(report) == ["clean", "clean"]
    assert seen_before_widening == [{"vllm/core.py"}]  # the module the series adds: not yet

    monkeypatch.setattr(narrow, "touched_paths", lambda patches: None)  # the whole checkout, as before
    code, report = run_apply(project, upstream, "--output", str(tmp_path / "whole"), "--rebuild")
    assert code == 0 and statuses(report) == ["clean", "clean"]
    assert len(seen_before_widening) == 2 and len(seen_before_widening[1]) > 1 + len(EXTRA)

    narrowed, whole = tmp_path / "narrowed", tmp_path / "whole"
    assert _git(narrowed, "rev-parse", "HEAD") == _git(whole, "rev-parse", "HEAD")
    assert _files(narrowed) == _files(whole) >= {f"vllm/untouched/module_{i}.py" for i in range(6)}
    for name in _files(whole):
        assert (narrowed / name).read_bytes() == (whole / name).read_bytes(), name
    # A plain clone: nothing skipped, no sparse setting or pattern, nothing changed since the build.
    assert {line[:2] for line in _git(narrowed, "ls-files", "-t").splitlines()} == {"H "}
    settings = "^(core.sparsecheckout|core.splitindex|sparse.|include.)"  # cone too
    assert _git(narrowed, "config", "--get-regexp", settings) == ""
    assert not (narrowed / ".git" / "info" / "sparse-checkout").exists()
    left = {path.name for path in (narrowed / ".git").glob("vllm-overlay-*")}
    assert left == {"vllm-overlay-applied.json", "vllm-overlay-published"}  # the record; nothing of the narrowing
    assert _git(narrowed, "status", "--porcelain", "--ignored") == ""


def test_the_patches_after_a_kept_build_are_applied_on_their_files_alone(
    project, make_patch, store_env, tmp_path, seen_before_widening, monkeypatch
):
    """A new output whose kept build shares all but the last patch: the clone of the kept build is
    narrowed to the last patch's files, and the result is the build from upstream's."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    last = make_patch(upstream, lambda t: (t / "vllm" / "untouched" / "module_0.py").write_text("value = 10\n"), "b")
    assert apply_json(project, upstream, tmp_path / "first")["code"] == 0
    reword(last, "Reworded.")
    seen_before_widening.clear()
    result = apply_json(project, upstream, tmp_path / "second")
    assert result["code"] == 0 and [p["status"] for p in result["patches"]] == ["clean", "clean"]
    assert seen_before_widening == [{"vllm/untouched/module_0.py"}]

    monkeypatch.setattr(narrow, "touched_paths", lambda patches: None)
    reference = apply_json(project, upstream, tmp_path / "reference", "--rebuild")
    second = tmp_path / "second"
    assert [p["commit"] for p in result["patches"]] == [p["commit"] for p in reference["patches"]]
    assert _files(second) == _files(tmp_path / "reference")
    assert (second / "vllm" / "added" / "new.py").is_file()  # the kept build's own patch, widened in
    assert {line[:2] for line in _git(second, "ls-files", "-t").splitlines()} == {"H "}
    assert _git(second, "status", "--porcelain", "--ignored") == ""
    assert not (second / ".git" / "info" / "sparse-checkout").exists()


def _entries_without_stat_data(tree: Path) -> list[str]:
    """Index entries git would read and hash again at the next ``git status``: no mtime recorded, or
    a size other than the file's (git's mark for an entry it could not date apart from the index)."""
    stale, name = [], ""
    for line in _git(tree, "ls-files", "--debug").splitlines():
        field = line.strip()
        if not line.startswith(" "):
            name = line
        elif field == "mtime: 0:0" or (
            field.startswith("size: ") and int(field.split()[1]) != (tree / name).stat().st_size
        ):
            stale.append(name)
    return sorted(set(stale))


def _narrowed_and_whole(project: Path, upstream: Path, tmp_path: Path, monkeypatch, patches: int) -> tuple[Path, Path]:
    """The series applied clean into ``narrowed`` as the engine narrows, and into ``whole`` checked
    out whole, as before the narrowing (``touched_paths`` answering None)."""
    code, report = run_apply(project, upstream, "--output", str(tmp_path / "narrowed"))
    assert code == 0 and statuses(report) == ["clean"] * patches
    monkeypatch.setattr(narrow, "touched_paths", lambda patches: None)  # the whole checkout, as before
    code, report = run_apply(project, upstream, "--output", str(tmp_path / "whole"), "--rebuild")
    assert code == 0 and statuses(report) == ["clean"] * patches
    return tmp_path / "narrowed", tmp_path / "whole"


def test_deleted_and_replaced_paths_are_widened_as_on_a_whole_checkout(
    project, make_patch, store_env, tmp_path, monkeypatch
):
    """A series that deletes a file and turns another into a directory: the touched paths are written
    from HEAD at the finish, every other file keeps the stat data its writer recorded."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)

    def delete_and_replace(tree: Path) -> None:
        (tree / "vllm" / "untouched" / "module_0.py").unlink()
        (tree / "vllm" / "untouched" / "module_1.py").unlink()
        (tree / "vllm" / "untouched" / "module_1.py").mkdir()
        (tree / "vllm" / "untouched" / "module_1.py" / "inner.py").write_text("inner = 1\n")

    make_patch(upstream, delete_and_replace, "untouched: drop module 0, make module 1 a package")
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    narrowed, whole = _narrowed_and_whole(project, upstream, tmp_path, monkeypatch, 2)
    assert _git(narrowed, "rev-parse", "HEAD") == _git(whole, "rev-parse", "HEAD")
    assert _files(narrowed) == _files(whole)
    assert "vllm/untouched/module_0.py" not in _files(narrowed)
    assert (narrowed / "vllm" / "untouched" / "module_1.py" / "inner.py").read_text() == "inner = 1\n"
    assert _entries_without_stat_data(narrowed) == []
    assert _git(narrowed, "status", "--porcelain", "--ignored") == ""


def test_the_index_is_split_while_narrowed_and_whole_once_published(
    project, make_patch, store_env, tmp_path, monkeypatch
):
    """The series' check and ``git am`` write the entries that changed (a split index), the published
    tree's index is whole, every entry in it, and no shared index file is left in its git directory."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    shared_while_narrowed: list[str] = []
    real_start = narrow.start_widening

    def start_widening(tree: Path, owner_fd: int | None = None) -> narrow.Widening | None:
        shared_while_narrowed.append(_git(tree, "rev-parse", "--shared-index-path").strip())
        return real_start(tree, owner_fd)

    monkeypatch.setattr(narrow, "start_widening", start_widening)
    out = tmp_path / "out"
    code, report = run_apply(project, upstream, "--output", str(out))
    assert code == 0 and statuses(report) == ["clean"]
    assert len(shared_while_narrowed) == 1 and "sharedindex." in shared_while_narrowed[0]
    assert _git(out, "rev-parse", "--shared-index-path") == ""
    assert list((out / ".git").glob("sharedindex.*")) == []
    assert len(_git(out, "ls-files").splitlines()) == len(_files(out))
    assert _git(out, "status", "--porcelain", "--ignored") == ""


def test_a_patch_beyond_an_upstream_symlink_is_refused_as_on_a_whole_checkout(
    project, make_patch, store_env, tmp_path, monkeypatch, capsys
):
    """A link on a patched path's way leads git's checks and the tool's beyond the touched files (to
    the link's target): such a tree is checked out whole, and the patch is refused exactly as there."""
    base, linked = symlinked_upstream(tmp_path, make_patch)
    narrowed_or_not: list[bool] = []
    real_narrow = narrow.narrow

    def recording_narrow(*args):
        narrowed_or_not.append(real_narrow(*args))
        return narrowed_or_not[-1]

    monkeypatch.setattr(narrow, "narrow", recording_narrow)
    where = ["--project", str(project), "--upstream", str(linked), "--base-upstream", str(base), "--3way"]

    capsys.readouterr()
    code = cli.main(["apply-patches", *where, "--output", str(tmp_path / "narrowed")])
    refusal = capsys.readouterr().err
    monkeypatch.setattr(narrow, "touched_paths", lambda patches: None)
    code_whole = cli.main(["apply-patches", *where, "--output", str(tmp_path / "whole")])
    refusal_whole = capsys.readouterr().err
    assert code == code_whole == 2
    why = "vllm/plugins/hook.py: lies beyond vllm/plugins, a symlink in the tree"
    assert why in refusal and why in refusal_whole
    assert not (tmp_path / "narrowed").exists() and not (tmp_path / "whole").exists()
    assert narrowed_or_not == [False]  # checked out whole


def _patch(path: str) -> series.Patch:
    text = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: test <test@example.invalid>\nDate: Sun, 29 Nov 2026 00:00:00 +0000\nSubject: [PATCH] x\n\n"
        f"Why.\n---\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    )
    return series.parse_patch_bytes(text.encode(), Path("x"), "demo/x.patch")


def test_paths_a_pattern_would_read_otherwise_leave_the_checkout_whole():
    assert narrow.touched_paths([_patch("vllm/core.py"), _patch("vllm/a-b_c.py")]) == ["vllm/core.py", "vllm/a-b_c.py"]
    for odd in ("vllm/a b.py", "vllm/*.py", "vllm/[ab].py", "vllm/!x.py", "vllm/#x.py", "vllm/a?.py"):
        assert narrow.touched_paths([_patch("vllm/core.py"), _patch(odd)]) is None, odd
    assert narrow.touched_paths([_patch("../outside.py")]) is None  # refused later, on a whole checkout
    assert narrow.touched_paths([]) is None


def test_files_the_writer_failed_to_write_are_written_before_publishing(
    project, make_patch, store_env, tmp_path, monkeypatch
):
    """The writer of the untouched files writes nothing (it fails at once): the last step of the
    widening writes every file it left out, and the tree is whole and clean."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    real_popen = subprocess.Popen
    writers: list[subprocess.Popen] = []

    def failing_writer(argv, **kwargs):  # the writer fails; every other git process runs as it is
        if "checkout-index" not in argv:
            return real_popen(argv, **kwargs)
        writers.append(real_popen(["git", "checkout-index", "--no-such-option"], **kwargs))
        return writers[-1]

    monkeypatch.setattr(subprocess, "Popen", failing_writer)
    code, report = run_apply(project, upstream, "--output", str(tmp_path / "out"))
    assert code == 0 and statuses(report) == ["clean"]
    assert len(writers) == 1 and writers[0].returncode == 129  # git's answer to an unknown option
    out = tmp_path / "out"
    assert _files(out) >= {f"vllm/untouched/module_{i}.py" for i in range(6)} | {"vllm/added/new.py"}
    assert (out / "vllm" / "untouched" / "module_3.py").read_text() == "value = 3\n"
    assert _git(out, "status", "--porcelain", "--ignored") == ""


def test_the_writer_is_stopped_when_the_series_fails(project, make_patch, store_env, tmp_path, monkeypatch):
    """A run that fails while the untouched files are being written stops their writer before its
    staging tree is removed (nothing keeps writing into a removed tree)."""
    from vllm_overlay.apply import engine as apply

    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    started: list[narrow.Widening | None] = []
    real_start = narrow.start_widening

    def start_widening(tree: Path, owner_fd: int | None = None) -> narrow.Widening | None:
        started.append(real_start(tree, owner_fd))
        return started[-1]

    def failing_series(*args, **kwargs):
        raise RuntimeError("the series failed")

    monkeypatch.setattr(narrow, "start_widening", start_widening)
    monkeypatch.setattr(apply, "_apply_each", failing_series)
    with pytest.raises(RuntimeError, match="the series failed"):
        run_apply(project, upstream, "--output", str(tmp_path / "out"))
    assert len(started) == 1 and started[0] is not None
    assert started[0].process.returncode is not None  # waited for: it no longer runs
    assert not (tmp_path / "out").exists()


def test_a_series_that_touches_every_file_leaves_the_writer_nothing_and_the_tree_whole(
    project, make_patch, store_env, tmp_path
):
    """No file is left to the writer (git writes no private index for no entries): the tree is still
    the series' last commit, clean, and a plain clone."""
    upstream = write_upstream(tmp_path / "up")

    def every_file(tree: Path) -> None:
        replace_line(tree / "vllm" / "core.py", "line_20 = 20\n", "line_20 = 200\n")
        (tree / "vllm" / "__init__.py").write_text("# the package\n")
        with open(tree / "vllm" / "_version.py", "a") as version:
            version.write("# patched\n")

    make_patch(upstream, every_file, "core: touch every file")
    out = tmp_path / "out"
    code, report = run_apply(project, upstream, "--output", str(out))
    assert code == 0 and statuses(report) == ["clean"]
    assert _files(out) == {"vllm/__init__.py", "vllm/_version.py", "vllm/core.py"}
    assert (out / "vllm" / "__init__.py").read_text() == "# the package\n"
    assert {line[:2] for line in _git(out, "ls-files", "-t").splitlines()} == {"H "}
    assert _git(out, "status", "--porcelain", "--ignored") == ""


def test_a_touched_file_git_converts_is_recorded_as_its_blob_not_as_hashed_again(
    project, make_patch, store_env, tmp_path, monkeypatch
):
    """A patch adds a file with CRLF line ends, a later one gives it the ``text`` attribute: its blob
    keeps the CRs and its file is written as the blob, but hashing the file again (as ``update-index``
    would) strips them. The finish reads such a file's entry from HEAD: the index is HEAD's, as on a
    whole checkout."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    notes = make_patch(upstream, lambda tree: (tree / "notes.txt").write_text("one\ntwo\n"), "notes: add CRLF notes")
    notes.write_bytes(notes.read_bytes().replace(b"+one\n+two\n", b"+one\r\n+two\r\n"))  # as a mail keeps them
    make_patch(upstream, lambda tree: (tree / ".gitattributes").write_text("*.txt text\n"), "attributes: text notes")
    narrowed, whole = _narrowed_and_whole(project, upstream, tmp_path, monkeypatch, 2)
    assert _git(narrowed, "rev-parse", "HEAD") == _git(whole, "rev-parse", "HEAD")
    assert (narrowed / "notes.txt").read_bytes() == b"one\r\ntwo\r\n"
    assert _git(narrowed, "ls-files", "--stage") == _git(whole, "ls-files", "--stage")
    assert _git(narrowed, "diff", "--cached", "--name-only") == ""


def test_converted_names_the_attributes_that_change_a_file_against_its_blob(tmp_path):
    """``converted`` answers from ``git check-attr``: set or valued conversions count; unset and
    unspecified ones, and attributes that convert nothing (``diff``), do not."""
    tree = tmp_path / "tree"
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitattributes").write_text("*.crlf eol=crlf\n*.id ident\n*.bin -text\n*.py diff=python\n")
    assert narrow.converted(tree, ["a.crlf"]) and narrow.converted(tree, ["b.py", "c.id"])
    assert not narrow.converted(tree, ["b.py", "d.bin", "e.txt"])


def test_the_objects_the_series_adds_are_written_stored_and_the_published_config_is_gits_default(
    project, make_patch, store_env, tmp_path
):
    """While narrowed, the loose objects the check and ``git am`` write are not deflated (the cache
    reads them all again to keep the build): each file is at least its object's size. The setting
    goes with the narrowing."""
    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    out = tmp_path / "out"
    code, report = run_apply(project, upstream, "--output", str(out))
    assert code == 0 and statuses(report) == ["clean"]
    added = _git(out, "rev-list", "--objects", "--no-object-names", "HEAD^..HEAD").split()
    assert len(added) >= 3  # the commit, its trees, the new and changed blobs
    for name in added:
        loose = out / ".git" / "objects" / name[:2] / name[2:]
        assert loose.stat().st_size >= int(_git(out, "cat-file", "-s", name)), name
    assert _git(out, "config", "--get", "core.looseCompression") == ""


def test_a_first_apply_publishes_an_index_git_need_not_check_again(project, make_patch, store_env, tmp_path):
    """Every entry dated before the index (none racily clean: git 2.39 compares them to the second)
    and a cache tree (TREE), so the first ``git status`` hashes no file and walks no tree of HEAD's;
    the tree is the one a whole checkout gives."""
    import git

    upstream = write_upstream(tmp_path / "up", extra=EXTRA)
    make_patch(upstream, _edits, "core: change line 20 and add a module")
    output = tmp_path / "fresh"
    assert run_apply(project, upstream, "--output", str(output))[0] == 0
    index_second = int((output / ".git" / "index").stat().st_mtime)
    index = git.IndexFile(git.Repo(output))
    racily_clean = [path for (path, _stage), entry in index.entries.items() if entry.mtime[0] >= index_second]
    assert racily_clean == []
    assert index._extension_data[:4] == b"TREE"  # git writes the cache tree as the first extension
    assert _git(output, "write-tree") == _git(output, "rev-parse", "HEAD^{tree}")
    replace_line(output / "vllm" / "core.py", "line_21 = 21\n", "line_21 = 22\n")  # same size, right away
    assert _git(output, "status", "--porcelain") == " M vllm/core.py\n"
