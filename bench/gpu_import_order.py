"""Does the import order of numpy vs our library decide the std::regex crash seen under pytest
on the GPU image? Each case loads MODEL in its own process. Usage: python gpu_import_order.py MODEL"""

import subprocess
import sys

LOAD = "llama_cpp.Llama(M, n_gpu_layers=2, n_ctx=256, verbose=False)"
CASES = {
    "numpy-first": "import numpy; import hypura, llama_cpp; " + LOAD,
    "library-first": "import hypura, llama_cpp; import numpy; " + LOAD,
    "cffi-first": "import hypura; from hypura.bindings.ffi import lib; lib(); import numpy, llama_cpp; " + LOAD,
}
for name, code in CASES.items():
    r = subprocess.run([sys.executable, "-c", f"M={sys.argv[1]!r}\n{code}\nprint('LOADED')"],
                       capture_output=True, text=True, timeout=120)
    print(f"=== {name}: rc={r.returncode} loaded={'LOADED' in r.stdout}", flush=True)
