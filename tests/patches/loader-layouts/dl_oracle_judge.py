# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The draft-loader oracle's property: what pristine 0.33.0 did with a
draft/target configuration decides what the patched loader must do.

- Where pristine refuses the draft, the patched tree refuses it with the same
  error.
- Where pristine starts it, the patched tree starts it with the same weights
  (each of lm_head and embed_tokens from the same place: the target's, the
  checkpoint's, tied, a never-loaded placeholder, absent; post-processed or
  not), the same outputs on the fixed input, the same warning-and-above log
  lines and the same loaded heads and embeddings post-processed and thrown
  away, except where an entry of oracle-differences.toml matches:
  ``refusal`` (patched refuses with the listed error, naming only weights
  pristine left as never-loaded placeholders, only with the configuration
  the entry names), ``log`` (a new line of the listed form, naming only
  such weights), ``discarded`` (a never-loaded placeholder
  pristine post-processed and threw away, which patched does not process).
- What the patch fixes must hold on the patched side whatever pristine did:
  no never-loaded placeholder is post-processed and then thrown away.

Traces come from dl_oracle_child.py.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

WEIGHTS = ("lm_head", "embed_tokens")
# The names the patched messages give the weights.
MESSAGE_NAMES = {"lm_head": "lm_head", "model.embed_tokens": "embed_tokens"}
COMPARED = ("weights", "outputs")


def uninitialized(trace: dict[str, Any]) -> set[str]:
    """The weights a started draft runs on that nothing loaded (tied to such included)."""
    weights = trace.get("weights") or {}
    found = {w for w in WEIGHTS if (weights.get(w) or {}).get("from") == "placeholder"}
    head = weights.get("lm_head") or {}
    if head.get("from") == "tied to the draft's embed_tokens" and "embed_tokens" in found:
        found.add("lm_head")
    return found


def named(match: re.Match) -> set[str] | None:
    """The weights a matched message names, or None if it names something else."""
    names = set()
    for name in match.group("names").split(", "):
        if name not in MESSAGE_NAMES:
            return None
        names.add(MESSAGE_NAMES[name])
    return names


def listed(
    what: str, text: str, config: dict[str, Any], pristine: dict[str, Any], differences: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The intended difference of kind ``what`` that allows ``text`` here, if any."""
    for entry in differences:
        if entry["what"] != what:
            continue
        if any(config.get(key) != value for key, value in (entry.get("config") or {}).items()):
            continue
        match = re.fullmatch(entry["text"], text, flags=re.S)
        if match is None:
            continue
        if "names" in match.groupdict():
            names = named(match)
            if entry.get("names") == "within pristine-uninitialized" and not (
                names and names <= uninitialized(pristine)
            ):
                continue
        return entry
    return None


def judge(
    config: dict[str, Any], pristine: dict[str, Any], patched: dict[str, Any], differences: list[dict[str, Any]]
) -> list[tuple[str, str]]:
    """The breaks of the property: (kind, message) pairs; empty if it holds."""
    for side, trace in (("pristine", pristine), ("patched", patched)):
        if "crash" in trace or "child_hung" in trace:
            return [("crash", f"the {side} child failed: {trace.get('crash') or trace.get('child_hung')}")]
    problems: list[tuple[str, str]] = []

    # What the patch fixes, whatever pristine did.
    for entry in patched.get("discarded_processed") or []:
        if not entry["loaded"]:
            problems.append(
                ("placeholder processed", f"patched post-processed a never-loaded {entry['weight']} and threw it away")
            )

    if not pristine["started"]:
        if patched["started"]:
            problems.append(("started", f"patched started a draft pristine refused with {pristine['error']!r}"))
        elif patched["error"] != pristine["error"]:
            problems.append(
                ("error", f"patched refused with {patched['error']!r}, pristine with {pristine['error']!r}")
            )
        return problems

    if not patched["started"]:
        if listed("refusal", patched["error"], config, pristine, differences) is None:
            problems.append(
                (
                    "refused",
                    f"patched refused a draft pristine started (on uninitialized "
                    f"{sorted(uninitialized(pristine)) or 'nothing'}): {patched['error']!r}",
                )
            )
        return problems

    for key in COMPARED:
        for name in sorted(set(pristine[key]) | set(patched[key])):
            if pristine[key].get(name) != patched[key].get(name):
                problems.append(
                    (key, f"{key} {name}: patched {patched[key].get(name)!r}, pristine {pristine[key].get(name)!r}")
                )

    # Loaded modules processed and thrown away: the same; never-loaded ones only where listed.
    pristine_discarded = Counter(tuple(sorted(e.items())) for e in pristine["discarded_processed"])
    patched_discarded = Counter(tuple(sorted(e.items())) for e in patched["discarded_processed"])
    for entry, count in (pristine_discarded - patched_discarded).items():
        text = f"{dict(entry)['weight']} loaded={dict(entry)['loaded']}"
        if listed("discarded", text, config, pristine, differences) is None:
            problems.append(("discarded", f"pristine post-processed and threw away {text} ({count}x), patched not"))
    for entry in patched_discarded - pristine_discarded:
        if dict(entry)["loaded"]:
            problems.append(("discarded", f"patched post-processed and threw away a loaded {dict(entry)['weight']}"))

    pristine_logs, patched_logs = Counter(pristine["logs"]), Counter(patched["logs"])
    for line in (pristine_logs - patched_logs).elements():
        problems.append(("log lost", f"pristine logged, patched not: {line!r}"))
    for line in (patched_logs - pristine_logs).elements():
        if listed("log", line, config, pristine, differences) is None:
            problems.append(("log", f"patched logged, pristine not: {line!r}"))
    return problems
