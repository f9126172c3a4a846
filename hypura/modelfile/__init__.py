"""GGUF model files: the header read and checked in Python before llama.cpp reads the file.

read_header(path) parses the header as ggml does and checks it against the conditions llama.cpp's
loader asserts on; a bad file raises hypura.errors.ModelFileError with one line naming the field,
its value and what was expected.

    header.py        read_header -> ModelHeader: parsed, checked, cached per (path, size, mtime)
    reader.py        the header parsed exactly as ggml's gguf.cpp reads it
    checks.py        every check, in the order llama.cpp would meet it
    metadata.py      typed key reads as llama.cpp's model loader makes them
    keys.py          the GGUF type llama.cpp reads each known key with
    archs.py         the architectures the vendored llama.cpp loads
    arch_rules.py    what some architectures' own code asserts on
    hparams.py       hyper-parameters checked as load_hparams asserts on them
    vocab_tables.py  tokenizer tables checked as llama_vocab's load reads them
    tensors.py       each tensor's type, bytes and shape checked
    tensor_roles.py  what llama.cpp does with each tensor, by name: the op, so the types it may have
    ggml_types.py    ggml's tensor types: block size and bytes per block
    problems.py      one-line problem reports, the file's values shown printable and bounded
    writer.py        header bytes written back fast: the synthetic models, the profile's slice of a model
"""

from hypura.modelfile.header import KV, ModelHeader, TensorEntry, read_header, read_kv, read_vocab
from hypura.modelfile.reader import STRUCT_CODES

__all__ = ["KV", "ModelHeader", "TensorEntry", "STRUCT_CODES", "read_header", "read_kv", "read_vocab"]
