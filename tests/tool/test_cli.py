# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Start-up: a verb's --help imports that verb's argument code alone, none of the heavy libraries."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.tool.helpers.cli import verb_help
from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay import cli
from vllm_overlay.commands import patch_tests
from vllm_overlay.env import testenv

# Imported only by the work of a verb: GitPython, the SBOM library and its schema validator, the
# test runner, the apply engine, the index reader.
HEAVY = (
    "git",
    "cyclonedx",
    "jsonschema",
    "vllm_overlay.testrun",
    "vllm_overlay.apply.engine",
    "urllib.request",
    "tqdm",
)

PROBE = """
import sys
from vllm_overlay.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = [name for name in sys.argv[0].split(",") if name in sys.modules]
print("heavy imports:", ",".join(heavy))
"""


@pytest.mark.parametrize("verb", [*cli.VERBS, None])
def test_help_imports_nothing_heavy(verb):
    argv = [verb, "--help"] if verb else ["--help"]
    out = subprocess.run(
        [sys.executable, "-c", PROBE.replace("sys.argv[0]", repr(",".join(HEAVY))), *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[-1] == "heavy imports: ", f"{verb} --help: {out.stdout.splitlines()[-1]}"
    assert "usage:" in out.stdout


def test_the_help_of_the_verb_run_is_its_full_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["apply-patches", "--help"])
    text = capsys.readouterr().out
    assert "--allow-offset" in text and "--rebuild" in text and "Exit codes" in text


def test_test_patches_names_the_environment_variable_envs_reads():
    assert patch_tests.ENV_VAR == testenv.ENV_VAR


def test_every_input_error_of_every_verb_ends_in_one_line_and_exit_2(tmp_path, capsys):
    """One error path: a verb raises its input error, cli.main says it in one line and exits 2."""
    from vllm_overlay import errors, report, series
    from vllm_overlay.apply import engine as apply
    from vllm_overlay.apply import export, staging
    from vllm_overlay.e2e import container, layout
    from vllm_overlay.image import build_context, engine
    from vllm_overlay.upstream import lock
    from vllm_overlay.upstream import trees as upstream_trees

    families = [
        lock.LockError,
        series.SeriesError,
        upstream_trees.SourceError,
        build_context.ImageError,
        apply.ApplyError,
    ]
    families += [export.ExportError, testenv.EnvError, engine.EngineError, report.ReportPathError]
    families += [staging.OutputBusy, staging.OutputNotOurs, container.ContainerError, layout.LayoutError]
    assert all(issubclass(family, errors.InputError) for family in families)
    (tmp_path / "upstream.lock").write_text("this is not TOML [\n")
    code = cli.main(["apply-patches", "--project", str(tmp_path), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _imported_modules(source: str, module: str) -> set[str]:
    """Every module ``source`` (vllm_overlay.commands.<module>) imports, at any depth, names included."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package vllm_overlay.commands (level 1) or above
                parent = ["vllm_overlay", "commands", module][: -node.level]
                base = ".".join([*parent, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_no_command_imports_the_dispatcher_or_another_command():
    """Verbs call library functions with typed arguments, never each other or cli (through argv)."""
    commands = REPO_ROOT / "vllm_overlay" / "commands"
    verbs = {path.stem for path in commands.glob("*.py") if path.stem != "__init__"}
    offending = set()
    for path in sorted(commands.glob("*.py")):
        for name in _imported_modules(path.read_text(encoding="utf-8"), path.stem):
            if name == "vllm_overlay.cli" or name.startswith("vllm_overlay.cli."):
                offending.add((path.stem, "cli"))
            parts = name.split(".")
            if parts[:2] == ["vllm_overlay", "commands"] and len(parts) > 2 and parts[2] in verbs - {path.stem}:
                offending.add((path.stem, parts[2]))
    assert offending == set(), sorted(offending)


def test_every_verbs_help_says_its_exit_codes(capsys):
    missing = [verb for verb in cli.VERBS if "Exit codes" not in verb_help(verb, capsys)]
    assert missing == []


def _readme_verb_table() -> list[str]:
    """The scripts the rows of README's "Verbs" table name, in table order."""
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    section = lines[lines.index("## Verbs") + 1 :]
    section = section[: next(n for n, line in enumerate(section) if line.startswith("## "))]
    rows = [line for line in section if line.startswith("| `scripts/")]
    return [row.split("`")[1].split()[0].removeprefix("scripts/") for row in rows]


def test_the_readme_has_one_verb_row_per_user_facing_script_and_every_verb():
    """A newcomer finds every command in one table: each executable in scripts/ once, every verb of the CLI."""
    scripts = {p.name for p in (REPO_ROOT / "scripts").iterdir() if p.is_file() and p.stat().st_mode & 0o111}
    named = _readme_verb_table()
    assert sorted(named) == sorted(set(named)), "a script has two rows"
    assert set(named) == scripts
    assert set(cli.VERBS) <= set(named)


@pytest.mark.parametrize("verb", sorted(cli.VERBS))
def test_every_verb_exits_2_on_a_bad_argument_and_0_on_its_help(verb, capsys):
    """The exit codes every verb's --help states: 2 for usage, 0 for --help itself (argparse's own)."""
    with pytest.raises(SystemExit) as refused:
        cli.main([verb, "--no-such-option"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm-overlay") and "error: " in err  # argparse's: the usage, then the problem
    assert verb_help(verb, capsys).startswith(f"usage: vllm-overlay {verb} ")
