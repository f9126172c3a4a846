"""Speculative decoding, `hypura bench --spec-type ... / -md DRAFT`: greedy decode of one sequence from a text
prompt, plain (a token a llama_decode) and speculative (a verification pass a step), r times each: tok/s,
tokens and accepted drafted tokens a pass, pass cost by tokens carried, drafting time, and the bound: the
tokens a pass yields over the pass's bytes at the measured rates (bound.py at the pass's mean size)."""

from __future__ import annotations

from dataclasses import dataclass

from hypura.errors import HypuraError
from hypura.speed.bound import run_bound
from hypura.speed.single import spread

# a prompt that asks for what it holds: n-gram drafters find their matches in it; a draft model's agreement
# with its target does not depend on the text
PROMPT = ("Rewrite the text below, replacing 'GPU' with 'accelerator'. Change nothing else.\n\nHypura runs models "
          "larger than GPU memory: the planner decides where every tensor lives, GPU memory, pinned RAM or disk, and "
          "the weights that do not fit are streamed for every token.\n\nRewritten:\n")


# a top-two logit gap below this is a near-tie that the CPU's kernels decide (one-token decoding and a pass of
# several tokens run other kernels): twice the largest change of a gap between two such paths measured on a
# 2-core x86 VM (0.49, SmolLM2); plain and speculative output are compared up to the plain run's first one
NEAR_TIE = 1.0


def compare_greedy(plain, spec) -> tuple[bool, int]:
    """(spec's tokens equal plain's up to plain's first near-tie, and all of them where it has none; the tokens
    compared)."""
    decided = next((i for i, gap in enumerate(plain.gaps) if gap < NEAR_TIE), len(plain.tokens))
    k = min(decided, len(plain.tokens))
    same = spec.tokens[:k] == plain.tokens[:k] and (k < len(plain.tokens) or spec.tokens == plain.tokens)
    return same, k


@dataclass(frozen=True)
class SpecBenchSettings:
    n_gen: int = 128
    repeats: int = 3
    prompt: str = PROMPT
    plain: bool = True  # False: speculative runs only (a second load mode's, beside a plain run made before)

    def __post_init__(self):
        if self.n_gen < 2 or self.repeats < 1:
            raise HypuraError("bench with speculation: want -n >= 2 (a first token, then passes) and -r >= 1")


def run_spec_bench(llm, plan, spec, s: SpecBenchSettings, say=lambda msg: None, rates=None) -> dict:
    """spec: the hypura.speculative.SpecSettings to verify with; rates: the machine's, for a bound without a plan."""
    from hypura.loaded.drafts import make_verifier
    from hypura.speculative.generate import greedy
    from hypura.speculative.verify import SpecStats

    tokens = llm.vocab.tokenize(s.prompt.encode(), True, False)
    if len(tokens) + s.n_gen > llm.n_ctx():
        raise HypuraError(f"the prompt ({len(tokens)} tokens) and -n {s.n_gen} do not fit the context {llm.n_ctx()}")
    say("warm-up ...")
    greedy(llm, tokens, 2)
    plain, fast, stats = [], [], []
    verifier = make_verifier(spec, llm, llm.vocab.is_eog, n_threads=llm.n_threads, n_threads_batch=llm.n_threads_batch)
    try:
        for i in range(s.repeats):
            say(f"run {i + 1}/{s.repeats}: {'plain, then ' if s.plain else ''}speculative ...")
            if s.plain:
                plain.append(greedy(llm, tokens, s.n_gen))
            verifier.stats = SpecStats()  # each run's own passes
            fast.append(greedy(llm, tokens, s.n_gen, verifier))
            stats.append(verifier.stats.summary())
    finally:
        verifier.close()
    last = stats[-1]
    result = {
        "settings": {"n_gen": s.n_gen, "repeats": s.repeats, "n_prompt": len(tokens), "n_threads": llm.n_threads,
                     "spec": {"type": spec.type, "draft_model": str(spec.draft_model) if spec.draft_model else None,
                              "n_max": spec.n_max, "n_min": spec.n_min, "tree": spec.tree}},
        "plain_tok_s": spread([r.tok_s for r in plain]),  # {} without plain runs
        "spec_tok_s": spread([r.tok_s for r in fast]),
        "tokens_per_pass": spread([x["tokens_per_pass"] for x in stats]),
        "accepted_per_pass": spread([x["accepted_per_pass"] for x in stats]),
        "drafted_per_pass": spread([x["drafted_per_pass"] for x in stats]),
        "acceptance": spread([x["acceptance"] for x in stats]),
        "pass_ms": spread([x["pass_ms"] for x in stats]),
        "draft_ms": spread([x["draft_ms"] for x in stats]),
        "pass_ms_by_tokens": last["pass_ms_by_tokens"],
        # where the kernels cannot decide it: up to the plain run's first near-tie
        "greedy_identical": all(compare_greedy(a, b)[0] for a, b in zip(plain, fast)) if plain else None,
        "greedy_compared": min(compare_greedy(a, b)[1] for a, b in zip(plain, fast)) if plain else None,
        "draft_on_gpu": llm.decision.beside_on_gpu,
        "tokens": {"plain": plain[-1].tokens if plain else None, "spec": fast[-1].tokens},  # the last runs'
        "plain_gaps": list(plain[-1].gaps) if plain else None,  # its top-two logit gaps (compare_greedy)
    }
    if plain:
        result["speedup"] = result["spec_tok_s"]["median"] / result["plain_tok_s"]["median"]
    carried = max(1, round(last["drafted_per_pass"] + 1))  # the tokens a pass carried, on the whole
    b = run_bound(llm, plan, rates, carried)
    if b is not None:  # a pass of `carried` tokens yields tokens_per_pass of them
        step_s = carried / b["decode_tok_s"]
        result["bound"] = dict(b, pass_tokens=carried, decode_tok_s=result["tokens_per_pass"]["median"] / step_s)
        result["bound_ratio"] = result["spec_tok_s"]["median"] / result["bound"]["decode_tok_s"]
    return result


def spec_report(r: dict) -> list[str]:
    m = lambda key, f: f"{r[key]['median']:{f}} ({r[key]['min']:{f}}-{r[key]['max']:{f}})"  # noqa: E731
    s = r["settings"]["spec"]
    what = (s["type"] + (f" with {s['draft_model']}" if s["draft_model"] else "")
            + (f", tree {s['tree']}" if s["tree"] else ""))
    where = {True: ", the draft on the GPU", False: ", the draft in RAM"}.get(r.get("draft_on_gpu"), "")
    by = ", ".join(f"{n}: {ms:.1f}" for n, ms in r["pass_ms_by_tokens"].items())
    versus = (f"  ({r['speedup']:.2f}x plain; greedy output {'identical' if r['greedy_identical'] else 'DIFFERS'} "
              f"over the {r['greedy_compared']} tokens before the first near-tie)" if r["plain_tok_s"] else "")
    lines = [f"speculative {what}{where}: -n {r['settings']['n_gen']}, median (min-max) of {r['settings']['repeats']}",
             *([f"plain       {m('plain_tok_s', '.2f')} tok/s"] if r["plain_tok_s"] else []),
             f"speculative {m('spec_tok_s', '.2f')} tok/s{versus}",
             f"per pass    {m('tokens_per_pass', '.2f')} tokens, acceptance {m('acceptance', '.2f')}, "
             f"pass {m('pass_ms', '.1f')} ms, drafting {m('draft_ms', '.1f')} ms",
             f"pass ms by tokens carried: {by or 'n/a'}"]
    if r.get("bound"):
        b = r["bound"]
        lines.append(f"bound       {b['decode_tok_s']:9.2f} tok/s  (a pass of {b['pass_tokens']} tokens: "
                     f"{b['limit']}); measured/bound {r['bound_ratio']:.2f}")
    return lines
