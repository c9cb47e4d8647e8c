"""config.json contents as published on the Hugging Face Hub (architecture fields verbatim)."""

from __future__ import annotations

from typing import Any

# https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

# https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}

# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

# https://huggingface.co/google/gemma-2-9b/blob/main/config.json (no tie_word_embeddings key)
GEMMA_2_9B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "head_dim": 256,
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# https://huggingface.co/Qwen/Qwen2-VL-2B-Instruct/blob/main/config.json (vision-language)
QWEN2_VL_2B_INSTRUCT: dict[str, Any] = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2_vl",
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 1536,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 151936,
}
# ... and its preprocessor_config.json
QWEN2_VL_2B_INSTRUCT_PROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_processor_type": "Qwen2VLImageProcessor",
}

# https://huggingface.co/HuggingFaceTB/SmolVLM2-500M-Video-Instruct/blob/main/config.json
SMOLVLM2_500M: dict[str, Any] = {
    "architectures": ["SmolVLMForConditionalGeneration"],
    "image_token_id": 49190,
    "model_type": "smolvlm",
    "pad_token_id": 128002,
    "scale_factor": 4,
    "text_config": {
        "architectures": ["VLlama3ForCausalLM"],
        "head_dim": 64,
        "hidden_size": 960,
        "intermediate_size": 2560,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "num_attention_heads": 15,
        "num_hidden_layers": 32,
        "num_key_value_heads": 5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 100000,
        "torch_dtype": "bfloat16",
        "vocab_size": 49280,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "vision_config": {
        "hidden_size": 768,
        "image_size": 512,
        "max_image_size": {"longest_edge": 512},
        "model_type": "smolvlm_vision",
        "num_attention_heads": 12,
        "patch_size": 16,
        "size": {"longest_edge": 2048},
        "tie_word_embeddings": False,
        "use_base_siglip": False,
    },
    "vocab_size": 49280,
}
# ... its preprocessor_config.json and processor_config.json (resize policy, image_seq_len)
SMOLVLM2_500M_PROCESSOR: dict[str, Any] = {
    "do_image_splitting": True,
    "max_image_size": {"longest_edge": 512},
    "size": {"longest_edge": 2048},
    "image_processor_type": "SmolVLMImageProcessor",
    "image_seq_len": 64,
}
