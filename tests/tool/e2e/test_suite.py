"""The suite's results table: the runtimes side by side."""

from __future__ import annotations

from vllm_overlay.e2e import scenarios, suite


def test_results_table_puts_runtimes_side_by_side():
    outcome = suite.Outcome(series_sha256="abc")
    outcome.results["pristine"] = [scenarios.Result("completions", True, "4 clients", 0.1)]
    outcome.results["patched"] = [scenarios.Result("completions", False, "1 error", 0.2)]
    outcome.steps["runtime"] = 2.5
    table = suite.render(outcome)
    assert "| completions | ok 0.1s: 4 clients | FAIL 0.2s: 1 error |" in table
    assert "| runtime | 2.5 |" in table
    assert not outcome.ok
