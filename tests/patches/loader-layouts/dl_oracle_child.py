# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""One side of the draft-loader oracle: start a speculative draft beside its
target with whichever vllm this process imports, and answer with what the
draft ended up with.

Started once per side (pristine, patched) by oracle_draft_loaders.py and kept
for the whole run, because importing vLLM costs seconds: one JSON request (a
draft/target configuration) per line on stdin, one JSON trace per line on the
stdout it was started with (anything else that writes to stdout, vLLM's
logger included, goes to stderr).

What runs is vLLM's own: the draft checkpoint is a safetensors folder written
here (deterministic tensors, so both sides load the same bytes), the real
ModelConfig / SpeculativeConfig / VllmConfig derive the draft's config from
it, and the draft starts through the runner's own load path: the v1
EagleProposer.load_model (get_model with the real DefaultModelLoader, then the
real sharing steps) or the v2 load_eagle_model, in a real single-process gloo
world. Replaced, and why (the seams of the hand-written tests, from
draft_loading.py):

- the v1 proposer is built without ``__init__``, whose pinned host buffers need
  a CUDA driver (``shell_proposer``);
- the MTP layer's attention asks the platform for a backend, and this CPU-only
  machine's UnspecifiedPlatform offers none: only ``get_attn_backend_cls`` is
  CpuPlatform's (``use_cpu_attention_backend``); attention is built, never run;
- the target is a stand-in holding what the sharing steps read (an input
  embedding, a head where the configuration has one; under PP = 2 the last
  stage: no embedding, a PPMissingLayer): a real target would need its
  decoder layers' kernels;
- under PP = 2, ``get_pp_group`` in the proposer modules reports a 2-stage
  group whose last stage this rank is (a real second stage is a second
  process; vLLM's own tests/v1/spec_decode/test_eagle.py does the same);
- ``UnquantizedEmbeddingMethod.process_weights_after_loading`` is wrapped to
  record which embeddings and heads were post-processed (the original runs).

The trace: whether the draft started or which error refused it; for its
top-level lm_head and input embedding, where each came from (the target's,
the checkpoint's, a placeholder nothing loaded, tied, absent) and whether it
was post-processed; the post-processed heads and embeddings that were thrown
away (and whether anything had loaded them); the warning-and-above log lines;
and the draft's outputs on a fixed input (the embedding of fixed token ids,
the logits of fixed hidden states) wherever the weights that give them are
determined (not a never-loaded placeholder, whose memory is whatever it was).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
VOCAB = 256
HIDDEN = 64
# A target wider than its EAGLE-3 draft (the draft's fc takes 3 target-width hidden states).
WIDE = 96
INTERMEDIATE = 128
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
TOKEN_IDS = [0, 5, 17, 128, 255]
WORK = Path(tempfile.mkdtemp(prefix="dl-oracle-"))
PATHS = re.compile(re.escape(str(WORK)) + r"[^\s'\")]*")


def normalized(text: str) -> str:
    """A message with this side's temporary folders replaced (both sides write their own)."""
    return PATHS.sub("<ckpt>", text)


class Records(logging.Handler):
    """The warning-and-above lines vLLM logs while a case runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {normalized(record.getMessage())}"[:1000])


def generator(key: str):
    import torch

    g = torch.Generator().manual_seed(int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
    return lambda *shape: torch.randn(*shape, generator=g).to(torch.bfloat16)


def digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().float().contiguous().numpy().tobytes()).hexdigest()[:16]


class Case:
    """One configuration: its checkpoint, its target stand-in, the draft started from them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.draft_kind = config["draft"]
        self.width = WIDE if config.get("width") == "differs" else HIDDEN
        rand = generator(json.dumps(config, sort_keys=True))
        # The target's weights, and the checkpoint's own where it has its own.
        self.target_embed_w = rand(VOCAB, self.width)
        self.target_head_w = rand(VOCAB, self.width)
        self.own_embed_w = rand(VOCAB, HIDDEN)
        self.own_head_w = rand(VOCAB, HIDDEN)
        self.tensors: dict[str, Any] = {}
        self.folder: Path | None = None

    def checkpoint_weight(self, which: str):
        """What the checkpoint gives the draft's ``which`` ("lm_head" or "embed_tokens"), or None."""
        choice = self.config["ckpt_" + which]
        if choice is None:
            return None
        if choice == "target" and self.width == HIDDEN:
            return self.target_head_w if which == "lm_head" else self.target_embed_w
        return self.own_head_w if which == "lm_head" else self.own_embed_w

    def write(self) -> tuple[str, str | None, str]:
        """The checkpoint folders; returns (target, draft or None, method)."""
        import torch
        from draft_loading import write_checkpoint

        folder = self.folder = Path(tempfile.mkdtemp(dir=WORK))
        rand = generator("weights")
        head, embed = self.checkpoint_weight("lm_head"), self.checkpoint_weight("embed_tokens")
        if self.draft_kind == "eagle3":
            llama = dict(
                model_type="llama",
                hidden_size=self.width,
                intermediate_size=INTERMEDIATE,
                num_attention_heads=HEADS,
                num_key_value_heads=HEADS,
                num_hidden_layers=1,
                vocab_size=VOCAB,
                max_position_embeddings=128,
                rms_norm_eps=1e-5,
                torch_dtype="bfloat16",
            )
            target = write_checkpoint(
                folder / "target",
                dict(llama, architectures=["LlamaForCausalLM"]),
                {"lm_head.weight": torch.zeros(VOCAB, self.width, dtype=torch.bfloat16)},
            )
            draft_config = dict(llama, architectures=["Eagle3LlamaForCausalLM"], num_hidden_layers=0)
            draft_config.update(hidden_size=HIDDEN, target_hidden_size=self.width)
            tensors = {"norm.weight": rand(HIDDEN), "fc.weight": rand(HIDDEN, 3 * self.width)}
            if head is not None:
                tensors["lm_head.weight"] = head
            if embed is not None:
                tensors["embed_tokens.weight"] = embed
            self.tensors = tensors
            return target, write_checkpoint(folder / "draft", draft_config, tensors), "eagle3"
        # Qwen3_5MTP: the draft comes from the target's own checkpoint.
        text = dict(
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
            tie_word_embeddings=self.config["tied"],
        )
        config = dict(
            model_type="qwen3_5",
            architectures=["Qwen3_5ForConditionalGeneration"],
            text_config=text,
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN),
            tie_word_embeddings=self.config["tied"],
            torch_dtype="bfloat16",
        )
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
        tensors = {name: rand(*shape) for name, shape in shapes.items()}
        if head is not None:
            tensors["lm_head.weight"] = head
        if embed is not None:
            tensors["model.language_model.embed_tokens.weight"] = embed
        self.tensors = tensors
        return write_checkpoint(folder / "qwen3_5", config, tensors), None, "mtp"

    def target(self):
        """The stand-in target language model: what the sharing steps read."""
        import torch
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
        from vllm.model_executor.models.utils import PPMissingLayer

        target = torch.nn.Module()
        target.model = torch.nn.Module()
        if self.config["pp"] > 1:
            # The last stage, where the draft sits: its embedding lives on the first.
            target.model.embed_tokens = PPMissingLayer()
        else:
            target.model.embed_tokens = VocabParallelEmbedding(VOCAB, self.width, params_dtype=torch.bfloat16)
            target.model.embed_tokens.weight.data.copy_(self.target_embed_w)
        if self.config["target_lm_head"]:
            target.lm_head = ParallelLMHead(VOCAB, self.width, params_dtype=torch.bfloat16)
            target.lm_head.weight.data.copy_(self.target_head_w)
        return target

    def run(self, monkeypatch, processed: list, records: Records) -> dict[str, Any]:
        import torch
        from draft_loading import shell_proposer, speculative_vllm_config, use_cpu_attention_backend
        from vllm.config import SpeculativeConfig, set_current_vllm_config

        target_path, draft_path, method = self.write()
        options = {}
        refuse_field = "refuse_uninitialized_draft_weights" in SpeculativeConfig.__dataclass_fields__
        if self.config["refuse"] and refuse_field:
            options["refuse_uninitialized_draft_weights"] = True
        use_cpu_attention_backend(monkeypatch)
        if self.config["pp"] > 1:
            from vllm.v1.spec_decode import llm_base_proposer
            from vllm.v1.worker.gpu.spec_decode.eagle import utils as v2_eagle

            stages = SimpleNamespace(world_size=2, rank_in_group=1, is_first_rank=False, is_last_rank=True)
            monkeypatch.setattr(llm_base_proposer, "get_pp_group", lambda: stages)
            monkeypatch.setattr(v2_eagle, "get_pp_group", lambda: stages)
        target = self.target()
        trace: dict[str, Any] = {"refuse_field": refuse_field}
        try:
            vllm_config = speculative_vllm_config(
                target_path, method, draft_path, pipeline_parallel_size=self.config["pp"], **options
            )
            with set_current_vllm_config(vllm_config):
                if self.config["runner"] == "v1":
                    from vllm.v1.spec_decode.eagle import EagleProposer

                    proposer = shell_proposer(EagleProposer, vllm_config)
                    proposer.load_model(target)
                    draft = proposer.model
                else:
                    from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model

                    draft = load_eagle_model(target, vllm_config)
        except Exception as e:
            trace.update(started=False, error=f"{type(e).__name__}: {normalized(str(e))}"[:1000])
            trace["logs"] = records.lines
            return trace
        trace["started"] = True
        trace["draft_class"] = type(draft).__name__
        finals = {
            "lm_head": getattr(draft, "lm_head", None),
            "embed_tokens": getattr(getattr(draft, "model", None), "embed_tokens", None),
        }
        final_ids = {id(m) for m in finals.values() if m is not None}
        trace["weights"] = {which: self.provenance(which, m, target, finals, processed) for which, m in finals.items()}
        # Heads and embeddings post-processed and then thrown away: what the patch saves.
        discarded = []
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        for layer in processed:
            if id(layer) in final_ids or not hasattr(layer, "weight"):
                continue
            which = "lm_head" if isinstance(layer, ParallelLMHead) else "embed_tokens"
            # A head tied to a loaded embedding holds the checkpoint's embedding.
            loaded = any(self.matches(layer.weight, self.checkpoint_weight(w)) for w in {which, "embed_tokens"})
            discarded.append({"weight": which, "loaded": loaded})
        trace["discarded_processed"] = sorted(discarded, key=json.dumps)
        trace["outputs"] = self.outputs(draft, trace["weights"])
        trace["logs"] = records.lines
        del torch
        return trace

    @staticmethod
    def matches(weight, expected) -> bool:
        return (
            expected is not None
            and tuple(weight.shape[-1:]) == tuple(expected.shape[-1:])
            and (bool((weight.data[:VOCAB].to(expected.dtype) == expected).all()))
        )

    def provenance(self, which: str, module, target, finals, processed) -> dict[str, Any]:
        """Where the draft's ``which`` came from, and whether it was post-processed."""
        from vllm.model_executor.models.utils import PPMissingLayer

        if module is None:
            return {"from": "absent"}
        if isinstance(module, PPMissingLayer):
            return {"from": "pp-missing"}
        if module is getattr(target, "lm_head", None):
            return {"from": "target lm_head"}
        if module is getattr(target.model, "embed_tokens", None):
            return {"from": "target embed_tokens"}
        processed_ids = {id(layer) for layer in processed}
        info: dict[str, Any] = {"processed": id(module) in processed_ids}
        embed = finals["embed_tokens"]
        if which == "lm_head" and embed is not None and getattr(module, "weight", None) is getattr(embed, "weight", 0):
            info["from"] = "tied to the draft's embed_tokens"
        elif self.matches(module.weight, self.checkpoint_weight(which)):
            info["from"] = "checkpoint"
        elif which == "lm_head" and self.matches(module.weight, self.checkpoint_weight("embed_tokens")):
            info["from"] = "the checkpoint's embed_tokens (tied)"
        else:
            info["from"] = "placeholder"
        return info

    def outputs(self, draft, weights: dict[str, Any]) -> dict[str, str]:
        """The draft's embedding of fixed ids and logits of fixed hidden states, where determined."""
        import torch

        def determined(which: str) -> bool:
            source = weights[which]["from"]
            if source == "tied to the draft's embed_tokens":
                return determined("embed_tokens")
            return source not in ("placeholder", "absent", "pp-missing")

        out: dict[str, str] = {}
        ids = torch.tensor(TOKEN_IDS)
        hidden = generator("hidden")(len(TOKEN_IDS), HIDDEN)
        for name, which, compute in (
            ("embedding", "embed_tokens", lambda: draft.embed_input_ids(ids)),
            ("logits", "lm_head", lambda: draft.compute_logits(hidden)),
        ):
            if not determined(which):
                out[name] = "undetermined (" + weights[which]["from"] + ")"
                continue
            try:
                with torch.no_grad():
                    value = compute()
                    out[name] = f"{digest(value)} of shape {list(value.shape)}"
            except Exception as e:
                out[name] = f"{type(e).__name__}: {normalized(str(e))}"[:300]
        return out


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import pytest
    import vllm
    from draft_loading import gloo_world
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.v1.attention import selector

    records = Records()
    logging.getLogger("vllm").addHandler(records)
    processed: list = []
    original = UnquantizedEmbeddingMethod.process_weights_after_loading

    def record(self, layer):
        processed.append(layer)
        original(self, layer)

    UnquantizedEmbeddingMethod.process_weights_after_loading = record
    with gloo_world():
        # The loader calls gc.collect() before post-processing; over vLLM's imported
        # modules that costs ~0.9 s a call here. What exists now lives as long as the
        # child: leave it out of every collection (a case's own objects are still collected).
        for name in (
            "vllm.v1.spec_decode.eagle",
            "vllm.v1.worker.gpu.spec_decode.eagle.utils",
            "vllm.model_executor.models.llama_eagle3",
            "vllm.model_executor.models.qwen3_5_mtp",
        ):
            __import__(name)
        gc.collect()
        gc.freeze()
        out.write(json.dumps({"vllm": os.path.dirname(vllm.__file__)}) + "\n")
        for line in sys.stdin:
            request = json.loads(line)
            started = time.monotonic()
            monkeypatch = pytest.MonkeyPatch()
            records.lines = []
            processed.clear()
            case = Case(request["config"])
            try:
                trace = case.run(monkeypatch, processed, records)
            except Exception:
                trace = {"crash": traceback.format_exc()}
            finally:
                # The checkpoint is read at load: a long run leaves no folders behind.
                if case.folder is not None:
                    shutil.rmtree(case.folder, ignore_errors=True)
                monkeypatch.undo()
                selector._cached_get_attn_backend.cache_clear()
                processed.clear()
            trace["seconds"] = round(time.monotonic() - started, 3)
            out.write(json.dumps(trace) + "\n")


if __name__ == "__main__":
    main()
