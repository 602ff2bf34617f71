"""Tiny randomly initialised models with a byte-level tokenizer, built from a config.

They load in milliseconds and download nothing. `make_tiny_model(folder)`
writes a complete HF folder (config, safetensors, tokenizer with a ChatML
template) that every part of Sapling accepts like a real model.
`make_sharp_model` builds one whose log-probs depend strongly on every weight
and position, for tests that compare two computations of the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_byte_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>",
    )
    tok.chat_template = CHATML
    return tok


def save_random_model(config: Any, tokenizer: Any, folder: Path, seed: int) -> Path:
    """A model of `config` with weights drawn from `seed`, saved with `tokenizer` in `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0) -> Path:
    from transformers import LlamaConfig, Qwen2Config

    tok = make_byte_tokenizer()
    common = dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    config = LlamaConfig(**common) if arch == "llama" else Qwen2Config(**common)
    return save_random_model(config, tok, folder, seed)


def make_sharp_model(folder: Path, arch: str, rope_theta: float = 50_000.0) -> Path:
    """A tiny model with large initial weights (biases too) and a non-default rope_theta.

    A uniform-ish random model would let two different computations agree
    by accident; this one does not.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tok = make_byte_tokenizer()
    common = dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.3, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )
    # llama with tied embeddings; qwen2 (attention biases) with its own lm_head.
    config = (LlamaConfig(**common, tie_word_embeddings=True) if arch == "llama"
              else Qwen2Config(**common, tie_word_embeddings=False))
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.3)  # biases start at zero; make them count
    folder = Path(folder)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_bundled_shapes_model(folder: Path, layers: int = 2, seed: int = 0) -> Path:
    """A random model with the bundled SmolLM2-135M's matmul shapes (hidden 576, MLP 1536, 9 heads of 64 over 3
    key-value heads, a 49,152-word LM head tied to the embedding) but `layers` layers: what a numerics test needs
    of the real model's sizes (the LM head's chunks, bf16's rounding over 576 and 1,536 terms) in seconds."""
    from transformers import LlamaConfig

    tok = make_byte_tokenizer()
    config = LlamaConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    return save_random_model(config, tok, folder, seed)
