"""`hypura synth`: random-weight GGUFs with real models' shapes, for tests and benchmarks.

shapes.py (model hyperparameters) -> layout.py (tensors of a shape) -> quant_mix.py (ggml type
of each, as llama.cpp's quantizer picks it) -> writer.py (header + streamed data, from
blocks.py's random block pools and tokenizer.py's vocabulary); command.py is the CLI.
"""

from hypura.synth.writer import SynthResult, plan, write_synth

__all__ = ["SynthResult", "plan", "write_synth"]
