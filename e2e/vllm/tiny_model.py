"""Build a tiny random-weight Llama checkpoint on local disk (no hub access).

Two layers, head_dim 64 (a size vLLM's CPU attention kernels support), a WordLevel
tokenizer trained on a handful of sentences and saved as ``PreTrainedTokenizerFast``.
The weights are seeded, so every build of the same directory is identical.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a cache stores key value tensors so that a prefix is computed only once",
    "large language models read a long prompt and then generate one token at a time",
    "the server keeps chunks of the kv cache in host memory and returns them on a hit",
    "every worker registers its paged buffers and the scheduler asks how many tokens match",
    "one two three four five six seven eight nine ten eleven twelve",
    "red green blue yellow orange purple black white grey brown",
]
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
MARKER = "lmcache-tiny-llama.json"


def build_tokenizer(out_dir: Path) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.save_pretrained(str(out_dir))
    return int(tokenizer.get_vocab_size())


def build_model(out_dir: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    # Larger-than-default init so greedy decoding does not collapse onto one token.
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build(out_dir: str | os.PathLike[str], seed: int = 0) -> Path:
    """Create the checkpoint in ``out_dir`` unless it is already there; return its path."""
    path = Path(out_dir)
    if (path / MARKER).exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(path)
    build_model(path, vocab_size, seed)
    (path / MARKER).write_text(json.dumps({"seed": seed, "vocab_size": vocab_size}))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out_dir, args.seed))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
