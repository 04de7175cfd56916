# SPDX-License-Identifier: Apache-2.0
"""GPU qualification of the B12x MoE route guard (route-sanitization series): the Triton kernel
against the torch reference path.

``sanitize_topk_routes`` (vllm/model_executor/layers/fused_moe/route_guard.py of the importable,
patched vLLM) runs one Triton kernel for CUDA tensors and a torch masked_fill path for CPU tensors.
For every case this script runs both on the same routes and requires identical int32 ids and
bit-identical weights:

* ids int32 and int64: random valid ids mixed with -1, num_experts, ids above it, negative ids,
  the dtype's extremes and, for int64, ids that wrap into [0, num_experts) when narrowed to int32;
* 1..8192 tokens (edges of the kernel's 256-route blocks included), top-8 and top-10, 512 experts;
* contiguous, transposed (column-major) and row-strided inputs; float32 and bfloat16 weights.

Then, through the real per-layer guard of both B12x backends (``FlashInferB12xExperts`` and
``B12xExperts`` built on CUDA with the tests' harness), the first call is made inside CUDA-graph
capture (the buffers come from construction, so nothing is allocated there), the graph is replayed
on new routes copied into the captured inputs, and the outputs are compared with the reference.

    python benchmarks/route_sanitization_qualify.py          # needs CUDA and the patched vllm

Prints one line per (ids dtype, top-k, layout, weights dtype) with the cases checked and failed,
and exits 1 if any case differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "patches"))

NUM_EXPERTS = 512
TOKENS = [1, 2, 3, 7, 8, 25, 26, 64, 100, 127, 256, 1000, 1024, 2047, 2048, 4095, 4096, 8191, 8192]


def random_ids(num_tokens: int, top_k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    n = num_tokens * top_k
    ids = torch.randint(0, NUM_EXPERTS, (n,), generator=gen, dtype=torch.int64)
    info = torch.iinfo(dtype)
    edges = [-1, NUM_EXPERTS, NUM_EXPERTS + 1, 2 * NUM_EXPERTS, -2, -NUM_EXPERTS, info.min, info.max]
    if dtype == torch.int64:
        edges += [2**32 + 7, 2**32, -(2**32) + 5, 2**31, -(2**31) - 1]
    pick = torch.rand(n, generator=gen)
    edge_at = torch.randint(0, len(edges), (n,), generator=gen)
    ids = torch.where(pick < 0.3, torch.tensor(edges, dtype=torch.int64)[edge_at], ids)
    wide = torch.randint(info.min if dtype == torch.int32 else -(2**62), 2**31 - 1, (n,), generator=gen)
    ids = torch.where((pick >= 0.3) & (pick < 0.4), wide, ids)
    # A padded tail, as VLLM_MOE_SKIP_PADDING writes it.
    ids.view(num_tokens, top_k)[num_tokens - num_tokens // 4 :] = -1
    return ids.to(dtype).view(num_tokens, top_k)


def layouts(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same logical [T, K] tensor in three memory layouts (on t's device)."""
    strided = torch.empty(t.size(0), 2 * t.size(1), dtype=t.dtype, device=t.device)[:, ::2]
    strided.copy_(t)
    return {"contiguous": t.contiguous(), "transposed": t.t().contiguous().t(), "row_strided": strided}


def check_kernel(top_k: int, ids_dtype: torch.dtype, weights_dtype: torch.dtype, tokens: list[int]) -> dict:
    from vllm.model_executor.layers.fused_moe.route_guard import sanitize_topk_routes

    gen = torch.Generator().manual_seed(top_k * 1000 + (ids_dtype == torch.int64))
    stats: dict[str, list[int]] = {}
    for num_tokens in tokens:
        ids = random_ids(num_tokens, top_k, ids_dtype, gen)
        weights = torch.rand(num_tokens, top_k, generator=gen).to(weights_dtype)
        ref_ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
        ref_w = torch.empty(num_tokens, top_k, dtype=torch.float32)
        sanitize_topk_routes(ids, weights, NUM_EXPERTS, ref_ids, ref_w)  # CPU: the torch path
        gpu_ids_by_layout, gpu_w_by_layout = layouts(ids.cuda()), layouts(weights.cuda())
        for name, gpu_ids in gpu_ids_by_layout.items():
            gpu_w = gpu_w_by_layout[name]
            out_ids = torch.full((num_tokens, top_k), -7, dtype=torch.int32, device="cuda")
            out_w = torch.full((num_tokens, top_k), float("nan"), dtype=torch.float32, device="cuda")
            sanitize_topk_routes(gpu_ids, gpu_w, NUM_EXPERTS, out_ids, out_w)  # CUDA: the Triton kernel
            ok = torch.equal(out_ids.cpu(), ref_ids) and torch.equal(
                out_w.cpu().view(torch.int32), ref_w.view(torch.int32)
            )
            # The reference itself: invalid -> (-1, 0.0), valid kept.
            valid = (ids >= 0) & (ids < NUM_EXPERTS)
            ok = ok and torch.equal(ref_ids.long(), torch.where(valid, ids, -1).long())
            ok = ok and torch.equal(ref_w, torch.where(valid, weights.float(), 0.0))
            checked_failed = stats.setdefault(name, [0, 0, 0])
            checked_failed[0] += 1
            checked_failed[1] += not ok
            checked_failed[2] += int((~valid).sum())
            if not ok:
                print(f"MISMATCH tokens={num_tokens} top_k={top_k} ids={ids_dtype} layout={name} w={weights_dtype}")
    return stats


def check_layer_guards_under_capture(top_k: int, num_tokens: int) -> list[str]:
    """First call of each backend's real guard inside CUDA-graph capture, then replays."""
    from b12x_harness import make_b12x_tp_experts, make_experts, make_moe_config
    from vllm.model_executor.layers.fused_moe.route_guard import sanitize_topk_routes

    config = make_moe_config(NUM_EXPERTS, top_k, 2048, 512, num_tokens, device="cuda")
    layers = {
        "FlashInferB12xExperts": make_experts(NUM_EXPERTS, top_k, 2048, 512, num_tokens, device="cuda"),
        "B12xExperts": make_b12x_tp_experts(("nvfp4", "nvfp4"), config),
    }
    gen = torch.Generator().manual_seed(num_tokens)
    lines = []
    for name, experts in layers.items():
        guard = experts._route_guard
        ids_in = random_ids(num_tokens, top_k, torch.int64, gen).cuda()
        w_in = torch.rand(num_tokens, top_k, generator=gen).cuda()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # The first call of this layer's guard (the Triton kernel itself was compiled by
        # check_kernel for the same specialization): its buffers come from construction.
        with torch.cuda.graph(graph):
            out_ids, out_w = guard(ids_in, w_in)
        ok = True
        for _ in range(3):
            ids = random_ids(num_tokens, top_k, torch.int64, gen)
            weights = torch.rand(num_tokens, top_k, generator=gen)
            ids_in.copy_(ids)
            w_in.copy_(weights)
            graph.replay()
            torch.cuda.synchronize()
            ref_ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
            ref_w = torch.empty(num_tokens, top_k, dtype=torch.float32)
            sanitize_topk_routes(ids, weights, NUM_EXPERTS, ref_ids, ref_w)
            ok = ok and torch.equal(out_ids.cpu(), ref_ids) and torch.equal(out_w.cpu(), ref_w)
        ok = ok and out_ids.data_ptr() == guard.ids.data_ptr()
        lines.append(
            f"{name:<22} top_k={top_k:<2} tokens={num_tokens:<5} first call captured, 3 replays "
            f"{'identical to reference' if ok else 'DIFFER'}"
        )
        if not ok:
            lines[-1] = "MISMATCH " + lines[-1]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    parser.add_argument("--top-k", type=int, nargs="+", default=[8, 10])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA: this qualifies the Triton kernel against the torch path")
        return 2

    from b12x_harness import describe_vllm
    from vllm.model_executor.layers.fused_moe import route_guard

    props = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}; CUDA device {props.name} (sm_{props.major}{props.minor})")
    print(describe_vllm())
    print(f"guard: {route_guard.__file__}, block size {route_guard._SANITIZE_ROUTES_BLOCK_SIZE}")
    print(f"experts={NUM_EXPERTS}; tokens {min(args.tokens)}..{max(args.tokens)} ({len(args.tokens)} sizes)")
    print("ids    top_k  weights   layout        cases  failed  invalid_routes")
    failed = 0
    for ids_dtype in (torch.int32, torch.int64):
        for top_k in args.top_k:
            for weights_dtype in (torch.float32, torch.bfloat16):
                stats = check_kernel(top_k, ids_dtype, weights_dtype, args.tokens)
                for layout, (cases, bad, invalid) in stats.items():
                    failed += bad
                    print(
                        f"{str(ids_dtype).removeprefix('torch.'):<6} {top_k:>5}  "
                        f"{str(weights_dtype).removeprefix('torch.'):<8}  {layout:<12} "
                        f"{cases:>6}  {bad:>6}  {invalid:>14}"
                    )
    for top_k in args.top_k:
        for num_tokens in (1, 8192):
            for line in check_layer_guards_under_capture(top_k, num_tokens):
                failed += line.startswith("MISMATCH")
                print(line)
    print(
        "RESULT:",
        "PASS (Triton kernel identical to the torch path in every case)" if not failed else f"FAIL ({failed})",
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
