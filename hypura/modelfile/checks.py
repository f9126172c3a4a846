"""Everything checked about a parsed GGUF header before llama.cpp reads the file, in the order
llama.cpp would meet it: the file's layout (llama-model-loader.cpp), the architecture
(llama-arch.cpp), the type of every known key (keys.py), the hyper-parameters (hparams.py), the
vocabulary (vocab_tables.py) and the tensors (tensors.py). The first problem raises Problem, one line.
"""

from __future__ import annotations

import gguf

from hypura.modelfile.arch_rules import NO_MEMORY
from hypura.modelfile.archs import ARCHITECTURES
from hypura.modelfile.hparams import check_hparams
from hypura.modelfile.keys import KEY_TYPES, PER_LAYER
from hypura.modelfile.metadata import Meta
from hypura.modelfile.problems import Invalid, Name, Problem, shown
from hypura.modelfile.reader import TYPE_NAMES, RawFile, type_name
from hypura.modelfile.tensors import check_block_shapes, check_tensors
from hypura.modelfile.vocab_tables import check_vocab

V = gguf.GGUFValueType


def check_file(raw: RawFile, file_size: int, vocab_only: bool = False) -> None:
    """vocab_only: what llama.cpp reads of a file loaded for its vocabulary alone (llama_model_params.vocab_only:
    the architecture, hyper-parameters and tokenizer; no tensor), such as the vocabulary-only GGUFs it ships."""
    if not vocab_only:
        check_tensors(raw, file_size)
    arch = _architecture(raw, vocab_only)
    meta = Meta(raw, arch)
    _key_types(meta)
    split = meta.scalar("split.count", V.UINT16, 0)
    if split > 1:
        raise Invalid("split.count", split, "1 (Hypura loads models of one file)")
    hp = check_hparams(meta, vocab_only)
    used = meta.find("%s.expert_used_count")
    if used is not None and used.vtype == V.ARRAY:  # Hypura's router hooks and planner take one top-k
        raise Invalid(meta.key("%s.expert_used_count"), type_name(used),
                      "one u32 for every layer (Hypura routes one top-k)")
    n_vocab = check_vocab(meta)
    if not vocab_only:
        check_block_shapes(raw, arch, hp, n_vocab)


def _architecture(raw: RawFile, vocab_only: bool = False) -> str:
    kv = next((kv for kv in raw.kvs if kv.key == "general.architecture"), None)
    if kv is None:
        raise Invalid("general.architecture", Name("missing"), "the model's architecture name")
    if kv.vtype != V.STRING:
        raise Invalid("general.architecture", type_name(kv), "type str")
    if kv.value not in ARCHITECTURES:
        raise Problem(f"unsupported model architecture {shown(kv.value)} "
                      "(general.architecture: expected one the vendored llama.cpp knows)")
    if kv.value in NO_MEMORY and not vocab_only:  # its tokenizer still tokenizes
        raise Problem(f"model architecture {shown(kv.value)} generates no text (general.architecture: llama.cpp "
                      "gives it no KV cache; expected a text-generation model)")
    return kv.value


def _key_types(meta: Meta) -> None:
    """Every key llama.cpp reads, if present, has the type it reads it with."""
    for template, vtype in KEY_TYPES.items():
        kv = meta.find(template)
        if kv is None:
            continue
        if vtype == PER_LAYER:
            if kv.vtype == V.ARRAY:
                continue  # checked against the block count with the hyper-parameters
            vtype = V.UINT32
        if kv.vtype != vtype:
            raise Invalid(meta.key(template), type_name(kv), f"type {TYPE_NAMES[vtype]} (llama.cpp reads it so)")
