#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU bytes of N identically configured B12x MoE wrappers, as the importable vLLM builds them.

Builds ``--layers`` real ``FlashInferB12xExperts`` of one MoE shape (NVFP4, the
B12x backend's only quant scheme) and calls each one's ``_ensure_wrapper()``:
the method ``apply()`` calls first, which builds flashinfer's real
``B12xMoEWrapper(use_cuda_graph=True)`` and with it the wrapper's static
workspace, dynamic workspace and output buffer. ``apply()`` itself is not
called: after ``_ensure_wrapper`` it launches the B12x kernels, which target
SM120/121 and are not what this measures.

The figures are the CUDA caching allocator's own statistics
(``torch.cuda.memory_stats``) around the N calls: allocated bytes (current and
peak), reserved bytes, the number of allocations, and per wrapper the bytes
the allocator handed out while it was built. Whether wrappers share buffers
is shown by the number of distinct static-workspace storages.

Run it once per vLLM tree (pristine, patched) in separate processes; the
vLLM measured is whichever ``import vllm`` finds, and its path is printed.

    python3 benchmarks/workspace_reuse_gpu.py --layers 48 --max-tokens 8192

Without a CUDA device (``--device cpu``) the same construction runs on CPU
tensors, which checks the script and the import path only: no allocator
statistics exist there, and the pristine tree cannot run that way (it always
builds its wrapper on ``cuda``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

# The real layer is built the way the series' tests build it (tests/patches/b12x_harness.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "patches"))

MiB = 1024**2
GiB = 1024**3


def storage_key(obj: object) -> int | None:
    """Data pointer of the first tensor a workspace dataclass (or tensor) holds."""
    if obj is None:
        return None
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().data_ptr()
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        if isinstance(value, torch.Tensor):
            return value.untyped_storage().data_ptr()
    return None


def stat(stats: dict, name: str) -> int:
    return int(stats.get(name, 0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--device", default="cuda", help="cuda (measure) or cpu (dry run)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args()

    import flashinfer
    import vllm
    from b12x_harness import describe_vllm, make_experts
    from vllm.model_executor.layers.fused_moe.experts import flashinfer_b12x_moe

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda given but CUDA is not available")
    variant = "patched" if hasattr(flashinfer_b12x_moe, "_B12X_SHARED_BUFFERS") else "pristine"
    print(f"{describe_vllm()} ({variant} FlashInferB12xExperts)", file=sys.stderr)
    print(f"flashinfer {flashinfer.__version__} {flashinfer.__file__}", file=sys.stderr)
    where = torch.cuda.get_device_name() if cuda else "cpu (dry run, no allocator statistics)"
    print(f"torch {torch.__version__}; device: {where}", file=sys.stderr)

    shape = (args.experts, args.top_k, args.hidden, args.intermediate, args.max_tokens)
    layers = [make_experts(*shape, device=args.device) for _ in range(args.layers)]
    per_wrapper: list[int] = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_stats()
    for layer in layers:
        start = torch.cuda.memory_allocated() if cuda else 0
        layer._ensure_wrapper()
        if cuda:
            torch.cuda.synchronize()
            per_wrapper.append(torch.cuda.memory_allocated() - start)
    wrappers = [layer._wrapper for layer in layers]
    result: dict[str, object] = {
        "variant": variant,
        "vllm_file": vllm.__file__,
        "device": where,
        "layers": args.layers,
        "shape": {
            "experts": args.experts,
            "top_k": args.top_k,
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "max_tokens": args.max_tokens,
        },
        "distinct_static_workspaces": len({storage_key(w._static_workspace) for w in wrappers}),
        "distinct_dynamic_workspaces": len({storage_key(w._dynamic_workspace) for w in wrappers}),
        "distinct_outputs": len({storage_key(w._moe_output) for w in wrappers}),
    }
    if cuda:
        after = torch.cuda.memory_stats()
        result.update(
            allocated_bytes=stat(after, "allocated_bytes.all.current") - stat(before, "allocated_bytes.all.current"),
            peak_allocated_bytes=stat(after, "allocated_bytes.all.peak") - stat(before, "allocated_bytes.all.current"),
            reserved_bytes=stat(after, "reserved_bytes.all.current") - stat(before, "reserved_bytes.all.current"),
            allocations=stat(after, "allocation.all.allocated") - stat(before, "allocation.all.allocated"),
            # Segments are the allocator's cudaMalloc calls.
            segments=stat(after, "segment.all.allocated") - stat(before, "segment.all.allocated"),
            first_wrapper_bytes=per_wrapper[0],
            later_wrapper_bytes_min=min(per_wrapper[1:], default=0),
            later_wrapper_bytes_max=max(per_wrapper[1:], default=0),
        )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            if isinstance(value, int) and key.endswith("bytes"):
                value = f"{value} B ({value / MiB:.1f} MiB, {value / GiB:.2f} GiB)"
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
