# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Shared builders for the loader-layouts regression tests.

The PLE embedding is sharded over the embedding-tensor-parallel (ETP) group.
On a CPU machine no process group exists, so the one seam these tests replace
is the group lookup: ``get_etp_group``/``get_tp_group`` in the modules that call
them, and ``get_tensor_model_parallel_rank``/``..._world_size`` where
``BasevLLMParameter`` stamps the TP rank on quantized parameters. The stand-in
only reports a rank and a world size; every vLLM class is the real one, and
the rank decides which rows ``VocabParallelEmbedding`` assigns to this shard.
"""

from types import SimpleNamespace

import pytest
import torch
import vllm.model_executor.layers.vocab_parallel_embedding as embedding_module
import vllm.model_executor.parameter as parameter_module
import vllm.models.qwen4_exp.amd.ple_layer as amd_ple_layer
import vllm.models.qwen4_exp.common.ngram_embedding as common_ngram_embedding
import vllm.models.qwen4_exp.nvidia.ngram_embedding as nvidia_ngram_embedding
from transformers import Qwen4ExpTextConfig


def _set_parallel_rank(monkeypatch: pytest.MonkeyPatch, *, rank: int, world_size: int) -> None:
    """Make the PLE layers see ``rank`` of an ETP=TP group of ``world_size``."""
    group = SimpleNamespace(
        rank_in_group=rank,
        world_size=world_size,
        all_reduce=lambda tensor: tensor,
    )
    for module in (common_ngram_embedding, nvidia_ngram_embedding, amd_ple_layer):
        monkeypatch.setattr(module, "get_etp_group", lambda: group)
        monkeypatch.setattr(module, "get_tp_group", lambda: group)
    for module in (embedding_module, parameter_module):
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: world_size)
    # No engram CPU offload: the table lives in ordinary (device) memory.
    no_offload = lambda: SimpleNamespace(engram_config=None)  # noqa: E731
    monkeypatch.setattr(nvidia_ngram_embedding, "get_current_vllm_config", no_offload)
    monkeypatch.setattr(amd_ple_layer, "get_current_vllm_config", no_offload)


def _small_ple_config(**overrides) -> Qwen4ExpTextConfig:
    """Two n-gram heads of 5 and 7 rows: a 12-row table padded to 16 rows."""
    kwargs = dict(
        ngram_size=3,
        heads_per_ngram=1,
        ngram_vocab_size_base=5,
        make_ngram_vocab_size_divisible_by=8,
        split_ngram_parts=2,
        ple_embed_dim=64,
        eos_token_id=0,
        vocab_size=64,
    )
    kwargs.update(overrides)
    return Qwen4ExpTextConfig(**kwargs)


def _build_nvidia_ngram_embedding(config: Qwen4ExpTextConfig):
    return nvidia_ngram_embedding.Qwen4ExpNGramEmbedding(
        config,
        embedding_dim=config.ple_embed_dim,
        ple_dense_layer_id=0,
        max_total_tokens=4,
        data_parallel_rank=0,
        prefix="model.layers.1.ple.ple_embedding",
        params_dtype=torch.float32,
    )


def _build_amd_ngram_embedding(config: Qwen4ExpTextConfig):
    return amd_ple_layer.Qwen4ExpNGramEmbedding(
        config,
        embedding_dim=config.ple_embed_dim,
        ple_dense_layer_id=0,
        max_total_tokens=4,
        prefix="model.layers.1.ple.ple_embedding",
        layer_name="model.layers.1.ple",
        params_dtype=torch.float32,
    )


@pytest.fixture
def parallel_rank(monkeypatch: pytest.MonkeyPatch):
    """Call with ``rank=..., world_size=...`` before building a PLE layer."""

    def set_rank(*, rank: int, world_size: int) -> None:
        _set_parallel_rank(monkeypatch, rank=rank, world_size=world_size)

    return set_rank


def _complete_table(module) -> torch.Tensor:
    """The complete PLE table of ``module``'s embedding, every value distinct (row-major arange)."""
    embedding = module.ngram_embedding
    rows, width = embedding.org_vocab_size, embedding.weight.shape[1]
    return torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)


@pytest.fixture
def ple_builders():
    """Builders of the real NVIDIA and AMD ``Qwen4ExpNGramEmbedding``, and of a complete table for one."""
    return SimpleNamespace(
        config=_small_ple_config,
        complete_table=_complete_table,
        by_platform={
            "nvidia": _build_nvidia_ngram_embedding,
            "amd": _build_amd_ngram_embedding,
        },
    )


@pytest.fixture(scope="module")
def gloo_world():
    """A real single-process gloo world (TP=PP=1) for loading drafts on CPU."""
    from draft_loading import gloo_world as world

    with world():
        yield


@pytest.fixture
def shell_eagle_proposer():
    """Call with ``(draft, vllm_config)``: the real ``EagleProposer`` sharing
    methods (``_maybe_share_embeddings``/``_maybe_share_lm_head``) on an
    instance built without ``__init__``, which allocates CUDA buffers."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    def build(draft: torch.nn.Module, vllm_config) -> EagleProposer:
        proposer = object.__new__(EagleProposer)
        proposer.model = draft
        proposer.vllm_config = vllm_config
        proposer.use_local_argmax_reduction = False
        return proposer

    return build


@pytest.fixture
def cpu_attention_backend(monkeypatch: pytest.MonkeyPatch):
    """Lets a draft or target with attention layers be built on this CPU-only machine
    (``draft_loading.use_cpu_attention_backend`` says how and why)."""
    from draft_loading import use_cpu_attention_backend

    yield use_cpu_attention_backend(monkeypatch)
    from vllm.v1.attention import selector

    # The selector caches its answer without the platform in the key.
    selector._cached_get_attn_backend.cache_clear()


@pytest.fixture
def shell_proposer():
    """Call with ``(proposer_class, vllm_config)``: a real v1 proposer built without
    ``__init__`` (``draft_loading.shell_proposer`` says why)."""
    from draft_loading import shell_proposer as build

    return build
