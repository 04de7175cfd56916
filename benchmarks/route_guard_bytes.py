# SPDX-License-Identifier: Apache-2.0
"""Bytes the B12x MoE layers' route guards hold (route-sanitization series; they come out of the KV cache).

The route guard (fused_moe/route_guard.py) writes sanitized int32 ids and float32 weights of
[max_num_tokens x DP x PCP, top_k] routes into buffers taken when each layer is built, before the
KV cache is profiled, so whatever they hold comes out of the KV cache. This script builds N real
MoE experts layers of the importable vLLM from one MoE config and one quant config (as the layers
of one model are) and prints the bytes of the tensors the layers hold beyond those two configs,
i.e. what the layers allocate themselves, each storage counted once (``held_bytes`` of
tests/patches/b12x_harness.py). Before any call no wrapper exists (flashinfer's is built on the
first apply(); the workspace-reuse series accounts for it), so that is the guards' memory.

By default the layers are built on the ``meta`` device: nothing is allocated, the sizes are the
tensors' own, and it runs on any machine. Run it once per tree to compare:

    scripts/with-patched-vllm --tree TREE -- "$(scripts/cache --env-python)" \\
        benchmarks/route_guard_bytes.py                     # 48 layers, 8192 tokens, top-8, DP 1 and 8
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "patches"))

MiB = 1024**2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=8192, help="max_num_batched_tokens of one rank")
    parser.add_argument("--dp", type=int, nargs="+", default=[1, 8], help="DP sizes (no EP)")
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--backend", nargs="+", default=["flashinfer", "b12x"], choices=["flashinfer", "b12x"])
    parser.add_argument("--device", default="meta", help="meta (sizes only, default) or cpu")
    args = parser.parse_args()

    from b12x_harness import describe_vllm, held_bytes, make_model_layers, make_moe_config
    from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

    print(describe_vllm())
    print(
        f"{args.layers} layers, max_num_tokens {args.max_tokens}, experts {args.experts}, top_k {args.top_k}, "
        f"hidden {args.hidden}, intermediate {args.intermediate}, device {args.device}; "
        "bytes the layers hold beyond their shared configs"
    )
    head = f"{'backend':<10} {'DP':>3} {'routes/call':>11} {'one layer B':>12} {'all layers B':>13} {'MiB':>8}"
    print(head)
    for backend in args.backend:
        for dp in args.dp:
            parallel = replace(FusedMoEParallelConfig.make_no_parallel(), dp_size=dp)
            moe_config = make_moe_config(
                args.experts,
                args.top_k,
                args.hidden,
                args.intermediate,
                args.max_tokens,
                args.device,
                moe_parallel_config=parallel,
            )
            layers = make_model_layers(backend, moe_config, args.layers)
            # The quant config is shared by all layers: held by the layers, allocated by none.
            configs = held_bytes(layers[0].quant_config, moe_config)
            one = held_bytes(layers[0]) - configs
            total = held_bytes(*layers) - configs
            rows = args.max_tokens * dp
            print(f"{backend:<10} {dp:>3} {rows:>11} {one:>12,} {total:>13,} {total / MiB:>8.2f}")
            del layers
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
