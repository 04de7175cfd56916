# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Differential, property-based oracle for the executor RPC path: pristine
vLLM 0.33.0 decides what the patched runtime must do.

Hypothesis generates a parallel layout (TP 1/2/4, or PP 2 whose batch queue
keeps several steps in flight), async scheduling on or off, fault tolerance
on or off, and a sequence of what EngineCore does to its executor: model
steps (fast, slow, with a delayed device-to-host copy, with a reply above the
response queue's max_chunk_bytes whose payload comes late, failing on the
output rank, another rank or all, the peers completing or blocked in the
collective), waits for the oldest step in flight, utility and collective
RPCs (by name or a pickled callable, every rank replying or only rank 0)
that succeed or raise on some or all ranks, and shutdown at any point. The
same sequence runs on pristine and on the patched tree, each in its own
long-lived child (qeo_oracle_child.py: the real MultiprocExecutor,
WorkerProc ranks and shared-memory MessageQueues, only the GPU worker and
the collective replaced), and qeo_oracle_judge.py decides, with the
differences the patches intend listed in oracle-differences.toml.

scripts/test-patches runs this after the series' last patch; a shrunk
failing example is printed with both traces and stays in the example
database, so it is replayed first next time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

if __name__ == "__main__":  # the reproducer: as pytest would, put the harness folders on sys.path
    import sys

    sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from oracle_harness import Sides, intended_differences, oracle_settings, violation
from qeo_oracle_judge import judge, pristine_problems

HERE = Path(__file__).resolve().parent
DIFFERENCES = intended_differences(HERE / "oracle-differences.toml")
# A sequence's trace must come back within this (every wait inside is bounded).
SEQUENCE_BOUND_S = 120.0
CI_EXAMPLES = 250
DEEP_EXAMPLES = 1500

layouts = st.sampled_from([(1, 1), (2, 1), (1, 2), (4, 1)])
configs = st.builds(
    lambda layout, async_scheduling, fault_tolerance: {
        "tp": layout[0],
        "pp": layout[1],
        "async_scheduling": async_scheduling,
        "fault_tolerance": fault_tolerance,
    },
    layouts,
    st.booleans(),
    st.booleans(),
)
steps = st.fixed_dictionaries(
    {
        "op": st.just("step"),
        # "delayed" first: hypothesis shrinks toward it, and an output whose
        # copy is still running when the next RPC arrives does not depend on
        # how fast the output thread is.
        "kind": st.sampled_from(["delayed", "fast", "slow", "large"]),
        # A failed model step stops the engine, so most steps succeed and
        # sequences get past their first failure-free stretch.
        "fail": st.sampled_from([None, None, None, None, None, "output", "other", "all"]),
        "peers": st.sampled_from(["complete", "block"]),
    }
)
rpcs = st.fixed_dictionaries(
    {
        "op": st.just("rpc"),
        "via": st.sampled_from(["name", "callable"]),
        "reply": st.sampled_from(["all", "unique"]),
        "fail": st.sampled_from([None, "all", "other"]),
    }
)
waits = st.just({"op": "wait"})


def numbered(body: list[dict], shutdown_at: int | None) -> list[dict]:
    """The operations in order, shutdown (if any) inserted at its point, each with its index."""
    ops = list(body)
    if shutdown_at is not None:
        ops.insert(min(shutdown_at, len(ops)), {"op": "shutdown"})
    return [dict(op, i=i) for i, op in enumerate(ops)]


# Weighted as an engine's life is: mostly steps, RPCs between them, an
# explicit wait now and then (the driver waits by itself once the batch
# queue is full); shutdown, which ends a sequence, at most once, anywhere.
operations = st.builds(
    numbered,
    st.lists(st.one_of(steps, steps, steps, rpcs, rpcs, waits), min_size=1, max_size=8),
    st.none() | st.integers(min_value=0, max_value=8),
)


@pytest.fixture(scope="module")
def sides():
    both = Sides(HERE / "qeo_oracle_child.py")
    yield both
    both.close()


@oracle_settings(ci_examples=CI_EXAMPLES, deep_examples=DEEP_EXAMPLES)
@given(config=configs, ops=operations)
def test_executor_rpc_path_matches_pristine(sides, config, ops):
    request = {"config": config, "ops": ops}
    pristine, patched = sides.run(request, SEQUENCE_BOUND_S)
    problems = judge(config, ops, pristine, patched, DIFFERENCES)
    if problems:
        note("sequence: " + json.dumps(request))
        note("pristine problems: " + json.dumps(pristine_problems(ops, pristine)))
        note("pristine trace: " + json.dumps(pristine))
        note("patched trace: " + json.dumps(patched))
        # One exception type per kind of break: hypothesis then keeps distinct
        # defects apart and shrinks each to its own minimal example.
        raise violation(problems[0][0])("\n".join(message for _, message in problems))


def replay(request: dict) -> list[tuple[str, str]]:
    """Run one sequence on both sides and print both traces and the judge's findings (the reproducer)."""
    both = Sides(HERE / "qeo_oracle_child.py")
    try:
        pristine, patched = both.run(request, SEQUENCE_BOUND_S)
    finally:
        both.close()
    problems = judge(request["config"], request["ops"], pristine, patched, DIFFERENCES)
    print("pristine vllm:", both.pristine.vllm_dir)
    print("patched vllm: ", both.patched.vllm_dir)
    print("pristine trace:", json.dumps(pristine))
    print("patched trace: ", json.dumps(patched))
    print("pristine problems:", json.dumps(pristine_problems(request["ops"], pristine)))
    for kind, message in problems:
        print(f"VIOLATION [{kind}]\n  " + message.replace("\n", "\n  "))
    print("property holds" if not problems else f"{len(problems)} violation(s)")
    return problems


if __name__ == "__main__":
    # python oracle_executor.py '{"config": {...}, "ops": [...]}' with the patched tree's shadow
    # first on PYTHONPATH (the sequence line a failing example prints): exit 1 on a violation.
    import sys

    sys.exit(1 if replay(json.loads(sys.argv[1])) else 0)
