"""Every tuning constant of the planner and its cost model, each with where the number comes from.

Rates a profile measures (disk, link, CPU decode) are not here: these are the defaults used when a
profile lacks a figure, and the fixed costs and margins no quick measurement pins down.
"""

# rates a profile derives from what it measured, the planner uses them too
from hypura.profile.measure_knobs import CPU_FLOPS_DEFAULT, GPU_FLOPS_DEFAULT, GPU_READ_EFFICIENCY  # noqa: F401
# the sizes of llama.cpp's buffers, counted with a model's units; the planner uses them too
from hypura.units import COMPUTE_ACTIVATIONS, COMPUTE_FLOOR, KV_BYTES_PER_ELEMENT  # noqa: F401

GiB = 1 << 30
MiB = 1 << 20

# --- memory margins -------------------------------------------------------------------------
# llama.cpp's own `--fit` leaves 1024 MiB free per device (common.h, fit_params_target)
GPU_MARGIN = 1 * GiB
# left to the OS, the Python process and other programs; RAM budgets count every byte we hold
RAM_MARGIN = 2 * GiB
# host memory a process that uses the GPU holds beyond the plan's tensors and buffers (the CUDA runtime,
# Python): on the H200 (2026-12-03) RSS peaked 114-185 MiB above the plan's RAM (bench/RESULTS.md)
GPU_PROCESS_RAM = 256 * MiB
# host memory a CPU-only process holds beyond the plan's tensors and buffers (GPU_PROCESS_RAM includes
# it): measured 2026-12-04 on a 2-core x86 machine, hypura.Llama(llama3.1-8b shape, 8 layers, ram=1400MiB,
# n_ctx=256) after a decode: Python with numpy, llama_cpp and the library mapped 42 MiB; the heap
# (llama.cpp's vocabulary of 128k tokens, ggml contexts, Python objects) 49-51 MiB; the streaming
# reader's O_DIRECT request buffer 16 MiB (profile/measure_knobs.py DISK_REQUEST_BYTES): 107-109 MiB, rounded
# up for larger vocabularies
PROCESS_RAM = 128 * MiB
# the tokens a speculative pass drafts, where the planner weighs a draft's place (plan/beside.py): the
# middle of the lengths the adaptive choice settles on over streamed weights (speculative/draft_length.py)
DRAFT_TOKENS_PLANNED = 8
# each further concurrent reader of streamed disk tensors maps its own O_DIRECT request buffer
# (runtime/transfers.py STREAM_REQUEST_BYTES); PROCESS_RAM counts the first
STREAM_READER_RAM = 16 * MiB

# --- decode cost ----------------------------------------------------------------------------
# fixed cost per GPU-computed layer per token (kernel launches, syncs): the same fit, 58 us
GPU_LAYER_S = 58e-6
# fixed cost per CPU-computed layer (thread barriers per op, ~15 ops): estimate, not fitted
CPU_LAYER_S = 20e-6
# each CPU<->GPU hand-off in a token's graph: a scheduler split, sync and activation copy; estimate,
# consistent with llama.cpp's -ot exps=CPU runs on the H200 (64-96 hand-offs a token)
SPLIT_S = 30e-6
# the same with the streamer's eval callback installed (every split synchronized, CPU threads idle
# while the GPU works, activations handed over through pageable memory): fit on the H200
# (2026-12-03), the 70B hybrid's 44 GPU splits took 20.8 ms a token beyond their weight waits, 9.9 ms
# of it reading weights and 4.6 ms per-layer costs, for 88 hand-offs (bench/RESULTS.md)
STREAM_SPLIT_S = 70e-6
# pinned host->GPU copies run at this share of their measured rate while the CPU decodes beside them
# (both read RAM): on the H200, a 70B hybrid plan's copies ran at 48.2 GB/s over the decode, 0.89 of
# a lone 1 GiB copy's 54.1 GB/s on the same machine (bench/RESULTS.md)
LINK_BESIDE_CPU = 0.89
# the CPU's decode and the link's pinned copies read the same RAM: together at most this multiple of the
# CPU's own decode rate. On an H100 host whose CPU decodes at 69 GB/s alone, a 70B hybrid plan at 8 GiB read
# a token's 20.6 GB on the CPU at 44 GB/s while the link moved 15.3 GB at 37 GB/s: 81 GB/s together (1.17x),
# 440 ms a token where budgets counted apart predicted 323 (bench/RESULTS.md)
RAM_SHARED_HEADROOM = 1.2
# an expert cache's host round trip per MoE layer and token (router result read, slot ids written, the
# Python hook): measured on the H200 (2026-12-03, qwen3-30b-a3b shape, 18 slots a layer, routing that
# spreads over the experts): router hooks beyond their waits for loads took 12.0 and 8.0 ms a token
# over 48 layers (250 and 167 us); with nearly all hits (2026-12-02) 4.7 ms (98 us)
EXPERT_LAYER_S = 210e-6
# attention reads on average this share of the context's KV cache per token (a chat that fills
# the context reads half of it on average)
KV_READ_FILL = 0.5

# --- the objective ---------------------------------------------------------------------------
# plans minimise the time of a chat turn: a prompt of this many tokens, then this many generated.
# Decode dominates while it is slow; the prompt keeps a plan from buying a sliver of decode speed
# with a far slower prefill (e.g. leaving the GPU idle on a disk-bound unified-memory machine)
OBJECTIVE_PROMPT_TOKENS = 512
OBJECTIVE_DECODE_TOKENS = 256

# a plan that streams (GPU slots, pinned CPU weights) replaces llama.cpp's kind of placement only when it predicts
# a chat turn at least this much faster: on an H100 host (2026-12-06) the 70B's streamed plan at 8.5 GiB measured
# 22 % under its prediction (2.87 tok/s against 3.51) while llama.cpp's --fit ran 3.30; part of that was the CPU's
# unrepacked rate, which profiles now measure (Rates.cpu_read_plain)
STREAM_GAIN_MIN = 0.10

# --- prefill cost ---------------------------------------------------------------------------
# llama.cpp's default micro-batch (llama_context_default_params().n_ubatch)
N_UBATCH = 512
# larger micro-batches a plan whose prompts wait on weight copies may take (plan/microbatch.py), judged by a turn
# with a prompt of this many tokens: a chat history, a file in a coding agent, a RAG context
MICROBATCH_CHOICES = (1024, 2048, 4096)
MICROBATCH_PROMPT_TOKENS = 4096
# ... a larger one only for a real gain: each costs GPU memory that weights could use
MICROBATCH_GAIN_MIN = 0.05
# ... and only while decode stays within this share of the default micro-batch's (as an unset context grows)
MICROBATCH_DECODE_TOLERANCE = 0.03

# --- streaming ------------------------------------------------------------------------------
# layers in flight ahead of the one computing: one absorbs the next layer's read, two absorb the
# jitter of a disk read (Hypura's "prefetch depth")
PREFETCH_DEPTH = 2

# --- compute buffers ------------------------------------------------------------------------
# llama.cpp's per-device buffers (KV element size, compute buffer) are sized where a model's units are
# counted (hypura/units.py)
# the CPU's compute buffer when the GPU computes every layer: llama.cpp logs show CPU/CUDA_Host
# compute buffers of 16-40 MiB with full offload (input embeddings of the micro-batch)
HOST_BUFFER_OFFLOADED = 64 * MiB

# --- tie-breaking among tensors of equal access density -------------------------------------
# fast tiers take small, always-read tensors first; FFN and experts are what streaming moves
# (streaming attention would drag the KV cache along)
ROLE_RANK = {"norm": 0, "other": 0, "router": 1, "attn": 2, "output": 3, "shared": 4,
             "ffn": 5, "expert": 6, "embd": 7}

# --- parallel sequences (batched decode) -----------------------------------------------------
# llama.cpp's CUDA backend computes an op whose weight lies in a host buffer on the GPU, copying the
# weight there first, once the op's batch reaches this many tokens (ggml-cuda.cu,
# ggml_backend_cuda_device_offload_op; GGML_OP_OFFLOAD_MIN_BATCH overrides it)
OP_OFFLOAD_MIN_BATCH = 32
# op offload's copies (compute stream) beside streamed ones (copy stream) in one step: this share of the shorter
# of the two is lost. H200, 2026-12-06, q3 at 4 GiB, 2048 tokens, 22 expert layers by op offload (6.9 GB, 0.125 s
# at 55.5 GB/s) and 23 streamed (9.1 GB): 0.379 s, where the link's 16.0 GB take 0.288 s and the compute stream
# (0.169 s resident, then those copies) 0.294 s; 0.09 s more, 0.7 of 0.125 (bench/RESULTS.md prefill-h200)
COPY_CLASH = 0.7
# while layers stream to the GPU, the CPU's matmuls of a decode step's further tokens ran at this share of
# the profile's prefill FLOP rate: H200, 2026-12-04, 70B shape at 8 GiB of GPU, 16 sequences, a step of 1.5 s
# with 11.2 GB of FFN weights on the CPU beside 24.6 GB streamed (0.47 TFLOP/s against 1.22; the copies'
# memory traffic and the hand-offs not told apart). Without streaming the full rate fits vanilla's runs
CPU_BATCH_FLOPS_BESIDE_STREAMING = 0.4
# those copies read ordinary (pageable) host memory, staged by the driver: H200 profile 8.5 GB/s,
# 7.3 on 2026-12-04; used when a profile did not measure its own (h2d_pageable_bw)
PAGEABLE_LINK_DEFAULT = 8e9
