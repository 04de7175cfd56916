"""TP=2 probes through vLLM's own offline entry point (``LLM``), run inside a runtime's interpreter.

    python -m vllm_overlay.e2e.tp_probe MODEL_DIR --reply-mib 64 --rounds 3

Starts one ``LLM`` with tensor_parallel_size=2 (two worker processes, the multiprocessing executor,
gloo on CPU), then:

- big-reply: ``collective_rpc`` of a function returning ``--reply-mib`` MiB from every rank, past the
  24 MiB a shared-memory broadcast chunk holds, so each reply travels the overflow path; every
  round's payload is compared byte for byte with what that rank must return;
- rank1-failure: ``collective_rpc`` of a function that raises on rank 1 only: the caller must get
  the error (its message), and the seconds it took are recorded;
- generate-after: one greedy generation afterwards, to show the engine still serves;
- prompt-logprobs: 32 prompts of 250 tokens in one step, prompt logprobs of the top 500 tokens at
  every position: one ModelRunnerOutput past 24 MiB from the output rank, three rounds, each checked
  for shape and against the first (and its digest printed, so two runtimes can be compared);
- forward-failure (last: the engine does not survive it): with the test model of
  vllm_overlay.e2e.fault_models, the trigger file is made and rank 1 raises inside forward while
  rank 0 goes on into the collective; the caller must get an error, and the seconds it took are
  recorded.

Prints one JSON object (the last line of stdout). Every step is bounded by the RPC timeout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time

RPC_TIMEOUT_S = 300
LOGPROB_PROMPTS, LOGPROB_PROMPT_TOKENS, LOGPROB_TOP = 32, 250, 500


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
    parser.add_argument("--fail-trigger", default=None, help="the test model's trigger file (forward-failure)")
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
        max_logprobs=LOGPROB_TOP,
        max_num_batched_tokens=LOGPROB_PROMPTS * LOGPROB_PROMPT_TOKENS + 192,
        max_num_seqs=64,
    )
    facts["ready_s"] = round(time.monotonic() - started, 1)
    size = args.reply_mib << 20
    rounds = _big_replies(llm, args.rounds, size)
    facts["big_reply"] = rounds
    facts["big_reply_ok"] = len(rounds) == args.rounds and all(r["ranks"] == 2 and all(r["right"]) for r in rounds)
    if not facts["big_reply_ok"]:
        # The engine does not survive a timed-out RPC; the later probes would only time out too.
        print(json.dumps(facts, sort_keys=True), flush=True)
        return 0
    _rank1_failure(llm, facts)
    try:
        out = llm.generate(
            ["the model serves"], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False
        )
        facts["generate_after"] = out[0].outputs[0].text
        facts["generate_after_ok"] = len(out[0].outputs[0].token_ids) == 16
    except Exception as exc:  # recorded: the engine no longer serves
        facts["generate_after"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        facts["generate_after_ok"] = False
    facts.update(prompt_logprobs(llm, args.rounds))
    if args.fail_trigger:
        facts.update(forward_failure(llm, args.fail_trigger))
    print(json.dumps(facts, sort_keys=True), flush=True)
    return 0


def _big_replies(llm: object, rounds: int, size: int) -> list[dict[str, object]]:
    """``rounds`` rounds of big-reply, each checked per rank; the first that raises ends them."""
    done: list[dict[str, object]] = []
    for index in range(rounds):
        begun = time.monotonic()
        try:
            replies = llm.collective_rpc(_big_reply, timeout=RPC_TIMEOUT_S, args=(index, size))
        except Exception as exc:  # recorded: a reply lost or late is what this probe looks for
            done.append(
                {
                    "ranks": 0,
                    "right": [],
                    "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                    "seconds": round(time.monotonic() - begun, 2),
                }
            )
            break
        right = [reply == payload(rank, index, size) for rank, reply in enumerate(replies)]
        done.append(
            {
                "ranks": len(replies),
                "right": right,
                "sha256": [hashlib.sha256(r).hexdigest()[:16] for r in replies],
                "seconds": round(time.monotonic() - begun, 2),
            }
        )
    return done


def _rank1_failure(llm: object, facts: dict[str, object]) -> None:
    """rank1-failure: what the caller got (into ``facts``), whether it is rank 1's error, and how long it took."""
    begun = time.monotonic()
    try:
        llm.collective_rpc(_fail_on_rank1, timeout=RPC_TIMEOUT_S)
        facts["rank1_failure"] = "no error raised"
        facts["rank1_failure_ok"] = False
    except Exception as exc:  # the caller must get the worker's error
        facts["rank1_failure"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        facts["rank1_failure_ok"] = "rank 1 fails on purpose" in str(exc)
    facts["rank1_failure_s"] = round(time.monotonic() - begun, 2)


def _logprob_digest(outputs: list) -> tuple[str, str | None]:
    """A digest of every prompt position's (token, logprob) pairs, and what is wrong with their shape."""
    digest = hashlib.sha256()
    for output in outputs:
        positions = output.prompt_logprobs or []
        if len(positions) != LOGPROB_PROMPT_TOKENS or positions[0] is not None:
            return "", f"{len(positions)} positions (expected {LOGPROB_PROMPT_TOKENS}, the first None)"
        for token, position in zip(output.prompt_token_ids[1:], positions[1:], strict=True):
            if position is None or len(position) < LOGPROB_TOP or token not in position:
                return "", f"a position with {0 if position is None else len(position)} logprobs or without its token"
            for key in sorted(position):
                digest.update(f"{key}:{position[key].logprob!r};".encode())
    return digest.hexdigest(), None


def prompt_logprobs(llm: object, rounds: int) -> dict[str, object]:
    """One step whose output carries prompt logprobs past 24 MiB; every round must give the same."""
    from vllm import SamplingParams

    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(2, 500) for _ in range(LOGPROB_PROMPT_TOKENS)]}
        for _ in range(LOGPROB_PROMPTS)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=LOGPROB_TOP)
    # logprobs (float32) and token ids (int64) for every position's top entries and its own token
    approx_mib = LOGPROB_PROMPTS * LOGPROB_PROMPT_TOKENS * (LOGPROB_TOP + 1) * 12 / (1 << 20)
    results = []
    first = None
    for _ in range(rounds):
        begun = time.monotonic()
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)  # type: ignore[attr-defined]
        except Exception as exc:  # recorded: the reply lost or late
            results.append(
                {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "seconds": round(time.monotonic() - begun, 2)}
            )
            break
        digest, problem = _logprob_digest(outputs)
        first = first or digest
        results.append(
            {
                "digest": digest[:16],
                "problem": problem,
                "same": digest == first,
                "seconds": round(time.monotonic() - begun, 2),
            }
        )
    ok = len(results) == rounds and all(not r.get("error") and not r.get("problem") and r.get("same") for r in results)
    return {"logprobs": results, "logprobs_ok": ok, "logprobs_mib": round(approx_mib, 1), "logprobs_digest": first}


def forward_failure(llm: object, trigger: str) -> dict[str, object]:
    """Rank 1 raises inside forward (the test model, once the trigger exists): the caller must get an error."""
    from vllm import SamplingParams

    from vllm_overlay.e2e.fault_models import FAIL_MESSAGE

    with open(trigger, "w", encoding="utf-8") as handle:
        handle.write("fail\n")
    begun = time.monotonic()
    try:
        llm.generate(  # type: ignore[attr-defined]
            ["rank one fails"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
        )
        error, ok = "no error raised", False
    except Exception as exc:  # the caller must get it, bounded
        error, ok = f"{type(exc).__name__}: {str(exc)[:200]}", True
    return {
        "forward_failure": error,
        "forward_failure_ok": ok,
        "forward_failure_names_it": FAIL_MESSAGE in error,
        "forward_failure_s": round(time.monotonic() - begun, 2),
    }


if __name__ == "__main__":
    raise SystemExit(main())
