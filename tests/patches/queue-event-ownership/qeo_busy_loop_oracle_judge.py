# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The busy-loop oracle's property: what pristine 0.33.0's engine core did with
an operation sequence decides what the patched one must do with it.

Correct, on either tree, means, per caller: every request not aborted gets
max_tokens tokens (the fake model samples 7) and finish reason "length" (a
shutdown may cut it short: a prefix); an aborted one gets a prefix of that;
every utility call answers its own caller (reset_prefix_cache, is_sleeping and
a plain collective_rpc with a result; collective_rpc raising in the worker and
a missing method with their own error; a held collective_rpc with its result
once released) within the bound; and a sequence without shutdown ends with the
engine alive (a request and a utility call after it complete).

- Where pristine is correct, the patched tree must give every caller the same
  outcome (the same tokens and finish reason, the same utility result or error
  class and text) and end the same way.
- Where pristine is not, the patched tree must still be correct.
- Progress (patched only, pristine has none): a difference only if an entry
  of oracle-differences.toml of a patch in patches/series lists it (op
  "progress"), within that entry's bounds: the check says stalled only while a
  step or utility call has been held for longer than the timeout, and says so
  at the latest detect_slack_s after timeout plus one report interval; an idle
  engine sends its frontend at most idle_reports reports per idle period.

Traces come from qeo_busy_loop_oracle_child.py.
"""

from __future__ import annotations

from typing import Any

from qeo_busy_loop_oracle_child import TIMEOUT_S

# The report interval the patch uses for TIMEOUT_S (progress_report_interval_s).
INTERVAL_S = min(1.0, max(0.01, TIMEOUT_S / 4))
# Start of the bracket before the executor sees its held step (scheduling), and a
# report's delivery: how early a stall may be reported, how late it may linger.
EARLY_S = 0.1
LINGER_S = INTERVAL_S + 0.3
# An idle period's first part, while the last step's reports and the idle report go out.
IDLE_SETTLE_S = 2 * INTERVAL_S + 0.05

NO_REQUEST = {"tokens": [], "max_tokens": 2, "aborted": False, "finish": None}
EXPECTED_UTILITY = {
    "reset_prefix_cache": ("result", None),
    "is_sleeping": ("result", None),
    "collective_rpc": ("result", None),
    "collective_rpc_raises": ("error", "boom util"),
    "no_such_method": ("error", "no_such_utility_method"),
}


def utility_problem(op: dict[str, Any], outcome: dict[str, Any]) -> str | None:
    if op["op"] == "hold" and op["what"] == "utility":
        want, text = "result", None
    else:
        want, text = EXPECTED_UTILITY[op["call"]]
    if outcome["kind"] != want:
        return f"{outcome['kind']} where its caller should get a {want}: {outcome}"
    if text is not None and text not in outcome.get("text", ""):
        return f"an error that is not its own: {outcome}"
    return None


def request_problem(rid: str, r: dict[str, Any], cut_short: bool) -> str | None:
    full = [7] * r["max_tokens"]
    tokens = r["tokens"]
    if r["aborted"] or cut_short:
        if tokens != full[: len(tokens)]:
            return f"{rid}: tokens {tokens} are not a prefix of {full}"
        return None
    if tokens != full or r["finish"] != "length":
        return f"{rid}: got {tokens} finish {r['finish']}, should get {full} finish length"
    return None


def correctness_problems(ops: list[dict[str, Any]], trace: dict[str, Any]) -> list[tuple[str, str]]:
    """Where one tree's run is not correct by itself, as (kind, message); empty: it is."""
    if "outcomes" not in trace:
        return [("run did not finish", f"the run did not finish: {str(trace)[:2000]}")]
    found: list[tuple[str, str]] = []
    for i, outcome in enumerate(trace["outcomes"]):
        op = ops[i]
        if op["op"] == "utility" or (op["op"] == "hold" and op["what"] == "utility"):
            problem = utility_problem(op, outcome)
            if problem:
                what = op.get("call", "held collective_rpc")
                found.append((f"utility {outcome['kind']}", f"op {i} ({what}): {problem}"))
    cut_short = trace["end"] == "shutdown"
    for rid, r in trace["requests"].items():
        problem = request_problem(rid, r, cut_short)
        if problem:
            found.append(("request output", problem))
    if not cut_short:
        final = trace["final"]
        if (
            request_problem("final request", final.get("request", NO_REQUEST), False)
            or final.get("utility", {}).get("kind") != "result"
            or final.get("engine_dead")
        ):
            message = f"the engine did not serve a request and a utility call at the end: {final}"
            found.append(("not alive at the end", message))
    return found


def same_outcome(op: dict[str, Any], p: dict[str, Any], q: dict[str, Any]) -> bool:
    keys = ("kind", "value", "class", "text")
    if op.get("call") == "reset_prefix_cache":
        # False while a request still holds blocks: whether one does when the
        # call arrives is timing, on either tree.
        keys = ("kind", "class", "text")
    return all(p.get(k) == q.get(k) for k in keys)


def progress_entry(differences: list[dict[str, Any]]) -> dict[str, Any] | None:
    for entry in differences:
        if entry["op"] == "progress" and "absent" in entry["pristine"] and entry["patched"] == "reports":
            return entry
    return None


def progress_problems(trace: dict[str, Any], entry: dict[str, Any]) -> list[tuple[str, str]]:
    """The patched progress check against the bounds of its listed difference."""
    found: list[tuple[str, str]] = []
    holds = trace["holds"]
    slack = entry["detect_slack_s"]
    t0 = trace["t0"]
    for t, stalled, seconds, stuck_in in trace["progress"]["samples"]:
        stuck = [h for h in holds if h[1] <= t - TIMEOUT_S + EARLY_S and h[2] >= t - LINGER_S]
        must = [h for h in holds if h[1] <= t - TIMEOUT_S - INTERVAL_S - slack and h[2] >= t + 0.02]
        if stalled and not stuck:
            message = f"at {t - t0:.2f} s the check said stalled ({seconds} s, {stuck_in!r}); held: {rel(holds, t0)}"
            found.append(("stalled while not stuck", message))
            break
        if must and not stalled:
            what = must[0][0]
            found.append(
                (
                    f"not stalled while a {what} is held",
                    f"at {t - t0:.2f} s the check said not stalled ({seconds} s, {stuck_in!r}) while a {what}"
                    f" had been held for {t - must[0][1]:.2f} s (timeout {TIMEOUT_S} s); held: {rel(holds, t0)}",
                )
            )
            break
    if trace.get("sample_error"):
        found.append(("progress check raised", f"the progress check raised: {trace['sample_error']}"))
    reports = trace["progress"]["reports"]
    for start, end in trace["idle_windows"]:
        n = sum(1 for t, _ in reports if start + IDLE_SETTLE_S <= t <= end)
        if n > entry["idle_reports"]:
            found.append(
                (
                    "idle engine sends reports",
                    f"an idle engine sent its frontend {n} progress reports in {end - start - IDLE_SETTLE_S:.2f} s "
                    f"(from {start - t0:.2f} s; at most {entry['idle_reports']} per idle period)",
                )
            )
            break
    return found


def rel(holds: list, t0: float) -> list:
    return [[what, round(a - t0, 2), round(b - t0, 2)] for what, a, b in holds]


def judge(
    config: dict[str, Any],
    ops: list[dict[str, Any]],
    pristine: dict[str, Any],
    patched: dict[str, Any],
    differences: list[dict[str, Any]],
) -> list[tuple[str, str]]:
    """Everything the patched trace does that pristine's does not allow, as (kind, message)."""
    if "outcomes" not in patched:
        return [("patched run did not finish", f"patched: {str(patched)[:2000]}")]
    p_problems = correctness_problems(ops, pristine)
    problems = [(kind, "patched: " + message) for kind, message in correctness_problems(ops, patched)]
    if not p_problems:
        for i, (p, q) in enumerate(zip(pristine["outcomes"], patched["outcomes"], strict=False)):
            if not same_outcome(ops[i], p, q):
                kind = f"{ops[i]['op']}: {q['kind']} where pristine gave {p['kind']}"
                problems.append((kind, f"op {i} ({ops[i]}): patched {q}, pristine {p}"))
        p_n, q_n = len(pristine["outcomes"]), len(patched["outcomes"])
        if p_n != q_n or pristine["end"] != patched["end"]:
            message = f"patched ended {patched['end']} after {q_n} ops, pristine {pristine['end']} after {p_n}"
            problems.append(("end", message))
        if patched["end"] != "shutdown":
            for rid, p in pristine["requests"].items():
                q = patched["requests"].get(rid)
                # An abort that raced the request's last step: either outcome is correct.
                if q is not None and (p["aborted"] or q["aborted"]):
                    continue
                if q is None or ((q["tokens"], q["finish"]) != (p["tokens"], p["finish"])):
                    problems.append(("request output", f"{rid}: patched {q}, pristine {p}"))
    if patched.get("progress") is not None:
        entry = progress_entry(differences)
        if entry is None:
            message = "patched sends progress reports, and no patch of the series lists them"
            problems.append(("progress not listed", message))
        else:
            problems += progress_problems(patched, entry)
    if pristine.get("progress") is not None:
        message = "the pristine side has an engine progress view: is the shadow applied to it?"
        problems.append(("pristine progress", message))
    return problems
