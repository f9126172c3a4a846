"""Who may touch what, read from the source: llama-cpp-python's private state is written in hypura/llama.py only
(the adapter), llama.cpp's KV-cache calls live in the loaded model's context wrapper only, and speculation never
imports what loads models or the adapter above it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hypura"
ADAPTER = PACKAGE / "llama.py"
CONTEXT = PACKAGE / "loaded" / "context.py"
# llama_cpp.Llama's private attributes (its constructor's), which only the adapter fills
PRIVATE = {"_model", "_ctx", "_batch", "_candidates", "_sampler", "_chat_handlers", "_logits_all", "_requires_eval",
           "_n_vocab", "_n_ctx", "_token_nl", "_token_eos", "_seed", "_mirostat_mu", "_lora_adapter", "_is_recurrent",
           "_is_hybrid"}
STATE = {"input_ids", "scores", "_requires_eval"}  # generation state a pass of their loop reads


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _imports(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_the_private_names_of_llama_cpp_python_appear_in_the_adapter_only():
    found = []
    for path, tree in _sources():
        if path == ADAPTER:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or (isinstance(node.value, ast.Name) and node.value.id == "self"):
                continue  # a class's own attribute of the same name (the engine's _batch) is its own
            if node.attr in PRIVATE or (node.attr in STATE and isinstance(node.ctx, ast.Store)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert found == []
    assert {"_model", "_ctx", "_batch", "_requires_eval"} <= {  # the scan sees the adapter's
        n.attr for n in ast.walk(ast.parse(ADAPTER.read_text())) if isinstance(n, ast.Attribute)}


def test_llama_memory_calls_live_in_the_context_wrapper_only():
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            if (name.startswith("llama_memory_") or name == "llama_get_memory") and path != CONTEXT:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert found == []
    assert "llama_memory_seq_rm" in CONTEXT.read_text()


def test_nothing_below_the_adapter_imports_it_and_speculation_loads_nothing():
    above = {"hypura.llama", "hypura.llama_speculative", "hypura.Llama"}
    allowed = {PACKAGE / "__init__.py", ADAPTER, PACKAGE / "llama_speculative.py", PACKAGE / "integrations" / "langchain.py"}
    found = [f"{path.relative_to(PACKAGE)}: {sorted(_imports(tree) & above)}" for path, tree in _sources()
             if path not in allowed and _imports(tree) & above]
    assert found == []
    for path, tree in _sources():
        if path.parent.name == "speculative":
            assert not {m for m in _imports(tree) if m.startswith(("hypura.loaded", "hypura.llama", "hypura.engine"))}, path
