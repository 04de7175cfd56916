# SPDX-License-Identifier: Apache-2.0
"""A draft checkpoint without an lm_head must not have its placeholder processed.

An EAGLE-3 draft builds an lm_head whether or not its checkpoint has one; the
proposer replaces a missing one with the target's head after loading. Before
that, ``BaseModelLoader.load_model`` ran ``process_weights_after_loading`` on
the never-loaded placeholder, so a draft built with a quant_config repacked or
quantized uninitialized memory into a copy that was thrown away.

The tests load a real ``Eagle3LlamaForCausalLM`` draft (no decoder layers, so
no attention backend is needed) with the real ``DefaultModelLoader`` from a
safetensors checkpoint in a temporary folder, beside a real target
``ModelConfig``/``SpeculativeConfig``/``VllmConfig``. Distributed state is a real
single-process gloo group.

Seams: ``process_weights_after_loading`` of the quantization methods is
wrapped to record which layers it processed (the unquantized method still
runs). For the ModelOpt FP8 draft, kernel selection
(``modelopt.select_linear_kernel``) and the FP8 post-processing target GPU
scaled-mm kernels that do not exist on CPU, so a stand-in kernel is selected
and the FP8 method's ``process_weights_after_loading`` only records the layer.
"""

import json
import os

import pytest
import torch
from draft_loading import load_speculative_draft
from safetensors.torch import save_file
from vllm.config import (
    DeviceConfig,
    LoadConfig,
    ModelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.model_executor.layers.quantization import modelopt
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader import DefaultModelLoader, base_loader

HIDDEN = 64
VOCAB = 256
LLAMA = dict(
    model_type="llama",
    hidden_size=HIDDEN,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_hidden_layers=1,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    torch_dtype="bfloat16",
)


def _write_model(path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return str(path)


def _load_draft(tmp_path, *, draft_tensors, quantization_config=None):
    return _load_draft_with_config(tmp_path, draft_tensors=draft_tensors, quantization_config=quantization_config)[0]


def _load_draft_with_config(tmp_path, *, draft_tensors, quantization_config=None):
    target = _write_model(
        tmp_path / "target",
        dict(LLAMA, architectures=["LlamaForCausalLM"]),
        {"lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)},
    )
    draft_config = dict(LLAMA, architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=0)
    if quantization_config is not None:
        draft_config["quantization_config"] = quantization_config
    draft = _write_model(tmp_path / "draft", draft_config, draft_tensors)

    return load_speculative_draft(target, "eagle3", draft)


def _record_processed_layers(monkeypatch, method_cls, *, run_original: bool):
    processed: list[torch.nn.Module] = []
    original = method_cls.process_weights_after_loading

    def record(self, layer):
        processed.append(layer)
        if run_original:
            original(self, layer)

    monkeypatch.setattr(method_cls, "process_weights_after_loading", record)
    return processed


def _draft_weights(**extra: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16), **extra}


def test_missing_lm_head_is_released_before_post_processing(gloo_world, tmp_path, monkeypatch):
    processed = _record_processed_layers(monkeypatch, UnquantizedEmbeddingMethod, run_original=True)

    draft = _load_draft(tmp_path, draft_tensors=_draft_weights())

    assert draft.has_own_lm_head is False
    # Neither the never-loaded head nor the never-loaded embedding is
    # processed or kept; the loaded norm is.
    assert not any(isinstance(layer, VocabParallelEmbedding) for layer in processed)
    assert not hasattr(draft, "lm_head")
    assert not hasattr(draft.model, "embed_tokens")
    assert hasattr(draft.model, "norm")


def test_embedding_from_the_checkpoint_is_kept(gloo_world, tmp_path, monkeypatch):
    processed = _record_processed_layers(monkeypatch, UnquantizedEmbeddingMethod, run_original=True)
    embed = torch.randn(VOCAB, HIDDEN).to(torch.bfloat16)

    draft = _load_draft(tmp_path, draft_tensors=_draft_weights(**{"embed_tokens.weight": embed}))

    assert draft.model.embed_tokens in processed
    torch.testing.assert_close(draft.model.embed_tokens.weight.data[:VOCAB], embed)
    assert not hasattr(draft, "lm_head")


def test_lm_head_from_the_checkpoint_is_kept_and_processed(gloo_world, tmp_path, monkeypatch):
    processed = _record_processed_layers(monkeypatch, UnquantizedEmbeddingMethod, run_original=True)
    head = torch.randn(VOCAB, HIDDEN).to(torch.bfloat16)

    draft = _load_draft(tmp_path, draft_tensors=_draft_weights(**{"lm_head.weight": head}))

    assert draft.has_own_lm_head is True
    assert isinstance(draft.lm_head, ParallelLMHead)
    assert draft.lm_head in processed
    torch.testing.assert_close(draft.lm_head.weight.data[:VOCAB], head)


class _CpuStandInKernel:
    """Selected instead of a GPU scaled-mm kernel; never applied."""

    def input_quant_key(self) -> None:
        # Like a kernel that quantizes its own input.
        return None

    def process_weights_after_loading(self, layer) -> None:
        raise AssertionError("the recorder replaces FP8 post-processing")


def test_quantized_draft_does_not_quantize_its_placeholder_head(gloo_world, tmp_path, monkeypatch):
    monkeypatch.setattr(modelopt, "select_linear_kernel", lambda *args, **kwargs: _CpuStandInKernel())
    processed = _record_processed_layers(monkeypatch, modelopt.ModelOptLinearMethod, run_original=False)

    draft = _load_draft(
        tmp_path,
        draft_tensors=_draft_weights(),
        quantization_config={"quant_method": "modelopt", "quant_algo": "FP8"},
    )

    assert draft.has_own_lm_head is False
    # The draft's quantized fc layer is post-processed as before ...
    assert draft.model.fc in processed
    # ... the uninitialized head is not quantized, and it is gone.
    assert not any(isinstance(layer, ParallelLMHead) for layer in processed)
    assert not hasattr(draft, "lm_head")


def test_model_loaded_as_its_own_main_model_keeps_its_head(gloo_world, tmp_path):
    """LlamaForCausalLM supports EAGLE and never sets has_own_lm_head, yet as
    the main model (a target, or a standalone draft model) it keeps its head."""
    target = _write_model(
        tmp_path / "target",
        dict(LLAMA, architectures=["LlamaForCausalLM"], num_hidden_layers=0),
        {
            "model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN).bfloat16(),
            "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            "lm_head.weight": torch.zeros(VOCAB, HIDDEN).bfloat16(),
        },
    )
    model_config = ModelConfig(model=target, skip_tokenizer_init=True)
    vllm_config = VllmConfig(
        model_config=model_config,
        device_config=DeviceConfig(device="cpu"),
        load_config=LoadConfig(),
    )
    loader = DefaultModelLoader(vllm_config.load_config)
    with set_current_vllm_config(vllm_config):
        model = loader.load_model(vllm_config, model_config=model_config)

    assert isinstance(model.lm_head, ParallelLMHead)


class _TargetWithoutHead(torch.nn.Module):
    """A target language model whose lm_head lives elsewhere (none here)."""

    def __init__(self, embed_tokens: torch.nn.Module | None = None):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = embed_tokens or torch.nn.Embedding(VOCAB, HIDDEN)


def test_draft_left_without_a_head_fails_at_load_naming_the_draft(gloo_world, tmp_path, shell_eagle_proposer):
    draft, vllm_config = _load_draft_with_config(tmp_path, draft_tensors=_draft_weights())
    target = _TargetWithoutHead()
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)

    assert draft.model.embed_tokens is target.model.embed_tokens
    with pytest.raises(RuntimeError, match=r"Draft model Eagle3LlamaForCausalLM \(.*draft\) has no lm_head"):
        base_loader.check_draft_placeholders_shared(draft, vllm_config)


def test_draft_whose_head_was_shared_passes_the_check(gloo_world, tmp_path, shell_eagle_proposer):
    draft, vllm_config = _load_draft_with_config(tmp_path, draft_tensors=_draft_weights())
    target = _TargetWithoutHead()
    target.lm_head = ParallelLMHead(VOCAB, HIDDEN)
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)

    base_loader.check_draft_placeholders_shared(draft, vllm_config)
    assert draft.lm_head is target.lm_head
