"""common/speculative.cpp's side of `hypura-cli`: the speculative decoding flags, spelled as the vendored
llama.cpp spells them (common/arg.cpp): -md/--spec-draft-model, --spec-type, --spec-draft-n-max/-n-min/-p-min/
-p-split and the ngram-simple sizes, plus --spec-tree (the speculative example's -np); no -md and no
--spec-type: no speculation. And the SpecDecoder the loop runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from hypura.cli.completion.arg_values import stof, stoi, value_error
from hypura.errors import HypuraError
from hypura.speculative.auto_draft import AUTO, AutoDraft
from hypura.speculative.settings import SPEC_TYPES, SpecSettings

SPEC_OPTIONS = [
    (("-md", "--spec-draft-model", "--model-draft", "spec_draft_model"),
     dict(metavar="FNAME|auto", help="draft model for speculative decoding (same vocabulary as -m); auto: one found "
                                     "in the stores (`hypura list`), kept where the plan predicts a gain",
          envvar="LLAMA_ARG_SPEC_DRAFT_MODEL")),
    (("--spec-type", "spec_type"),
     dict(metavar="|".join(SPEC_TYPES) + "|none",
          help="speculative decoding type (default: draft-simple with -md, else auto: ngram-simple where the plan "
               "streams weights, a pass costing about the same whatever it carries; none: off)")),
    (("--spec-draft-n-max", "spec_draft_n_max"),
     dict(metavar="N", help="most tokens to draft a pass; Hypura picks the length up to N from pass costs "
                            f"(default: {SpecSettings.n_max})")),
    (("--spec-draft-n-min", "spec_draft_n_min"), dict(metavar="N", help="fewest tokens to draft (default: 0)")),
    (("--spec-draft-p-min", "--draft-p-min", "spec_draft_p_min"),
     dict(metavar="P", help="draft model: stop drafting below this probability (default: 0.00)")),
    (("--spec-tree", "spec_tree"),
     dict(metavar="N", help="draft model: verify a tree of up to N branches in one pass (llama.cpp's speculative "
                            "example: -np N); the node budget, up to N x --spec-draft-n-max, follows pass costs "
                            "(default: 0, a chain)")),
    (("--spec-draft-p-split", "--draft-p-split", "spec_draft_p_split"),
     dict(metavar="P", help=f"--spec-tree: a lower draft candidate opens a branch above this probability "
                            f"(default: {SpecSettings.p_split:.2f})")),
    (("--spec-pass-ms", "spec_pass_ms"),
     dict(metavar="N:MS,...", help="verification pass costs by tokens carried, measured beforehand "
                                   "(`hypura bench -p 1,2,4,...`'s ms a pass); without them the first passes measure")),
    (("--spec-ngram-simple-size-n", "spec_ngram_n"),
     dict(metavar="N", help=f"ngram-simple: length of the looked-up n-gram (default: {SpecSettings.ngram_size_n})")),
    (("--spec-ngram-simple-size-m", "spec_ngram_m"),
     dict(metavar="N", help=f"ngram-simple: longest draft m-gram (default: {SpecSettings.ngram_size_m})")),
]

_INTS = (("spec_draft_n_max", "n_max", "--spec-draft-n-max"), ("spec_draft_n_min", "n_min", "--spec-draft-n-min"),
         ("spec_ngram_n", "ngram_size_n", "--spec-ngram-simple-size-n"),
         ("spec_ngram_m", "ngram_size_m", "--spec-ngram-simple-size-m"), ("spec_tree", "tree", "--spec-tree"))
_FLOATS = (("spec_draft_p_min", "p_min", "--spec-draft-p-min"),
           ("spec_draft_p_split", "p_split", "--spec-draft-p-split"))


def spec_settings(kw: dict, default: Optional[SpecSettings] = None) -> Optional[SpecSettings]:
    """The --spec-* flags (popped from kw) as SpecSettings; without -md or --spec-type, `default` (the other flags
    over it); --spec-type none: None (off)."""
    model, kind = kw.pop("spec_draft_model"), kw.pop("spec_type")
    fields: dict = {}
    for key, field, flag, parse in [(*x, stoi) for x in _INTS] + [(*x, stof) for x in _FLOATS]:
        value = kw.pop(key)
        if value is not None:
            try:
                fields[field] = parse(value)
            except ValueError as e:
                raise value_error(flag, str(e)) from None
    pass_ms = kw.pop("spec_pass_ms")
    if pass_ms is not None:
        try:
            fields["pass_ms"] = tuple((stoi(n), stof(ms)) for n, ms in (x.split(":") for x in pass_ms.split(",")))
        except ValueError:
            raise value_error("--spec-pass-ms", f"expected N:MS[,N:MS...], not '{pass_ms}'") from None
    if kind == "none" or (model is None and kind is None and default is None):
        return None
    if model is None and kind is None:
        return dataclasses.replace(default, **fields)
    search = model == AUTO and not Path(model).is_file()  # -md auto: a draft found in the stores
    if model is not None and not search and not Path(model).is_file():
        raise value_error("-md", f"error: failed to open file '{model}'")
    draft = AutoDraft(getattr(default.draft_model, "models_dir", None) if default else None) if search else \
        Path(model) if model else None
    try:
        return SpecSettings(type=kind or (AUTO if search else "draft-simple"), draft_model=draft, **fields)
    except HypuraError as e:
        raise value_error("--spec-tree" if "--spec-tree" in str(e) else "--spec-type" if kind else "-md",
                          str(e)) from None


def speculation(s: SpecSettings, llm, vocab, sampler, interactive: bool, con):
    """The SpecDecoder hypura-cli's loop runs, or None in interactive mode (a turn may end mid-pass)."""
    import llama_cpp

    from hypura.speculative.loop import SpecDecoder
    from hypura.loaded.drafts import make_verifier

    if interactive:
        con.wrn("speculative decoding is off in interactive mode: one-shot runs (-no-cnv, or -st with -p) use it\n")
        return None
    # the draft's threads are the target's, as llama.cpp's -td/-tbd default to -t/-tb
    verifier = make_verifier(s, llm, vocab.is_eog, n_threads=llm.n_threads, n_threads_batch=llm.n_threads_batch)
    con.inf(f"speculative: {s.type}" + (f" with {s.draft_model}" if s.draft_model else "")
            + (f", a tree of up to {s.tree} branches, {s.n_max} deep\n" if s.tree
               else f", up to {s.n_max} drafted tokens a pass\n"))

    def sample(i: int) -> int:  # into the chain now, into the loop's history when the loop takes it
        tok = sampler.sample(llm.ctx, i)
        llama_cpp.llama_sampler_accept(sampler.chain, tok)
        return tok

    return SpecDecoder(verifier, llm.decode_tokens, sample, llama_cpp.llama_n_ctx(llm.ctx))
