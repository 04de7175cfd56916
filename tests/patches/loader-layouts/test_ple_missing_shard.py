# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A PLE checkpoint saved in numbered row shards that lacks one must not load.

``Qwen4ExpNGramEmbedding.load_weights`` (NVIDIA and AMD) places each
``ngram_embedding.shard_<i>.weight`` at the rows ``split_ngram_parts`` gives it.
When a shard is missing (a truncated download, a file left out of the index),
the rows it covers on this rank are never written and keep what ``torch.empty``
left there; the parameter is still reported loaded, and DefaultModelLoader's
strict check exempts the table anyway (its quant method post-processes), so the
model served garbage embeddings for those n-gram ids. Loading must now fail at
the end, in the post-load processing vLLM's loader runs for every layer, naming
the parameter, the missing shard and the rows, on each rank that owns any of
those rows. A rank whose rows all arrived loads: its table is complete, and the
ranks that own the missing rows fail the load.

Everything runs through the real loader entry points: ``load_weights`` and
``model_loader.utils.process_weights_after_loading``, as BaseModelLoader calls
them. The TP rank seam is explained in conftest.py.
"""

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from vllm.model_executor.model_loader import utils as loader_utils

PLATFORMS = ["amd", "nvidia"]
TABLE_ROWS = 16

# (checkpoint shards, TP size, missing shard, {rank: this rank's missing rows}):
# three shards of 6/6/4 rows at TP=2 lose the middle one, which straddles the
# ranks; four aligned shards at TP=4 lose the third, which only rank 2 owns;
# two shards at TP=4 lose the first, which ranks 0 and 1 share.
MISSING_SHARD_LAYOUTS = [
    pytest.param(3, 2, 1, {0: "[6, 8)", 1: "[8, 12)"}, id="3-shards-tp2-middle"),
    pytest.param(4, 4, 2, {2: "[8, 12)"}, id="4-shards-tp4-third"),
    pytest.param(2, 4, 0, {0: "[0, 4)", 1: "[4, 8)"}, id="2-shards-tp4-first"),
]


def _table(width: int) -> torch.Tensor:
    return torch.arange(TABLE_ROWS * width, dtype=torch.float32).reshape(TABLE_ROWS, width)


def _shards(table: torch.Tensor, split_parts: int, leaf: str = "weight") -> list[tuple[str, torch.Tensor]]:
    rows = -(-TABLE_ROWS // split_parts)
    return [(f"ngram_embedding.shard_{index}.{leaf}", part) for index, part in enumerate(table.split(rows))]


def _finish_loading(module: nn.Module) -> None:
    """Run the post-load step BaseModelLoader.load_model runs after load_weights."""
    model = nn.Module()
    model.ple_embedding = module
    model_config = SimpleNamespace(quantization=None, word_embeddings_untied_by_checkpoint=False, dtype=torch.float32)
    loader_utils.process_weights_after_loading(model, model_config, torch.device("cpu"))


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(("split_parts", "world_size", "missing", "missing_rows"), MISSING_SHARD_LAYOUTS)
def test_missing_row_shard_is_refused_by_every_rank_that_owns_its_rows(
    parallel_rank, ple_builders, platform, split_parts, world_size, missing, missing_rows
):
    build = ple_builders.by_platform[platform]
    config = ple_builders.config(split_ngram_parts=split_parts)
    rows_per_rank = TABLE_ROWS // world_size
    for rank in range(world_size):
        parallel_rank(rank=rank, world_size=world_size)
        module = build(config)
        weight = module.ngram_embedding.weight
        assert weight.shape[0] == rows_per_rank
        table = _table(weight.shape[1])
        shards = _shards(table, split_parts)
        assert len(shards) == split_parts
        del shards[missing]

        # Placing the shards that are there still works and names the table.
        assert module.load_weights(shards) == {"ngram_embedding.weight"}

        if rank in missing_rows:
            with pytest.raises(ValueError) as excinfo:
                _finish_loading(module)
            message = str(excinfo.value)
            assert "model.layers.1.ple.ple_embedding.ngram_embedding.weight" in message
            assert f"ngram_embedding.shard_{missing}.weight" in message
            assert f"rows {missing_rows[rank]}" in message
            assert f"ETP rank {rank} of {world_size}" in message
        else:
            # Every row of this rank arrived; the ranks above refuse the load.
            _finish_loading(module)
            torch.testing.assert_close(weight, table[rank * rows_per_rank : (rank + 1) * rows_per_rank])


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("layout", ["numbered-in-two-groups", "complete", "unsharded"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_complete_checkpoint_loads_every_ranks_rows(parallel_rank, ple_builders, platform, layout, world_size):
    """Every layout that writes all rows passes, also when the numbered shards
    reach load_weights in two calls, as they do from two safetensors files."""
    build = ple_builders.by_platform[platform]
    config = ple_builders.config(split_ngram_parts=3)
    rows_per_rank = TABLE_ROWS // world_size
    for rank in range(world_size):
        parallel_rank(rank=rank, world_size=world_size)
        module = build(config)
        weight = module.ngram_embedding.weight
        table = _table(weight.shape[1])
        if layout == "numbered-in-two-groups":
            shards = _shards(table, 3)
            loaded = module.load_weights(shards[2:]) | module.load_weights(shards[:2])
        elif layout == "complete":
            loaded = module.load_weights([("ngram_embedding.shard_.weight", table)])
        else:
            loaded = module.load_weights([("ngram_embedding.weight", table)])
        assert loaded == {"ngram_embedding.weight"}

        _finish_loading(module)
        torch.testing.assert_close(weight, table[rank * rows_per_rank : (rank + 1) * rows_per_rank])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_table_without_any_checkpoint_rows_is_not_checked(parallel_rank, ple_builders, platform):
    """Dummy weights (load_format=dummy) never call the PLE weight loader."""
    parallel_rank(rank=1, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    _finish_loading(module)


def test_nvfp4_missing_block_scale_shard_is_refused(parallel_rank, ple_builders):
    """NVFP4 block scales are split like the codes; all codes and the global
    scale arriving does not make up for a missing scale shard."""
    parallel_rank(rank=0, world_size=2)
    module = ple_builders.by_platform["nvidia"](ple_builders.config(ple_embedding_dtype="nvfp4", split_ngram_parts=4))
    embedding = module.ngram_embedding
    codes = torch.arange(TABLE_ROWS * 16).reshape(TABLE_ROWS, 16).to(torch.uint8)
    scales = ((torch.arange(TABLE_ROWS * 2).reshape(TABLE_ROWS, 2) + 1) / 4).to(torch.float8_e4m3fn)
    scale_shards = _shards(scales, 4, "weight_scale")
    del scale_shards[1]

    module.load_weights(
        _shards(codes, 4) + scale_shards + [("ngram_embedding.weight_scale_2", torch.tensor(0.5))],
    )

    with pytest.raises(ValueError) as excinfo:
        _finish_loading(module)
    message = str(excinfo.value)
    assert "ngram_embedding.weight_scale: rows [4, 8)" in message
    assert "ngram_embedding.shard_1.weight_scale" in message
    assert "ngram_embedding.weight:" not in message
    torch.testing.assert_close(embedding.weight, codes[:8])
