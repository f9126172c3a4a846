"""Every constant of `hypura profile`'s measurements, with why it has its value."""

from hypura.tiers.direct_io import DIRECT_ALIGN, DISK_REQUEST_BYTES  # noqa: F401  (what the profile measures with)

MiB = 1 << 20
GiB = 1 << 30

# --- disk -----------------------------------------------------------------------------------
# experts are read where a router sends decode: random reads of one expert's slice of a stacked tensor
# (Qwen3-30B-A3B Q4_K: 0.9 MB), which ran at 0.5-0.7 of the sequential 4 MiB rate on the H200 (2026-12-03)
DISK_RANDOM_REQUEST_BYTES = 1 * MiB
# reader threads the profile tries (requests of DISK_REQUEST_BYTES, as the runtime reads)
DISK_THREADS = (1, 2, 4)
# test file: big enough for a steady rate, small enough to write in ~1 s
DISK_TEST_BYTES = 512 * MiB
# a model file at least this large is read in place of a test file (nothing written beside the model): the
# passes need 96 MiB, and a larger file is less likely to sit in a virtual disk's host cache
DISK_FILE_MIN_BYTES = 1 * GiB
# each thread count reads for at most this long (the whole file when faster): 0.5 s is hundreds of requests
# even at random on a slow disk (0.7 GB/s of 1 MiB reads on the CPU VM); six passes of 1.5 s were half of the
# 70B's first-use profile on the H100 host (~19 s, issue 41), and the passes are measured once per machine
DISK_PASS_S = 0.5

# --- RAM ------------------------------------------------------------------------------------
# larger than any last-level cache, so the copy measures DRAM
RAM_COPY_BYTES = 256 * MiB
RAM_COPY_REPEATS = 5

# --- GPU links (ggml device API) --------------------------------------------------------------
# large enough that a 55 GB/s PCIe copy takes ~20 ms, dwarfing launch overhead
LINK_BYTES = 1 * GiB
LINK_REPEATS = 5
D2D_REPEATS = 20
# GPU to GPU (several local GPUs): NVLink's 450 GB/s moves 256 MiB in 0.6 ms, PCIe's 25 in 11 ms, both well above
# a copy's launch cost; the layer split's hand-offs are single activations, but the rate is the link's
PEER_BYTES = 256 * MiB

# --- CPU compute (a short llama.cpp run on a few of the model's blocks) -----------------------
# the blocks copied for the timed run: the 70B's Q4_K_M blocks are 0.5 GB each (1 + 2 blocks), an MoE
# block is most of its file's share but a token reads k/E of it; copied and loaded, they are held twice
SLICE_BYTES = 1 << 30
# a prompt long enough for batched matmuls; decode stops at the token count or the time limit,
# whichever comes first (a loaded machine must not stretch the profile past seconds)
LLAMA_PROMPT_TOKENS = 32
LLAMA_DECODE_TOKENS = 32
LLAMA_DECODE_S = 4.0  # measured per model: a busy 2-core VM took 28 s for the 4-layer llama3.1-8b shape at 8.0
# a decode step of several tokens (sequences decoded together, a small draft's verification): the CPU reads the
# distinct experts (or the dense weights once) faster than one token's rate says (H100 host, q3: about 75 GB/s at 4
# sequences against 52 a token; bench/RESULTS.md prefill-h200), so such steps are timed too, after the tokens: 8
# tokens, between the 4 and 16 sequences of that table; a few steps, at most LLAMA_BATCH_S: SmolLM2-135M's
# profile on a 2-core VM took 0.16 s more (of 2.0 s), and a step of q3's 3 blocks reads about 0.35 GB
LLAMA_BATCH_TOKENS = 8
LLAMA_BATCH_STEPS = 4
LLAMA_BATCH_S = 2.0
# the GPU's prompt rate on the model's blocks (gpu_compute.py): a micro-batch of a long prompt (plan/microbatch.py's
# prompts average half of 4096), best of a few after a warm-up
GPU_PROMPT_TOKENS = 2048
GPU_PROMPT_REPEATS = 3
LLAMA_CTX = 256  # 3 x 32 prompt tokens (a warm-up, two timed), 2 x 32 decode tokens, 4 x 8 batched: 192 positions

# --- rates derived from the measurements (the planner's fits) --------------------------------
# GPU decode reads weights at this fraction of a device copy's memory traffic: fit of the
# vanilla llama.cpp H200 runs (14B 149 tok/s, 70B 43.1 tok/s) with a per-layer cost gives 2.34 TB/s over
# the 4.28 TB/s measured for HBM
GPU_READ_EFFICIENCY = 0.55
# discrete GPU matmul rate on quantized weights: vanilla llama.cpp's pp512 on the H200 gives
# 132 (14B), 159 (70B), 140 (Mixtral active) TFLOP/s
GPU_FLOPS_DEFAULT = 150e12
# CPU matmul rate when the profile has no llama.cpp measurement: 2 FLOP/weight at 8 cores x
# ~32 FLOP/cycle x 2.5 GHz, halved for dequantization: an estimate
CPU_FLOPS_DEFAULT = 300e9

# --- defaults when nothing was measured (inspect without `hypura profile`) --------------------
# conservative figures so an unmeasured plan does not promise too much
DEFAULT_DISK_BW = 1.4e9  # the H200 host's NVMe with O_DIRECT (docs/design.md); consumer NVMe reads 2-7 GB/s
DEFAULT_CPU_DECODE_BW = 20e9  # llama.cpp CPU decode on dual-channel DDR4/DDR5 desktops: 15-40 GB/s
DEFAULT_LINK_BW = 25e9  # PCIe 4.0 x16 pinned copies (~25 GB/s); 55 measured on the H200's PCIe 5.0
DEFAULT_GPU_DECODE_BW = 500e9  # a mid-range discrete GPU's effective decode read rate
