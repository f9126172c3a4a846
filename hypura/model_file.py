"""Moved to hypura.modelfile; this module re-exports its names."""

from hypura.modelfile import KV, STRUCT_CODES, ModelHeader, TensorEntry, read_header, read_kv  # noqa: F401
