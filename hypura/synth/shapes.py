"""Model shapes for `hypura synth`: real hyperparameters (from each model's HF config.json)
plus tiny shapes for tests that load in milliseconds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypura.errors import HypuraError


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.x `rope_scaling` (rope_type "llama3"): written as the `rope_freqs` tensor."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class Mla:
    """DeepSeek multi-head latent attention (HF config names): q and kv pass through low-rank latents;
    k_b/v_b are kv_b split per head, as convert_hf_to_gguf writes it for llama.cpp's absorbed MLA."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Yarn:
    """YaRN rope scaling ({arch}.rope.scaling.*); log_mul: deepseek2's 0.1 * mscale_all_dim, 0 if none."""

    factor: float
    original_context: int
    log_mul: float = 0.0


@dataclass(frozen=True)
class Router:
    """How a MoE router scores experts, where it is not llama.cpp's per-arch default (softmax)."""

    gating: int  # {arch}.expert_gating_func: 1 softmax, 2 sigmoid
    weights_scale: float = 0.0  # routed_scaling_factor; 0: not written
    weights_norm: bool = False  # norm_topk_prob
    n_group: int = 0  # expert groups and groups used per token (deepseek-v3's grouped top-k)
    n_group_used: int = 0
    probs_bias: bool = False  # exp_probs_b.bias: per-expert bias added to scores for selection only


@dataclass(frozen=True)
class ModelShape:
    name: str
    arch: str  # GGUF general.architecture
    size_label: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int  # dense FFN width ({arch}.feed_forward_length)
    n_vocab: int
    n_ctx: int  # {arch}.context_length (n_ctx_train)
    rope_theta: float
    norm_eps: float  # RMS norm epsilon
    head_dim: int = 0  # 0: n_embd / n_head; else written as attention.key_length/value_length
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # expert FFN width when it differs from n_ff (qwen3moe)
    qkv_bias: bool = False  # qwen2: attn_{q,k,v}.bias
    qk_norm: bool = False  # qwen3: attn_{q,k}_norm
    llama3_rope: Llama3Rope | None = None
    mla: Mla | None = None  # deepseek2: replaces q/k/v; n_head_kv is then 1 (MQA over the latent)
    yarn: Yarn | None = None
    router: Router | None = None
    n_dense_lead: int = 0  # leading blocks with a dense FFN (n_ff) before the MoE ones
    n_expert_shared: int = 0  # shared experts of width n_ff_exp, run for every token
    n_swa: int = 0  # sliding window of every other block, from block 0 (gpt-oss); 0: none
    attn_sinks: bool = False  # per-head attention sink logits (gpt-oss)
    proj_bias: bool = False  # biases on attn_output, the router and the experts (gpt-oss)
    post_attn_norm: bool = False  # the FFN's input norm is named post_attention_norm (gpt-oss)
    ftype: str = "q4_k_m"  # the file type when --ftype is not given: how the model is published
    n_layer_full: int = 0  # set by truncated(): the real model's depth

    @property
    def n_embd_head(self) -> int:
        if self.mla:  # what llama.cpp caches per token: the kv latent and the shared rope key
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return self.head_dim or self.n_embd // self.n_head

    def is_moe_layer(self, i: int) -> bool:
        return self.n_expert > 0 and i >= self.n_dense_lead

    @property
    def n_embd_q(self) -> int:
        return self.n_embd_head * self.n_head

    @property
    def n_embd_kv(self) -> int:
        return self.n_embd_head * self.n_head_kv

    @property
    def expert_ff(self) -> int:
        return self.n_ff_exp or self.n_ff

    def truncated(self, n_layer: int | None) -> ModelShape:
        """The same model with only its first `n_layer` blocks (`--layers N`)."""
        if n_layer is None or n_layer == self.n_layer:
            return self
        if not 1 <= n_layer <= self.n_layer:
            raise HypuraError(f"--layers must be between 1 and {self.n_layer} for {self.name}, got {n_layer}")
        return dataclasses.replace(self, n_layer=n_layer, n_layer_full=self.n_layer_full or self.n_layer)


_LLAMA3 = dict(n_vocab=128256, n_ctx=131072, rope_theta=500000.0, norm_eps=1e-5, llama3_rope=Llama3Rope())

SHAPES: dict[str, ModelShape] = {s.name: s for s in [
    # meta-llama/Llama-3.1-8B-Instruct
    ModelShape("llama3.1-8b", "llama", "8B", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
               n_ff=14336, **_LLAMA3),
    # meta-llama/Llama-3.3-70B-Instruct
    ModelShape("llama3.3-70b", "llama", "70B", n_layer=80, n_embd=8192, n_head=64, n_head_kv=8,
               n_ff=28672, **_LLAMA3),
    # Qwen/Qwen2.5-14B-Instruct: q/k/v biases, untied output
    ModelShape("qwen2.5-14b", "qwen2", "14B", n_layer=48, n_embd=5120, n_head=40, n_head_kv=8,
               n_ff=13824, n_vocab=152064, n_ctx=32768, rope_theta=1e6, norm_eps=1e-5, qkv_bias=True),
    # mistralai/Mixtral-8x7B-v0.1: arch llama with 8 stacked experts, top-2
    ModelShape("mixtral-8x7b", "llama", "8x7B", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
               n_ff=14336, n_vocab=32000, n_ctx=32768, rope_theta=1e6, norm_eps=1e-5,
               n_expert=8, n_expert_used=2),
    # Qwen/Qwen3-30B-A3B: 128 experts of width 768, top-8, head_dim 128 != n_embd/n_head, q/k norms
    ModelShape("qwen3-30b-a3b", "qwen3moe", "30B-A3B", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4,
               n_ff=6144, n_vocab=151936, n_ctx=40960, rope_theta=1e6, norm_eps=1e-6, head_dim=128,
               n_expert=128, n_expert_used=8, n_ff_exp=768, qk_norm=True),
    # Qwen/Qwen3-235B-A22B: qwen3-30b-a3b's design at 94 blocks, 128 experts of width 1536
    ModelShape("qwen3-235b-a22b", "qwen3moe", "235B-A22B", n_layer=94, n_embd=4096, n_head=64, n_head_kv=4,
               n_ff=12288, n_vocab=151936, n_ctx=40960, rope_theta=1e6, norm_eps=1e-6, head_dim=128,
               n_expert=128, n_expert_used=8, n_ff_exp=1536, qk_norm=True),    # deepseek-ai/DeepSeek-V3: MLA, 3 dense blocks then 256 routed experts (top-8 of 4 groups out of 8,
    # sigmoid scores, selection bias) plus 1 shared expert; MTP block not written (llama.cpp skips it)
    ModelShape("deepseek-v3", "deepseek2", "671B", n_layer=61, n_embd=7168, n_head=128, n_head_kv=1,
               n_ff=18432, n_vocab=129280, n_ctx=163840, rope_theta=10000.0, norm_eps=1e-6,
               n_expert=256, n_expert_used=8, n_ff_exp=2048, n_dense_lead=3, n_expert_shared=1,
               mla=Mla(1536, 512, 64, 128, 128), yarn=Yarn(40.0, 4096, 0.1),
               router=Router(2, 2.5, True, 8, 4, probs_bias=True)),    # openai/gpt-oss-120b: 128 experts of width 2880 in MXFP4 (as released), top-4, q/k/v/o biases,
    # attention sinks, a 128-token sliding window on even blocks, YaRN
    ModelShape("gpt-oss-120b", "gpt-oss", "120B", n_layer=36, n_embd=2880, n_head=64, n_head_kv=8,
               n_ff=2880, n_vocab=201088, n_ctx=131072, rope_theta=150000.0, norm_eps=1e-5, head_dim=64,
               n_expert=128, n_expert_used=4, n_ff_exp=2880, qkv_bias=True, yarn=Yarn(32.0, 4096),
               n_swa=128, attn_sinks=True, proj_bias=True, post_attn_norm=True, ftype="mxfp4_moe"),

    # Tiny shapes for tests. n_embd 256 keeps K-quants (256-element blocks along ne[0]) valid;
    # tiny-qwen3moe's expert width 128 exercises llama.cpp's fallbacks (Q4_K->Q5_0, Q6_K->Q8_0).
    # Small vocabularies (the tokenizer truncated) keep them fast to write and read.
    ModelShape("tiny-llama", "llama", "tiny", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
               n_vocab=8192, n_ctx=2048, rope_theta=500000.0, norm_eps=1e-5, llama3_rope=Llama3Rope()),
    ModelShape("tiny-qwen2", "qwen2", "tiny", n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_ff=768,
               n_vocab=4096, n_ctx=2048, rope_theta=1e6, norm_eps=1e-6, qkv_bias=True),
    ModelShape("tiny-mixtral", "llama", "tiny", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
               n_vocab=4096, n_ctx=2048, rope_theta=1e6, norm_eps=1e-5, n_expert=8, n_expert_used=2),
    ModelShape("tiny-qwen3moe", "qwen3moe", "tiny", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=768,
               n_vocab=4096, n_ctx=2048, rope_theta=1e6, norm_eps=1e-6, head_dim=128,
               n_expert=16, n_expert_used=4, n_ff_exp=128, qk_norm=True),
    ModelShape("tiny-deepseek2", "deepseek2", "tiny", n_layer=3, n_embd=256, n_head=4, n_head_kv=1, n_ff=512,
               n_vocab=4096, n_ctx=2048, rope_theta=10000.0, norm_eps=1e-6, n_expert=16, n_expert_used=4,
               n_ff_exp=256, n_dense_lead=1, n_expert_shared=1, mla=Mla(256, 256, 64, 128, 128),
               yarn=Yarn(40.0, 4096, 0.1), router=Router(2, 2.5, True, 4, 2, probs_bias=True)),
    ModelShape("tiny-gpt-oss", "gpt-oss", "tiny", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256,
               n_vocab=4096, n_ctx=2048, rope_theta=150000.0, norm_eps=1e-5, head_dim=64, n_expert=8,
               n_expert_used=2, n_ff_exp=256, qkv_bias=True, yarn=Yarn(32.0, 4096), n_swa=128,
               attn_sinks=True, proj_bias=True, post_attn_norm=True, ftype="mxfp4_moe"),
]}


def get_shape(name: str) -> ModelShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise HypuraError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None
