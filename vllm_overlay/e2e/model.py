"""A tiny Llama checkpoint made on the spot, for the end-to-end suite: no hub, no download.

Runs inside the CPU runtime's interpreter (it needs torch, transformers and tokenizers, which the
tool's own environment does not hold): ``python -m vllm_overlay.e2e.model OUT_DIR``.

The shape is the smallest the CPU build serves: hidden 256 with 4 heads (head_dim 64; the CPU
attention kernel refuses head_dim 16), 2 layers, a 512-token byte-level BPE vocabulary trained here
on generated text. Weights are random but seeded, in bfloat16, with a wide initializer so that
greedy decoding has clear winners (near-uniform logits would let rounding pick the next token).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HIDDEN = 256
HEADS = 4
LAYERS = 2
VOCAB = 512
MAX_POSITIONS = 256
SEED = 0
SPECIAL_TOKENS = ["<s>", "</s>"]
WORDS = (
    "the a model serves tokens from every request while workers answer the engine core steps once "
    "per batch and each rank reads its share of the weights before the first prompt arrives then "
    "streams the reply back to the client over http with one chunk per token"
).split()


def corpus(lines: int = 2000) -> list[str]:
    """Deterministic text for the tokenizer to learn merges from."""
    out = []
    for i in range(lines):
        words = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(8 + i % 9)]
        out.append(" ".join(words) + (". " if i % 3 else "? ") + str(i))
    return out


def build(out: Path) -> dict[str, object]:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        initializer_range=0.2,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    facts = {"vocab": tokenizer.get_vocab_size(), "parameters": sum(p.numel() for p in model.parameters())}
    (out / "e2e-model.json").write_text(json.dumps(facts, sort_keys=True) + "\n", encoding="utf-8")
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
