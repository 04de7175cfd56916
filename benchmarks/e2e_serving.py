#!/usr/bin/env python3
"""Throughput and time to first token, pristine against patched, under the same load in one run.

    python3 benchmarks/e2e_serving.py [--rounds 6] [--clients 4] [--requests 8] [--max-tokens 64]

Uses what scripts/serve-e2e builds (the cached CPU runtime, the carried series laid over a copy of
it, the tiny Llama), starts both servers at once on loopback ports and sends them the same load in
alternating rounds (pristine, patched, pristine, ...) so that a change in the machine's load hits
both alike. Each round: ``--clients`` threads, each sending ``--requests`` streamed greedy
completions of ``--max-tokens`` tokens (ignore_eos). Printed per runtime: completion tokens per
second of each round, its median, and p50 / p99 time to first token over all requests; then the
ratios patched / pristine, and the noise: the spread (max / min) of one runtime's round medians.
Both servers are stopped by their process groups on every exit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_overlay.e2e import scenarios, suite  # noqa: E402
from vllm_overlay.e2e.server import Server, ServerSpec, stream_completion  # noqa: E402


def one_round(server: Server, clients: int, requests: int, max_tokens: int) -> tuple[float, list[float]]:
    ttft: list[float] = []
    tokens = [0]
    lock_ = threading.Lock()
    errors: list[str] = []

    def client(index: int) -> None:
        for n in range(requests):
            payload = {
                "model": "tiny",
                "prompt": scenarios.PROMPTS[(index + n) % len(scenarios.PROMPTS)],
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            try:
                chunks, first = stream_completion(server.url + "/v1/completions", payload, 600)
            except Exception as exc:  # counted: a benchmark with failed requests is not reported as one
                errors.append(str(exc))
                continue
            with lock_:
                tokens[0] += len(chunks)  # one streamed chunk per generated token
                if first is not None:
                    ttft.append(first)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    wall = time.monotonic() - started
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed on {server.spec.label}: {errors[0]}")
    return tokens[0] / wall, ttft


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    args = parser.parse_args()

    runtimes = suite.runtime_pair(ROOT)
    pristine, patched, model = runtimes.pristine, runtimes.patched, runtimes.model
    out = runtimes.project.build / "bench"
    out.mkdir(parents=True, exist_ok=True)
    servers = {
        label: Server(ServerSpec(python=env.python, model=model, label=label), out / f"server-{label}.log")
        for label, env in (("pristine", pristine), ("patched", patched))
    }
    try:
        for server in servers.values():
            server.start()
        for label, server in servers.items():
            print(f"{label}: ready in {server.wait_ready(args.ready_timeout):.0f}s", flush=True)
        for server in servers.values():  # warm-up round, not counted
            one_round(server, args.clients, 1, args.max_tokens)
        rates: dict[str, list[float]] = {label: [] for label in servers}
        ttfts: dict[str, list[float]] = {label: [] for label in servers}
        for index in range(args.rounds):
            order = list(servers) if index % 2 == 0 else list(reversed(servers))
            for label in order:
                rate, ttft = one_round(servers[label], args.clients, args.requests, args.max_tokens)
                rates[label].append(rate)
                ttfts[label] += ttft
                print(f"round {index + 1} {label}: {rate:.1f} tokens/s", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    summary = {}
    print(f"\nload: {args.clients} clients x {args.requests} streamed requests x {args.max_tokens} tokens per round")
    for label in servers:
        summary[label] = (
            statistics.median(rates[label]),
            percentile(ttfts[label], 0.5),
            percentile(ttfts[label], 0.99),
            max(rates[label]) / min(rates[label]),
        )
        median, p50, p99, spread = summary[label]
        print(
            f"{label:9s} tokens/s median {median:.1f} (rounds {', '.join(f'{r:.1f}' for r in rates[label])}); "
            f"TTFT p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms; round spread x{spread:.2f}"
        )
    (pm, p50p, p99p, _), (qm, p50q, p99q, _) = summary["pristine"], summary["patched"]
    print(
        f"patched/pristine: tokens/s x{qm / pm:.3f}, TTFT p50 x{p50q / p50p:.3f}, p99 x{p99q / p99p:.3f}; "
        f"noise (largest round spread) x{max(s[3] for s in summary.values()):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
