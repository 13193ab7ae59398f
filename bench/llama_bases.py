"""Llama-like bases for the LoRA benchmarks: built from a config with a fixed seed and saved with
``save_pretrained`` (nothing downloaded).

``tiny`` and ``10M`` are the byte-count sizes, ``100M`` the iteration-time size (hidden 768, 12
layers, vocabulary 8192: 97.5M parameters), and ``350M`` to ``13B`` the ladder that
``bench/lora_vs_td.py sweep`` climbs (the larger ones shaped as Llama 2 7B and 13B).
"""

from __future__ import annotations

import os

import torch

CONFIGS = {
    "tiny": dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64),
    "10M": dict(vocab_size=8000, hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=4, intermediate_size=704, max_position_embeddings=256),
    "100M": dict(vocab_size=8192, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=12, intermediate_size=2048, max_position_embeddings=512),
    "350M": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=16, intermediate_size=2816,
                 max_position_embeddings=512),
    "1B": dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
               num_key_value_heads=16, intermediate_size=5632, max_position_embeddings=512),
    "3B": dict(vocab_size=32000, hidden_size=3072, num_hidden_layers=26, num_attention_heads=24,
               num_key_value_heads=24, intermediate_size=8192, max_position_embeddings=512),
    "7B": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=11008, max_position_embeddings=512),
    "13B": dict(vocab_size=32000, hidden_size=5120, num_hidden_layers=40,
                num_attention_heads=40, num_key_value_heads=40, intermediate_size=13824,
                max_position_embeddings=512),
}
"""``LlamaConfig`` arguments by size name (untied input and output embeddings)."""

LADDER = ["100M", "350M", "1B", "3B", "7B", "13B"]
"""The sizes a sweep for the largest base climbs, in order."""

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
"""The attention projections LoRA targets."""


def save_base(root: str, name: str, dtype: str = "float32", seed: int = 0) -> str:
    """Build the ``name`` base with weights from ``torch.manual_seed(seed)`` in ``dtype``, save
    it with ``save_pretrained`` under ``root/name`` and return that directory."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    path = os.path.join(root, name)
    config = LlamaConfig(tie_word_embeddings=False, **CONFIGS[name])
    AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).save_pretrained(path)
    return path


def parameter_count(name: str) -> int:
    """The ``name`` base's parameters, counted from its config (no weights built)."""
    c = CONFIGS[name]
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = h * c["num_key_value_heads"] // c["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h     # attention, MLP, two norms
    return 2 * c["vocab_size"] * h + layers * per_layer + h          # embeddings, head, norm
