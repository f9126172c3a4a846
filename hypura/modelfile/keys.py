"""The GGUF type llama.cpp reads each known metadata key with (src/llama-arch.cpp LLM_KV_NAMES for
the names; the type is that of the variable llama_model_loader::get_key fills in
src/llama-model.cpp, src/models/*.cpp and src/llama-vocab.cpp). "%s" is the architecture.

A key present with another type makes llama.cpp throw while loading, and Hypura's planner read
some of them itself; so each is checked up front. PER_LAYER keys may also be arrays of one entry
per layer (get_key_or_arr).
"""

from __future__ import annotations

import gguf

V = gguf.GGUFValueType

PER_LAYER = "u32 or one per layer"

KEY_TYPES: dict[str, object] = {
    "general.architecture": V.STRING,
    "general.name": V.STRING,
    "general.alignment": V.UINT32,
    "general.file_type": V.UINT32,
    "split.no": V.UINT16,
    "split.count": V.UINT16,
    "%s.vocab_size": V.UINT32,
    "%s.context_length": V.UINT32,
    "%s.embedding_length": V.UINT32,
    "%s.embedding_length_out": V.UINT32,
    "%s.block_count": V.UINT32,
    "%s.leading_dense_block_count": V.UINT32,
    "%s.nextn_predict_layers": V.UINT32,
    "%s.feed_forward_length": PER_LAYER,
    "%s.expert_feed_forward_length": PER_LAYER,
    "%s.expert_shared_feed_forward_length": V.UINT32,
    "%s.use_parallel_residual": V.BOOL,
    "%s.expert_count": V.UINT32,
    "%s.expert_used_count": PER_LAYER,
    "%s.expert_shared_count": V.UINT32,
    "%s.expert_group_count": V.UINT32,
    "%s.expert_group_used_count": V.UINT32,
    "%s.expert_weights_scale": V.FLOAT32,
    "%s.expert_weights_norm": V.BOOL,
    "%s.expert_gating_func": V.UINT32,
    "%s.pooling_type": V.UINT32,
    "%s.classifier.pooling_type": V.UINT32,
    "%s.logit_scale": V.FLOAT32,
    "%s.attn_logit_softcapping": V.FLOAT32,
    "%s.final_logit_softcapping": V.FLOAT32,
    "%s.attention.head_count": PER_LAYER,
    "%s.attention.head_count_kv": PER_LAYER,
    "%s.attention.key_length": V.UINT32,
    "%s.attention.value_length": V.UINT32,
    "%s.attention.key_length_swa": V.UINT32,
    "%s.attention.value_length_swa": V.UINT32,
    "%s.attention.layer_norm_epsilon": V.FLOAT32,
    "%s.attention.layer_norm_rms_epsilon": V.FLOAT32,
    "%s.attention.causal": V.BOOL,
    "%s.attention.sliding_window": V.UINT32,
    "%s.attention.scale": V.FLOAT32,
    "%s.rope.dimension_count": V.UINT32,
    "%s.rope.dimension_count_swa": V.UINT32,
    "%s.rope.freq_base": V.FLOAT32,
    "%s.rope.freq_base_swa": V.FLOAT32,
    "%s.rope.scale_linear": V.FLOAT32,
    "%s.rope.scaling.type": V.STRING,
    "%s.rope.scaling.factor": V.FLOAT32,
    "%s.rope.scaling.alpha": V.FLOAT32,
    "%s.rope.scaling.attn_factor": V.FLOAT32,
    "%s.rope.scaling.original_context_length": V.UINT32,
    "%s.rope.scaling.finetuned": V.BOOL,
    "tokenizer.ggml.model": V.STRING,
    "tokenizer.ggml.token_type_count": V.UINT32,
    "tokenizer.ggml.pre": V.STRING,
    "tokenizer.chat_template": V.STRING,
    "tokenizer.ggml.bos_token_id": V.UINT32,
    "tokenizer.ggml.eos_token_id": V.UINT32,
    "tokenizer.ggml.eot_token_id": V.UINT32,
    "tokenizer.ggml.eom_token_id": V.UINT32,
    "tokenizer.ggml.unknown_token_id": V.UINT32,
    "tokenizer.ggml.seperator_token_id": V.UINT32,
    "tokenizer.ggml.padding_token_id": V.UINT32,
    "tokenizer.ggml.mask_token_id": V.UINT32,
    "tokenizer.ggml.fim_pre_token_id": V.UINT32,
    "tokenizer.ggml.fim_suf_token_id": V.UINT32,
    "tokenizer.ggml.fim_mid_token_id": V.UINT32,
    "tokenizer.ggml.fim_pad_token_id": V.UINT32,
    "tokenizer.ggml.fim_rep_token_id": V.UINT32,
    "tokenizer.ggml.fim_sep_token_id": V.UINT32,
    "tokenizer.ggml.prefix_token_id": V.UINT32,
    "tokenizer.ggml.suffix_token_id": V.UINT32,
    "tokenizer.ggml.middle_token_id": V.UINT32,
    "tokenizer.ggml.add_bos_token": V.BOOL,
    "tokenizer.ggml.add_eos_token": V.BOOL,
    "tokenizer.ggml.add_sep_token": V.BOOL,
    "tokenizer.ggml.add_space_prefix": V.BOOL,
    "tokenizer.ggml.remove_extra_whitespaces": V.BOOL,
    "tokenizer.ggml.normalizer.lowercase": V.BOOL,
    "tokenizer.ggml.normalizer.strip_accents": V.BOOL,
}
