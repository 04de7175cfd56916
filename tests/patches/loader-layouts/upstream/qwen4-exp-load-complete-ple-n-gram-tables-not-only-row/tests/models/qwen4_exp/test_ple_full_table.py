# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A PLE checkpoint may store the complete n-gram table instead of row shards.

``Qwen4ExpNGramEmbedding.load_weights`` (NVIDIA and AMD) must accept the table
under an empty shard index (``ngram_embedding.shard_.weight``) and under the
shorter ``shard_.weight``, give every tensor-parallel rank its own rows, and
reject a table of the wrong shape before touching the parameter. The Engram
pattern that keeps PLE tables off the GPU must route the same names.

No process group exists on CPU, so the tests replace only the group lookups
(``get_etp_group``/``get_tp_group`` and the TP rank ``VocabParallelEmbedding``
and ``BasevLLMParameter`` read); every layer is the real one.
"""

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen4ExpTextConfig

import vllm.model_executor.layers.vocab_parallel_embedding as embedding_module
import vllm.model_executor.parameter as parameter_module
import vllm.models.qwen4_exp.common.ngram_embedding as common_ngram_embedding
from vllm.model_executor.model_loader.weight_utils import _ENGRAM_WEIGHT_RE
from vllm.models.qwen4_exp.amd import ple_layer as amd_ple_layer
from vllm.models.qwen4_exp.nvidia import ngram_embedding as nvidia_ngram_embedding

FULL_TABLE_NAMES = ["ngram_embedding.shard_.weight", "shard_.weight"]
PREFIX = "model.layers.1.ple.ple_embedding"
# Two n-gram heads of 5 and 7 rows: a 12-row table padded to 16 rows.
TABLE_ROWS = 16
TP_SIZE = 2


def _set_tp_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    group = SimpleNamespace(
        rank_in_group=rank, world_size=TP_SIZE, all_reduce=lambda tensor: tensor
    )
    for module in (common_ngram_embedding, nvidia_ngram_embedding, amd_ple_layer):
        monkeypatch.setattr(module, "get_etp_group", lambda: group)
        monkeypatch.setattr(module, "get_tp_group", lambda: group)
    for module in (embedding_module, parameter_module):
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(
            module, "get_tensor_model_parallel_world_size", lambda: TP_SIZE
        )
    # No Engram CPU offload: the table lives in ordinary memory.
    for module in (nvidia_ngram_embedding, amd_ple_layer):
        monkeypatch.setattr(
            module,
            "get_current_vllm_config",
            lambda: SimpleNamespace(engram_config=None),
        )


def _build(platform: str):
    config = Qwen4ExpTextConfig(
        ngram_size=3,
        heads_per_ngram=1,
        ngram_vocab_size_base=5,
        make_ngram_vocab_size_divisible_by=8,
        split_ngram_parts=2,
        ple_embed_dim=64,
        eos_token_id=0,
        vocab_size=64,
    )
    kwargs = dict(
        embedding_dim=config.ple_embed_dim,
        ple_dense_layer_id=0,
        max_total_tokens=4,
        prefix=PREFIX,
        params_dtype=torch.float32,
    )
    if platform == "nvidia":
        return nvidia_ngram_embedding.Qwen4ExpNGramEmbedding(
            config, data_parallel_rank=0, **kwargs
        )
    return amd_ple_layer.Qwen4ExpNGramEmbedding(
        config, layer_name="model.layers.1.ple", **kwargs
    )


def _complete_table(module) -> torch.Tensor:
    """Every value distinct, so a misplaced row shows."""
    embedding = module.ngram_embedding
    rows, width = embedding.org_vocab_size, embedding.weight.shape[1]
    return torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)


@pytest.mark.parametrize("platform", ["nvidia", "amd"])
@pytest.mark.parametrize("name", FULL_TABLE_NAMES)
@pytest.mark.parametrize("rank", range(TP_SIZE))
def test_complete_table_gives_each_tp_rank_its_rows(monkeypatch, platform, name, rank):
    _set_tp_rank(monkeypatch, rank)
    module = _build(platform)
    table = _complete_table(module)
    rows = TABLE_ROWS // TP_SIZE
    assert module.ngram_embedding.weight.shape[0] == rows

    loaded = module.load_weights([(name, table)])

    assert loaded == {"ngram_embedding.weight"}
    torch.testing.assert_close(
        module.ngram_embedding.weight, table[rank * rows : (rank + 1) * rows]
    )


@pytest.mark.parametrize("platform", ["nvidia", "amd"])
@pytest.mark.parametrize("shape_error", ["rows", "width"])
def test_complete_table_of_wrong_shape_is_rejected_before_copy(
    monkeypatch, platform, shape_error
):
    _set_tp_rank(monkeypatch, 1)
    module = _build(platform)
    module.ngram_embedding.weight.data.fill_(-7.0)
    table = _complete_table(module)
    # Too few rows still overlap this rank's range and a width of one would
    # broadcast: both must be refused as a whole.
    bad = table[:-3] if shape_error == "rows" else table[:, :1]

    with pytest.raises(ValueError, match="Shape mismatch"):
        module.load_weights([("ngram_embedding.shard_.weight", bad)])

    assert torch.all(module.ngram_embedding.weight == -7.0)


@pytest.mark.parametrize(
    "table_name", ["ngram_embedding.shard_", "shard_", "ngram_embedding.shard_3"]
)
@pytest.mark.parametrize("leaf", ["weight", "weight_scale"])
def test_engram_pattern_routes_every_ple_table_layout(table_name, leaf):
    """Codes and NVFP4 block scales of every layout stay off the GPU."""
    assert _ENGRAM_WEIGHT_RE.search(f"{PREFIX}.{table_name}.{leaf}")


@pytest.mark.parametrize(
    "name",
    [
        "shard_3.weight",
        "ngram_embedding.shard_x.weight",
        "ngram_embedding.weight_scale_2",
        "ngram_embedding.weight_scale",
    ],
)
def test_engram_pattern_leaves_other_ple_names(name):
    assert not _ENGRAM_WEIGHT_RE.search(f"{PREFIX}.{name}")
