#!/usr/bin/env python3
"""Clients this project did not write, against pristine and patched vLLM servers on this machine.

    python benchmarks/e2e_clients.py [--rounds 3] [--num-prompts 48] [--request-rate 8] [--seed 0]
    python benchmarks/e2e_clients.py --no-bench     # the openai SDK cases only
    python benchmarks/e2e_clients.py --no-sdk       # vllm bench serve only

Uses what scripts/serve-e2e builds (the cached CPU runtime, the carried series laid over a copy of
it, the tiny Llama) and starts both servers at once on loopback ports, as
benchmarks/e2e_serving.py does, with a plain chat template (the tiny model has none). Every
client runs in the pristine runtime's interpreter, the same program against both servers.

1. The openai SDK: completions and chat, streamed and not, n > 1, logprobs, seeded sampling, and
   bad requests (an unknown model, max_tokens < 0, a prompt over the context length, too many
   logprobs, a negative temperature). Printed case by case: what pristine returned, what patched
   returned where it differs, and every difference (texts, finish reasons, usage, response shape,
   logprobs; for a refused request: HTTP status, the SDK's exception class, the error's fields,
   its message beyond run-specific values such as ids, paths and ports). Then each server's own
   checks (streamed text equals non-streamed, a seeded request repeated gives the same text, n
   choices, every bad request refused with its status).
2. vLLM's own benchmark client (`vllm bench serve`, through its module): the random dataset,
   a fixed seed and request rate, --rounds rounds of one pristine run then one patched run.
   Printed per run: requests/s, output tokens/s, median TTFT, median ITL; then each runtime's
   medians over its runs and the ratios patched / pristine.

Results: stdout, build/cpu/clients/results.json (each run's bench result JSON, the SDK's raw
results, the server logs beside it). Exit 0 only when every SDK case is the same on both servers,
each server passes its own checks and every bench run completed all its requests. The figures of
a 2-core shared machine vary run to run by a factor of up to 2: compare medians, not runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_overlay.e2e import clients  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    default = clients.BenchLoad()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="bench rounds, one pristine and one patched run each")
    parser.add_argument("--num-prompts", type=int, default=default.num_prompts, help="requests per bench run")
    parser.add_argument("--request-rate", type=float, default=default.request_rate, help="requests per second")
    parser.add_argument("--input-len", type=int, default=default.input_len, help="random prompt length, tokens")
    parser.add_argument("--output-len", type=int, default=default.output_len, help="tokens generated per request")
    parser.add_argument("--seed", type=int, default=default.seed, help="the bench's seed (prompts, arrival times)")
    parser.add_argument("--no-sdk", dest="sdk", action="store_false", help="skip the openai SDK cases")
    parser.add_argument("--no-bench", dest="bench", action="store_false", help="skip vllm bench serve")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds for each server to be ready")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default build/cpu/clients)")
    args = parser.parse_args(argv)
    load = clients.BenchLoad(args.num_prompts, args.request_rate, args.input_len, args.output_len, args.seed)
    options = clients.Options(args.rounds, load, args.sdk, args.bench, args.ready_timeout, args.out)
    return 0 if clients.run(ROOT, options).ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
