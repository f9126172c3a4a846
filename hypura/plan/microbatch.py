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

Where the CPU computes experts paged from disk (runtime/moe/expert_paging.py), the micro-batch bounds memory too:
the pager keeps every expert one llama_decode micro-batch selects of a layer until that layer computed, up to
min(disk experts of the layer, n_ubatch x k), and the plan's disk staging must hold them (`experts_per_call`,
counted by the search's stage_need) or RSS leaves the RAM budget. So such a plan is made at the asked micro-batch
and at the smaller ones whose selections stage fewer experts (`paged_choices`), and the one whose chat turn is
fastest (steps.turn_seconds, what plans minimise) is kept (`within_staging`): a large micro-batch reads each
expert once for many tokens, a small one leaves RAM to resident experts and fits budgets a large one cannot. With
a GPU the staging holds one token's experts, as it did (the load handed to llama.cpp stays as it was).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hypura.errors import HypuraError
from hypura.plan import knobs
from hypura.plan.pools import paged_by_expert
from hypura.plan.steps import turn_seconds


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


def experts_per_call(k: int, n_ubatch: int, has_gpu: bool) -> int:
    """The experts of a layer one micro-batch may select, which the disk staging holds (k: the model's per token,
    0 for a dense model): each of its tokens' k on the CPU; one token's with a GPU (module docstring)."""
    return max(1, k) * (1 if has_gpu else n_ubatch)


def paged_choices(asked: int, n_expert: int, k: int, parallel: int) -> list[int]:
    """The micro-batches a CPU plan paging experts is made at: the asked one, then the powers of two below it that
    select fewer than a layer's n_expert experts (a larger one stages them all, as the asked one does), none below a
    decode step of `parallel` sequences (smaller would split it), largest first."""
    out, u = [asked], 1
    while u < asked and u * k < n_expert:
        if u >= parallel:
            out.append(u)
        u *= 2
    return [out[0]] + sorted(out[1:], reverse=True)


def floor_microbatch(asked: int, n_expert: int, k: int, parallel: int, has_gpu: bool) -> int:
    """The micro-batch of the smallest RAM budget that plans a model (search.ram_floor): the smallest of
    paged_choices on the CPU, the asked one with a GPU."""
    return asked if has_gpu else min(paged_choices(asked, n_expert, k, parallel))


def within_staging(plan_at: Callable[[int], object], asked: int, n_expert: int, k: int, parallel: int,
                   has_gpu: bool):
    """The plan at the asked micro-batch, unless the CPU computes experts paged from disk (or nothing fits): then
    the fastest turn of the plans at paged_choices (module docstring). plan_at(n_ubatch) makes the plan there and
    raises HypuraError where nothing fits; the error raised is the smallest micro-batch's (its RAM floor is the
    model's: staging and compute buffer shrink with the micro-batch)."""
    try:
        plan, error = plan_at(asked), None
    except HypuraError as e:
        plan, error = None, e
    choices = paged_choices(asked, n_expert, k, parallel)
    if has_gpu or len(choices) == 1 or (plan is not None and not any(paged_by_expert(t) for t in plan.tensors)):
        if plan is None:
            raise error
        return plan
    plans = [plan] if plan is not None else []
    for u in choices[1:]:
        try:
            plans.append(plan_at(u))
        except HypuraError as e:
            error = e
    if not plans:
        raise error
    return min(plans, key=lambda p: (turn_seconds(p.prediction), -p.n_ubatch))


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
    if plan.n_ubatch < knobs.N_UBATCH:
        return plan  # a CPU plan paging experts took a smaller one for its staging (within_staging)
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


__all__ = ["experts_per_call", "floor_microbatch", "largest_paying", "long_prompt_s", "outputs_needed", "paged_choices",
           "turn_with_long_prompt", "within_staging"]
