# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""forward: one signed-off commit on a branch of the upstream, its ported test, the pre-commit report."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.tool.helpers.repos import MAINTAINER, SPDX_HEADER, change_line_20, git, replace_line
from vllm_overlay import cli, forward

PORTED = SPDX_HEADER + "from vllm.core import line_20\n\n\ndef test_line_20():\n    assert line_20 == 200\n"


@pytest.fixture
def identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME whose git configuration names the user (and no system file read)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_CONFIG_GLOBAL", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME"):
        monkeypatch.delenv(name, raising=False)
    (home / ".gitconfig").write_text("[user]\n\tname = Ada Lovelace\n\temail = ada@example.invalid\n")
    return home


def _port_test(project: Path, patch: Path, rel: str = "tests/test_core.py", text: str = PORTED) -> Path:
    series = patch.parent.name
    target = project / "tests" / "patches" / series / "upstream" / patch.stem / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def _forward(project: Path, upstream: Path, patch: Path, *extra: str) -> int:
    spec = f"{patch.parent.name}/{patch.stem}"
    argv = ["forward", "--project", str(project), "--upstream", str(upstream), "--skip-test-run", "--skip-checks"]
    return cli.main([*argv, *extra, spec])


def test_branch_and_signed_off_commit(project, upstream_dir, make_patch, identity):
    patch = make_patch(upstream_dir, change_line_20, "core: fix line 20", series="demo")
    _port_test(project, patch)

    assert _forward(project, upstream_dir, patch) == 0

    tree = project / "build" / "forward" / patch.stem
    assert git(tree, "branch", "--show-current").strip() == f"forward/{patch.stem}"
    assert git(tree, "tag", "--points-at", "HEAD^").strip().startswith("upstream/dir-")  # one commit on upstream
    message = git(tree, "log", "-1", "--format=%B")
    assert message.splitlines()[0] == "[Bugfix] core: fix line 20"
    assert "Why and how." in message and "The change." in message
    assert "Configurations covered" not in message and "Forwarded:" not in message
    assert message.rstrip().splitlines()[-1] == "Signed-off-by: Ada Lovelace <ada@example.invalid>"
    assert git(tree, "log", "-1", "--format=%an <%ae>").strip() == "Ada Lovelace <ada@example.invalid>"
    changed = git(tree, "show", "--name-only", "--format=", "HEAD").split()
    assert sorted(changed) == ["tests/test_core.py", "vllm/core.py"]
    assert "line_20 = 200" in (tree / "vllm" / "core.py").read_text()
    body = (project / "build" / "forward" / f"{patch.stem}.pr.md").read_text()
    for heading in ("## Purpose", "## Test Plan", "## Test Result"):
        assert heading in body
    assert "pytest tests/test_core.py" in body


@pytest.mark.parametrize(
    "user", ["Ada Lovelace <ada@example.invalid>", "test <test@example.invalid>"], ids=["another", "the-maintainer"]
)
def test_the_forwarded_commit_is_signed_off_by_the_user_alone(project, upstream_dir, make_patch, identity, user):
    """The patch's own sign-off (its maintainer's, or a stale one) stays in patches/: the forwarded commit
    carries the user's sign-off once, and the pull request's body none."""
    patch = make_patch(upstream_dir, change_line_20, "core: fix line 20", series="demo")
    signed = f"Signed-off-by: {MAINTAINER}\n"
    replace_line(patch, signed, "Signed-off-by: Former Maintainer <former@example.invalid>\n" + signed)
    _port_test(project, patch)
    name, email = user[:-1].split(" <")
    (identity / ".gitconfig").write_text(f"[user]\n\tname = {name}\n\temail = {email}\n")

    assert _forward(project, upstream_dir, patch) == 0

    message = git(project / "build" / "forward" / patch.stem, "log", "-1", "--format=%B")
    assert [line for line in message.splitlines() if "Signed-off-by" in line] == [f"Signed-off-by: {user}"]
    assert message.rstrip().endswith(f"\n\nSigned-off-by: {user}")
    body = (project / "build" / "forward" / f"{patch.stem}.pr.md").read_text()
    assert "Signed-off-by" not in body and "former@example.invalid" not in body


def test_patches_unchanged_and_tag_from_trailer(project, upstream_dir, make_patch, identity):
    patch = make_patch(upstream_dir, change_line_20, "core: fix line 20", series="demo")
    patch.write_text(patch.read_text().replace("Series: demo\n", "Series: demo\nForward-Tag: [Perf]\n"))
    _port_test(project, patch)
    before = {p: p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}

    assert _forward(project, upstream_dir, patch) == 0

    tree = project / "build" / "forward" / patch.stem
    assert git(tree, "log", "-1", "--format=%s").strip() == "[Perf] core: fix line 20"
    assert {p: p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()} == before


def test_refused_without_identity(project, upstream_dir, make_patch, identity, capsys):
    patch = make_patch(upstream_dir, change_line_20, "core: fix line 20")
    _port_test(project, patch)
    (identity / ".gitconfig").write_text("[user]\n\tname = Ada Lovelace\n")  # no e-mail

    assert _forward(project, upstream_dir, patch) == 2

    err = capsys.readouterr().err
    assert "no git identity to sign off with (user.email unset)" in err
    assert len(err.strip().splitlines()) == 1
    assert not (project / "build" / "forward").exists()


def test_a_patch_that_needs_an_earlier_one_is_refused(project, upstream_dir, make_patch, identity, capsys):
    first = make_patch(upstream_dir, change_line_20, "core: fix line 20")
    second = make_patch(
        upstream_dir,
        lambda tree: replace_line(tree / "vllm" / "core.py", "line_20 = 200\n", "line_20 = 2000\n"),
        "core: fix line 20 again",
    )
    _port_test(project, second)

    assert _forward(project, upstream_dir, second) == 2

    err = capsys.readouterr().err
    assert f"it is made on top of {first.parent.name}/{first.name} (the earlier patch of its series" in err
    assert f"(`scripts/forward demo/{second.stem} --onto forward/{first.stem}`)" in err
    # Refused after the upstream was checked out: nothing of it is left for a next run to replace.
    assert list((project / "build" / "forward").iterdir()) == []


def test_a_patch_made_on_another_series_patch_names_it(project, upstream_dir, make_patch, identity, capsys):
    first, second = _two_stacked(project, upstream_dir, make_patch)

    assert _forward(project, upstream_dir, second) == 2

    err = capsys.readouterr().err
    assert f"it is made on top of routes/{first.name} (the earlier patch of the routes series" in err
    assert f"(`scripts/forward buffers/{second.stem} --onto forward/{first.stem}`)" in err
    assert list((project / "build" / "forward").iterdir()) == []


def _two_stacked(project: Path, upstream_dir: Path, make_patch) -> tuple[Path, Path]:
    """A patch and a second one made on top of it (another series), each with its ported test."""
    first = make_patch(upstream_dir, change_line_20, "core: fix line 20", series="routes")
    second = make_patch(
        upstream_dir,
        lambda tree: replace_line(tree / "vllm" / "core.py", "line_20 = 200\n", "line_20 = 2000\n"),
        "core: share line 20",
        series="buffers",
    )
    _port_test(project, first)
    _port_test(project, second, rel="tests/test_shared.py", text=PORTED.replace("200", "2000"))
    return first, second


def test_stacked_branch_holds_the_earlier_commit_then_its_own(project, upstream_dir, make_patch, identity):
    first, second = _two_stacked(project, upstream_dir, make_patch)
    assert _forward(project, upstream_dir, first) == 0
    earlier_commit = git(project / "build" / "forward" / first.stem, "rev-parse", "HEAD").strip()

    assert _forward(project, upstream_dir, second, "--onto", f"forward/{first.stem}") == 0

    tree = project / "build" / "forward" / second.stem
    assert git(tree, "branch", "--show-current").strip() == f"forward/{second.stem}"
    assert git(tree, "rev-parse", "HEAD^").strip() == earlier_commit
    assert git(tree, "tag", "--points-at", "HEAD~2").strip().startswith("upstream/dir-")
    assert git(tree, "log", "--format=%s", "HEAD~2..HEAD").splitlines() == [
        "[Bugfix] core: share line 20",
        "[Bugfix] core: fix line 20",
    ]
    assert git(tree, "rev-parse", f"forward/{first.stem}").strip() == earlier_commit
    assert git(tree, "remote").strip() == ""
    assert sorted(git(tree, "show", "--name-only", "--format=", "HEAD").split()) == [
        "tests/test_shared.py",
        "vllm/core.py",
    ]
    assert "line_20 = 2000" in (tree / "vllm" / "core.py").read_text()
    body = (project / "build" / "forward" / f"{second.stem}.pr.md").read_text()
    assert f"Depends on forward/{first.stem} ([Bugfix] core: fix line 20)" in body
    assert "pytest tests/test_shared.py\n" in body


def test_onto_a_branch_not_built_is_refused_with_the_command(project, upstream_dir, make_patch, identity, capsys):
    first, second = _two_stacked(project, upstream_dir, make_patch)

    assert _forward(project, upstream_dir, second, "--onto", f"forward/{first.stem}") == 2

    err = capsys.readouterr().err
    assert f"make it first with `scripts/forward routes/{first.stem}`" in err
    assert not (project / "build" / "forward" / second.stem).exists()


@pytest.mark.parametrize("onto", ["later", "unknown"])
def test_onto_must_name_an_earlier_patch(project, upstream_dir, make_patch, identity, capsys, onto):
    first, second = _two_stacked(project, upstream_dir, make_patch)
    name = second.stem if onto == "later" else "no-such-patch"

    assert _forward(project, upstream_dir, first, "--onto", f"forward/{name}") == 2

    err = capsys.readouterr().err
    if onto == "later":
        assert f"--onto forward/{name}: buffers/{second.name} does not come before routes/{first.name}" in err
    else:
        assert "--onto forward/no-such-patch: no patch of patches/series is named no-such-patch" in err


def test_stacked_red_is_measured_on_the_earlier_commit(project, upstream_dir, make_patch, identity, tmp_path):
    """Red on the commit the stacked commit sits on (line 20 is 200 there, not the release's 20),
    green on the stacked commit; the hooks see only the stacked commit's files."""
    import sys

    (upstream_dir / "pyproject.toml").write_text("[project]\nname = 'vllm'\n")  # vLLM's, beside its tests/
    first, second = _two_stacked(project, upstream_dir, make_patch)
    assert _forward(project, upstream_dir, first) == 0
    outcome = forward.forward(
        project,
        f"buffers/{second.stem}",
        upstream=str(upstream_dir),
        test_run=False,
        checks=False,
        onto=f"forward/{first.stem}",
    )
    site = tmp_path / "site"  # the environment's "installed" vllm: the release's
    shutil.copytree(upstream_dir / "vllm", site / "vllm")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} "$@"\n')
    python.chmod(0o755)

    red, green = forward.run_tests(python, outcome.branch, tmp_path / "runs")

    assert red.side == f"forward/{first.stem}"
    assert red.red and green.green, (red.log.read_text(), green.log.read_text())
    assert [line.split(" - ")[-1] for line in red.failures] == ["assert 200 == 2000"]
    assert outcome.branch.files == ("tests/test_shared.py", "vllm/core.py")
    body = forward.pr_body(outcome.branch.onto.patch, outcome.branch, "9.9.9", (red, green), [])
    assert f"Without this change (vLLM 9.9.9 with forward/{first.stem}): `1 failed in" in body


def test_ported_test_must_not_import_the_harness(project, upstream_dir, make_patch, identity, capsys):
    patch = make_patch(upstream_dir, change_line_20, "core: fix line 20")
    (project / "tests" / "patches" / "qwen_harness.py").write_text(SPDX_HEADER)
    _port_test(project, patch, text=SPDX_HEADER + "import qwen_harness\n")

    assert _forward(project, upstream_dir, patch) == 2

    assert "imports qwen_harness, which vLLM lacks" in capsys.readouterr().err


CONFIG = """
default_stages: [pre-commit, manual]
exclude: 'vllm/third_party/.*'
repos:
- repo: https://github.com/astral-sh/ruff-pre-commit
  rev: v0.14.0
  hooks:
  - id: ruff-check
    args: [--fix]
- repo: https://github.com/crate-ci/typos
  rev: v1.43.5
  hooks:
  - id: typos
- repo: https://github.com/DavidAnson/markdownlint-cli2
  rev: v0.21.0
  hooks:
  - id: markdownlint-cli2
- repo: local
  hooks:
  - id: check-spdx-header
    entry: python tools/check_spdx.py
    language: python
    types_or: [python]
  - id: mypy
    entry: python tools/mypy.py "3.11"
    language: python
    types_or: [python, pyi]
    additional_dependencies: ["mypy==1.20.2"]
  - id: signoff-commit
    entry: bash
    language: system
    stages: [commit-msg]
"""


def _tools(ruff: bool, binaries: tuple[str, ...] = ()) -> forward.Tools:
    return forward.Tools(
        python=Path("/usr/bin/python3"),
        ruff=ruff,
        which=lambda name: f"/usr/bin/{name}" if name in binaries else None,
        missing_dependencies=lambda hook: [d for d in hook.additional_dependencies if d.startswith("mypy")],
    )


def _classified(tools: forward.Tools, matched: list[str]) -> dict[str, str]:
    config = forward.load_precommit(CONFIG)
    results = {}
    for hook in config.hooks:
        result = forward.classify(hook, config, matched, tools)
        results[hook.id] = "run" if result is None else f"{result.outcome}: {result.detail}"
    return results


def test_network_hooks_are_skipped_not_passed():
    found = _classified(_tools(ruff=False), ["vllm/core.py"])
    assert found["ruff-check"] == (
        "skipped: needs the network: pre-commit installs it from https://github.com/astral-sh/ruff-pre-commit"
    )
    assert found["typos"].startswith("skipped: needs the network") and "typos is not installed here" in found["typos"]
    assert found["markdownlint-cli2"].startswith("skipped: needs the network")
    assert found["check-spdx-header"] == "run"
    assert found["mypy"] == "skipped: needs mypy==1.20.2, not installed in /usr/bin/python3 (offline)"
    assert found["signoff-commit"] == "skipped: runs at the commit-msg stage, not on files"


def test_installed_tools_run_remote_hooks():
    found = _classified(_tools(ruff=True, binaries=("typos",)), ["vllm/core.py"])
    assert found["ruff-check"] == "run"
    assert found["typos"] == "run"
    assert found["markdownlint-cli2"].startswith("skipped: needs the network")


def test_hooks_with_no_matching_file_are_skipped(tmp_path):
    tree = tmp_path / "tree"
    (tree / "vllm" / "third_party").mkdir(parents=True)
    (tree / "vllm" / "core.py").write_text("x = 1\n")
    (tree / "vllm" / "third_party" / "lib.py").write_text("x = 1\n")
    (tree / "README.md").write_text("# hi\n")
    config = forward.load_precommit(CONFIG)
    spdx = next(h for h in config.hooks if h.id == "check-spdx-header")
    files = ["vllm/core.py", "vllm/third_party/lib.py", "README.md"]

    assert forward.hook_files(spdx, config, tree, files) == ["vllm/core.py"]
    result = forward.classify(spdx, config, forward.hook_files(spdx, config, tree, ["README.md"]), _tools(True))
    assert result == forward.CheckResult(
        "check-spdx-header", "skipped", "no file of the commit matches its files/types"
    )


def test_local_hook_runs_and_fails(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tools").mkdir(parents=True)
    (tree / "vllm").mkdir()
    (tree / "vllm" / "core.py").write_text("x = 1\n")
    (tree / "tools" / "check_spdx.py").write_text(
        "import sys\nbad = [f for f in sys.argv[1:] if 'SPDX' not in open(f).read()]\n"
        "print('missing SPDX:', *bad)\nsys.exit(1 if bad else 0)\n"
    )
    (tree / ".pre-commit-config.yaml").write_text(CONFIG)
    import sys

    tools = forward.Tools(python=Path(sys.executable), ruff=False, which=lambda name: None)
    results = {r.hook: r for r in forward.run_checks(tree, "HEAD", ["vllm/core.py"], tools)}

    assert results["check-spdx-header"].outcome == "failed"
    assert "missing SPDX: vllm/core.py" in results["check-spdx-header"].detail
    assert results["ruff-check"].outcome == "skipped"
    (tree / "vllm" / "core.py").write_text(SPDX_HEADER)
    results = {r.hook: r for r in forward.run_checks(tree, "HEAD", ["vllm/core.py"], tools)}
    assert results["check-spdx-header"] == forward.CheckResult("check-spdx-header", "passed", "1 file(s)")
