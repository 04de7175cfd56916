"""The per-patch runner: every patch red -> green, and vLLM's own tests never worse than pristine.

For patch k of the applied series (steps: 0 = pristine upstream, k = patches 1..k applied):

    red        its Tests on step k-1 must FAIL: every Tests file has a failing test
               (a file that passes, errors only, or does not collect is reported as such)
    green      its Tests on step k must PASS (every file: no failure, at least one pass)
    upstream   its Upstream-Tests (vLLM's own tests, copied out of the upstream tree) on step k
               against the pristine baseline, test id by test id: nothing may go from pass or
               skip to fail, error or timeout, and no new failing test may appear

After the last patch, every selected patch's Tests run together on the full series (one pytest
process: no interference), then the tool's own tests.

The rooms, in the order a run goes through them:

    plan.py           which results the run needs (units), which the store holds, the jobs for the rest
    trees.py          the steps: tree ids, shadow packages, upstream-tests roots
    verdict_store.py  results kept under keys made of what decided them (tree, tests, environment)
    execute.py        pytest processes: pool, time limits, stopping
    runner.py         runs a plan's jobs and decides each patch as its results come in
    verdicts.py       pure rules from test outcomes to verdicts (red, green, upstream comparison)
    outcome.py        the per-patch outcome and the run's report (JSON)
    render.py         the table and the JUnit cases
    session.py        one run put together (run_series), and the scripts/test-patches session around it

Each step's patched files are laid over the shared environment's installed vllm by a *shadow
package* (``shadow.build_shadow``) put first on PYTHONPATH; the environment itself is never
written to. vLLM's tests run offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE) with a per-test timeout.
"""

from vllm_overlay.testrun.execute import (
    Config,
    Executor,
    Job,
    base_environment,
    default_jobs,
    tool_test_python,
    workdir_lock,
)
from vllm_overlay.testrun.outcome import PatchOutcome, RunReport, Unit
from vllm_overlay.testrun.render import junit_cases, table
from vllm_overlay.testrun.session import PatchTestOptions, PatchTestResult, run_patch_tests, run_series
from vllm_overlay.testrun.verdicts import (
    Comparison,
    Result,
    Verdict,
    cases_for,
    compare,
    green_verdict,
    parse_specs,
    red_verdict,
)

__all__ = [
    "Comparison",
    "Config",
    "Executor",
    "Job",
    "PatchOutcome",
    "PatchTestOptions",
    "PatchTestResult",
    "Result",
    "RunReport",
    "Unit",
    "Verdict",
    "base_environment",
    "cases_for",
    "compare",
    "default_jobs",
    "green_verdict",
    "junit_cases",
    "parse_specs",
    "red_verdict",
    "run_patch_tests",
    "run_series",
    "table",
    "tool_test_python",
    "workdir_lock",
]
