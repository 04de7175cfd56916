# SPDX-License-Identifier: Apache-2.0
"""Expert-0 work the B12x route guard adds for padded rows (route-sanitization series, its third round).

With VLLM_MOE_SKIP_PADDING on (the default) vLLM's routers write expert id -1 into every padded
row, and flashinfer 0.7.2.post1's B12x kernels skip a negative id (no row, no work). A guard that
rewrites -1 to expert 0 with weight 0 turns each padded route into a real expert-0 row: FC1, the
activation and FC2 of expert 0 over that row, multiplied by 0 at the end.

This script counts, on CPU, the routes that reach the kernel launch through the real ``apply()``
of both B12x backends of the importable vLLM (``FlashInferB12xExperts`` with the real flashinfer
``B12xMoEWrapper``, and ``B12xExperts``), with the kernel launch replaced by a recorder (the seams
of tests/patches/route-sanitization/conftest.py). Run it once per tree to compare:

    scripts/with-patched-vllm --tree TREE -- "$(scripts/cache --env-python)" \\
        benchmarks/route_sanitization_expert0_rows.py

Batches (512 experts, top-8 by default; the router's real routes are drawn uniformly, distinct per
token, seed fixed): decode steps under CUDA graphs, each real batch size padded to vLLM 0.33.0's
default capture size (1, 2, 4, then multiples of 8 up to 256, then of 16); a DP=2 step in which one
rank is idle and runs its dummy batch (all rows padding, all-gathered into every rank's MoE call);
and a padded prefill tail. For each: the routes to expert 0 the router wrote, the routes to expert 0
the kernel receives, and the routes it receives as -1 (skipped). "added" is the difference: expert-0
rows that exist only because of the guard. This counts rows, not time: the B12x kernels run only on
SM12x GPUs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "patches"))

NUM_EXPERTS = 512


def capture_size(num_tokens: int, max_size: int = 512) -> int:
    """vLLM 0.33.0's default CUDA-graph capture sizes (config/vllm.py): the graph a batch replays."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return next(s for s in sizes if s >= num_tokens)


def router_routes(real: int, padded: int, top_k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's output: distinct experts per real token, -1 in every padded row."""
    ids = torch.full((padded, top_k), -1, dtype=torch.int32)
    for t in range(real):
        ids[t] = torch.randperm(NUM_EXPERTS, generator=gen)[:top_k].to(torch.int32)
    weights = torch.full((padded, top_k), 1.0 / top_k)
    return ids, weights


class Recorder:
    """Stands in for a kernel launch; keeps a copy of the route ids it was handed."""

    def __init__(self, key: str, returns: str | None) -> None:
        self.key, self.returns, self.ids = key, returns, None

    def __call__(self, **kwargs: Any) -> Any:
        self.ids = kwargs[self.key].clone()
        return kwargs[self.returns] if self.returns else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--decode", type=int, nargs="+", default=[1, 3, 5, 9, 13, 17, 33, 50, 100, 200, 300, 500])
    args = parser.parse_args()
    top_k = args.top_k

    import flashinfer.fused_moe as fi_fused_moe
    import vllm.model_executor.layers.fused_moe.b12x as b12x
    from b12x_harness import (
        B12xLayer,
        apply_b12x_tp_routes,
        cpu_wrapper_class,
        describe_vllm,
        make_b12x_tp_experts,
        make_moe_config,
    )
    from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch

    fi_launch = Recorder("topk_ids", "scatter_output")
    tp_launch = Recorder("topk_ids", None)
    fi_fused_moe.B12xMoEWrapper = cpu_wrapper_class()
    moe_dispatch.launch_sm120_moe = fi_launch
    b12x._run_b12x_moe_plan = tp_launch
    b12x._is_current_stream_capturing = lambda: False

    print(describe_vllm())
    guard = getattr(b12x, "TopKRouteGuard", None)
    print(f"route guard: {'present' if guard else 'absent (pristine)'}; experts={NUM_EXPERTS} top_k={top_k}")

    max_tokens = 1024
    fi_layer = B12xLayer(num_experts=NUM_EXPERTS, top_k=top_k, max_num_tokens=max_tokens)
    tp_experts = make_b12x_tp_experts(("nvfp4", "nvfp4"), make_moe_config(NUM_EXPERTS, top_k, 256, 128, max_tokens))

    def run(backend: str, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if backend == "FlashInferB12xExperts":
            fi_layer.apply_routes(ids, weights)
            return fi_launch.ids
        apply_b12x_tp_routes(tp_experts, ids, weights)
        return tp_launch.ids

    batches: list[tuple[str, int, int]] = [
        (f"decode {r} -> graph {capture_size(r)}", r, capture_size(r)) for r in args.decode
    ]
    # DP=2 without EP, one rank idle: its dummy rows (all -1) are all-gathered after the busy
    # rank's batch, both padded to the same graph size.
    for r in (1, 9, 100):
        batches.append((f"DP=2, one rank idle: {r} + dummy, graph {capture_size(r)} x 2", r, 2 * capture_size(r)))
    batches.append(("prefill 1000 padded to 1024", 1000, 1024))

    head = ["pad_rows", "router_e0", "kernel_e0", "added", "skipped"]
    print(f"{'batch':<48} {'backend':<22} " + " ".join(f"{h:>9}" for h in head))
    totals: dict[str, list[int]] = {}
    for name, real, padded in batches:
        gen = torch.Generator().manual_seed(real * 7919 + padded)
        ids, weights = router_routes(real, padded, top_k, gen)
        router_e0 = int((ids == 0).sum())
        for backend in ("FlashInferB12xExperts", "B12xExperts"):
            seen = run(backend, ids, weights)
            kernel_e0 = int((seen == 0).sum())
            skipped = int((seen < 0).sum())
            added = kernel_e0 - router_e0
            t = totals.setdefault(backend, [0, 0, 0, 0])
            t[0] += router_e0
            t[1] += kernel_e0
            t[2] += added
            t[3] += skipped
            row = [padded - real, router_e0, kernel_e0, added, skipped]
            print(f"{name:<48} {backend:<22} " + " ".join(f"{v:>9}" for v in row))
    for backend, (router_e0, kernel_e0, added, skipped) in totals.items():
        print(
            f"TOTAL {backend}: expert-0 routes from the router {router_e0}, at the kernel {kernel_e0}, "
            f"added by the guard {added}, padding routes skipped {skipped}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
