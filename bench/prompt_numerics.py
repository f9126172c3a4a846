"""How far do a prompt's logits move when CPU-computed weights are streamed or paged on a GPU build?

    python3 bench/prompt_numerics.py DENSE.gguf MOE.gguf      (GPU machine; tiny-llama and tiny-qwen3moe)

For each model, a plan with every tensor on the GPU but some computed by the CPU (dense: every layer's
FFN, through two host slots when on disk; MoE: the stacked experts, odd ones on disk) runs several ways,
beside the same plan with those tensors resident and op offload off. Each variant changes one thing:
- op offload on;
- the file read with direct I/O (as a plan with a disk tier loads it);
- llama.cpp's repacking CPU buffers on or off (the reference uses them as the disk variant does: on for
  dense host-pool layers, off for paged experts);
- a router hook installed (MoE);
- the tensors streamed or paged from disk.
Printed per variant: max |difference|, the rows (tokens) that moved, NaN counts, and which backends
computed the FFN's matmuls in the prompt, for a 72-token prompt and for 6 decoded tokens; the disk
variants' split traces. Why: on the H200 the disk variants matched op offload on and one paged run gave
NaN. The plans then had no GPU tensors, and the runtime left op offload on (bench/RESULTS.md, fifth
session).
"""

import re
import sys

import hypura  # first: our library loads before numpy (as tests/conftest.py does; numpy first crashed on the H200)
import llama_cpp
import numpy as np

sys.path.insert(0, "tests")
from test_gpu_placement import _decode_logits, _for_the_cpu, _logits  # noqa: E402

TEXT = b"The quick brown fox jumps over the lazy dog. " * 6
FFN = re.compile(r"ffn_(moe_)?(gate|up|down)")


def run(model: str, picked, tier: str, op_offload=None, direct_io=False, repack=False, **extra):
    """repack: llama.cpp's repacking CPU buffer types, which a plan keeps for dense host-pool layers
    (they are loaded whole) and turns off for paged experts (written by expert)."""
    overrides = {"model_params": {"use_extra_bufts": repack, "no_host": True}}
    if op_offload is not None:
        overrides["context_params"] = {"op_offload": op_offload}
    if direct_io:
        overrides["model_params"]["load_mode"] = llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO
    llm = hypura.Llama(model, plan=_for_the_cpu(model, picked, tier, staging_slots=2), param_overrides=overrides, n_ctx=256,
                       logits_all=True, verbose=False, **{"n_threads": 4, **extra})
    try:
        tokens = llm.tokenize(TEXT)
        prompt = _logits(llm, tokens)
        splits = llm.stats()["prefill"]["last_call_splits_ms"] if "prefill" in llm.stats() else []
        ffn_backends = sorted({buft for _, buft, name in splits if FFN.match(name)})
        if splits:
            print(f"  {tier} prompt splits: " + " ".join(f"{name}@{buft}" for _, buft, name in splits[:24]), flush=True)
        return prompt, _decode_logits(llm, tokens[:6]), ffn_backends
    finally:
        llm.close()


def describe(a, b) -> str:
    diff = np.abs(np.nan_to_num(a, nan=1e9) - np.nan_to_num(b, nan=1e9))
    moved = np.flatnonzero(diff.max(axis=1) > 1e-4)
    rows = f"{len(moved)} of {len(a)} rows moved" + (f" (first {moved[0]})" if len(moved) else "")
    return (f"max |diff| {float(np.nanmax(np.abs(a - b))):.4g}, {rows}, "
            f"NaN {int(np.isnan(a).sum())} (resident: {int(np.isnan(b).sum())})")


def main(dense: str, moe: str) -> None:
    for model, pattern in ((dense, r"blk\.\d+\.ffn_(up|gate|down)\."), (moe, r"_exps\.")):
        picked = lambda name, p=pattern: re.search(p, name) is not None  # noqa: E731
        repack = model == dense  # as the runtime loads the disk variant
        *want, want_backends = run(model, picked, "ram", op_offload=False, repack=repack)
        print(f"{model}: resident, op offload off, repack {repack}: prompt FFN splits on {want_backends}", flush=True)
        variants = {"resident, op offload on": lambda: run(model, picked, "ram", op_offload=True, repack=repack),
                    "resident, direct I/O load": lambda: run(model, picked, "ram", op_offload=False,
                                                             direct_io=True, repack=repack),
                    f"resident, repack {not repack}": lambda: run(model, picked, "ram", op_offload=False,
                                                                  repack=not repack),
                    "streamed or paged from disk": lambda: run(model, picked, "disk", repack=repack)}
        if model == moe:
            variants["resident, router hook"] = lambda: run(model, picked, "ram", op_offload=False,
                                                            on_route=lambda layer, ids: None)
            for again in (2, 3):  # the H200 gave NaN in some runs only
                variants[f"paged from disk, run {again}"] = lambda: run(model, picked, "disk")
            variants["paged from disk, 1 thread"] = lambda: run(model, picked, "disk", n_threads=1)
        for name, variant in variants.items():
            *got, backends = variant()
            for phase, a, b in zip(("prompt", "decode"), got, want):
                print(f"{model}: {name}, {phase}: {describe(a, b)}", flush=True)
            print(f"{model}: {name}: prompt FFN splits on {backends}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
