# SPDX-License-Identifier: Apache-2.0
"""Bytes the workspace-reuse series saves: per-layer B12xMoEWrapper buffers.

Builds the real flashinfer ``B12xMoEWrapper(use_cuda_graph=True)`` for a MoE
shape and adds up the tensors its own ``_allocate_buffers`` creates (through
flashinfer's ``allocate_sm120_moe_workspace``): the static workspace, the
dynamic workspace and the output buffer. Views are not counted twice (one count per storage).

By default the wrapper is built on the ``meta`` device, so nothing is really
allocated and the script runs on any machine; the sizes are flashinfer's own
allocation sizes for that shape. With ``--device cuda`` the buffers are really
allocated and the CUDA allocator's delta is printed next to the computed sum.

Without sharing every MoE layer holds its own set; with it, all identically
shaped layers hold one, so the saving is ``(layers - 1) * per_layer``.

    python benchmarks/workspace_reuse_bytes.py                 # default table
    python benchmarks/workspace_reuse_bytes.py --experts 512 --top-k 10 \\
        --hidden 2048 --intermediate 512 --max-tokens 8192 --layers 48
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
from collections.abc import Iterable

import torch

GiB = 1024**3
MiB = 1024**2


def owned_bytes(obj: object) -> int:
    """Bytes of the tensors ``obj`` owns (a tensor or a workspace dataclass)."""
    if obj is None:
        return 0
    tensors: Iterable[object]
    if isinstance(obj, torch.Tensor):
        tensors = [obj]
    else:
        tensors = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    # Views (``packed_a_view``, ``packed_a_flat``, ...) share their base's
    # storage; count every storage once. On ``meta`` data pointers are all 0,
    # so storages are told apart by their StorageImpl handle.
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage._cdata not in seen:
                seen.add(storage._cdata)
                total += storage.nbytes()
    return total


def wrapper_buffer_bytes(
    experts: int,
    top_k: int,
    hidden: int,
    intermediate: int,
    max_tokens: int,
    activation: str,
    device: str,
) -> tuple[int, int, int, int | None]:
    from flashinfer.fused_moe import B12xMoEWrapper

    before = torch.cuda.memory_allocated() if device.startswith("cuda") else None
    wrapper = B12xMoEWrapper(
        num_experts=experts,
        top_k=top_k,
        hidden_size=hidden,
        intermediate_size=intermediate,
        use_cuda_graph=True,
        max_num_tokens=max_tokens,
        num_local_experts=experts,
        output_dtype=torch.bfloat16,
        device=device,
        activation=activation,
        quant_mode="nvfp4",
        source_format="modelopt",
    )
    measured = None
    if before is not None:
        torch.cuda.synchronize()
        measured = torch.cuda.memory_allocated() - before
    return (
        owned_bytes(wrapper._static_workspace),
        owned_bytes(wrapper._dynamic_workspace),
        owned_bytes(wrapper._moe_output),
        measured,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--activation", default="silu")
    parser.add_argument(
        "--device",
        default="meta",
        help="meta (sizes only, default) or cuda (really allocate)",
    )
    args = parser.parse_args()

    import flashinfer

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda given but CUDA is not available")
        where = f"CUDA device {torch.cuda.get_device_name()}"
    else:
        where = f"{args.device} device (no memory allocated) on {platform.node()}"
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}")
    print(f"buffers sized on: {where}; CUDA available: {cuda}")
    print(
        f"shape: experts={args.experts} top_k={args.top_k} hidden={args.hidden} "
        f"intermediate={args.intermediate} activation={args.activation} "
        f"layers={args.layers}"
    )
    header = (
        "max_tokens  static_MiB  dynamic_MiB  output_MiB  per_layer_MiB  "
        f"unshared_{args.layers}_GiB  shared_GiB  saved_GiB  saved_bytes"
    )
    print(header)
    for max_tokens in args.max_tokens:
        static, dynamic, output, measured = wrapper_buffer_bytes(
            args.experts,
            args.top_k,
            args.hidden,
            args.intermediate,
            max_tokens,
            args.activation,
            args.device,
        )
        per_layer = static + dynamic + output
        saved = (args.layers - 1) * per_layer
        print(
            f"{max_tokens:>10}  {static / MiB:>10.1f}  {dynamic / MiB:>11.1f}  "
            f"{output / MiB:>10.1f}  {per_layer / MiB:>13.1f}  "
            f"{args.layers * per_layer / GiB:>14.2f}  {per_layer / GiB:>10.2f}  "
            f"{saved / GiB:>9.2f}  {saved}"
        )
        if measured is not None:
            print(f"            CUDA allocator delta for one wrapper: {measured} B")
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
