# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The executor oracle's property: what pristine 0.33.0 did decides what the
patched runtime must do with the same operation sequence.

- Where pristine is healthy (every result delivered to its own caller, every
  error to its own caller, nothing hung, the executor usable at the end), the
  patched runtime must give every operation the same outcome and end the same
  way, except where a difference listed in oracle-differences.toml matches.
- Where pristine hangs, misroutes or loses a reply, the patched runtime must
  still be correct: no caller waits past the bound, every outcome is the
  operation's own (or a listed difference), and it is usable at the end
  unless a failed model step stopped the engine.

Traces come from qeo_oracle_child.py; each outcome names the operations whose
token its result or error text carries, so "which caller got it" is exact.
"""

from __future__ import annotations

from typing import Any

NOT_RUN = ("skipped", "abandoned")


def relation(i: int, named: list[int], ops: list[dict[str, Any]]) -> str:
    """Whose result or failure outcome ``named`` reports, relative to operation ``i``."""
    names = set(named)
    if names == {i}:
        return "own"
    if not names:
        return "unnamed"
    if all(j > i for j in names):
        side = "later"
    elif all(j < i for j in names):
        side = "earlier"
    else:
        return "mixed"
    kinds = {ops[j]["op"] for j in names}
    return f"{side}-{kinds.pop()}" if len(kinds) == 1 else f"{side}-mixed"


def is_own(i: int, outcome: dict[str, Any], ops: list[dict[str, Any]]) -> bool:
    """The operation's own result or error (an unnamed failure counts if the operation failed somewhere)."""
    kind = outcome["kind"]
    if kind in ("none", *NOT_RUN):
        return True
    if outcome.get("after_shutdown") and kind == "error" and outcome["class"] == "cancelled":
        return True  # shut down while it waited: 0.33.0's RuntimeError("cancelled")
    rel = relation(i, outcome["ops"], ops)
    if kind == "result":
        return rel == "own"
    if kind == "error":
        return rel == "own" or (rel == "unnamed" and bool(ops[i].get("fail")) and outcome["class"] != "timeout")
    return False


def final_healthy(trace: dict[str, Any]) -> bool:
    """After a completed sequence, a model step and a collective RPC both get their own replies."""
    final = trace.get("final") or {}
    return all(final.get(k, {}).get("kind") == "result" and not final[k]["ops"] for k in ("step", "rpc"))


def pristine_problems(ops: list[dict[str, Any]], trace: dict[str, Any]) -> list[str]:
    """Why pristine's run is not healthy (empty: it is)."""
    if "outcomes" not in trace:
        return [f"the run did not finish: {trace}"]
    found = [
        f"op {i} ({ops[i]['op']}): {o['kind']} {o.get('class', '')} {o['text']!r}"
        for i, o in enumerate(trace["outcomes"])
        if not is_own(i, o, ops)
    ]
    if trace["end"] == "hung":
        found.append("a caller waited past the bound")
    if trace["end"] == "completed" and not final_healthy(trace):
        found.append(f"not usable at the end: {trace['final']}")
    return found


def matching_difference(
    i: int,
    ops: list[dict[str, Any]],
    config: dict[str, Any],
    pristine: dict[str, Any],
    patched: dict[str, Any],
    differences: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """The listed intended difference that explains operation ``i``'s patched outcome, if any."""
    rel = relation(i, patched["ops"], ops)
    if rel == "unnamed" and ops[i].get("fail"):
        rel = "own"
    for entry in differences:
        if entry["op"] not in ("any", ops[i]["op"]):
            continue
        if pristine["kind"] not in entry["pristine"] or patched["kind"] != entry["patched"]:
            continue
        if entry.get("cause", rel) != rel:
            continue
        if "fault_tolerance" in entry and entry["fault_tolerance"] != config["fault_tolerance"]:
            continue
        return entry
    return None


def final_stop_listed(
    config: dict[str, Any],
    ops: list[dict[str, Any]],
    pristine: dict[str, Any],
    patched: dict[str, Any],
    differences: list[dict[str, Any]],
) -> bool:
    """Whether the end-of-sequence model step failed as a listed difference that stops the engine.

    The check's step is one more operation after the sequence: a failure the patched tree reports
    late (with the next RPC, as a listed difference says) lands on it; the engine stops there, so
    the check's RPC after it is not judged.
    """
    step = patched["final"]["step"]
    if step["kind"] != "error":
        return False
    check = [*ops, {"op": "step"}]
    p_final = (pristine.get("final") or {}).get("step") or {"kind": "result", "ops": []}
    entry = matching_difference(len(ops), check, config, p_final, step, differences)
    return entry is not None and bool(entry.get("stops"))


def normal(i: int, outcome: dict[str, Any], ops: list[dict[str, Any]]) -> tuple[str, str, str]:
    rel = relation(i, outcome["ops"], ops)
    if outcome["kind"] == "result":
        return ("result", outcome["text"], rel)
    return (outcome["kind"], outcome.get("class", ""), rel)


def judge(
    config: dict[str, Any],
    ops: list[dict[str, Any]],
    pristine: dict[str, Any],
    patched: dict[str, Any],
    differences: list[dict[str, Any]],
) -> list[tuple[str, str]]:
    """Every way the patched run breaks the property, as (kind of break, what happened); empty: it holds.

    The kind names the operation, the patched outcome and whose it is (e.g.
    "step: error (earlier-rpc) where pristine gave result"), so distinct
    defects stay apart while hypothesis shrinks each.
    """
    if "outcomes" not in patched:
        return [("patched run did not finish", f"patched: the run did not finish: {patched}")]
    healthy = not pristine_problems(ops, pristine)
    p_out = pristine["outcomes"] if "outcomes" in pristine else [{"kind": "skipped", "ops": []}] * len(ops)
    q_out = patched["outcomes"]
    problems: list[tuple[str, str]] = []
    stopped_legitimately = False
    for i, (p, q) in enumerate(zip(p_out, q_out, strict=True)):
        what = f"op {i} ({ops[i]['op']})"
        if q["kind"] == "hang":
            problems.append((f"{ops[i]['op']}: hang", f"{what}: the patched caller got nothing within the bound"))
            continue
        if q["kind"] in NOT_RUN:
            if healthy and p["kind"] not in NOT_RUN and not stopped_legitimately:
                message = f"{what}: never completed on patched ({q['kind']}), pristine gave {p['kind']}"
                problems.append((f"{ops[i]['op']}: not run", message))
            continue
        entry = None
        own = is_own(i, q, ops)
        same = p["kind"] in NOT_RUN or q.get("after_shutdown") or normal(i, p, ops) == normal(i, q, ops)
        if not own or (healthy and not same):
            entry = matching_difference(i, ops, config, p, q, differences)
            if entry is None:
                rel = relation(i, q["ops"], ops)
                problems.append(
                    (
                        f"{ops[i]['op']}: {q['kind']} ({rel}) where pristine gave {p['kind']}",
                        f"{what}: patched {q['kind']} {q.get('class', '')} {q['text']!r} ({rel}),"
                        f" pristine {p['kind']} {p.get('class', '')} {p.get('text', '')!r}",
                    )
                )
                continue
        if ops[i]["op"] == "step" and q["kind"] == "error":
            # A failed model step stops the engine; so does a listed difference that says so.
            if own or (entry and entry.get("stops")):
                stopped_legitimately = True
    end = patched["end"]
    if end == "hung":
        problems.append(("end: hang", "patched: a caller waited past the bound"))
    if (
        end == "completed"
        and not final_healthy(patched)
        and not final_stop_listed(config, ops, pristine, patched, differences)
    ):
        problems.append(("end: unusable", f"patched: not usable at the end: {patched['final']}"))
    if end == "stopped" and not stopped_legitimately:
        message = "patched: the engine stopped without a failed model step of its own or a listed difference"
        problems.append(("end: stopped", message))
    if patched["is_failed"] and end != "stopped" and end != "shutdown":
        problems.append(("end: failed", "patched: the executor is marked failed although no model step failed"))
    if healthy and pristine["end"] == "completed" and end != "completed" and not stopped_legitimately:
        problems.append(("end: stopped", f"patched ended {end!r} where pristine completed and stayed usable"))
    return problems
