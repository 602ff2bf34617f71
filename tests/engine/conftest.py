"""Models the export and Try it tests share, made once a session: the bundled model converted, and a tiny
llama built from a config that carries its tokenizer (tests/engine/test_export.py says why)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled SmolLM2-135M-Instruct, converted once for the session."""
    from engine.models.sources import bundled_model_dir

    return bundled_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_smol_dir(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama built from a config, with sharp random weights and the bundled tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-smol")
    tok = AutoTokenizer.from_pretrained(str(smol_dir))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True, initializer_range=0.3,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
