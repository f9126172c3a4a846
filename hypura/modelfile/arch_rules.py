"""What some architectures' own code asserts on, beyond llama_model_base::load_hparams: read from the
vendored src/models/*.cpp (each architecture's class, as llama_model_mapping maps them in
src/llama-model.cpp) and restated; tests/test_modelfile_tables.py derives them again from the source.

ROT_IS_HEAD: the graph asserts n_embd_head_v == n_embd_head_k and n_embd_head_v == n_rot;
HEAD_K_IS_V: it asserts n_embd_head_v == n_embd_head_k. Both abort when the first graph is built.
NEEDS_EXPERTS: load_arch_tensors asserts n_expert > 0 and n_expert_used > 0 (for LFM2-MoE, in the layers
past its leading dense ones). NO_MEMORY: llama_model::create_memory gives these no KV cache
(encoders, diffusion models): nothing generates text with them through llama-cpp-python.
"""

ROT_IS_HEAD = frozenset((
    'apertus', 'arcee', 'arctic', 'baichuan', 'chameleon', 'codeshell', 'cogvlm', 'cohere2moe', 'dbrx',
    'deci', 'deepseek', 'dots1', 'dream', 'ernie4_5', 'ernie4_5-moe', 'exaone', 'exaone-moe', 'exaone4',
    'falcon', 'granite', 'granite_swa', 'graniteswitch', 'grok', 'grovemoe', 'hunyuan-moe',
    'hunyuan_vl', 'hy_v3', 'internlm2', 'jais2', 'llada', 'llada-moe', 'llama', 'llama4', 'maincoder',
    'mellum', 'minimax-01', 'minimax-m2', 'mistral3', 'nemotron', 'olmo', 'olmo2', 'olmoe', 'orion',
    'paddleocr', 'pangu-embedded', 'plamo', 'pockettts', 'qwen2', 'qwen2moe', 'qwen2vl', 'qwen3',
    'qwen3moe', 'qwen3vl', 'qwen3vlmoe', 'rnd1', 'seed_oss', 'smallthinker', 'smollm3', 'starcoder2',
    'talkie', 'xverse',
))

HEAD_K_IS_V = frozenset((
    'afmoe', 'bailingmoe2', 'bert', 'bitnet', 'bloom', 'chatglm', 'cohere2', 'command-r', 'deepseek4',
    'dflash', 'eagle3', 'eurobert', 'glm4', 'glm4moe', 'gpt2', 'gptneox', 'granitehybrid', 'jais',
    'laguna', 'minimax-m3', 'modern-bert', 'mpt', 'muse-glimmer', 'nanbeige', 'nemotron_h',
    'nemotron_h_moe', 'neo-bert', 'openelm', 'phi2', 'phi3', 'qwen', 'qwen35', 'qwen35moe', 'qwen3next',
    'qwen4exp', 'refact', 'spark2_5', 'stablelm', 'starcoder', 't5',
))

NO_MEMORY = frozenset((
    'bert', 'dream', 'eurobert', 'gemma-embedding', 'jina-bert-v2', 'jina-bert-v3', 'llada',
    'llada-moe', 'modern-bert', 'neo-bert', 'nomic-bert', 'nomic-bert-moe', 'rnd1', 'wavtokenizer-dec',
))

NEEDS_EXPERTS = frozenset(("bailingmoe2", "glm4moe", "grovemoe", "llada-moe", "smallthinker"))
NEEDS_EXPERTS_PAST_DENSE_LEAD = frozenset(("lfm2moe",))  # models/lfm2moe.cpp: layers past n_layer_dense_lead
