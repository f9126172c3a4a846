"""ggml's tensor types as the vendored llama.cpp defines them, restated for Python.

Product code cannot read vendor/ at run time, so the table is copied from ggml/include/ggml.h
(enum ggml_type) and ggml/src/ggml.c (type_traits: block size, bytes per block);
tests/test_modelfile_tables.py compares it with the built library. The `gguf` package has its own
list, which lags the vendored ggml (it lacks GGML_TYPE_Q2_0 = 42): it is not used here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Optional

GGML_TYPE_COUNT = 43  # ggml.h: GGML_TYPE_COUNT; gguf.cpp rejects a tensor type >= this


class GGMLType(IntEnum):
    """ggml.h enum ggml_type; the numbers ggml removed (4, 5, 31-33, 36-38) are absent."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeTraits:
    name: str  # ggml_type_name
    block: int  # elements per block (ggml_blck_size)
    size: int  # bytes per block (ggml_type_size)


# ggml.c type_traits[]: (type_name, blck_size, type_size)
TRAITS: dict[GGMLType, TypeTraits] = {
    GGMLType.F32: TypeTraits("f32", 1, 4),
    GGMLType.F16: TypeTraits("f16", 1, 2),
    GGMLType.Q4_0: TypeTraits("q4_0", 32, 18),
    GGMLType.Q4_1: TypeTraits("q4_1", 32, 20),
    GGMLType.Q5_0: TypeTraits("q5_0", 32, 22),
    GGMLType.Q5_1: TypeTraits("q5_1", 32, 24),
    GGMLType.Q8_0: TypeTraits("q8_0", 32, 34),
    GGMLType.Q8_1: TypeTraits("q8_1", 32, 36),
    GGMLType.Q2_K: TypeTraits("q2_K", 256, 84),
    GGMLType.Q3_K: TypeTraits("q3_K", 256, 110),
    GGMLType.Q4_K: TypeTraits("q4_K", 256, 144),
    GGMLType.Q5_K: TypeTraits("q5_K", 256, 176),
    GGMLType.Q6_K: TypeTraits("q6_K", 256, 210),
    GGMLType.Q8_K: TypeTraits("q8_K", 256, 292),
    GGMLType.IQ2_XXS: TypeTraits("iq2_xxs", 256, 66),
    GGMLType.IQ2_XS: TypeTraits("iq2_xs", 256, 74),
    GGMLType.IQ3_XXS: TypeTraits("iq3_xxs", 256, 98),
    GGMLType.IQ1_S: TypeTraits("iq1_s", 256, 50),
    GGMLType.IQ4_NL: TypeTraits("iq4_nl", 32, 18),
    GGMLType.IQ3_S: TypeTraits("iq3_s", 256, 110),
    GGMLType.IQ2_S: TypeTraits("iq2_s", 256, 82),
    GGMLType.IQ4_XS: TypeTraits("iq4_xs", 256, 136),
    GGMLType.I8: TypeTraits("i8", 1, 1),
    GGMLType.I16: TypeTraits("i16", 1, 2),
    GGMLType.I32: TypeTraits("i32", 1, 4),
    GGMLType.I64: TypeTraits("i64", 1, 8),
    GGMLType.F64: TypeTraits("f64", 1, 8),
    GGMLType.IQ1_M: TypeTraits("iq1_m", 256, 56),
    GGMLType.BF16: TypeTraits("bf16", 1, 2),
    GGMLType.TQ1_0: TypeTraits("tq1_0", 256, 54),
    GGMLType.TQ2_0: TypeTraits("tq2_0", 256, 66),
    GGMLType.MXFP4: TypeTraits("mxfp4", 32, 17),
    GGMLType.NVFP4: TypeTraits("nvfp4", 64, 36),
    GGMLType.Q1_0: TypeTraits("q1_0", 128, 18),
    GGMLType.Q2_0: TypeTraits("q2_0", 64, 18),
}

# Types a weight may have where llama.cpp multiplies by it or gathers rows of it (MUL_MAT,
# MUL_MAT_ID, GET_ROWS): those with a CPU dot product (ggml-cpu.c type_traits_cpu[].vec_dot).
# Q8_1 and Q8_K are activation formats without one, and the integer types and F64 have none:
# a matrix of those segfaults in the CPU's matmul.
MATMUL_TYPES = frozenset(set(TRAITS) - {GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.I8, GGMLType.I16, GGMLType.I32,
                                        GGMLType.I64, GGMLType.F64})

# Element-wise weights (norms, biases, scales: MUL, ADD, DIV, ROPE factors) combine with F32
# activations; ggml-cpu's binary_op supports only an F32 second operand then, and aborts otherwise.
ELEMENTWISE_TYPES = frozenset({GGMLType.F32})


def ggml_type(raw: int) -> Optional[GGMLType]:
    """The type numbered `raw`, None where the vendored ggml has none (out of range or removed)."""
    try:
        return GGMLType(raw)
    except ValueError:
        return None
