# SPDX-License-Identifier: Apache-2.0
"""Cost of the B12x MoE route guard per MoE call (route-sanitization series).

Times, per MoE call, for 512 experts, top-k 8 and 10 and 1..8192 tokens:

* ``to_int32``: the id conversion the unpatched apply() does
  (``topk_ids.to(torch.int32)``), which the guard replaces;
* ``fused``: the shipped guard, ``sanitize_topk_routes`` from the patched
  ``vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe``
  (one Triton kernel on CUDA);
* ``chain``: the same guard written as a chain of torch compare/where ops;
* ``moe_proxy`` (up to 64 tokens, CUDA only): a decode-size MoE stand-in, two bf16 GEMMs
  over the routed rows (hidden 2048, intermediate 512), to put the guard's
  cost in proportion.

On CUDA every variant is captured ``--reps`` times into one CUDA graph, the
graph is replayed, and CUDA events time the replays: the figure is the
per-call cost under CUDA-graph replay. On CPU the same functions are timed
with ``time.perf_counter`` (no graphs, no CUDA events); those figures only
show that the script and the guard's CPU path run, and say nothing about GPU
cost. Each run also checks the guard's output against the expected routes.

    python benchmarks/route_sanitization_guard.py            # needs patched vllm
    python benchmarks/route_sanitization_guard.py --tokens 1 8 64 --top-k 10

On a GPU machine without vLLM installed, ``--guard-source PATH`` takes the
patched ``flashinfer_b12x_moe.py`` instead: its ``_SANITIZE_ROUTES_BLOCK_SIZE``,
``_sanitize_topk_routes_kernel`` and ``sanitize_topk_routes`` definitions are
copied verbatim into a scratch module (with ``torch`` and Triton's ``tl`` and
``triton``) and imported from there, so the code timed is the shipped code.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

NUM_EXPERTS = 512
HIDDEN = 2048
INTERMEDIATE = 512
DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def make_routes(
    num_tokens: int, top_k: int, device: torch.device, ids_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(num_tokens * 131 + top_k)
    ids = torch.randint(0, NUM_EXPERTS, (num_tokens, top_k), generator=gen)
    # Padded rows (-1 sentinel) at the tail plus scattered out-of-range ids.
    ids[num_tokens - max(1, num_tokens // 4) :] = -1
    ids.view(-1)[::7] = NUM_EXPERTS
    weights = torch.rand(num_tokens, top_k, generator=gen)
    return ids.to(device=device, dtype=ids_dtype), weights.to(device)


def expected_routes(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    valid = (ids >= 0) & (ids < NUM_EXPERTS)
    return (
        torch.where(valid, ids, 0).to(torch.int32),
        torch.where(valid, weights, 0.0),
    )


def time_per_call(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Microseconds per call of ``fn``."""
    if device.type == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm up (Triton compile, allocator)
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        replays = 20
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / (replays * reps)
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e6 / reps


GUARD_NAMES = (
    "_SANITIZE_ROUTES_BLOCK_SIZE",
    "_sanitize_topk_routes_kernel",
    "sanitize_topk_routes",
)


def load_guard(source: str | None) -> Callable[..., None]:
    """The shipped guard: from the installed (patched) vLLM, or from a copy of
    the patched module's own definitions when vLLM is not installed."""
    if source is None:
        from vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe import (
            sanitize_topk_routes,
        )

        return sanitize_topk_routes
    text = Path(source).read_text()
    lines = text.splitlines()
    chunks = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        else:
            names = [getattr(node, "name", "")]
        if not any(name in GUARD_NAMES for name in names):
            continue
        # Whole top-level statement, decorators included.
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        chunks.append("\n".join(lines[first - 1 : node.end_lineno]))
    if len(chunks) != len(GUARD_NAMES):
        raise SystemExit(f"{source}: did not find all of {GUARD_NAMES}")
    header = "import torch\nimport triton\nimport triton.language as tl\n\n"
    scratch = Path(tempfile.mkdtemp()) / "b12x_route_guard.py"
    scratch.write_text(header + "\n\n".join(chunks) + "\n")
    spec = importlib.util.spec_from_file_location("b12x_route_guard", scratch)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["b12x_route_guard"] = module
    spec.loader.exec_module(module)
    print(f"guard loaded from {source} (copied definitions: {', '.join(GUARD_NAMES)})")
    return module.sanitize_topk_routes


def measure(
    guard: Callable[..., None],
    num_tokens: int,
    top_k: int,
    device: torch.device,
    ids_dtype: torch.dtype,
    reps: int,
) -> str:
    """One table row: the timings of one (tokens, top-k) point."""
    ids, weights = make_routes(num_tokens, top_k, device, ids_dtype)
    out_ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=device)
    out_w = torch.empty_like(weights)

    guard(ids, weights, NUM_EXPERTS, out_ids, out_w)
    want_ids, want_w = expected_routes(ids, weights)
    correct = torch.equal(out_ids, want_ids) and torch.equal(out_w, want_w)

    t_conv = time_per_call(lambda: ids.to(torch.int32), device, reps)
    t_fused = time_per_call(lambda: guard(ids, weights, NUM_EXPERTS, out_ids, out_w), device, reps)
    t_chain = time_per_call(lambda: expected_routes(ids, weights), device, reps)

    t_proxy = None
    # The proxy only means something on a GPU (bf16 GEMMs on a CPU take ms).
    if num_tokens <= 64 and device.type == "cuda":
        rows = num_tokens * top_k
        x = torch.randn(rows, HIDDEN, dtype=torch.bfloat16, device=device)
        w1 = torch.randn(HIDDEN, 2 * INTERMEDIATE, dtype=torch.bfloat16, device=device)
        w2 = torch.randn(INTERMEDIATE, HIDDEN, dtype=torch.bfloat16, device=device)

        def proxy() -> torch.Tensor:
            gate, up = (x @ w1).chunk(2, dim=-1)
            return (torch.nn.functional.silu(gate) * up) @ w2

        t_proxy = time_per_call(proxy, device, max(1, reps // 10))

    def ratio(t: float) -> str:
        return f"{t / t_proxy:>11.2f}" if t_proxy else f"{'-':>11}"

    proxy_s = f"{t_proxy:>9.2f}" if t_proxy else f"{'-':>9}"
    return (
        f"{num_tokens:>6}  {top_k:>5}  {t_conv:>8.2f}  {t_fused:>6.2f}  "
        f"{t_chain:>6.2f}  {proxy_s}  {t_fused - t_conv:>14.2f}  "
        f"{ratio(t_fused)}  {ratio(t_chain)}  {'yes' if correct else 'NO'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS)
    parser.add_argument("--top-k", type=int, nargs="+", default=[8, 10])
    parser.add_argument("--reps", type=int, default=100, help="calls per graph")
    parser.add_argument("--ids-dtype", choices=["int32", "int64"], default="int32", help="router ids")
    parser.add_argument(
        "--guard-source",
        help="patched flashinfer_b12x_moe.py to take the guard from (no vLLM)",
    )
    args = parser.parse_args()

    sanitize_topk_routes = load_guard(args.guard_source)

    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(device)
        where = (
            f"CUDA device {props.name} (sm_{props.major}{props.minor}), "
            "per-call cost under CUDA-graph replay, timed with CUDA events"
        )
    else:
        device = torch.device("cpu")
        where = (
            f"CPU only ({platform.processor() or platform.machine()}): no CUDA, "
            "wall-clock per call, NOT a GPU/CUDA-graph measurement"
        )
    ids_dtype = torch.int32 if args.ids_dtype == "int32" else torch.int64
    print(f"torch {torch.__version__}; device: {where}")
    print(f"experts={NUM_EXPERTS} ids_dtype={args.ids_dtype} reps/graph={args.reps}; times in us per MoE call")
    print("tokens  top_k  to_int32   fused   chain  moe_proxy  fused-to_int32  fused/proxy  chain/proxy  correct")

    for top_k in args.top_k:
        for num_tokens in args.tokens:
            print(measure(sanitize_topk_routes, num_tokens, top_k, device, ids_dtype, args.reps))


if __name__ == "__main__":
    main()
