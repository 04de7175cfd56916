# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""forward's exit codes: 0 only for a red -> green test and no failed check; 1 says which went wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_overlay import cli, forward


def _outcome(pristine_exit: int, forwarded_exit: int, check: str) -> forward.Outcome:
    branch = forward.ForwardBranch(Path("t"), "forward/p", "b" * 40, "c" * 40, "[Core] p", "m", (), ())
    runs = (
        forward.TestRun("pristine", pristine_exit, "pristine summary", (), Path("log")),
        forward.TestRun("forwarded", forwarded_exit, "forwarded summary", (), Path("log")),
    )
    return forward.Outcome(branch, runs, [forward.CheckResult("ruff-check", check)], Path("p.pr.md"))


@pytest.mark.parametrize(
    ("pristine_exit", "forwarded_exit", "check", "code", "said"),
    [
        (1, 0, "passed", 0, ""),
        (1, 0, "skipped", 0, ""),
        (0, 0, "passed", 1, "not red -> green: pristine pristine summary; forwarded forwarded summary"),
        (1, 0, "failed", 1, "pre-commit check(s) failed: ruff-check"),
    ],
)
def test_exit_code(monkeypatch, capsys, pristine_exit, forwarded_exit, check, code, said):
    monkeypatch.setattr(forward, "forward", lambda *a, **k: _outcome(pristine_exit, forwarded_exit, check))

    assert cli.main(["forward", "demo/p"]) == code

    assert said in capsys.readouterr().err
