"""GGUF model files: the header read and checked in Python before llama.cpp reads the file.

read_header(path) parses the header as ggml does and checks it against the conditions llama.cpp's
loader asserts on; a bad file raises hypura.errors.ModelFileError with one line naming the field,
its value and what was expected. writer.py writes a header back (header_bytes): the synthetic models and
the profile's slice of a model's first blocks.
"""

from hypura.modelfile.header import KV, ModelHeader, TensorEntry, read_header, read_kv
from hypura.modelfile.reader import STRUCT_CODES

__all__ = ["KV", "ModelHeader", "TensorEntry", "STRUCT_CODES", "read_header", "read_kv"]
