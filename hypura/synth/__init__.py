"""`hypura synth`: random-weight GGUFs with real models' shapes, for tests and benchmarks.

shapes.py (model hyperparameters) -> layout.py (tensors of a shape) -> quant_mix.py (ggml type
of each, as llama.cpp's quantizer picks it) -> writer.py (header + streamed data, from
blocks.py's random block pools and tokenizer.py's vocabulary); command.py is the CLI.

    shapes.py     real models' hyperparameters, and tiny shapes for tests
    layout.py     a shape's tensors in llama-quantize's order
    quant_mix.py  each tensor's ggml type, as llama.cpp's quantizer picks it
    blocks.py     random but valid quant blocks, from pools per type
    tokenizer.py  the tokenizer metadata, resized to the shape's vocabulary
    routing.py    router weights for a set expert popularity and cross-layer correlation
    writer.py     the header and streamed data of a synthetic GGUF
    draft.py      `--draft-for`: a draft for a target, agreeing with it at a set rate
    command.py    `hypura synth`
"""

from hypura.synth.writer import SynthResult, plan, write_synth

__all__ = ["SynthResult", "plan", "write_synth"]
