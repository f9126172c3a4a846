"""How far do a prompt's logits move when CPU-computed weights are streamed or paged on a GPU build?

    python3 bench/prompt_numerics.py DENSE.gguf MOE.gguf      (GPU machine; tiny-llama and tiny-qwen3moe)

For each model, the all-GPU plan with some tensors computed by the CPU (dense: blk.1's FFN; MoE: the
stacked experts, odd ones on disk) is run three ways beside the same plan with those tensors resident
and op offload off: resident with op offload on, resident with a router hook installed (MoE), and
streamed/paged from disk. Printed: max |difference| and NaN count, for a 72-token prompt and for
6 decoded tokens. Why: on the H200 (2026-12-03) the streamed and paged prompts were 0.08-0.39 off the
resident plan and one run held a NaN, while on the CPU they are bit-equal (bench/RESULTS.md).
"""

import re
import sys

import numpy as np

sys.path.insert(0, "tests")

import hypura  # noqa: E402
from test_gpu_placement import _decode_logits, _for_the_cpu, _logits  # noqa: E402

TEXT = b"The quick brown fox jumps over the lazy dog. " * 6
SAME_KERNELS = {"model_params": {"use_extra_bufts": False, "no_host": True}}


def run(model: str, picked, tier: str, op_offload=None, **extra):
    overrides = dict(SAME_KERNELS)
    if op_offload is not None:
        overrides["context_params"] = {"op_offload": op_offload}
    llm = hypura.Llama(model, plan=_for_the_cpu(model, picked, tier), param_overrides=overrides, n_ctx=256,
                       logits_all=True, verbose=False, n_threads=4, **extra)
    try:
        tokens = llm.tokenize(TEXT)
        return _logits(llm, tokens), _decode_logits(llm, tokens[:6])
    finally:
        llm.close()


def main(dense: str, moe: str) -> None:
    for model, pattern in ((dense, r"blk\.1\.ffn_(up|gate|down)\."), (moe, r"_exps\.")):
        picked = lambda name, p=pattern: re.search(p, name) is not None  # noqa: E731
        want = run(model, picked, "ram", op_offload=False)
        variants = {"resident, op offload on": run(model, picked, "ram", op_offload=True),
                    "streamed or paged from disk": run(model, picked, "disk")}
        if model == moe:
            variants["resident, router hook"] = run(model, picked, "ram", op_offload=False,
                                                    on_route=lambda layer, ids: None)
        for name, got in variants.items():
            for phase, a, b in zip(("prompt", "decode"), got, want):
                print(f"{model}: {name}, {phase}: max |diff| {float(np.nanmax(np.abs(a - b))):.4g}, "
                      f"NaN {int(np.isnan(a).sum())} (resident: {int(np.isnan(b).sum())})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
