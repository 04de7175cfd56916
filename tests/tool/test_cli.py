# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Start-up: a verb's --help imports that verb's argument code alone, none of the heavy libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tool.conftest import REPO_ROOT
from vllm_overlay import cli, envs
from vllm_overlay.commands import test_patches

# Imported only by the work of a verb: GitPython, the SBOM library and its schema validator, the
# test runner, the apply engine, the index reader.
HEAVY = ("git", "cyclonedx", "jsonschema", "vllm_overlay.testrun", "vllm_overlay.apply", "urllib.request", "tqdm")

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
    assert test_patches.ENV_VAR == envs.ENV_VAR
