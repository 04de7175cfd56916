# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Quantized PLE tables take only checkpoint tensors of their own dtype, on both platforms.

An FP8 table stores float8_e4m3fn values; an NVFP4 table stores packed E2M1
bytes and E4M3 block scales. A checkpoint tensor of another dtype would be cast
on the way in (requantized without a scale, or reinterpreted), load without an
error and serve wrong embeddings. The NVIDIA loader refused this only for NVFP4
and only in its own ``load_weights``; the AMD twin cast silently. Every table
layout (numbered shards, the complete table, an unsharded table) must refuse it
before copying anything, and a table of the right dtype must still load.

The real NVIDIA and AMD ``Qwen4ExpNGramEmbedding`` are built as rank 1 of a
two-way ETP group; the TP rank seam is explained in conftest.py.
"""

import pytest
import torch

PLATFORMS = ["amd", "nvidia"]
LAYOUTS = ["numbered", "complete", "unsharded"]


def _entries(layout: str, table: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    if layout == "numbered":
        return [(f"ngram_embedding.shard_{index}.weight", part) for index, part in enumerate(table.split(8))]
    if layout == "complete":
        return [("ngram_embedding.shard_.weight", table)]
    return [("ngram_embedding.weight", table)]


def _fp8_module(parallel_rank, ple_builders, platform):
    parallel_rank(rank=1, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config(ple_embedding_dtype="float8_e4m3fn"))
    assert module.ngram_embedding.weight.dtype == torch.float8_e4m3fn
    return module


def _values() -> torch.Tensor:
    return (torch.arange(16 * 32, dtype=torch.float32).reshape(16, 32) % 7) - 3


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_table_refuses_a_table_it_would_have_to_cast(parallel_rank, ple_builders, platform, layout):
    module = _fp8_module(parallel_rank, ple_builders, platform)
    weight = module.ngram_embedding.weight
    weight.data.copy_(torch.full(weight.shape, -2.0).to(torch.float8_e4m3fn))

    with pytest.raises(ValueError, match=r"float8_e4m3fn.*bfloat16"):
        module.load_weights(_entries(layout, _values().to(torch.bfloat16)))

    assert torch.all(weight.float() == -2.0)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp8_table_of_its_own_dtype_loads_each_ranks_rows(parallel_rank, ple_builders, platform, layout):
    module = _fp8_module(parallel_rank, ple_builders, platform)
    table = _values().to(torch.float8_e4m3fn)

    assert module.load_weights(_entries(layout, table)) == {"ngram_embedding.weight"}

    torch.testing.assert_close(module.ngram_embedding.weight.float(), table[8:16].float())


@pytest.mark.parametrize("name", ["ngram_embedding.shard_1.weight_scale", "ngram_embedding.shard_.weight_scale"])
def test_nvfp4_block_scales_of_another_dtype_are_refused(parallel_rank, ple_builders, name):
    parallel_rank(rank=1, world_size=2)
    module = ple_builders.by_platform["nvidia"](ple_builders.config(ple_embedding_dtype="nvfp4"))
    scale = module.ngram_embedding.weight_scale
    rows = 8 if "shard_1" in name else 16

    with pytest.raises(ValueError, match=r"weight_scale stores torch\.float8_e4m3fn"):
        module.load_weights([(name, torch.ones(rows, scale.shape[1], dtype=torch.float32))])
