# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""An MTP draft's never-loaded lm_head is released before post-processing.

``Qwen3_5MTP`` builds a top-level ``ParallelLMHead`` with the draft's quant
config on the last pipeline stage and has no ``has_own_lm_head`` record; the
proposer replaces it with the target's head after loading. Whether the
checkpoint provided it is decided from the names its ``load_weights``
reported -- not the set ``DefaultModelLoader``'s weight tracking adds every
post-processed module to.

``Step3p5MTP`` has no top-level head at all: each MTP layer computes its
logits with its own ``shared_head.head``, loaded from the checkpoint
(``has_own_lm_head = True``; the v1 ``Step3p5MTPProposer`` shares no head).
Nothing of it is released, so the check after sharing must not ask for a
top-level ``lm_head``: on both model runners it loads as it does on 0.33.0.

The tests load the real ``Qwen3_5MTP`` (one MTP layer, tiny sizes) with the
real ``DefaultModelLoader`` from a safetensors checkpoint in a temporary
folder, as ``SpeculativeConfig(method="mtp")`` derives it from a real
``qwen3_5`` target config, in a real single-process gloo group. The
Step-3.5 tests load the real ``Step3p5MTP`` draft (one dense MTP layer) from
a tiny Step-3.5 checkpoint through the real load paths of both runners: v1
``Step3p5MTPProposer.load_model`` (on an instance built without
``__init__``, whose pinned buffers need a CUDA driver: see ``shell_proposer``)
and v2 ``load_eagle_model`` (what ``MTPSpeculator`` calls). Their target is
a stand-in with an embedding and a head: ``Step3p5ForCausalLM`` refuses to
build without MoE layers, and the fused-MoE layers need GPU kernels.

Seams: ``process_weights_after_loading`` of the unquantized embedding method
is wrapped to record the layers it processes (the original still runs). The
MTP layer's ``Attention`` asks the platform for a backend; this CPU-only
environment has no accelerator platform, and ``UnspecifiedPlatform`` offers
none ("Invalid attention backend for None"). The current platform's
``get_attn_backend_cls`` is replaced by ``CpuPlatform``'s -- vLLM's own
selector tests put ``CpuPlatform`` in place for the same reason -- and only
that method, so every other platform query the loader makes is unchanged.
The attention layer is built, never run.
"""

import json
import logging
import re

import pytest
import torch
from draft_loading import load_speculative_draft, speculative_vllm_config, write_checkpoint
from safetensors.torch import save_file
from vllm.config import set_current_vllm_config
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
)
from vllm.model_executor.model_loader import base_loader

HIDDEN = 64
VOCAB = 256
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
INTERMEDIATE = 128
DTYPE = torch.bfloat16
TEXT_CONFIG = dict(
    model_type="qwen3_5_text",
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=1,
    layer_types=["full_attention"],
    mtp_num_hidden_layers=1,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)


def _mtp_tensors() -> dict[str, torch.Tensor]:
    """The MTP layer's weights (vLLM's fused qkv/gate_up names load whole)."""
    # Gated attention: the query projection also yields the output gate.
    qkv_rows = (2 * HEADS + 2 * KV_HEADS) * HEAD_DIM
    shapes = {
        "mtp.fc.weight": (HIDDEN, 2 * HIDDEN),
        "mtp.layers.0.self_attn.qkv_proj.weight": (qkv_rows, HIDDEN),
        "mtp.layers.0.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        "mtp.layers.0.self_attn.q_norm.weight": (HEAD_DIM,),
        "mtp.layers.0.self_attn.k_norm.weight": (HEAD_DIM,),
        "mtp.layers.0.mlp.gate_up_proj.weight": (2 * INTERMEDIATE, HIDDEN),
        "mtp.layers.0.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        "mtp.layers.0.input_layernorm.weight": (HIDDEN,),
        "mtp.layers.0.post_attention_layernorm.weight": (HIDDEN,),
        "mtp.norm.weight": (HIDDEN,),
        "mtp.pre_fc_norm_hidden.weight": (HIDDEN,),
        "mtp.pre_fc_norm_embedding.weight": (HIDDEN,),
    }
    return {name: torch.randn(shape).to(DTYPE) for name, shape in shapes.items()}


@pytest.fixture
def processed_embeddings(monkeypatch):
    """The layers ``UnquantizedEmbeddingMethod`` post-processed (it still runs)."""
    processed: list[torch.nn.Module] = []
    original = UnquantizedEmbeddingMethod.process_weights_after_loading

    def record(self, layer):
        processed.append(layer)
        original(self, layer)

    monkeypatch.setattr(UnquantizedEmbeddingMethod, "process_weights_after_loading", record)
    return processed


def _write_qwen3_5(tmp_path, *, with_lm_head: bool) -> tuple[str, dict[str, torch.Tensor]]:
    """A tiny qwen3_5 checkpoint with its MTP layer; its lm_head only where asked."""
    path = tmp_path / "qwen3_5"
    path.mkdir()
    config = dict(
        model_type="qwen3_5",
        architectures=["Qwen3_5ForConditionalGeneration"],
        text_config=TEXT_CONFIG,
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    (path / "config.json").write_text(json.dumps(config))
    tensors = _mtp_tensors()
    tensors["model.language_model.embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN).to(DTYPE)
    if with_lm_head:
        tensors["lm_head.weight"] = torch.randn(VOCAB, HIDDEN).to(DTYPE)
    save_file(tensors, path / "model.safetensors")
    return str(path), tensors


def _load_mtp_draft(tmp_path, *, with_lm_head: bool, **speculative_options):
    """Load the MTP draft the way the proposer does; returns it and its config."""
    path, tensors = _write_qwen3_5(tmp_path, with_lm_head=with_lm_head)
    draft, vllm_config = load_speculative_draft(path, "mtp", **speculative_options)
    assert type(draft).__name__ == "Qwen3_5MTP"
    return draft, vllm_config, tensors


def test_mtp_head_missing_from_checkpoint_is_released_before_post_processing(
    gloo_world, cpu_attention_backend, processed_embeddings, tmp_path
):
    draft, _, tensors = _load_mtp_draft(tmp_path, with_lm_head=False)

    # The never-loaded head is neither post-processed nor kept ...
    assert not any(isinstance(layer, ParallelLMHead) for layer in processed_embeddings)
    assert not hasattr(draft, "lm_head")
    # ... the loaded embedding is loaded, processed and kept.
    assert draft.model.embed_tokens in processed_embeddings
    torch.testing.assert_close(
        draft.model.embed_tokens.weight.data[:VOCAB], tensors["model.language_model.embed_tokens.weight"]
    )


def test_mtp_head_from_the_checkpoint_is_kept_and_processed(
    gloo_world, cpu_attention_backend, processed_embeddings, tmp_path
):
    draft, _, tensors = _load_mtp_draft(tmp_path, with_lm_head=True)

    assert isinstance(draft.lm_head, ParallelLMHead)
    assert draft.lm_head in processed_embeddings
    torch.testing.assert_close(draft.lm_head.weight.data[:VOCAB], tensors["lm_head.weight"])


class _Target(torch.nn.Module):
    """A target language model: an embedding, and a head only where given."""

    def __init__(self, lm_head: torch.nn.Module | None):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        if lm_head is not None:
            self.lm_head = lm_head


def test_mtp_draft_left_without_a_head_gets_its_own_back_and_an_error_naming_it(
    gloo_world, cpu_attention_backend, shell_eagle_proposer, tmp_path, caplog
):
    draft, vllm_config, _ = _load_mtp_draft(tmp_path, with_lm_head=False)
    target = _Target(lm_head=None)
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)
    with caplog.at_level(logging.ERROR, logger="vllm.model_executor.model_loader.base_loader"):
        base_loader.check_draft_placeholders_shared(draft, vllm_config)

    assert draft.model.embed_tokens is target.model.embed_tokens
    assert isinstance(draft.lm_head, ParallelLMHead)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert re.search(r"Draft model Qwen3_5MTP \(.*qwen3_5\) runs with an uninitialized lm_head", errors[0])


def _start_mtp_draft_beside_headless_target(tmp_path, runner: str, shell_proposer, **speculative_options):
    """Start the Qwen3_5MTP draft (no lm_head in the checkpoint) beside a target
    without one, through the runner's own load path: v1 EagleProposer.load_model
    (its MTP branch shares nothing, the target has no lm_head) or v2
    load_eagle_model (what MTPSpeculator calls)."""
    path, _ = _write_qwen3_5(tmp_path, with_lm_head=False)
    vllm_config = speculative_vllm_config(path, "mtp", **speculative_options)
    target = _Target(lm_head=None)
    with set_current_vllm_config(vllm_config):
        if runner == "v1":
            from vllm.v1.spec_decode.eagle import EagleProposer

            proposer = shell_proposer(EagleProposer, vllm_config)
            proposer.load_model(target)
            draft = proposer.model
        else:
            from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model

            draft = load_eagle_model(target, vllm_config)
    assert type(draft).__name__ == "Qwen3_5MTP"
    return draft, target


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_mtp_draft_whose_head_the_target_cannot_replace_starts_as_on_0_33_0(
    gloo_world, cpu_attention_backend, shell_proposer, tmp_path, runner
):
    """0.33.0 starts it on the head it built; the target verifies every draft
    token. Default settings must keep starting it."""
    draft, target = _start_mtp_draft_beside_headless_target(tmp_path, runner, shell_proposer)

    assert isinstance(draft.lm_head, ParallelLMHead)
    assert draft.model.embed_tokens is target.model.embed_tokens


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_mtp_draft_whose_head_the_target_cannot_replace_is_refused_when_asked(
    gloo_world, cpu_attention_backend, shell_proposer, tmp_path, runner
):
    with pytest.raises(RuntimeError, match=r"Draft model Qwen3_5MTP \(.*qwen3_5\) runs with an uninitialized lm_head"):
        _start_mtp_draft_beside_headless_target(
            tmp_path, runner, shell_proposer, refuse_uninitialized_draft_weights=True
        )


def test_mtp_draft_given_the_target_head_passes_the_check(
    gloo_world, cpu_attention_backend, shell_eagle_proposer, tmp_path
):
    draft, vllm_config, _ = _load_mtp_draft(tmp_path, with_lm_head=False)
    target = _Target(lm_head=ParallelLMHead(VOCAB, HIDDEN))
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)

    base_loader.check_draft_placeholders_shared(draft, vllm_config)
    assert draft.lm_head is target.lm_head


STEP3P5 = dict(
    model_type="step3p5",
    architectures=["Step3p5ForCausalLM"],
    hidden_size=HIDDEN,
    intermediate_size=INTERMEDIATE,
    num_hidden_layers=1,
    num_nextn_predict_layers=1,
    layer_types=["full_attention"],
    mtp_layer_types=["full_attention"],
    mlp_layer_types=["dense"],
    mtp_mlp_layer_types=["dense"],
    # A homogeneous model: no per-layer overrides (transformers' Step3p7TextConfig,
    # which vLLM uses for step3p5, defaults to an empty heterogeneity spec).
    per_layer_config=None,
    num_attention_heads=HEADS,
    num_attention_groups=KV_HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    vocab_size=VOCAB,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def _step3p5_tensors() -> dict[str, torch.Tensor]:
    """The target's layer 0, head and norm, and MTP layer 1 with its own shared head."""

    def layer(prefix: str) -> dict[str, tuple[int, ...]]:
        return {
            f"{prefix}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            f"{prefix}.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            f"{prefix}.self_attn.q_norm.weight": (HEAD_DIM,),
            f"{prefix}.self_attn.k_norm.weight": (HEAD_DIM,),
            f"{prefix}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            f"{prefix}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
            f"{prefix}.input_layernorm.weight": (HIDDEN,),
            f"{prefix}.post_attention_layernorm.weight": (HIDDEN,),
        }

    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
        **layer("model.layers.0"),
        **layer("model.layers.1"),
        "model.layers.1.enorm.weight": (HIDDEN,),
        "model.layers.1.hnorm.weight": (HIDDEN,),
        "model.layers.1.eh_proj.weight": (HIDDEN, 2 * HIDDEN),
        "model.layers.1.shared_head.norm.weight": (HIDDEN,),
        "model.layers.1.shared_head.output.weight": (VOCAB, HIDDEN),
    }
    return {name: torch.randn(shape).to(DTYPE) for name, shape in shapes.items()}


def _load_step3p5_mtp(tmp_path, runner: str, shell_proposer):
    """Load the target, then its MTP draft through the runner's own load path."""
    tensors = _step3p5_tensors()
    path = write_checkpoint(tmp_path / "step3p5", STEP3P5, tensors)
    vllm_config = speculative_vllm_config(path, "mtp")
    assert vllm_config.speculative_config.use_step3p5_mtp()
    target = _Target(lm_head=ParallelLMHead(VOCAB, HIDDEN))
    with set_current_vllm_config(vllm_config):
        if runner == "v1":
            from vllm.v1.spec_decode.step3p5 import Step3p5MTPProposer

            proposer = shell_proposer(Step3p5MTPProposer, vllm_config)
            proposer.load_model(target)
            draft = proposer.model
        else:
            from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model

            draft = load_eagle_model(target, vllm_config)
    assert type(draft).__name__ == "Step3p5MTP"
    return draft, target, tensors


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_step3p5_mtp_with_per_layer_heads_loads(gloo_world, cpu_attention_backend, shell_proposer, tmp_path, runner):
    draft, target, tensors = _load_step3p5_mtp(tmp_path, runner, shell_proposer)

    # The MTP layer keeps the head its checkpoint carries (not the target's) ...
    head = draft.model.layers["1"].shared_head.head
    assert isinstance(head, ParallelLMHead)
    assert head is not target.lm_head
    torch.testing.assert_close(head.weight.data[:VOCAB], tensors["model.layers.1.shared_head.output.weight"])
    # ... there is no top-level head to ask for, and the embedding is the target's.
    assert not hasattr(draft, "lm_head")
    assert draft.model.embed_tokens is target.model.embed_tokens
