"""Tiny configs, one per architecture mlxfit sizes, shaped like real ones.

Each keeps the flags that change the parameter count (biases, tied heads, q/k
norms, head_dim different from hidden/heads, MoE layout) so tests cover them.
"""

TINY = {
    "llama": {
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": 256, "tie_word_embeddings": True,
        "rope_theta": 500000.0,
    },
    "llama_untied_bias": {
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "vocab_size": 300, "tie_word_embeddings": False,
        "attention_bias": True, "mlp_bias": True,
    },
    "mistral": {
        "model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "rms_norm_eps": 1e-5, "vocab_size": 256,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "vocab_size": 256, "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 256,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 3,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
        "decoder_sparse_step": 1, "mlp_only_layers": [1], "moe_intermediate_size": 32,
        "rms_norm_eps": 1e-6, "vocab_size": 256, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "norm_topk_prob": True,
    },
    "gemma2": {
        "model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 256,
        "query_pre_attn_scalar": 32,
    },
    "gemma3_text": {
        "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 256,
        "query_pre_attn_scalar": 32, "sliding_window": 32,
        "sliding_window_pattern": 2,
    },
    "phi3": {
        "model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": 256, "tie_word_embeddings": False,
    },
    "phi3_tied": {
        "model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "vocab_size": 256, "tie_word_embeddings": True,
        "partial_rotary_factor": 0.75,
    },
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
        "vocab_size": 256, "tie_word_embeddings": False,
    },
}
