# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Differential, property-based oracle for the draft loaders: pristine vLLM
0.33.0 decides what the patched loader must do with a draft beside its target.

Hypothesis generates a draft/target configuration: the draft (a real
Eagle3LlamaForCausalLM from its own checkpoint, or the real Qwen3_5MTP that
SpeculativeConfig(method="mtp") derives from a qwen3_5 checkpoint), what its
checkpoint provides (lm_head and embed_tokens: absent, its own, or equal to
the target's, which makes the draft's record "has its own" while the v1
proposer still shares the target's), whether the target has an lm_head,
whether the EAGLE-3 target is wider than its draft (the v1 proposer shares no
embedding of another width), whether the MTP head is tied to its embedding,
the runner (the v1 EagleProposer.load_model or the v2 load_eagle_model),
PP 1 or 2 (this rank the last stage) and
speculative_config.refuse_uninitialized_draft_weights on or off (the patched
tree's setting; pristine has no such field and runs without it). The same
configuration starts on pristine and on the patched tree, each in its own
long-lived child (dl_oracle_child.py), and dl_oracle_judge.py decides, with
the differences the patch intends listed in oracle-differences.toml.

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
from dl_oracle_judge import judge, uninitialized
from oracle_harness import Sides, intended_differences, oracle_settings, violation

HERE = Path(__file__).resolve().parent
DIFFERENCES = intended_differences(HERE / "oracle-differences.toml")
# A configuration's trace must come back within this (a draft starts in about a second).
CASE_BOUND_S = 120.0
CI_EXAMPLES = 300
DEEP_EXAMPLES = 2000


def configuration(
    draft: str,
    runner: str,
    pp: int,
    ckpt_lm_head: str | None,
    ckpt_embed_tokens: str | None,
    target_lm_head: bool,
    width: str,
    tied: bool,
    refuse: bool,
) -> dict:
    """One draft/target configuration; choices that do not apply to the draft take one value."""
    return {
        "draft": draft,
        "runner": runner,
        "pp": pp,
        "ckpt_lm_head": ckpt_lm_head,
        "ckpt_embed_tokens": ckpt_embed_tokens,
        "target_lm_head": target_lm_head,
        # An EAGLE-3 draft may be narrower than its target; an MTP layer is the target's width.
        "width": width if draft == "eagle3" else "same",
        # An EAGLE-3 head is never tied; a Qwen3.5 checkpoint may tie its head to its embedding.
        "tied": tied if draft == "mtp" else False,
        "refuse": refuse,
    }


# The first value of each choice is the one hypothesis shrinks toward: the
# simplest draft (EAGLE-3 on v1, PP 1), a checkpoint with neither head nor
# embedding, a target without a head, the default setting.
present = st.sampled_from([None, "own", "target"])
configs = st.builds(
    configuration,
    draft=st.sampled_from(["eagle3", "mtp"]),
    runner=st.sampled_from(["v1", "v2"]),
    pp=st.sampled_from([1, 2]),
    ckpt_lm_head=present,
    ckpt_embed_tokens=present,
    target_lm_head=st.booleans(),
    width=st.sampled_from(["same", "differs"]),
    tied=st.booleans(),
    refuse=st.booleans(),
)


@pytest.fixture(scope="module")
def sides():
    both = Sides(HERE / "dl_oracle_child.py")
    yield both
    both.close()


@oracle_settings(ci_examples=CI_EXAMPLES, deep_examples=DEEP_EXAMPLES)
@given(config=configs)
def test_draft_loaders_match_pristine(sides, config):
    request = {"config": config}
    pristine, patched = sides.run(request, CASE_BOUND_S)
    problems = judge(config, pristine, patched, DIFFERENCES)
    if problems:
        note("configuration: " + json.dumps(request))
        note("pristine left uninitialized: " + json.dumps(sorted(uninitialized(pristine))))
        note("pristine trace: " + json.dumps(pristine))
        note("patched trace: " + json.dumps(patched))
        # One exception type per kind of break: hypothesis then keeps distinct
        # defects apart and shrinks each to its own minimal example.
        raise violation(problems[0][0])("\n".join(message for _, message in problems))


def replay(request: dict) -> list[tuple[str, str]]:
    """Start one configuration on both sides and print both traces and the judge's findings (the reproducer)."""
    both = Sides(HERE / "dl_oracle_child.py")
    try:
        pristine, patched = both.run(request, CASE_BOUND_S)
    finally:
        both.close()
    problems = judge(request["config"], pristine, patched, DIFFERENCES)
    print("pristine vllm:", both.pristine.vllm_dir)
    print("patched vllm: ", both.patched.vllm_dir)
    print("pristine trace:", json.dumps(pristine))
    print("patched trace: ", json.dumps(patched))
    print("pristine left uninitialized:", json.dumps(sorted(uninitialized(pristine))))
    for kind, message in problems:
        print(f"VIOLATION [{kind}]\n  " + message.replace("\n", "\n  "))
    print("property holds" if not problems else f"{len(problems)} violation(s)")
    return problems


if __name__ == "__main__":
    # python oracle_draft_loaders.py '{"config": {...}}' with the patched tree's shadow first
    # on PYTHONPATH (the configuration line a failing example prints): exit 1 on a violation.
    import sys

    sys.exit(1 if replay(json.loads(sys.argv[1])) else 0)
