"""A prompt's micro-batch (llama.cpp's n_ubatch) as large as pays, where weights cross the link for each one.

A micro-batch computed on the GPU from weights that are not resident there copies them over the link once
(streamed layers into slots, op offload's share of pinned or pageable CPU weights), whatever its size: a
micro-batch of 2048 tokens moves the bytes of one of 512 and serves four times the tokens. It costs GPU memory:
llama.cpp's compute buffer grows with it (every token's activations, the logits of the rows it outputs), and a
plan within a GPU budget gives weights up for it, which can slow decode. So the decision (plan/decision.py), once the context is
chosen, makes the plan again at larger sizes and keeps the one whose chat turn with a long prompt
(knobs.MICROBATCH_PROMPT_TOKENS, then the objective's decode) is fastest, the smallest of equals, among those
that keep decode within knobs.MICROBATCH_DECODE_TOLERANCE, each larger one kept only where the long prompt
itself gains knobs.MICROBATCH_GAIN_MIN (a slow decode, l70's 2 tok/s, would hide a prompt twice as fast in the
turn): a long prompt is never bought with slower replies.
Where the prompt is compute-bound already, nothing changes.

A grown micro-batch comes with llama.cpp's n_outputs_max at what the caller reads (`outputs_needed`): the
compute graph holds logits for that many rows, not for every token (a 4096-token micro-batch of a 128k-token
vocabulary would hold 2 GiB of them), and the planner counts the buffer so (PlanSettings.n_outputs). A batch
that asks more outputs than that is refused before llama.cpp sees it (runtime.Runtime.decode: llama.cpp
aborts on one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hypura.errors import HypuraError
from hypura.plan import knobs


def outputs_needed(context: Mapping[str, object], all_rows: bool, seqs: int = 1) -> int:
    """llama.cpp's n_outputs_max for a caller whose context fields are `context` and who decodes `seqs` sequence
    ids: the one it set; 0 (every token of a batch, llama.cpp's default) where it reads every row (logits_all,
    embeddings, a draft verified in the pass); else one output per sequence a step (n_seq_max: llama.cpp
    reserves no fewer)."""
    if "n_outputs_max" in context:
        return int(context["n_outputs_max"] or 0)
    if all_rows or context.get("embeddings"):
        return 0
    return max(1, int(context.get("n_seq_max") or seqs))


def long_prompt_s(plan) -> float:
    """Seconds of a long prompt (knobs.MICROBATCH_PROMPT_TOKENS) in micro-batches of the plan's size."""
    pr = plan.prediction
    batch_s = plan.n_ubatch / pr.prefill_tok_s if pr.prefill_tok_s > 0 else float("inf")
    return math.ceil(knobs.MICROBATCH_PROMPT_TOKENS / plan.n_ubatch) * batch_s


def turn_with_long_prompt(plan) -> float:
    """Seconds of a turn: a long prompt in micro-batches of the plan's size, then the objective's decode."""
    return long_prompt_s(plan) + knobs.OBJECTIVE_DECODE_TOKENS / plan.prediction.decode_tok_s


def largest_paying(plan, plan_at: Callable[[int], object], n_ctx: int):
    """The plan at the micro-batch (of knobs.MICROBATCH_CHOICES, at most the context) whose long-prompt turn is
    fastest; plan_at(n_ubatch) makes the plan at another size. `plan` is kept where its prompts copy no weights (a
    prompt limited by compute beside copies, op offload's in turn with the GPU's, still gains from fewer of them)."""
    if plan.prediction.prefill_limit == "compute" and not plan.traffic.prefill_link_bytes:
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
        # the prompt itself must gain (a slow decode would hide any prompt gain in the turn), the turn not lose
        if s >= best_s or long_prompt_s(alt) >= long_prompt_s(best) * (1 - knobs.MICROBATCH_GAIN_MIN):
            break  # the copies no longer bound the prompt
        best, best_s = alt, s
    return best


__all__ = ["largest_paying", "long_prompt_s", "outputs_needed", "turn_with_long_prompt"]
