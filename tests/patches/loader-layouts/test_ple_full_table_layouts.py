# SPDX-License-Identifier: Apache-2.0
"""A PLE checkpoint may store the complete n-gram table instead of row shards.

``Qwen4ExpNGramEmbedding.load_weights`` (NVIDIA and AMD) must accept the table
under an empty shard index (``ngram_embedding.shard_.weight``) and under the
shorter ``shard_.weight``, give every tensor-parallel rank its own rows, and
reject a table of the wrong shape before touching the parameter. The Engram
name pattern that keeps such tables off the GPU must accept the same names.

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


def _complete_table(module) -> torch.Tensor:
    embedding = module.ngram_embedding
    rows, width = embedding.org_vocab_size, embedding.weight.shape[1]
    return torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("name", FULL_TABLE_NAMES)
@pytest.mark.parametrize("rank", [0, 1])
def test_complete_table_gives_each_tp_rank_its_rows(parallel_rank, ple_builders, platform, name, rank):
    parallel_rank(rank=rank, world_size=2)
    module = ple_builders.by_platform[platform](ple_builders.config())
    table = _complete_table(module)
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
    table = _complete_table(module)
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
@pytest.mark.parametrize("rank", [0, 1])
def test_numbered_shards_match_the_complete_table(parallel_rank, ple_builders, platform, rank):
    parallel_rank(rank=rank, world_size=2)
    config = ple_builders.config()
    build = ple_builders.by_platform[platform]
    sharded = build(config)
    whole = build(config)
    table = _complete_table(whole)

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


@pytest.mark.parametrize(
    "weight_name",
    [
        f"{ENGRAM_PREFIX}.ngram_embedding.shard_.weight",
        f"{ENGRAM_PREFIX}.shard_.weight",
        f"{ENGRAM_PREFIX}.ngram_embedding.shard_3.weight",
    ],
)
def test_engram_pattern_keeps_complete_tables_on_cpu(cpu_only_instanttensor, tmp_path, weight_name):
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
    ],
)
def test_engram_pattern_leaves_other_names_to_the_gpu_reader(weight_name):
    assert weight_utils._ENGRAM_WEIGHT_RE.search(weight_name) is None
