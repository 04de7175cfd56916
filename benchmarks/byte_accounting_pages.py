#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""KV pages the hybrid planner picks for Qwen4Exp, and what the cache holds.

For the Qwen4Exp hybrid spec (head size 256, 2 KV heads, GDN state page
3,207,168 B) this builds the real forward context (the QSA side caches first,
then the main attention layer), runs the real
``Platform.update_block_size_for_backend`` of the importable vLLM and reports,
per KV cache dtype:

* the block size the planner chose and the padded recurrent page it set;
* the page the allocator builds for the main attention layer (through the same
  ``customize_attention_spec`` call ``GPUModelRunner.get_kv_cache_spec`` makes);
* the bytes of every block that page unification pads and nobody reads;
* one real tensor allocated at the planned attention page size and one at the
  padded recurrent page size, on the available device (CUDA when present,
  otherwise CPU tensors, and the output says so), with the device's own count
  of allocated bytes where it keeps one.

Pristine vs patched: the numbers come from whichever vLLM is importable. Pass
``--tree PRISTINE_TREE --tree PATCHED_TREE`` to run the measurement once per
tree through the project's ``scripts/with-patched-vllm`` runner (each tree's
changed vllm files laid over the installed package), side by side.

Examples::

    python3 benchmarks/byte_accounting_pages.py
    python3 benchmarks/byte_accounting_pages.py --json
    python3 benchmarks/byte_accounting_pages.py \\
        --tree /path/to/upstream-tree --tree /path/to/patched-tree
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "scripts" / "with-patched-vllm"
# The scenario (model config, side caches, layers, seams) is the byte-accounting test's own.
sys.path.insert(0, str(REPO / "tests" / "patches"))
import qwen4_exp_hybrid as hybrid  # noqa: E402

# (cache dtype, main attention layer)
SCENARIOS = [
    ("fp8", "nvidia-qsa"),
    ("nvfp4", "flashinfer"),
    ("octave_k3v4", "amd-qsa"),
    ("octave_k3v3", "amd-qsa"),
    ("octave_k3v3_compact", "amd-qsa"),
]


@dataclass
class PageReport:
    vllm_file: str
    planner: str
    platform: str
    cache_dtype: str
    main_backend: str
    first_backend: str
    block_size: int
    recurrent_page: int
    padded_recurrent_page: int
    attn_page: int
    attn_bytes_per_token: int
    planned_bytes_per_token: float
    padding_per_block: int
    device: str
    attn_tensor_bytes: int
    recurrent_tensor_bytes: int
    device_allocated_delta: int | None


def _main_layer(vllm_config, kind: str, has_cuda: bool):
    """The main attention layer: FlashInfer (NVFP4) or the vendor's QSA owner."""
    if kind == "flashinfer":
        with contextlib.ExitStack() as stack:
            if not has_cuda:
                for name, value in hybrid.flashinfer_device_answers().items():
                    stack.enter_context(mock.patch(name, value))
            return hybrid.flashinfer_attention(vllm_config)
    return hybrid.qsa_owner(vllm_config, "amd" if kind == "amd-qsa" else "nvidia")


def measure(cache_dtype: str, kind: str, model_dir: Path) -> PageReport:
    import torch
    import vllm
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    has_cuda = torch.cuda.is_available()
    device = torch.device("cuda") if has_cuda else torch.device("cpu")
    vllm_config = hybrid.make_vllm_config(model_dir, cache_dtype, device=device.type)
    cache_config = vllm_config.cache_config
    with set_current_vllm_config(vllm_config):
        hybrid.register_qsa_side_caches(vllm_config)
        layer = _main_layer(vllm_config, kind, has_cuda)
        backends = Platform._find_non_ssm_backends(vllm_config)

        # CUDA and ROCm platforms inherit Platform's method; elsewhere (this
        # machine's platform may be CPU or unspecified) call that one directly.
        platform_cls = type(current_platform) if current_platform.is_cuda_alike() else Platform
        platform_cls.update_block_size_for_backend(vllm_config)
    spec = hybrid.allocated_spec(vllm_config, layer)
    recurrent = hybrid.recurrent_page(vllm_config)

    padded = cache_config.mamba_page_size_padded or recurrent
    attn_page = spec.page_size_bytes
    before = torch.cuda.memory_allocated(device) if has_cuda else None
    attn_tensor = torch.empty(attn_page, dtype=torch.uint8, device=device)
    recurrent_tensor = torch.empty(padded, dtype=torch.uint8, device=device)
    if has_cuda:
        torch.cuda.synchronize(device)
        delta = torch.cuda.memory_allocated(device) - before
        device_name = f"cuda:{device.index or 0} {torch.cuda.get_device_name(device)}"
    else:
        delta = None
        device_name = "cpu (no CUDA device: CPU tensors)"

    return PageReport(
        vllm_file=vllm.__file__,
        planner=("patched" if hasattr(Platform, "_attention_page_size_1_token") else "pristine"),
        platform=platform_cls.__name__,
        cache_dtype=cache_dtype,
        main_backend=layer.get_attn_backend().get_name(),
        first_backend=backends[0].get_name(),
        block_size=cache_config.block_size,
        recurrent_page=recurrent,
        padded_recurrent_page=padded,
        attn_page=attn_page,
        attn_bytes_per_token=attn_page // spec.block_size,
        planned_bytes_per_token=padded / cache_config.block_size,
        # Page unification pads the attention page up to the shared page.
        padding_per_block=max(padded - attn_page, 0),
        device=device_name,
        attn_tensor_bytes=attn_tensor.numel() * attn_tensor.element_size(),
        recurrent_tensor_bytes=recurrent_tensor.numel() * recurrent_tensor.element_size(),
        device_allocated_delta=delta,
    )


def run_here(scenarios: list[tuple[str, str]], failed: list[str]) -> list[PageReport]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        hybrid.write_model_dir(model_dir)
        reports = []
        for dtype, kind in scenarios:
            try:
                reports.append(measure(dtype, kind, model_dir))
            except Exception as exc:  # report the scenario, go on with the others
                failed.append(dtype)
                traceback.print_exc()
                print(f"{dtype}: NOT MEASURED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return reports


def print_table(label: str, reports: list[PageReport]) -> None:
    if not reports:
        return
    first = reports[0]
    print(f"== {label}: {first.planner} planner ({first.vllm_file})")
    print(f"   platform method: {first.platform}; device: {first.device}")
    header = (
        f"{'cache dtype':<20} {'main backend':<21} {'block':>6} "
        f"{'B/tok held':>10} {'B/tok planned':>13} {'attn page':>10} "
        f"{'padded rec.':>11} {'pad/block':>10} {'attn tensor':>11} {'rec. tensor':>11} {'alloc delta':>11}"
    )
    print(header)
    for r in reports:
        delta = "-" if r.device_allocated_delta is None else r.device_allocated_delta
        print(
            f"{r.cache_dtype:<20} {r.main_backend:<21} {r.block_size:>6} "
            f"{r.attn_bytes_per_token:>10} {r.planned_bytes_per_token:>13.1f} "
            f"{r.attn_page:>10} {r.padded_recurrent_page:>11} "
            f"{r.padding_per_block:>10} {r.attn_tensor_bytes:>11} {r.recurrent_tensor_bytes:>11} {delta!s:>11}"
        )
    print(
        f"   recurrent page {first.recurrent_page} B; first non-SSM backend "
        f"{first.first_backend}; 'attn tensor' / 'rec. tensor': bytes of one "
        f"tensor allocated on {first.device} at the attention page and at the "
        "padded recurrent page; 'alloc delta': the device allocator's count "
        "for both (CUDA only)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="vLLM source tree to measure (repeatable); runs this script "
        "through scripts/with-patched-vllm once per tree",
    )
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    parser.add_argument(
        "--cache-dtype",
        action="append",
        default=[],
        help="limit to these KV cache dtypes (default: all scenarios)",
    )
    args = parser.parse_args(argv)
    scenarios = [s for s in SCENARIOS if not args.cache_dtype or s[0] in args.cache_dtype]

    if args.tree:
        rc = 0
        for tree in args.tree:
            # The runner runs on its own interpreter (its shebang); the
            # measurement runs on this one, whose vllm it overlays.
            cmd = [
                str(RUNNER),
                "--tree",
                tree,
                "--python",
                sys.executable,
                "--",
                sys.executable,
                str(Path(__file__).resolve()),
                *(["--json"] if args.json else []),
                *(f"--cache-dtype={d}" for d in args.cache_dtype),
            ]
            print(f"## tree {tree}", flush=True)
            rc |= subprocess.call(cmd)
        return rc

    failed: list[str] = []
    reports = run_here(scenarios, failed)
    if args.json:
        for r in reports:
            print(json.dumps(asdict(r)))
    else:
        print_table("importable vllm", reports)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
