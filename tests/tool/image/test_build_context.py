"""The image's build context: one layer per series with only its files, the manifest, reproducibility, refusals."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.tool.helpers.apply_runs import apply_no_patches, run_apply
from tests.tool.helpers.images import do_stage
from tests.tool.helpers.repos import REPO_ROOT, replace_line, tree_files, two_series, users_files, write_upstream
from vllm_overlay.image import build_context


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest.update(f"{path.relative_to(root)} {stat.st_mode:o} {int(stat.st_mtime)}\n".encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_one_layer_per_series_with_only_its_files(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project)
    layers = context.root / "layers"
    assert sorted(p.name for p in layers.iterdir()) == ["01-alpha", "02-beta"]
    files = {p.relative_to(layers).as_posix() for p in layers.rglob("*") if p.is_file()}
    assert files == {"01-alpha/vllm/core.py", "01-alpha/vllm/added.py", "02-beta/vllm/core.py"}
    # each layer holds the file as it stands after its series
    assert "line_5 = 50\n" in (layers / "01-alpha/vllm/core.py").read_text()
    assert "line_9 = 9\n" in (layers / "01-alpha/vllm/core.py").read_text()
    assert "line_9 = 90\n" in (layers / "02-beta/vllm/core.py").read_text()
    final = (layers / "02-beta/vllm/core.py").read_bytes()
    manifest = json.loads((context.root / "overlay/vllm_overlay_status/manifest.json").read_text())
    assert manifest["files"] == {
        "vllm/added.py": hashlib.sha256(b"ADDED = 1\n").hexdigest(),
        "vllm/core.py": hashlib.sha256(final).hexdigest(),
    }
    assert [s["name"] for s in manifest["series"]] == ["alpha", "beta"]
    patch = manifest["series"][0]["patches"][0]
    assert patch["sha256"] == hashlib.sha256((image_project / "patches" / patch["name"]).read_bytes()).hexdigest()
    assert {f["path"]: f["change"] for f in manifest["series"][0]["files"]} == {
        "vllm/core.py": "modified",
        "vllm/added.py": "added",
    }
    assert manifest["unshipped"] == [{"path": "docs.md", "patches": ["alpha/a2.patch"]}]
    assert (context.root / "overlay/vllm_overlay_status/_record.py").read_bytes() == (
        REPO_ROOT / "vllm_overlay/env/record.py"
    ).read_bytes()
    record = (context.root / "overlay/vllm_overlay_status-0.1.0.dist-info/RECORD").read_text()
    assert "vllm_overlay_status/manifest.json,sha256=" in record


def test_staging_is_reproducible(image_project, make_patch, upstream_dir, store_env):
    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0
    first = tree_digest(do_stage(image_project).root)
    second = tree_digest(do_stage(image_project).root)
    assert first == second
    for path in (image_project / "build" / "image").rglob("*"):
        assert int(path.lstat().st_mtime) == 1_700_000_000


def test_stale_tree_is_refused(image_project, make_patch, upstream_dir, store_env):
    path = make_patch(
        upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1"
    )
    assert run_apply(image_project, upstream_dir)[0] == 0
    path.write_text(path.read_text().replace("+line_5 = 50", "+line_5 = 51"))
    with pytest.raises(build_context.ImageError, match="changed after apply-patches"):
        do_stage(image_project)


def test_series_not_applied_is_refused(image_project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1")
    with pytest.raises(build_context.ImageError, match="apply-patches"):
        do_stage(image_project)


def test_deleting_a_file_is_refused(image_project, make_patch, upstream_dir, store_env):
    make_patch(upstream_dir, lambda t: (t / "vllm" / "core.py").unlink(), "drop core")
    assert run_apply(image_project, upstream_dir)[0] == 0
    with pytest.raises(build_context.ImageError, match="cannot delete"):
        do_stage(image_project)


def test_other_upstream_version_is_refused(image_project, make_patch, tmp_path, store_env):
    other = write_upstream(tmp_path / "upstream-other")  # 9.9.9
    make_patch(other, lambda t: replace_line(t / "vllm" / "core.py", "line_5 = 5\n", "line_5 = 50\n"), "a1")
    assert run_apply(image_project, other)[0] == 0
    with pytest.raises(build_context.ImageError, match=r"locked vllm 0\.33\.0"):
        do_stage(image_project)


def test_overlay_may_not_write_into_vllm(image_project, make_patch, upstream_dir, store_env):
    apply_no_patches(image_project, upstream_dir)
    (image_project / "overlay" / "vllm").mkdir()
    (image_project / "overlay" / "vllm" / "x.py").write_text("")
    with pytest.raises(build_context.ImageError, match="never into it"):
        do_stage(image_project)


def test_unusual_file_names_and_a_mode_only_change_stage(image_project, make_patch, upstream_dir, store_env):
    """Names git quotes (a space, a non-ASCII letter) and a mode-only change: staged, not "changed after apply"."""

    def edit(tree: Path) -> None:
        (tree / "vllm" / "with space.py").write_text("SPACED = 1\n")
        (tree / "vllm" / "café.py").write_text("ACCENTED = 1\n")
        (tree / "vllm" / "core.py").chmod(0o755)

    make_patch(upstream_dir, edit, "odd names", "alpha")
    assert run_apply(image_project, upstream_dir)[0] == 0
    context = do_stage(image_project)
    manifest = json.loads((context.root / "overlay/vllm_overlay_status/manifest.json").read_text())
    assert {"vllm/with space.py", "vllm/café.py"} <= set(manifest["files"])
    assert (context.root / "layers" / "01-alpha" / "vllm" / "café.py").read_text() == "ACCENTED = 1\n"


def test_image_staging_never_replaces_a_users_directory(image_project, upstream_dir, store_env):
    apply_no_patches(image_project, upstream_dir)
    context = image_project / "build" / "image"
    before = users_files(context)
    with pytest.raises(build_context.ImageError, match=r"holds notes\.txt, sub.*nothing was touched"):
        do_stage(image_project)
    assert tree_files(context) == before
    (context / "notes.txt").unlink()
    (context / "sub" / "data.bin").unlink()
    (context / "sub").rmdir()
    do_stage(image_project)  # empty: staged
    do_stage(image_project)  # what an earlier stage wrote: replaced
    assert (context / "Dockerfile").is_file()


def test_a_failed_git_call_is_an_image_error_with_gits_message(
    image_project, make_patch, upstream_dir, store_env, monkeypatch
):
    """Reading the patched tree and its layers: git's own message, the command and the tree, as an ImageError."""
    from vllm_overlay import git as gitcmd
    from vllm_overlay.apply import patched_repo

    two_series(make_patch, upstream_dir)
    assert run_apply(image_project, upstream_dir)[0] == 0

    def broken(repo: Path, commit: str) -> list:
        raise gitcmd.GitError(Path(repo), ("diff-tree", commit), 128, b"fatal: bad object\n")

    monkeypatch.setattr(patched_repo, "commit_changes", broken)
    with pytest.raises(build_context.ImageError, match=r"^git diff-tree \w+ in .*patched: fatal: bad object$"):
        do_stage(image_project)
