"""Hypura: run GGUF models larger than GPU memory and RAM, over a patched llama.cpp."""

__version__ = "0.1.0"

__all__ = ["Llama", "__version__"]

from hypura.bindings.library import preload_our_library

preload_our_library()  # `import llama_cpp` after `import hypura` gets our library; before numpy


def __getattr__(name: str):
    # imported lazily: `hypura synth` and `hypura inspect` need no llama.cpp library
    if name == "Llama":
        from hypura.llama import Llama

        return Llama
    raise AttributeError(f"module 'hypura' has no attribute {name!r}")
