# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The KV offload oracle's property: what pristine 0.33.0 did with an operation
sequence decides what the patched worker must do with it.

Correct, on either tree, means: no caller waits past the bound; every store's
copy is ordered after its own step's compute (the compute-done record it waited
on is its own step's); every store and every load is reported done exactly
once, none that was never submitted; every load brings back the bytes its store
took; and a sequence that completes drains and loads every stored block back
byte for byte.

- Pristine's failures of that (a store ordered after a later step's compute: the
  shared event; a report lost or doubled; wrong bytes; a hang) are its own: the
  patched tree must be correct there.
- Where the two trees are compared (every operation both ran), the patched tree
  must give each step the same outcome and each preemption flush the same
  outcome (returned, raised and why, or nothing within the bound), taking no
  longer than pristine's flush plus FLUSH_SLACK_S, and, where the copy engine
  was held or lagging at the flush so the state is deterministic, the same
  answer to "was everything submitted before the flush reported done by that
  step". A difference passes only if an entry of oracle-differences.toml of a
  patch in patches/series matches it (operation, backend, pristine's outcome,
  patched's outcome, whether it may take longer, whether the engine stops).

Traces come from qeo_offload_oracle_child.py.
"""

from __future__ import annotations

from typing import Any

# A listed "slower" flush may take up to the flush_timeout_s the sequence configures, plus FLUSH_SLACK_S.
from qeo_offload_oracle_child import FLUSH_TIMEOUT_S

# How much longer than pristine's a flush may take before it is a cost the patch must list.
FLUSH_SLACK_S = 0.2
NOT_RUN = ("skipped",)


def flush_key(flush: dict[str, Any] | None, other: dict[str, Any] | None) -> str | None:
    """A flush's outcome as compared: returned (synced or not, where that is deterministic), error:<class>, hang."""
    if flush is None:
        return None
    if flush["kind"] == "hang":
        return "hang"
    if flush["kind"] == "error":
        return f"error:{flush['class']}"
    if flush.get("held") and (other is None or other.get("held")) and "synced" in flush:
        return "returned-synced" if flush["synced"] else "returned-unsynced"
    return "returned"


def correctness_problems(ops: list[dict[str, Any]], trace: dict[str, Any]) -> list[tuple[str, str]]:
    """Where one tree's run is not correct by itself, as (kind, message); empty: it is."""
    if "outcomes" not in trace:
        return [("run did not finish", f"the run did not finish: {trace}")]
    found: list[tuple[str, str]] = []
    for i, outcome in enumerate(trace["outcomes"]):
        if outcome["kind"] == "hang":
            what = "flush" if outcome.get("flush") else ops[i]["op"]
            found.append((f"{what}: hang", f"op {i} ({ops[i]['op']}): the caller got nothing within the bound"))
    if trace["end"] == "hung":
        found.append(("end: hang", "a caller waited past the bound"))
    for i, store in trace["stores"].items():
        waited = store["waited_on"]
        if waited is not None and waited != [f"op{i}"]:
            found.append(
                (
                    "store: ordered after another step",
                    f"op {i} (store): its copy waited on the compute-done record(s) of {waited}, not op{i}'s",
                )
            )
        if store["reports"] > 1:
            found.append(("store: reported twice", f"op {i} (store): reported done {store['reports']} times"))
        if trace["end"] == "completed" and store["reports"] != 1:
            found.append(("store: never reported", f"op {i} (store): never reported done"))
    if trace["phantom_reports"]:
        found.append(("phantom report", f"reported done but never submitted: {trace['phantom_reports']}"))
    final = trace.get("final")
    if trace["end"] == "completed" and final is not None:
        if not final["drained"]:
            found.append(("end: not drained", "some transfer was never reported done after the drain"))
        bad_loads = [i for i, ok in final["loads_ok"].items() if not ok]
        if bad_loads:
            found.append(("load: wrong bytes", f"loads {bad_loads} brought back bytes their store did not take"))
        bad_back = [i for i, ok in final["readback_ok"].items() if not ok]
        if bad_back:
            found.append(("end: wrong bytes", f"the blocks of stores {bad_back} did not load back byte for byte"))
    return found


def matching_difference(
    backend: str,
    pristine_key: str | None,
    patched_key: str | None,
    slower: bool,
    differences: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """The listed intended difference for a flush whose outcome or duration differs, if any."""
    for entry in differences:
        if entry["op"] != "flush" or entry.get("backend", backend) != backend:
            continue
        if pristine_key not in entry["pristine"] or patched_key != entry["patched"]:
            continue
        if slower and not entry.get("slower", False):
            continue
        return entry
    return None


def judge(
    config: dict[str, Any],
    ops: list[dict[str, Any]],
    pristine: dict[str, Any],
    patched: dict[str, Any],
    differences: list[dict[str, Any]],
) -> list[tuple[str, str]]:
    """Every way the patched run breaks the property, as (kind of break, what happened); empty: it holds."""
    if "outcomes" not in patched:
        return [("patched run did not finish", f"patched: the run did not finish: {patched}")]
    problems = [(kind, f"patched: {message}") for kind, message in correctness_problems(ops, patched)]
    if "outcomes" not in pristine:
        return problems
    backend = config["backend"]
    pristine_ok = not correctness_problems(ops, pristine)
    stopped_legitimately = False
    for i, (p, q) in enumerate(zip(pristine["outcomes"], patched["outcomes"], strict=True)):
        if p["kind"] in NOT_RUN or q["kind"] in NOT_RUN or q["kind"] == "hang":
            continue
        what = f"op {i} ({ops[i]['op']})"
        pf, qf = p.get("flush"), q.get("flush")
        pk, qk = flush_key(pf, qf), flush_key(qf, pf)
        limit = (pf["seconds"] if pf else 0.0) + FLUSH_SLACK_S
        slower = qf is not None and qf["seconds"] > limit
        if pk != qk or slower:
            entry = matching_difference(backend, pk, qk, slower, differences)
            if entry is None or (slower and qf["seconds"] > FLUSH_TIMEOUT_S + FLUSH_SLACK_S):
                took = f"{qf['seconds']:.3f} s" if qf else "-"
                ptook = f"{pf['seconds']:.3f} s" if pf else "-"
                # The kind leaves out how much slower (timing): a replay must raise the same kind.
                kind = f"flush: {qk} where pristine {pk}" if pk != qk else f"flush: slower than pristine's {pk}"
                text = f" ({qf['text']})" if qf and qf.get("text") else ""
                message = f"{what}: flush {qk} in {took}{text}, pristine {pk} in {ptook} ({backend} backend)"
                problems.append((kind, message))
                continue
            if entry.get("stops"):
                stopped_legitimately = True
            continue
        if (p["kind"], p.get("class", "")) != (q["kind"], q.get("class", "")):
            problems.append(
                (
                    f"{ops[i]['op']}: {q['kind']} where pristine gave {p['kind']}",
                    f"{what}: patched {q['kind']} {q.get('class', '')} {q.get('text', '')!r},"
                    f" pristine {p['kind']} {p.get('class', '')} {p.get('text', '')!r}",
                )
            )
            continue
        if q["kind"] == "error":
            stopped_legitimately = True  # the same failure as pristine's: it stops the engine there too
    end, p_end = patched["end"], pristine["end"]
    if end == "stopped" and not stopped_legitimately:
        message = "patched: the engine stopped without pristine's failure or a listed difference"
        problems.append(("end: stopped", message))
    if pristine_ok and p_end == "completed" and end not in ("completed", "hung") and not stopped_legitimately:
        problems.append(("end: stopped", f"patched ended {end!r} where pristine completed correctly"))
    return problems
