# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Differential, property-based oracle for the simple KV offload worker:
pristine vLLM 0.33.0 decides what the patched worker must do.

Hypothesis generates the backend ("cpu": DmaCopyBackend and its copy thread;
"disk": DiskBackend, its IO threads and a real file) and a sequence of what
the model runner and the scheduler do to the connector: model steps that
store some blocks, load back an earlier store's blocks, or first flush for a
preemption (handle_preemptions); the copy engine held (a launch that does not
return), lagging (launches held for a while) or released; and shutdown at any
point. The same sequence runs on pristine and on the patched tree, each in its
own long-lived child (qeo_offload_oracle_child.py: the real connector, worker
and backends, only CUDA events, streams, the batched copy launch and host
pinning replaced), and qeo_offload_oracle_judge.py decides, with the
differences the patches intend listed in oracle-differences.toml.

scripts/test-patches runs this after the series' last patch; a shrunk failing
example is printed with both traces and stays in the example database, so it
is replayed first next time.
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
from qeo_offload_oracle_judge import correctness_problems, judge

HERE = Path(__file__).resolve().parent
CHILD = HERE / "qeo_offload_oracle_child.py"
DIFFERENCES = intended_differences(HERE / "oracle-differences.toml")
# A sequence's trace must come back within this (every wait inside is bounded).
SEQUENCE_BOUND_S = 90.0
CI_EXAMPLES = 300
DEEP_EXAMPLES = 3000

configs = st.fixed_dictionaries({"backend": st.sampled_from(["cpu", "disk"])})
steps = st.fixed_dictionaries(
    {
        "op": st.just("step"),
        # Blocks this step computes and stores (0: none), each to a fresh CPU block / disk slot.
        "store": st.integers(min_value=0, max_value=2),
        # Load back the blocks of an earlier store (its index among the stores so far, modulo).
        "load": st.none() | st.integers(min_value=0, max_value=7),
        # Requests were preempted: the step flushes first.
        "flush": st.booleans(),
    }
)
engine_ops = st.sampled_from([{"op": "hold"}, {"op": "lag"}, {"op": "release"}])


def numbered(body: list[dict], shutdown_at: int | None) -> list[dict]:
    """The operations in order, shutdown (if any) inserted at its point."""
    ops = [dict(op) for op in body]
    if shutdown_at is not None:
        ops.insert(min(shutdown_at, len(ops)), {"op": "shutdown"})
    return ops


# Mostly model steps; the copy engine's state changes between them; shutdown,
# which ends a sequence, at most once, anywhere.
operations = st.builds(
    numbered,
    st.lists(st.one_of(steps, steps, steps, engine_ops), min_size=1, max_size=10),
    st.none() | st.integers(min_value=0, max_value=10),
)


@pytest.fixture(scope="module")
def sides():
    both = Sides(CHILD)
    yield both
    both.close()


@oracle_settings(ci_examples=CI_EXAMPLES, deep_examples=DEEP_EXAMPLES)
@given(config=configs, ops=operations)
def test_offload_worker_matches_pristine(sides, config, ops):
    request = {"config": config, "ops": ops}
    pristine, patched = sides.run(request, SEQUENCE_BOUND_S)
    problems = judge(config, ops, pristine, patched, DIFFERENCES)
    if problems:
        note("sequence: " + json.dumps(request))
        note("pristine problems: " + json.dumps(correctness_problems(ops, pristine)))
        note("pristine trace: " + json.dumps(pristine))
        note("patched trace: " + json.dumps(patched))
        # One exception type per backend and kind of break: hypothesis then keeps
        # distinct defects apart and shrinks each to its own minimal example.
        raise violation(f"{config['backend']} {problems[0][0]}")("\n".join(message for _, message in problems))


def replay(request: dict) -> list[tuple[str, str]]:
    """Run one sequence on both sides and print both traces and the judge's findings (the reproducer)."""
    both = Sides(CHILD)
    try:
        pristine, patched = both.run(request, SEQUENCE_BOUND_S)
    finally:
        both.close()
    problems = judge(request["config"], request["ops"], pristine, patched, DIFFERENCES)
    print("pristine vllm:", both.pristine.vllm_dir)
    print("patched vllm: ", both.patched.vllm_dir)
    print("pristine trace:", json.dumps(pristine))
    print("patched trace: ", json.dumps(patched))
    print("pristine problems:", json.dumps(correctness_problems(request["ops"], pristine)))
    for kind, message in problems:
        print(f"VIOLATION [{kind}]\n  " + message.replace("\n", "\n  "))
    print("property holds" if not problems else f"{len(problems)} violation(s)")
    return problems


if __name__ == "__main__":
    # python oracle_offload.py '{"config": {...}, "ops": [...]}' with the patched tree's shadow
    # first on PYTHONPATH (the sequence line a failing example prints): exit 1 on a violation.
    import sys

    sys.exit(1 if replay(json.loads(sys.argv[1])) else 0)
