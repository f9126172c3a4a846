"""Typed reads of metadata as llama.cpp's model loader makes them (src/llama-model-loader.cpp).

`get_key<T>` takes a key only when it is stored with exactly T's GGUF type (GGUFMeta::GKV::get_kv
throws "key X has wrong type" otherwise), and `get_key_or_arr` takes a scalar or an array of one
entry per layer. Reading a key here with the wrong type raises Invalid, naming key, type and the
type expected, before llama.cpp would throw (or Hypura's planner would stumble on it).
"""

from __future__ import annotations

import gguf

from hypura.modelfile.problems import Invalid, Name
from hypura.modelfile.reader import TYPE_NAMES, RawFile, RawKV, type_name

V = gguf.GGUFValueType
# get_arr<std::array<uint32_t, N>> accepts these element types (llama-model-loader.cpp)
_U32_ARRAY_TYPES = (V.UINT32, V.INT32, V.BOOL)


class Meta:
    """The file's metadata by key, with `{arch}.` keys given relative to the architecture."""

    def __init__(self, raw: RawFile, arch: str):
        self.kvs: dict[str, RawKV] = {kv.key: kv for kv in raw.kvs}
        self.arch = arch

    def key(self, name: str) -> str:
        return name.replace("%s", self.arch)

    def find(self, name: str):
        return self.kvs.get(self.key(name))

    def scalar(self, name: str, vtype: gguf.GGUFValueType, default=None, required: bool = False):
        """get_key<T>: the value of a key stored as `vtype`, `default` when absent."""
        kv = self.find(name)
        if kv is None:
            if required:
                raise Invalid(self.key(name), Name("missing"), f"a {TYPE_NAMES[vtype]} value (llama.cpp requires it)")
            return default
        if kv.vtype != vtype:
            raise Invalid(self.key(name), type_name(kv), f"type {TYPE_NAMES[vtype]} (llama.cpp reads it so)")
        return kv.value

    def u32(self, name: str, default=None, required: bool = False):
        return self.scalar(name, V.UINT32, default, required)

    def f32(self, name: str, default=None, required: bool = False):
        return self.scalar(name, V.FLOAT32, default, required)

    def per_layer(self, name: str, n_layer: int, default: int = 0) -> list[int]:
        """get_key_or_arr into std::array<uint32_t, LLAMA_MAX_LAYERS>: one u32 for every layer, or
        an array of exactly n_layer u32/i32/bool entries."""
        kv = self.find(name)
        if kv is None:
            return [default] * n_layer
        if kv.vtype != V.ARRAY:
            return [self.u32(name)] * n_layer
        if kv.count != n_layer:
            raise Invalid(self.key(name), type_name(kv), f"one entry per layer ({n_layer})")
        if kv.sub_type not in _U32_ARRAY_TYPES:
            raise Invalid(self.key(name), type_name(kv), "an array of u32, i32 or bool")
        values = [int(v) & 0xFFFFFFFF for v in kv.items]  # copied into uint32_t
        return values
