# SPDX-License-Identifier: Apache-2.0
"""Which FlashInfer B12x wrapper capacities flashinfer accepts (route-sanitization series, its third round).

Without EP, FlashInferB12xExperts builds flashinfer's ``B12xMoEWrapper(use_cuda_graph=True)`` for
max_num_tokens x DP size x PCP size tokens. flashinfer sizes the wrapper's workspaces for that many
tokens x top_k routes and rejects any plane over 2^31-1 elements. This script builds the real
wrapper of the installed flashinfer on the ``meta`` device (flashinfer's own sizing and check, no
allocation; any machine) for a few MoE shapes and token capacities, and prints whether it is
accepted, the plane flashinfer names when it is not, and how long building it took.

    python benchmarks/b12x_wrapper_capacity.py
    python benchmarks/b12x_wrapper_capacity.py --shape 256 8 7168 256 --tokens 8192 65536 131072
"""

from __future__ import annotations

import argparse
import time
from importlib.metadata import version

import torch

SHAPES = [(512, 10, 2048, 512), (256, 8, 7168, 256), (128, 8, 4096, 1536), (512, 22, 4096, 256)]
TOKENS = [8192, 16384, 32768, 65536, 131072]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, action="append", metavar=("E", "TOPK", "HIDDEN", "INTER"))
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    args = parser.parse_args()
    from flashinfer.fused_moe import B12xMoEWrapper

    print(f"flashinfer-python {version('flashinfer-python')}; wrapper on the meta device (NVFP4, SiLU)")
    print(f"{'experts':>7} {'top_k':>5} {'hidden':>6} {'inter':>5} {'tokens':>7}  {'build_ms':>8}  result")
    for e, top_k, hidden, inter in args.shape or SHAPES:
        for tokens in args.tokens:
            start = time.perf_counter()
            try:
                B12xMoEWrapper(
                    num_experts=e,
                    top_k=top_k,
                    hidden_size=hidden,
                    intermediate_size=inter,
                    use_cuda_graph=True,
                    max_num_tokens=tokens,
                    num_local_experts=e,
                    activation="silu",
                    output_dtype=torch.bfloat16,
                    device="meta",
                )
                result = "accepted"
            except ValueError as exc:
                result = f"REFUSED: {exc}".split(". Reduce")[0]
            ms = (time.perf_counter() - start) * 1e3
            print(f"{e:>7} {top_k:>5} {hidden:>6} {inter:>5} {tokens:>7}  {ms:>8.2f}  {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
