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
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "scripts" / "with-patched-vllm"

HEAD_SIZE = 256
NUM_KV_HEADS = 2
INDEX_HEAD_DIM = 128
COMPRESS_RATIO = 4
ATTN_PREFIX = "model.layers.3.self_attn"

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


def _write_model_dir(path: Path) -> None:
    from transformers import Qwen4ExpTextConfig

    # GDN: conv (2*16*128 + 48*128) x 3 x 2 B + fp32 state 48 x 128 x 128 x 4 B
    # = 3,207,168 B; rotary over 64 of 256 dims (what Octave's kernels take).
    Qwen4ExpTextConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_SIZE,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        eos_token_id=1,
        hc_count=2,
        hc_lowrank=4,
        ple_layer_ids=[],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        architectures=["Qwen4ExpForCausalLM"],
        torch_dtype="bfloat16",
    ).save_pretrained(path)


def _cpu_flashinfer_seams(stack: contextlib.ExitStack) -> None:
    """Without a GPU, answer FlashInferImpl's device queries as an H200 would
    and keep its multi-CTA counter on the CPU. Not used when CUDA is present."""
    from unittest import mock

    import torch

    module = "vllm.v1.attention.backends.flashinfer"
    stack.enter_context(mock.patch(f"{module}._nvfp4_kv_on_fa2", lambda: True))
    stack.enter_context(mock.patch(f"{module}.get_device_sm_count", lambda device: 132))
    stack.enter_context(
        mock.patch(
            f"{module}._get_multi_ctas_kv_counter_buffer",
            lambda min_bytes, device: torch.zeros(min_bytes, dtype=torch.uint8),
        )
    )


def _main_layer(vllm_config, kind: str, has_cuda: bool):
    from torch import nn
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    if kind == "flashinfer":
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.attention.backends.flashinfer import FlashInferBackend

        with contextlib.ExitStack() as stack:
            if not has_cuda:
                _cpu_flashinfer_seams(stack)
            return Attention(
                num_heads=16,
                head_size=HEAD_SIZE,
                scale=HEAD_SIZE**-0.5,
                num_kv_heads=NUM_KV_HEADS,
                cache_config=vllm_config.cache_config,
                prefix=f"{ATTN_PREFIX}.attn",
                attn_backend=FlashInferBackend,
            )

    # The QSA owners' __init__ builds TP projections and the QSA/Octave impl;
    # the planner and the allocator read only the backend and the KV spec, so
    # the owner carries just the attributes its __init__ sets for those.
    # The owner and model modules import each other: enter through the model.
    vendor = "amd" if kind == "amd-qsa" else "nvidia"
    importlib.import_module(f"vllm.models.qwen4_exp.{vendor}.model")
    qsa = importlib.import_module(f"vllm.models.qwen4_exp.{vendor}.qsa")
    owner = object.__new__(qsa.Qwen4ExpQSAAttention)
    nn.Module.__init__(owner)
    cache_dtype = vllm_config.cache_config.cache_dtype
    owner.num_kv_heads = NUM_KV_HEADS
    owner.head_dim = HEAD_SIZE
    owner.kv_cache_dtype = cache_dtype
    owner.kv_cache_torch_dtype = kv_cache_dtype_str_to_dtype(cache_dtype, vllm_config.model_config)
    owner.attn_backend = qsa.Qwen4ExpQSAFlashAttentionBackend
    context = vllm_config.compilation_config.static_forward_context
    context[f"{ATTN_PREFIX}.attn"] = owner
    return owner


def measure(cache_dtype: str, kind: str, model_dir: Path) -> PageReport:
    import torch
    import vllm
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.models import ModelRegistry
    from vllm.models.qwen4_exp.common.qsa_cache import (
        QSACompressedKeyCache,
        QSAKeyStateCache,
    )
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform
    from vllm.v1.worker.utils import customize_attention_spec

    has_cuda = torch.cuda.is_available()
    device = torch.device("cuda") if has_cuda else torch.device("cpu")
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16"),
        cache_config=CacheConfig(
            cache_dtype=cache_dtype,  # type: ignore[arg-type]
            mamba_ssm_cache_dtype="float32",
        ),
        device_config=DeviceConfig(device=device.type),
    )
    cache_config = vllm_config.cache_config
    with set_current_vllm_config(vllm_config):
        for cache_cls, name in (
            (QSAKeyStateCache, "raw_key_cache"),
            (QSACompressedKeyCache, "compressed_key_cache"),
        ):
            cache_cls(
                head_size=INDEX_HEAD_DIM,
                dtype=torch.bfloat16,
                cache_config=cache_config,
                prefix=f"{ATTN_PREFIX}.indexer.{name}",
                compress_ratio=COMPRESS_RATIO,
                vllm_config=vllm_config,
            )
        layer = _main_layer(vllm_config, kind, has_cuda)
        backends = Platform._find_non_ssm_backends(vllm_config)

        # CUDA and ROCm platforms inherit Platform's method; elsewhere (this
        # machine's platform may be CPU or unspecified) call that one directly.
        platform_cls = type(current_platform) if current_platform.is_cuda_alike() else Platform
        platform_cls.update_block_size_for_backend(vllm_config)

        spec = customize_attention_spec(layer.get_attn_backend(), layer.get_kv_cache_spec(vllm_config))
        model_cls, _ = ModelRegistry.resolve_model_cls(
            vllm_config.model_config.architecture,
            model_config=vllm_config.model_config,
        )
        recurrent = max(s.page_size_bytes for s in model_cls.get_mamba_specs_from_config(vllm_config))

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
        _write_model_dir(model_dir)
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
        "--unspecified-platform",
        action="store_true",
        help="make vLLM's current_platform the UnspecifiedPlatform before the "
        "measurement. For a CUDA machine without vLLM's compiled extensions: "
        "with the CUDA platform, importing the Qwen4Exp model and "
        "vllm.v1.worker.utils needs torch.ops._C and vllm_flash_attn's "
        "_vllm_fa2_C/_vllm_fa3_C. The planner measured is then Platform's "
        "update_block_size_for_backend, which CudaPlatform inherits unchanged; "
        "the page tensors are still allocated on CUDA.",
    )
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

    if args.unspecified_platform:
        import vllm.platforms
        from vllm.platforms.interface import UnspecifiedPlatform

        forced = UnspecifiedPlatform()
        vllm.platforms._current_platform = forced
        vllm.platforms.current_platform = forced
        print("vLLM current_platform forced to UnspecifiedPlatform", file=sys.stderr)
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
