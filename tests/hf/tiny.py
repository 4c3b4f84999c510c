"""Tiny random-init configs of every family attngen.transformers knows (tests and benchmarks)."""

from __future__ import annotations

# the parts every family shares: 2 layers, 4 query heads over 2 KV heads (groups of 2), hidden 64
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=96, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32,
            first_k_dense_replace=1, n_shared_experts=1)
# per family what makes it itself: windows short enough that the test lengths cross them
FAMILY = {
    "llama": dict(),
    "mistral": dict(sliding_window=9),
    "qwen2": dict(use_sliding_window=True, sliding_window=9, max_window_layers=1, num_attention_heads=6,
                  num_key_value_heads=2, hidden_size=48),  # GQA groups of 3; layer 1 slides
    "phi3": dict(sliding_window=9, num_key_value_heads=4),
    "gemma2": dict(head_dim=24, sliding_window=9, query_pre_attn_scalar=20, attn_logit_softcapping=5.0),
    "gemma3_text": dict(head_dim=16, sliding_window=9, query_pre_attn_scalar=24, sliding_window_pattern=2),
    "deepseek_v2": dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, **_MOE),
    "deepseek_v3": dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, **_MOE),
}


def tiny_config(family: str, **over):
    from transformers import AutoConfig
    return AutoConfig.for_model(family, **{**COMMON, **FAMILY[family], **over})
