"""Where our patched llama.cpp lives, and making llama-cpp-python load that same library.

llama-cpp-python loads `libllama` from $LLAMA_CPP_LIB_PATH when it is first imported, and our
cffi bindings dlopen the same file, so both see one copy of llama.cpp (and of the hook state).
"""

import ctypes
import os
import sys
from pathlib import Path

from hypura.errors import HypuraError

_LIB_NAMES = {"linux": "libllama.so", "darwin": "libllama.dylib", "win32": "llama.dll"}


def _lib_file_name() -> str:
    for prefix, name in _LIB_NAMES.items():
        if sys.platform.startswith(prefix):
            return name
    return "libllama.so"


def lib_dir() -> Path:
    """The folder holding our libllama: $HYPURA_LIB_DIR, else $LLAMA_CPP_LIB_PATH, else the
    folder `./build.sh` recorded in the venv (`<venv>/hypura-lib`)."""
    for var in ("HYPURA_LIB_DIR", "LLAMA_CPP_LIB_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    recorded = Path(sys.prefix) / "hypura-lib"
    if recorded.is_file():
        return Path(recorded.read_text().strip())
    raise HypuraError(
        "Hypura's llama.cpp library is not built: run ./build.sh (or set HYPURA_LIB_DIR)"
    )


def lib_path() -> Path:
    path = lib_dir() / _lib_file_name()
    if not path.is_file():
        raise HypuraError(f"{path} not found: run ./build.sh (or set HYPURA_LIB_DIR)")
    return path


def point_llama_cpp_at_our_library() -> Path:
    """Make `import llama_cpp` load our library; fail clearly if it already loaded another."""
    path = lib_path()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(path.parent)
    # ggml-cuda registers host memory (runtime/mapped_weights.py) only where this is set, and reads it at each
    # call: set once, before the library runs, never while another thread may read the environment
    os.environ.setdefault("GGML_CUDA_REGISTER_HOST", "1")
    loaded = sys.modules.get("llama_cpp.llama_cpp")
    if loaded is not None:
        loaded_path = Path(getattr(loaded._lib, "_name", "")).resolve()
        if loaded_path != path.resolve():
            raise HypuraError(
                f"llama_cpp was imported before hypura and loaded {loaded_path}; "
                f"import hypura first (or set LLAMA_CPP_LIB_PATH={path.parent})"
            )
    return path


def preload_our_library() -> None:
    """Point llama_cpp at our library and load it now, when it is built; silent when not
    (`hypura synth`/`inspect` need no library). Loading it before numpy matters: on the GPU
    machine's image, numpy first crashed llama.cpp's std::regex (H200, 2026-12-02)."""
    try:
        path = point_llama_cpp_at_our_library()
    except HypuraError:
        return  # not built, or llama_cpp already loaded another library: lib() says so at first use
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # as llama_cpp will open it
    except OSError:
        pass  # reported with a clear message at first use
