"""What llama.cpp does with each tensor it loads, by name, as src/llama-arch.cpp says
(LLM_TENSOR_NAMES for the name, LLM_TENSOR_INFOS for the op that reads the weight).

The op decides which ggml types the weight may have (ggml_types.py): ELEMENTWISE weights (MUL, ADD,
DIV, ROPE factors, SCALE) must be F32, MATMUL ones (MUL_MAT, MUL_MAT_ID, GET_ROWS) a type with a dot
product; OTHER ones (convolutions, scans, unused) are left to llama.cpp. A ".bias" of any of them is
added (ADD, ADD_ID): ELEMENTWISE. "%d" is a block or sub-block index. Names that map to two ops
are in OTHER. tests/test_modelfile_tables.py compares these lists with the vendored llama-arch.cpp.
"""

ELEMENTWISE = (
    'blk.%d.altup_correct_scale', 'blk.%d.altup_router_norm', 'blk.%d.attn_compressor_norm',
    'blk.%d.attn_conv_base', 'blk.%d.attn_k_norm', 'blk.%d.attn_kv_a_norm', 'blk.%d.attn_norm',
    'blk.%d.attn_norm_2', 'blk.%d.attn_output_norm', 'blk.%d.attn_q_a_norm', 'blk.%d.attn_q_norm',
    'blk.%d.attn_res_score', 'blk.%d.attn_sinks', 'blk.%d.attn_sub_norm', 'blk.%d.channel_mix_lerp_k',
    'blk.%d.channel_mix_lerp_r', 'blk.%d.exp_probs_b', 'blk.%d.exp_probs_b_vl', 'blk.%d.ffn.act',
    'blk.%d.ffn_conv_base', 'blk.%d.ffn_norm', 'blk.%d.ffn_norm_exps', 'blk.%d.ffn_res_score',
    'blk.%d.ffn_routed_norm', 'blk.%d.ffn_sub_norm', 'blk.%d.hc_attn_base', 'blk.%d.hc_attn_norm',
    'blk.%d.hc_attn_scale', 'blk.%d.hc_ffn_base', 'blk.%d.hc_ffn_norm', 'blk.%d.hc_ffn_scale',
    'blk.%d.indexer.k_norm', 'blk.%d.indexer.q_norm', 'blk.%d.indexer_compressor_norm',
    'blk.%d.laurel_post_norm', 'blk.%d.layer_output_norm', 'blk.%d.layer_output_scale',
    'blk.%d.nextn.enorm', 'blk.%d.nextn.hnorm', 'blk.%d.nextn.shared_head_norm', 'blk.%d.ple_norm_conv',
    'blk.%d.ple_norm_key', 'blk.%d.ple_norm_query', 'blk.%d.post_attention_norm',
    'blk.%d.post_ffw_norm', 'blk.%d.post_ffw_norm_1', 'blk.%d.post_ffw_norm_2', 'blk.%d.post_norm',
    'blk.%d.pre_ffw_norm_2', 'blk.%d.ssm_b_norm', 'blk.%d.ssm_c_norm', 'blk.%d.ssm_conv1d_k',
    'blk.%d.ssm_conv1d_q', 'blk.%d.ssm_conv1d_v', 'blk.%d.ssm_d', 'blk.%d.ssm_dt_norm',
    'blk.%d.ssm_norm', 'blk.%d.time_mix_a0', 'blk.%d.time_mix_decay', 'blk.%d.time_mix_k_a',
    'blk.%d.time_mix_k_k', 'blk.%d.time_mix_lerp_fused', 'blk.%d.time_mix_lerp_g',
    'blk.%d.time_mix_lerp_k', 'blk.%d.time_mix_lerp_r', 'blk.%d.time_mix_lerp_v',
    'blk.%d.time_mix_lerp_w', 'blk.%d.time_mix_lerp_x', 'blk.%d.time_mix_ln', 'blk.%d.time_mix_r_k',
    'blk.%d.time_mix_v0', 'blk.%d.time_mix_w0', 'cls.norm', 'convnext.%d.gamma', 'convnext.%d.norm',
    'dec.blk.%d.attn_norm', 'dec.blk.%d.cross_attn_norm', 'dec.blk.%d.ffn_norm', 'dec.output_norm',
    'enc.blk.%d.attn_norm', 'enc.blk.%d.ffn_norm', 'enc.output_norm', 'hrm.z_l_init', 'output_hc_base',
    'output_hc_norm', 'output_hc_scale', 'output_norm', 'output_res_score', 'per_layer_proj_norm',
    'posnet.%d.attn_norm', 'posnet.%d.norm', 'posnet.%d.norm1', 'posnet.%d.norm2', 'rope_factors_long',
    'rope_factors_short', 'rope_freqs', 'token_embd_norm',
)

MATMUL = (
    'altup_proj', 'altup_unembd_proj', 'blk.%d.altup_correct_coef', 'blk.%d.altup_predict_coef',
    'blk.%d.altup_router', 'blk.%d.attn_compressor_ape', 'blk.%d.attn_compressor_gate',
    'blk.%d.attn_compressor_kv', 'blk.%d.attn_conv_proj', 'blk.%d.attn_gate', 'blk.%d.attn_k',
    'blk.%d.attn_k_b', 'blk.%d.attn_kv', 'blk.%d.attn_kv_a_mqa', 'blk.%d.attn_kv_b',
    'blk.%d.attn_output', 'blk.%d.attn_output_a', 'blk.%d.attn_output_b', 'blk.%d.attn_q',
    'blk.%d.attn_q_a', 'blk.%d.attn_q_b', 'blk.%d.attn_qkv', 'blk.%d.attn_v', 'blk.%d.attn_v_b',
    'blk.%d.channel_mix_key', 'blk.%d.channel_mix_receptance', 'blk.%d.channel_mix_value',
    'blk.%d.ffn_conv_proj', 'blk.%d.ffn_down', 'blk.%d.ffn_down_chexps', 'blk.%d.ffn_down_exps',
    'blk.%d.ffn_down_shexp', 'blk.%d.ffn_gate', 'blk.%d.ffn_gate_chexps', 'blk.%d.ffn_gate_exps',
    'blk.%d.ffn_gate_inp', 'blk.%d.ffn_gate_inp_shexp', 'blk.%d.ffn_gate_shexp',
    'blk.%d.ffn_gate_tid2eid', 'blk.%d.ffn_gate_up_exps', 'blk.%d.ffn_latent_down',
    'blk.%d.ffn_latent_up', 'blk.%d.ffn_routed_down', 'blk.%d.ffn_routed_up', 'blk.%d.ffn_up',
    'blk.%d.ffn_up_chexps', 'blk.%d.ffn_up_exps', 'blk.%d.ffn_up_shexp', 'blk.%d.hc_attn_down',
    'blk.%d.hc_attn_fn', 'blk.%d.hc_attn_inject', 'blk.%d.hc_attn_up', 'blk.%d.hc_ffn_down',
    'blk.%d.hc_ffn_fn', 'blk.%d.hc_ffn_inject', 'blk.%d.hc_ffn_up', 'blk.%d.indexer.attn_k',
    'blk.%d.indexer.attn_q_b', 'blk.%d.indexer.k_proj', 'blk.%d.indexer.proj', 'blk.%d.indexer.q_proj',
    'blk.%d.indexer_compressor_gate', 'blk.%d.indexer_compressor_kv', 'blk.%d.inp_gate',
    'blk.%d.laurel_l', 'blk.%d.laurel_r', 'blk.%d.nextn.eh_proj', 'blk.%d.nextn.embed_tokens',
    'blk.%d.nextn.shared_head_head', 'blk.%d.ple_key', 'blk.%d.ple_value', 'blk.%d.proj',
    'blk.%d.shortconv.in_proj', 'blk.%d.shortconv.out_proj', 'blk.%d.ssm_alpha', 'blk.%d.ssm_ba',
    'blk.%d.ssm_beta', 'blk.%d.ssm_dt', 'blk.%d.ssm_f_a', 'blk.%d.ssm_f_b', 'blk.%d.ssm_g',
    'blk.%d.ssm_g_a', 'blk.%d.ssm_g_b', 'blk.%d.ssm_in', 'blk.%d.ssm_out', 'blk.%d.ssm_x',
    'blk.%d.time_mix_a1', 'blk.%d.time_mix_a2', 'blk.%d.time_mix_decay_w1', 'blk.%d.time_mix_decay_w2',
    'blk.%d.time_mix_g1', 'blk.%d.time_mix_g2', 'blk.%d.time_mix_gate', 'blk.%d.time_mix_key',
    'blk.%d.time_mix_output', 'blk.%d.time_mix_receptance', 'blk.%d.time_mix_v1', 'blk.%d.time_mix_v2',
    'blk.%d.time_mix_value', 'blk.%d.time_mix_w1', 'blk.%d.time_mix_w2', 'blk.%d.vis_attn_output',
    'blk.%d.vis_attn_qkv', 'blk.%d.vis_down', 'blk.%d.vis_gate', 'blk.%d.vis_up', 'cls', 'cls.output',
    'conf_proj', 'convnext.%d.pw1', 'convnext.%d.pw2', 'd2t', 'dec.blk.%d.attn_k', 'dec.blk.%d.attn_o',
    'dec.blk.%d.attn_q', 'dec.blk.%d.attn_rel_b', 'dec.blk.%d.attn_v', 'dec.blk.%d.cross_attn_k',
    'dec.blk.%d.cross_attn_o', 'dec.blk.%d.cross_attn_q', 'dec.blk.%d.cross_attn_v',
    'dec.blk.%d.ffn_down', 'dec.blk.%d.ffn_gate', 'dec.blk.%d.ffn_up', 'dense_2', 'dense_3',
    'enc.blk.%d.attn_k', 'enc.blk.%d.attn_o', 'enc.blk.%d.attn_q', 'enc.blk.%d.attn_rel_b',
    'enc.blk.%d.attn_v', 'enc.blk.%d.ffn_down', 'enc.blk.%d.ffn_gate', 'enc.blk.%d.ffn_up', 'fc',
    'markov_w1', 'markov_w2', 'nextn.post_projection', 'nextn.pre_projection', 'output',
    'output_hc_down', 'output_hc_fn', 'output_hc_up', 'per_layer_model_proj', 'per_layer_token_embd',
    'position_embd', 'posnet.%d.attn_k', 'posnet.%d.attn_output', 'posnet.%d.attn_q',
    'posnet.%d.attn_v', 'selector_hidden', 'selector_predecessor', 'selector_successor', 'token_embd',
    'token_types',
)

OTHER = (
    'blk.%d.attn_rot_embd', 'blk.%d.ffn_down.%d', 'blk.%d.ffn_gate.%d', 'blk.%d.ffn_up.%d',
    'blk.%d.indexer_compressor_ape', 'blk.%d.ple_conv1d', 'blk.%d.shortconv.conv', 'blk.%d.ssm_a',
    'blk.%d.ssm_conv1d', 'blk.%d.time_mix_first', 'conv1d', 'convnext.%d.dw',
    'dec.blk.%d.cross_attn_rel_b', 'masked_embd_centroids', 'masked_embd_ordering', 'posnet.%d.conv1',
    'posnet.%d.conv2',
)
