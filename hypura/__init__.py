"""Hypura: run GGUF models larger than GPU memory and RAM, over a patched llama.cpp."""

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
