"""TP=2 probes through vLLM's own offline entry point (``LLM``), run inside a runtime's interpreter.

    python -m vllm_overlay.e2e.tp_probe MODEL_DIR --reply-mib 64 --rounds 3

Starts one ``LLM`` with tensor_parallel_size=2 (two worker processes, the multiprocessing executor,
gloo on CPU), then:

- big-reply: ``collective_rpc`` of a function returning ``--reply-mib`` MiB from every rank, past the
  24 MiB a shared-memory broadcast chunk holds, so each reply travels the overflow path; every
  round's payload is compared byte for byte with what that rank must return;
- rank1-failure: ``collective_rpc`` of a function that raises on rank 1 only: the caller must get
  the error (its message), and the seconds it took are recorded;
- generate-after: one greedy generation afterwards, to show the engine still serves.

Prints one JSON object (the last line of stdout). Every step is bounded by the RPC timeout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time

RPC_TIMEOUT_S = 300


def payload(rank: int, round_index: int, size: int) -> bytes:
    return random.Random(f"{rank}:{round_index}").randbytes(size)


def _big_reply(worker: object, round_index: int, size: int) -> bytes:
    import torch.distributed as dist

    return payload(dist.get_rank(), round_index, size)


def _fail_on_rank1(worker: object) -> str:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("e2e probe: rank 1 fails on purpose")
    return "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--reply-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from vllm import LLM, SamplingParams

    facts: dict[str, object] = {}
    started = time.monotonic()
    llm = LLM(
        model=args.model,
        tensor_parallel_size=2,
        max_model_len=256,
        dtype="bfloat16",
        seed=0,
        distributed_executor_backend="mp",
    )
    facts["ready_s"] = round(time.monotonic() - started, 1)
    size = args.reply_mib << 20
    rounds = []
    for index in range(args.rounds):
        begun = time.monotonic()
        try:
            replies = llm.collective_rpc(_big_reply, timeout=RPC_TIMEOUT_S, args=(index, size))
        except Exception as exc:  # recorded: a reply lost or late is what this probe looks for
            rounds.append(
                {
                    "ranks": 0,
                    "right": [],
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                    "seconds": round(time.monotonic() - begun, 2),
                }
            )
            break
        right = [reply == payload(rank, index, size) for rank, reply in enumerate(replies)]
        rounds.append(
            {
                "ranks": len(replies),
                "right": right,
                "sha256": [hashlib.sha256(r).hexdigest()[:16] for r in replies],
                "seconds": round(time.monotonic() - begun, 2),
            }
        )
    facts["big_reply"] = rounds
    facts["big_reply_ok"] = len(rounds) == args.rounds and all(r["ranks"] == 2 and all(r["right"]) for r in rounds)
    if not facts["big_reply_ok"]:
        # The engine does not survive a timed-out RPC; the later probes would only time out too.
        print(json.dumps(facts, sort_keys=True), flush=True)
        return 0
    begun = time.monotonic()
    try:
        llm.collective_rpc(_fail_on_rank1, timeout=RPC_TIMEOUT_S)
        facts["rank1_failure"] = "no error raised"
        facts["rank1_failure_ok"] = False
    except Exception as exc:  # the caller must get the worker's error
        facts["rank1_failure"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        facts["rank1_failure_ok"] = "rank 1 fails on purpose" in str(exc)
    facts["rank1_failure_s"] = round(time.monotonic() - begun, 2)
    try:
        out = llm.generate(
            ["the model serves"], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False
        )
        facts["generate_after"] = out[0].outputs[0].text
        facts["generate_after_ok"] = len(out[0].outputs[0].token_ids) == 16
    except Exception as exc:  # recorded: the engine no longer serves
        facts["generate_after"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        facts["generate_after_ok"] = False
    print(json.dumps(facts, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
