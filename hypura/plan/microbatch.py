"""A prompt's micro-batch (llama.cpp's n_ubatch) as large as pays, where weights cross the link for each one.

A micro-batch computed on the GPU from weights that are not resident there copies them over the link once
(streamed layers into slots, op offload's share of pinned or pageable CPU weights), whatever its size: a
micro-batch of 2048 tokens moves the bytes of one of 512 and serves four times the tokens. It costs GPU memory:
llama.cpp's compute buffer grows with it (logits and activations of every token), and a plan within a GPU
budget gives weights up for it, which can slow decode. So the decision (plan/decision.py), once the context is
chosen, makes the plan again at larger sizes and keeps the one whose chat turn with a long prompt
(knobs.MICROBATCH_PROMPT_TOKENS, then the objective's decode) is fastest, the smallest of equals, among those
that keep decode within knobs.MICROBATCH_DECODE_TOLERANCE: a long prompt is never bought with slower replies.
Where the prompt is compute-bound already, nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hypura.errors import HypuraError
from hypura.plan import knobs


def turn_with_long_prompt(plan) -> float:
    """Seconds of a turn: a long prompt in micro-batches of the plan's size, then the objective's decode."""
    pr, tokens = plan.prediction, knobs.MICROBATCH_PROMPT_TOKENS
    batch_s = plan.n_ubatch / pr.prefill_tok_s if pr.prefill_tok_s > 0 else float("inf")
    return math.ceil(tokens / plan.n_ubatch) * batch_s + knobs.OBJECTIVE_DECODE_TOKENS / pr.decode_tok_s


def largest_paying(plan, plan_at: Callable[[int], object], n_ctx: int):
    """The plan at the micro-batch (of knobs.MICROBATCH_CHOICES, at most the context) whose long-prompt turn is
    fastest; plan_at(n_ubatch) makes the plan at another size. `plan` is kept where its prefill is not limited
    by the weights' copies."""
    if plan.prediction.prefill_limit == "compute":
        return plan
    best, best_s = plan, turn_with_long_prompt(plan)
    for u in knobs.MICROBATCH_CHOICES:
        if u <= plan.n_ubatch or u > n_ctx:
            continue
        try:
            alt = plan_at(u)
        except HypuraError:
            break  # its compute buffer does not fit: no larger one will
        if alt.prediction.decode_tok_s < plan.prediction.decode_tok_s * (1 - knobs.MICROBATCH_DECODE_TOLERANCE):
            break  # a larger one gives weights up too
        s = turn_with_long_prompt(alt)
        if s >= best_s * (1 - knobs.MICROBATCH_GAIN_MIN):
            break  # the copies no longer bound the prompt
        best, best_s = alt, s
    return best


__all__ = ["largest_paying", "turn_with_long_prompt"]
