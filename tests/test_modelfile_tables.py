"""hypura.modelfile restates tables of the vendored llama.cpp (product code cannot read vendor/):
the ggml type table against the built library, the architectures, tensor roles and key names
against the vendored source."""

import re
from pathlib import Path

import pytest

from hypura.bindings.ffi import ffi, lib
from hypura.modelfile import arch_rules, archs, keys, tensor_roles
from hypura.modelfile.ggml_types import GGML_TYPE_COUNT, TRAITS, GGMLType
from hypura.modelfile.reader import TYPE_NAMES

VENDOR = Path(__file__).resolve().parents[1] / "vendor" / "llama.cpp"


@pytest.fixture(scope="module")
def llama_arch_cpp() -> str:
    path = VENDOR / "src" / "llama-arch.cpp"
    assert path.is_file(), "vendor/llama.cpp is made by ./build.sh"
    return path.read_text()


def test_ggml_type_table_is_the_librarys():
    L = lib()
    for raw in range(GGML_TYPE_COUNT):
        block, size = L.ggml_blck_size(raw), L.ggml_type_size(raw)
        t = GGMLType(raw) if raw in GGMLType._value2member_map_ else None
        if block == 0:  # removed from ggml: not in the table
            assert t is None, raw
            continue
        assert t is not None, f"type {raw} ({ffi.string(L.ggml_type_name(raw)).decode()}) is missing"
        assert (TRAITS[t].block, TRAITS[t].size, TRAITS[t].name) == \
            (block, size, ffi.string(L.ggml_type_name(raw)).decode()), t


def test_ggml_type_count_is_the_headers():
    header = (VENDOR / "ggml" / "include" / "ggml.h").read_text()
    assert f"GGML_TYPE_COUNT   = {GGML_TYPE_COUNT}," in header


def test_architectures_are_llama_arch_cpps(llama_arch_cpp):
    names = set(re.findall(r'\{\s*LLM_ARCH_\w+,\s*"([^"]+)"\s*\}', llama_arch_cpp)) - {"(unknown)"}
    assert set(archs.ARCHITECTURES) == names


def test_tensor_roles_are_llama_arch_cpps(llama_arch_cpp):
    body = llama_arch_cpp[llama_arch_cpp.index("LLM_TENSOR_NAMES"):]
    names = dict(re.findall(r'\{\s*(LLM_TENSOR_\w+),\s*"([^"]+)"\s*\}', body[:body.index("LLM_TENSOR_INFOS")]))
    ops = dict(re.findall(r'\{\s*(LLM_TENSOR_\w+),\s*\{\s*LLM_TENSOR_LAYER_\w+,\s*(GGML_OP_\w+)\s*\}\s*\}', body))
    roles: dict[str, set] = {}
    for tensor, name in names.items():
        op = ops.get(tensor, "GGML_OP_NONE")
        role = ("matmul" if op in ("GGML_OP_MUL_MAT", "GGML_OP_MUL_MAT_ID", "GGML_OP_GET_ROWS") else
                "elementwise" if op in ("GGML_OP_ADD", "GGML_OP_MUL", "GGML_OP_DIV", "GGML_OP_ROPE", "GGML_OP_SCALE")
                else "other")
        roles.setdefault(name, set()).add(role)
    single = {name: r.pop() if len(r) == 1 else "other" for name, r in roles.items()}
    assert set(tensor_roles.ELEMENTWISE) == {n for n, r in single.items() if r == "elementwise"}
    assert set(tensor_roles.MATMUL) == {n for n, r in single.items() if r == "matmul"}
    assert set(tensor_roles.OTHER) == {n for n, r in single.items() if r == "other"}


def test_checked_keys_are_llama_cpps(llama_arch_cpp):
    names = set(re.findall(r'\{\s*LLM_KV_\w+,\s*"([^"]+)"\s*\}', llama_arch_cpp))
    assert set(keys.KEY_TYPES) <= names
    assert all(t == keys.PER_LAYER or t in TYPE_NAMES for t in keys.KEY_TYPES.values())


def _class_sources(llama_arch_cpp: str) -> dict[str, str]:
    """Architecture name -> the source of its model class (src/models/*.cpp), as llama_model_mapping maps them."""
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', llama_arch_cpp))
    factory = (VENDOR / "src" / "llama-model.cpp").read_text()
    classes = {arch: cls for cases, cls in re.findall(r'((?:case LLM_ARCH_\w+:\s*)+)return new (llama_model_\w+)\(',
                                                       factory) for arch in re.findall(r"LLM_ARCH_\w+", cases)}
    sources: dict[str, list[str]] = {}
    for f in sorted((VENDOR / "src" / "models").glob("*.cpp")):
        text = f.read_text()
        for cls in set(re.findall(r"(llama_model_\w+)::", text)):
            sources.setdefault(cls, []).append(text)
    return {names[arch]: "".join(sources.get(cls, [])) for arch, cls in classes.items()}


def test_architecture_rules_are_their_sources(llama_arch_cpp):
    sources = _class_sources(llama_arch_cpp)
    rot = {a for a, src in sources.items() if "GGML_ASSERT(n_embd_head == n_rot);" in src}
    head_k = {a for a, src in sources.items() if "GGML_ASSERT(n_embd_head == hparams.n_embd_head_k());" in src}
    assert arch_rules.ROT_IS_HEAD == rot
    assert arch_rules.HEAD_K_IS_V == head_k - rot
    experts = re.compile(r"GGML_ASSERT\(\s*(?:hparams\.)?n_expert(?:_used)?(?:\(\))?\s*(?:>\s*0|&&)")
    needs = {a for a, src in sources.items() if experts.search(src)}
    assert arch_rules.NEEDS_EXPERTS | arch_rules.NEEDS_EXPERTS_PAST_DENSE_LEAD == needs - {"lfm2"}  # lfm2: all dense
    factory = (VENDOR / "src" / "llama-model.cpp").read_text()
    create_memory = factory[factory.index("llama_memory_i * llama_model::create_memory"):]
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', llama_arch_cpp))
    no_memory = {names[a] for a in re.findall(r"case (LLM_ARCH_\w+):", create_memory[:create_memory.index("nullptr")])}
    assert arch_rules.NO_MEMORY == no_memory
