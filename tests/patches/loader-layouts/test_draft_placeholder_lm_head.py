# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
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

The check after sharing asks only for what the loader released. Drafts that
never had a top-level head or embedding load as on 0.33.0: a tiny Gemma2
(tied, no ``lm_head``) and a tiny OPT (``model.decoder.embed_tokens``) drafted
by the v1 ``draft_model`` method, loaded as the main model of their own config
through the real ``DraftModelProposer.load_model``. Under PP > 1 the v1
proposer never shares an embedding, so the loader keeps it: an EAGLE-3 draft
whose checkpoint has none starts, as on 0.33.0, with a warning that its
embedding was never initialized. The proposers are built without
``__init__``, whose pinned host buffers need a CUDA driver (conftest's
``shell_proposer``); the attention layers get ``CpuPlatform``'s backend
(conftest's ``cpu_attention_backend``).

Seams: ``process_weights_after_loading`` of the quantization methods is
wrapped to record which layers it processed (the unquantized method still
runs). For the ModelOpt FP8 draft, kernel selection
(``modelopt.select_linear_kernel``) and the FP8 post-processing target GPU
scaled-mm kernels that do not exist on CPU, so a stand-in kernel is selected
and the FP8 method's ``process_weights_after_loading`` only records the layer.
"""

import logging
import re
from types import SimpleNamespace

import pytest
import torch
from draft_loading import load_speculative_draft, load_target, speculative_vllm_config, write_checkpoint
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
from vllm.model_executor.models.utils import PPMissingLayer

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


def _load_draft(tmp_path, *, draft_tensors, quantization_config=None):
    return _load_draft_with_config(tmp_path, draft_tensors=draft_tensors, quantization_config=quantization_config)[0]


def _load_draft_with_config(tmp_path, *, draft_tensors, quantization_config=None, **speculative_options):
    target = write_checkpoint(
        tmp_path / "target",
        dict(LLAMA, architectures=["LlamaForCausalLM"]),
        {"lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)},
    )
    draft_config = dict(LLAMA, architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=0)
    if quantization_config is not None:
        draft_config["quantization_config"] = quantization_config
    draft = write_checkpoint(tmp_path / "draft", draft_config, draft_tensors)

    return load_speculative_draft(target, "eagle3", draft, **speculative_options)


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
    target = write_checkpoint(
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


def _shared_with_headless_target(tmp_path, shell_eagle_proposer, **speculative_options):
    """The real EagleProposer sharing steps and check against a target without an lm_head."""
    draft, vllm_config = _load_draft_with_config(tmp_path, draft_tensors=_draft_weights(), **speculative_options)
    target = _TargetWithoutHead()
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)
    assert draft.model.embed_tokens is target.model.embed_tokens
    base_loader.check_draft_placeholders_shared(draft, vllm_config)
    return draft


def test_draft_left_without_a_head_gets_its_own_back_and_an_error_naming_it(
    gloo_world, tmp_path, shell_eagle_proposer, monkeypatch, caplog
):
    """By default the draft starts as on 0.33.0, on the head it built, now
    post-processed as the loader would have; an error names draft, weight and why."""
    processed = _record_processed_layers(monkeypatch, UnquantizedEmbeddingMethod, run_original=True)
    with caplog.at_level(logging.ERROR, logger="vllm.model_executor.model_loader.base_loader"):
        draft = _shared_with_headless_target(tmp_path, shell_eagle_proposer)

    assert isinstance(draft.lm_head, ParallelLMHead)
    assert draft.lm_head in processed
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert re.search(
        r"Draft model Eagle3LlamaForCausalLM \(.*draft\) runs with an uninitialized lm_head: its "
        r"checkpoint does not contain it and the target model's could not replace it",
        errors[0],
    )
    assert "refuse_uninitialized_draft_weights" in errors[0]


def test_draft_left_without_a_head_is_refused_when_asked(gloo_world, tmp_path, shell_eagle_proposer):
    with pytest.raises(
        RuntimeError,
        match=r"Draft model Eagle3LlamaForCausalLM \(.*draft\) runs with an uninitialized lm_head.*"
        r"Refused: speculative_config.refuse_uninitialized_draft_weights is set",
    ):
        _shared_with_headless_target(tmp_path, shell_eagle_proposer, refuse_uninitialized_draft_weights=True)


def _start_headless_target_draft(
    tmp_path, runner: str, shell_proposer, *, target_embed_tokens: torch.nn.Module | None = None, **speculative_options
):
    """Start an EAGLE-3 draft without an lm_head in its checkpoint beside a
    target without one, through the runner's own load path: the v1
    EagleProposer.load_model (shares nothing, the target has no lm_head) or the
    v2 load_eagle_model (no target head to share)."""
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model

    target_path = write_checkpoint(
        tmp_path / "target",
        dict(LLAMA, architectures=["LlamaForCausalLM"]),
        {"lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)},
    )
    draft_path = write_checkpoint(
        tmp_path / "draft",
        dict(LLAMA, architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=0),
        _draft_weights(),
    )
    vllm_config = speculative_vllm_config(target_path, "eagle3", draft_path, **speculative_options)
    target = _TargetWithoutHead(target_embed_tokens)
    with set_current_vllm_config(vllm_config):
        if runner == "v1":
            proposer = shell_proposer(EagleProposer, vllm_config)
            proposer.load_model(target)
            draft = proposer.model
        else:
            draft = load_eagle_model(target, vllm_config)
    return draft, target


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_draft_whose_head_the_target_cannot_replace_starts_as_on_0_33_0(gloo_world, tmp_path, shell_proposer, runner):
    """0.33.0 starts this draft on the head it built (never loaded); the
    target verifies every draft token, so the output is correct and only the
    acceptance rate suffers. Default settings must keep starting it."""
    draft, target = _start_headless_target_draft(tmp_path, runner, shell_proposer)

    assert draft.has_own_lm_head is False
    assert isinstance(draft.lm_head, ParallelLMHead)
    assert draft.model.embed_tokens is target.model.embed_tokens


def test_draft_narrower_than_its_target_keeps_its_own_embedding(gloo_world, tmp_path, shell_proposer):
    """Found by the draft-loader oracle (docs/oracle.md). An EAGLE-3 draft
    narrower than its target (hidden size 64 against 96) whose checkpoint has
    no embedding, on the v1 runner: 0.33.0's width check in
    _maybe_share_embeddings keeps the draft's own embedding, since the
    target's cannot feed it. With the embedding set aside by the loader, the
    check found none and shared the target's 96-wide one; it must look at the
    one set aside, and the draft start with an embedding of its own width."""
    wide = torch.nn.Embedding(VOCAB, HIDDEN + 32)
    draft, target = _start_headless_target_draft(tmp_path, "v1", shell_proposer, target_embed_tokens=wide)

    assert draft.model.embed_tokens is not target.model.embed_tokens
    assert draft.model.embed_tokens.weight.shape[-1] == HIDDEN


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_draft_whose_head_the_target_cannot_replace_is_refused_when_asked(gloo_world, tmp_path, shell_proposer, runner):
    refusal = r"Draft model Eagle3LlamaForCausalLM \(.*draft\) runs with an uninitialized lm_head.*Refused"
    with pytest.raises(RuntimeError, match=refusal):
        _start_headless_target_draft(tmp_path, runner, shell_proposer, refuse_uninitialized_draft_weights=True)


def test_draft_whose_head_was_shared_passes_the_check(gloo_world, tmp_path, shell_eagle_proposer):
    draft, vllm_config = _load_draft_with_config(tmp_path, draft_tensors=_draft_weights())
    target = _TargetWithoutHead()
    target.lm_head = ParallelLMHead(VOCAB, HIDDEN)
    proposer = shell_eagle_proposer(draft, vllm_config)

    proposer._maybe_share_embeddings(target)
    proposer._maybe_share_lm_head(target)

    base_loader.check_draft_placeholders_shared(draft, vllm_config)
    assert draft.lm_head is target.lm_head


# Drafts that keep what they build: only the speculative draft of an EAGLE/MTP
# method has placeholders released, so only that draft may be asked for them.


def _gemma2_checkpoint(path) -> tuple[str, dict[str, torch.Tensor]]:
    """A tiny Gemma2ForCausalLM: tied, so no lm_head -- its logits use model.embed_tokens."""
    config = dict(
        model_type="gemma2",
        architectures=["Gemma2ForCausalLM"],
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        sliding_window=64,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    p = "model.layers.0"
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        f"{p}.self_attn.q_proj.weight": (64, HIDDEN),
        f"{p}.self_attn.k_proj.weight": (32, HIDDEN),
        f"{p}.self_attn.v_proj.weight": (32, HIDDEN),
        f"{p}.self_attn.o_proj.weight": (HIDDEN, 64),
        f"{p}.mlp.gate_proj.weight": (128, HIDDEN),
        f"{p}.mlp.up_proj.weight": (128, HIDDEN),
        f"{p}.mlp.down_proj.weight": (HIDDEN, 128),
        f"{p}.input_layernorm.weight": (HIDDEN,),
        f"{p}.post_attention_layernorm.weight": (HIDDEN,),
        f"{p}.pre_feedforward_layernorm.weight": (HIDDEN,),
        f"{p}.post_feedforward_layernorm.weight": (HIDDEN,),
    }
    tensors = {name: torch.randn(shape).to(torch.bfloat16) for name, shape in shapes.items()}
    return write_checkpoint(path, config, tensors), tensors


def _opt_checkpoint(path) -> tuple[str, dict[str, torch.Tensor]]:
    """A tiny OPTForCausalLM: its embedding is model.decoder.embed_tokens, the head tied to it."""
    config = dict(
        model_type="opt",
        architectures=["OPTForCausalLM"],
        hidden_size=HIDDEN,
        word_embed_proj_dim=HIDDEN,
        ffn_dim=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=128,
        do_layer_norm_before=True,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    p = "decoder.layers.0"
    shapes = {
        "decoder.embed_tokens.weight": (VOCAB, HIDDEN),
        # OPT's learned positions are offset by 2.
        "decoder.embed_positions.weight": (128 + 2, HIDDEN),
        "decoder.final_layer_norm.weight": (HIDDEN,),
        "decoder.final_layer_norm.bias": (HIDDEN,),
        f"{p}.self_attn_layer_norm.weight": (HIDDEN,),
        f"{p}.self_attn_layer_norm.bias": (HIDDEN,),
        f"{p}.final_layer_norm.weight": (HIDDEN,),
        f"{p}.final_layer_norm.bias": (HIDDEN,),
        f"{p}.fc1.weight": (128, HIDDEN),
        f"{p}.fc1.bias": (128,),
        f"{p}.fc2.weight": (HIDDEN, 128),
        f"{p}.fc2.bias": (HIDDEN,),
    }
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        shapes[f"{p}.self_attn.{proj}.weight"] = (HIDDEN, HIDDEN)
        shapes[f"{p}.self_attn.{proj}.bias"] = (HIDDEN,)
    tensors = {name: torch.randn(shape).to(torch.bfloat16) for name, shape in shapes.items()}
    return write_checkpoint(path, config, tensors), tensors


def _draft_embedding(draft: torch.nn.Module, kind: str) -> torch.nn.Module:
    return draft.model.decoder.embed_tokens if kind == "opt" else draft.model.embed_tokens


@pytest.mark.parametrize(
    ("kind", "checkpoint", "embedding_name"),
    [
        ("gemma2", _gemma2_checkpoint, "model.embed_tokens.weight"),
        ("opt", _opt_checkpoint, "decoder.embed_tokens.weight"),
    ],
)
def test_draft_model_without_top_level_head_or_embedding_loads(
    gloo_world, cpu_attention_backend, shell_proposer, tmp_path, kind, checkpoint, embedding_name
):
    """The v1 draft_model method loads a small model of the target's family as
    the main model of its own config; the proposer shares nothing with it.
    Gemma2 has no lm_head (its logits use the embedding); OPT's embedding is
    model.decoder.embed_tokens. Both are complete as they are and load as on
    0.33.0, through the real DraftModelProposer.load_model."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    target_path, _ = checkpoint(tmp_path / "target")
    draft_path, tensors = checkpoint(tmp_path / "draft")
    vllm_config = speculative_vllm_config(target_path, "draft_model", draft_path)
    target = load_target(vllm_config)
    proposer = shell_proposer(DraftModelProposer, vllm_config, pass_hidden_states_to_model=False)
    with set_current_vllm_config(vllm_config):
        proposer.load_model(target)

    draft = proposer.model
    assert type(draft) is type(target)
    embedding = _draft_embedding(draft, kind)
    assert embedding is not _draft_embedding(target, kind)
    torch.testing.assert_close(embedding.weight.data[:VOCAB], tensors[embedding_name])
    if kind == "gemma2":
        assert not hasattr(draft, "lm_head")
    else:
        assert draft.lm_head.weight is embedding.weight


class _LastStageTarget(torch.nn.Module):
    """The last PP stage of a Llama target: its head, and no embedding (PPMissingLayer)."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = PPMissingLayer()
        self.lm_head = ParallelLMHead(VOCAB, HIDDEN)


def _load_pp2_eagle3_draft(tmp_path, shell_proposer, monkeypatch, **speculative_options):
    """PP = 2 on the v1 runner, this rank the last stage, an EAGLE-3 draft with
    neither embedding nor head in its checkpoint (EAGLE-3 checkpoints ship no
    embedding), through the real EagleProposer.load_model. Seam: get_pp_group
    in the v1 proposer reports a 2-stage group -- vLLM's own
    test_eagle.py::test_load_model does the same; a real second stage would be
    a second process. The loader reads the PP size from the config."""
    from vllm.v1.spec_decode import llm_base_proposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    target_path = write_checkpoint(
        tmp_path / "target",
        dict(LLAMA, architectures=["LlamaForCausalLM"]),
        {"lm_head.weight": torch.zeros(VOCAB, HIDDEN, dtype=torch.bfloat16)},
    )
    draft_path = write_checkpoint(
        tmp_path / "draft",
        dict(LLAMA, architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=0),
        _draft_weights(),
    )
    vllm_config = speculative_vllm_config(
        target_path, "eagle3", draft_path, pipeline_parallel_size=2, **speculative_options
    )
    stages = SimpleNamespace(world_size=2, rank_in_group=1, is_first_rank=False, is_last_rank=True)
    monkeypatch.setattr(llm_base_proposer, "get_pp_group", lambda: stages)
    target = _LastStageTarget()
    proposer = shell_proposer(EagleProposer, vllm_config)
    with set_current_vllm_config(vllm_config):
        proposer.load_model(target)
    return proposer.model, target


def test_pp2_eagle3_draft_without_embedding_starts_as_on_0_33_0(gloo_world, tmp_path, shell_proposer, monkeypatch):
    """The v1 proposer shares the target's head on the last stage but never
    the embedding under PP > 1, so 0.33.0 runs this draft with the embedding
    it built. That deployment starts and serves correct text (the target
    verifies every draft token), so it must still start: the embedding is
    kept, and the head is the target's."""
    draft, target = _load_pp2_eagle3_draft(tmp_path, shell_proposer, monkeypatch)

    assert draft.has_own_embed_tokens is False
    assert isinstance(draft.model.embed_tokens, VocabParallelEmbedding)
    assert draft.lm_head is target.lm_head


def test_pp2_eagle3_draft_without_embedding_is_reported_at_error_level(
    gloo_world, tmp_path, shell_proposer, monkeypatch, caplog
):
    """What 0.33.0 leaves unsaid: the kept embedding was never initialized."""
    with caplog.at_level(logging.ERROR, logger="vllm.model_executor.model_loader.base_loader"):
        _load_pp2_eagle3_draft(tmp_path, shell_proposer, monkeypatch)

    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert re.search(
        r"Draft model Eagle3LlamaForCausalLM \(.*draft\) runs with an uninitialized model.embed_tokens: "
        r"its checkpoint does not contain it, and the target model's is not shared with a draft under "
        r"pipeline parallelism",
        errors[0],
    )


def test_pp2_eagle3_draft_without_embedding_is_refused_when_asked(gloo_world, tmp_path, shell_proposer, monkeypatch):
    with pytest.raises(RuntimeError, match=r"runs with an uninitialized model.embed_tokens.*Refused"):
        _load_pp2_eagle3_draft(tmp_path, shell_proposer, monkeypatch, refuse_uninitialized_draft_weights=True)
