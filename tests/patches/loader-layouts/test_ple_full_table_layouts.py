# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A PLE checkpoint may store the complete n-gram table instead of row shards.

``Qwen4ExpNGramEmbedding.load_weights`` (NVIDIA and AMD) must accept the table
under an empty shard index (``ngram_embedding.shard_.weight``) and under the
shorter ``shard_.weight``, give every tensor-parallel rank its own rows, and
reject a table of the wrong shape before touching the parameter, at TP=2 and
TP=4 and with checkpoint shard boundaries that differ from the TP boundaries.
The Engram name pattern that keeps such tables off the GPU must accept the same
names, for the codes and for NVFP4 block scales.

The TP rank seam is explained in conftest.py.
"""

import sys
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from safetensors.torch import save_file
from vllm.model_executor.model_loader import weight_utils
from vllm.platforms import current_platform

FULL_TABLE_NAMES = ["ngram_embedding.shard_.weight", "shard_.weight"]
PLATFORMS = ["amd", "nvidia"]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FULL_TABLE_NAMES)
@pytest.mark.parametrize("rank", [0, 1])
def test_complete_table_gives_each_tp_rank_its_rows(parallel_rank, ple_builders, platform, name, rank):
    parallel_rank(rank=rank, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    table = ple_builders.complete_table(module)
    embedding = module.ngram_embedding
    assert embedding.org_vocab_size == 16 and embedding.weight.shape[0] == 8

    loaded = module.load_weights([(name, table)])

    assert loaded == {"ngram_embedding.weight"}
    torch.testing.assert_close(embedding.weight, table[rank * 8 : (rank + 1) * 8])


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FULL_TABLE_NAMES)
@pytest.mark.parametrize("shape_error", ["rows", "width"])
def test_complete_table_of_wrong_shape_is_rejected_before_copy(
    parallel_rank, ple_builders, platform, name, shape_error
):
    parallel_rank(rank=1, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    embedding = module.ngram_embedding
    embedding.weight.data.fill_(-7.0)
    table = ple_builders.complete_table(module)
    # Too few rows would still overlap this rank's range; a width of one would
    # broadcast. Both must be refused as a whole.
    bad = table[:-3] if shape_error == "rows" else table[:, :1]

    with pytest.raises(ValueError) as excinfo:
        module.load_weights([(name, bad)])

    message = str(excinfo.value)
    assert str(tuple(table.shape)) in message
    assert str(tuple(bad.shape)) in message
    assert torch.all(embedding.weight == -7.0)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FULL_TABLE_NAMES)
def test_complete_table_at_tp4_gives_every_rank_its_quarter(parallel_rank, ple_builders, platform, name):
    build = ple_builders.by_platform[platform]
    for rank in range(4):
        parallel_rank(rank=rank, world_size=4)
        module = build(ple_builders.config())
        table = ple_builders.complete_table(module)
        assert module.ngram_embedding.weight.shape[0] == 4

        assert module.load_weights([(name, table)]) == {"ngram_embedding.weight"}
        torch.testing.assert_close(module.ngram_embedding.weight, table[rank * 4 : (rank + 1) * 4])


# (checkpoint shards, TP size): 3 shards of 6/6/4 rows straddle the 4-row TP
# ranges; 4 shards of 4 rows land two to each rank of TP=2; 2 shards of 8 rows
# split across TP=4.
MISMATCHED_BOUNDARIES = [(3, 4), (4, 2), (2, 4)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(("split_parts", "world_size"), MISMATCHED_BOUNDARIES)
def test_shard_boundaries_that_differ_from_tp_boundaries(
    parallel_rank, ple_builders, platform, split_parts, world_size
):
    build = ple_builders.by_platform[platform]
    config = ple_builders.config(split_ngram_parts=split_parts)
    shard_rows = -(-16 // split_parts)
    rows_per_rank = 16 // world_size
    for rank in range(world_size):
        parallel_rank(rank=rank, world_size=world_size)
        module = build(config)
        table = ple_builders.complete_table(module)
        shards = [(f"ngram_embedding.shard_{index}.weight", part) for index, part in enumerate(table.split(shard_rows))]
        assert len(shards) == split_parts

        assert module.load_weights(shards) == {"ngram_embedding.weight"}
        torch.testing.assert_close(
            module.ngram_embedding.weight, table[rank * rows_per_rank : (rank + 1) * rows_per_rank]
        )


@pytest.mark.parametrize("platform", PLATFORMS)
def test_checkpoint_sharded_unlike_its_config_is_refused(parallel_rank, ple_builders, platform):
    """Shard offsets come from split_ngram_parts; a checkpoint saved in three
    shards cannot be placed by a config that says two, so it must not load."""
    parallel_rank(rank=1, world_size=4)
    module = ple_builders.by_platform[platform](ple_builders.config(split_ngram_parts=2))
    module.ngram_embedding.weight.data.fill_(-7.0)
    table = ple_builders.complete_table(module)
    shards = [(f"ngram_embedding.shard_{index}.weight", part) for index, part in enumerate(table.split(6))]

    with pytest.raises(ValueError, match="Shape mismatch for PLE embedding shard 0"):
        module.load_weights(shards)
    assert torch.all(module.ngram_embedding.weight == -7.0)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("rank", [0, 1])
def test_numbered_shards_match_the_complete_table(parallel_rank, ple_builders, platform, rank):
    parallel_rank(rank=rank, world_size=2)
    config = ple_builders.config()
    build = ple_builders.by_platform[platform]
    sharded = build(config)
    whole = build(config)
    table = ple_builders.complete_table(whole)

    shards = [(f"ngram_embedding.shard_{index}.weight", part) for index, part in enumerate(table.split(8))]
    assert sharded.load_weights(shards) == {"ngram_embedding.weight"}
    assert whole.load_weights([("ngram_embedding.shard_.weight", table)]) == {"ngram_embedding.weight"}

    torch.testing.assert_close(sharded.ngram_embedding.weight, whole.ngram_embedding.weight)


def test_nvfp4_complete_table_loads_codes_and_block_scales(parallel_rank, ple_builders):
    """NVFP4 splits block scales like rows, so the complete form covers both."""
    parallel_rank(rank=1, world_size=2)
    build = ple_builders.by_platform["nvidia"]
    module = build(ple_builders.config(ple_embedding_dtype="nvfp4"))
    embedding = module.ngram_embedding
    codes = torch.arange(16 * 16).reshape(16, 16).to(torch.uint8)
    scales = ((torch.arange(32).reshape(16, 2) + 1) / 4).to(torch.float8_e4m3fn)

    loaded = module.load_weights(
        [
            ("shard_.weight", codes),
            ("ngram_embedding.shard_.weight_scale", scales),
            ("ngram_embedding.weight_scale_2", torch.tensor(0.5)),
        ]
    )

    assert loaded == {
        "ngram_embedding.weight",
        "ngram_embedding.weight_scale",
        "ngram_embedding.weight_scale_2",
    }
    torch.testing.assert_close(embedding.weight, codes[8:16])
    torch.testing.assert_close(embedding.weight_scale.float(), scales[8:16].float())


ENGRAM_PREFIX = "model.language_model.layers.1.ple.ple_embedding"


@pytest.fixture
def cpu_only_instanttensor(monkeypatch):
    """InstantTensor is a CUDA-only reader: stand in for its native module.

    Only tables the Engram pattern routes to the CPU are read by safetensors
    here; anything else would go to this mock, which yields nothing.
    """
    native_open = MagicMock()
    reader = native_open.return_value.__enter__.return_value
    reader.total_tensor_size = 0
    reader.tensors.return_value = ()
    monkeypatch.setitem(sys.modules, "instanttensor", SimpleNamespace(safe_open=native_open))
    monkeypatch.setattr(
        weight_utils,
        "get_world_group",
        lambda: SimpleNamespace(world_size=1, device_group=None),
    )
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "current_device", lambda: 0)
    return native_open


@pytest.mark.parametrize("leaf", ["weight", "weight_scale"])
@pytest.mark.parametrize(
    "table_name",
    ["ngram_embedding.shard_", "shard_", "ngram_embedding.shard_3"],
)
def test_engram_pattern_keeps_ple_tables_on_cpu(cpu_only_instanttensor, tmp_path, table_name, leaf):
    """Codes and NVFP4 block scales of every table layout take the CPU route."""
    weight_name = f"{ENGRAM_PREFIX}.{table_name}.{leaf}"
    path = tmp_path / "ple.safetensors"
    table = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    save_file({weight_name: table}, str(path))

    loaded = dict(weight_utils.instanttensor_weights_iterator([str(path)], False, load_engram_on_cpu=True))

    cpu_only_instanttensor.assert_not_called()
    assert list(loaded) == [weight_name]
    assert loaded[weight_name].device.type == "cpu"
    torch.testing.assert_close(loaded[weight_name], table)


@pytest.mark.parametrize(
    "weight_name",
    [
        f"{ENGRAM_PREFIX}.shard_3.weight",
        f"{ENGRAM_PREFIX}.ngram_embedding.shard_x.weight",
        f"{ENGRAM_PREFIX}.layer_multipliers",
        # Global scales are scalars, not tables.
        f"{ENGRAM_PREFIX}.ngram_embedding.weight_scale_2",
        f"{ENGRAM_PREFIX}.ngram_embedding.weight_scale",
        f"{ENGRAM_PREFIX}.ngram_embedding.shard_3.weight_scale_2",
    ],
)
def test_engram_pattern_leaves_other_names_to_the_gpu_reader(cpu_only_instanttensor, tmp_path, weight_name):
    path = tmp_path / "other.safetensors"
    save_file({weight_name: torch.ones(2)}, str(path))

    loaded = dict(weight_utils.instanttensor_weights_iterator([str(path)], False, load_engram_on_cpu=True))

    # Handed to the (stand-in) GPU reader, which yields nothing here.
    cpu_only_instanttensor.assert_called_once()
    assert loaded == {}
