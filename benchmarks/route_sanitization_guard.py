# SPDX-License-Identifier: Apache-2.0
"""Cost of the B12x MoE route guard per MoE call (route-sanitization series).

Times, per MoE call, for 512 experts, top-k 8 and 10 and 1..8192 tokens:

* ``to_int32``: the id conversion the unpatched apply() does
  (``topk_ids.to(torch.int32)``), which the guard replaces;
* ``fused``: the shipped guard, the real per-layer ``TopKRouteGuard`` of a
  ``FlashInferB12xExperts`` of the importable (patched) vLLM (``B12xExperts``
  calls the same guard, fused_moe/route_guard.py), which runs
  ``sanitize_topk_routes`` (one Triton kernel on CUDA) into route buffers the
  layer allocated at construction;
* ``chain``: the same guard written as a chain of torch compare/where ops;
* ``moe_ref`` (up to 64 tokens, CUDA only): a decode-size MoE of the same shape
  to put the guard's cost in proportion: the routed rows grouped by expert and
  two bf16 grouped GEMMs (``torch._grouped_mm``) over 512 experts' weights
  (hidden 2048, intermediate 512), SiLU-and-mul between them. It is not the
  B12x kernel (NVFP4, SM120 only): bf16 weights are 4x the bytes of NVFP4, so
  this call is slower than B12x's and the guard's share is understated by
  up to that factor.

On CUDA every variant is captured ``--reps`` times into one CUDA graph, the
graph is replayed 50 times, CUDA events time each replay, and the figure is
the median replay divided by ``--reps``: the per-call cost under CUDA-graph
replay (the capture itself is the
graph-capturability check). ``launches`` counts the CUDA kernels one eager
call starts (torch profiler): the pristine conversion vs the guarded call.
On CPU the same functions are timed with ``time.perf_counter`` (no graphs,
no CUDA events); those figures only show that the script and the guard's
CPU path run, and say nothing about GPU cost. Each row also checks the
guard's output against the expected routes.

    python benchmarks/route_sanitization_guard.py            # needs patched vllm
    python benchmarks/route_sanitization_guard.py --tokens 1 8 64 --top-k 10
    python benchmarks/route_sanitization_guard.py --block-size 256   # tuning only

``--block-size`` overrides the module's ``_SANITIZE_ROUTES_BLOCK_SIZE`` for a
tuning run; the output then says so, and such rows are not the shipped guard.

``fused-to_int32`` is also what skipping the guard saves: with
``VLLM_MOE_SKIP_PADDING=0`` the guard is skipped and the call keeps the
``to_int32`` hand-off (no launch at all for int32 ids). The last line reports
the guard's median at 8192 tokens x top-10 against the 1.5 us budget.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The real layer is built the way the series' tests build it (tests/patches/b12x_harness.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "patches"))

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
    """FlashInferB12xExperts' guard: invalid ids become -1 (which its kernels skip), weight 0."""
    valid = (ids >= 0) & (ids < NUM_EXPERTS)
    return (
        torch.where(valid, ids, -1).to(torch.int32),
        torch.where(valid, weights, 0.0),
    )


def time_per_call(fn: Callable[[], object], device: torch.device, reps: int, replays: int = 50) -> float:
    """Microseconds per call of ``fn``: the median over ``replays`` timings of ``reps`` calls."""
    return statistics.median(replay_times(fn, device, reps, replays))


def replay_times(fn: Callable[[], object], device: torch.device, reps: int, replays: int = 50) -> list[float]:
    """Microseconds per call of ``fn`` in each of ``replays`` timed batches of ``reps`` calls."""
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
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1000.0 / reps for s, e in zip(starts, ends, strict=True)]
    for _ in range(3):
        fn()
    samples = []
    for _ in range(replays):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / reps)
    return samples


def kernel_launches(fn: Callable[[], object]) -> int:
    """CUDA kernels (and memcpy/memset) one eager call of ``fn`` starts."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def grouped_moe(num_tokens: int, top_k: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """A decode-size bf16 MoE of the benchmark's shape over grouped GEMMs."""
    gen = torch.Generator(device="cpu").manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=gen)[:top_k] for _ in range(num_tokens)])
    counts = torch.bincount(ids.flatten(), minlength=NUM_EXPERTS)
    offs = counts.cumsum(0).to(device=device, dtype=torch.int32)
    rows = num_tokens * top_k
    x = torch.randn(rows, HIDDEN, dtype=torch.bfloat16, device=device)
    # Stored out x in, as checkpoints store them; the GEMMs take the transposes.
    w13 = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=torch.bfloat16, device=device) * 0.02
    w2 = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE, dtype=torch.bfloat16, device=device) * 0.02

    def moe() -> torch.Tensor:
        gate, up = torch._grouped_mm(x, w13.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        return torch._grouped_mm(torch.nn.functional.silu(gate) * up, w2.transpose(-2, -1), offs=offs)

    return moe


def measure(num_tokens: int, top_k: int, device: torch.device, ids_dtype: torch.dtype, reps: int) -> tuple[str, float]:
    """One table row (the timings of one (tokens, top-k) point) and the guard's median."""
    from b12x_harness import make_experts

    ids, weights = make_routes(num_tokens, top_k, device, ids_dtype)
    layer = make_experts(NUM_EXPERTS, top_k, HIDDEN, INTERMEDIATE, num_tokens, device=device.type)
    guard = layer._route_guard  # its buffers were allocated with the layer
    assert guard.enabled, "VLLM_MOE_SKIP_PADDING=0 skips the guard: nothing to time"
    out_ids, out_w = guard(ids, weights)
    want_ids, want_w = expected_routes(ids, weights)
    correct = torch.equal(out_ids, want_ids) and torch.equal(out_w, want_w)

    def guarded() -> object:
        return guard(ids, weights)

    t_conv = time_per_call(lambda: ids.to(torch.int32), device, reps)
    fused_times = replay_times(guarded, device, reps)
    t_fused = statistics.median(fused_times)
    # The outputs of the captured graph's last replay are checked as well.
    replayed = torch.equal(out_ids, want_ids) and torch.equal(out_w, want_w)
    t_chain = time_per_call(lambda: expected_routes(ids, weights), device, reps)
    launches = "-"
    if device.type == "cuda":
        launches = f"{kernel_launches(lambda: ids.to(torch.int32))}/{kernel_launches(guarded)}"

    t_moe = None
    # The reference only means something on a GPU (bf16 GEMMs on a CPU take ms).
    if num_tokens <= 64 and device.type == "cuda":
        try:
            t_moe = time_per_call(grouped_moe(num_tokens, top_k, device), device, max(1, reps // 10))
        except RuntimeError as exc:  # grouped GEMM unsupported on this device/torch
            print(f"moe_ref not timed at {num_tokens} tokens: {exc}")

    def ratio(t: float) -> str:
        return f"{t / t_moe:>9.3f}" if t_moe else f"{'-':>9}"

    moe_s = f"{t_moe:>8.2f}" if t_moe else f"{'-':>8}"
    row = (
        f"{num_tokens:>6}  {top_k:>5}  {t_conv:>8.2f}  {t_fused:>6.2f}  "
        f"{max(fused_times):>9.2f}  {t_chain:>6.2f}  {moe_s}  {t_fused - t_conv:>14.2f}  "
        f"{ratio(t_fused)}  {ratio(t_chain)}  {launches:>8}  {'yes' if correct and replayed else 'NO'}"
    )
    return row, t_fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS)
    parser.add_argument("--top-k", type=int, nargs="+", default=[8, 10])
    parser.add_argument("--reps", type=int, default=100, help="calls per graph")
    parser.add_argument("--ids-dtype", choices=["int32", "int64"], default="int32", help="router ids")
    parser.add_argument(
        "--block-size",
        type=int,
        help="tuning only: override the guard kernel's _SANITIZE_ROUTES_BLOCK_SIZE",
    )
    args = parser.parse_args()

    from b12x_harness import describe_vllm
    from vllm.model_executor.layers.fused_moe import route_guard

    shipped = route_guard._SANITIZE_ROUTES_BLOCK_SIZE
    if args.block_size:
        route_guard._SANITIZE_ROUTES_BLOCK_SIZE = args.block_size
        print(f"TUNING RUN: block size {args.block_size} instead of the shipped {shipped}")
    else:
        print(f"guard: the importable vLLM's, block size {shipped}")
    print(describe_vllm())

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
    print(
        "tokens  top_k  to_int32   fused  fused_max   chain   moe_ref  fused-to_int32  fused/moe  chain/moe"
        "  launches  correct"
    )
    budget = None
    for top_k in args.top_k:
        for num_tokens in args.tokens:
            row, t_fused = measure(num_tokens, top_k, device, ids_dtype, args.reps)
            print(row, flush=True)
            if (num_tokens, top_k) == (8192, 10):
                budget = t_fused
    print(
        "medians of 50 timed replays; fused_max: the slowest replay of the guarded call; "
        "launches: CUDA kernels of one eager call, pristine conversion/guarded call"
    )

    if budget is not None and device.type == "cuda":
        verdict = "within" if budget <= 1.5 else "OVER"
        print(f"budget: guard median at 8192 tokens x top-10 = {budget:.2f} us, {verdict} the 1.5 us budget")


if __name__ == "__main__":
    main()
