"""JSON schemas as llama.cpp grammars (GBNF), through llama-cpp-python's converter (llama_cpp.llama_grammar,
a port of llama.cpp's json_schema_to_grammar): what structured outputs and forced tool calls sample with.

The converter ignores integer bounds (`minimum`, `maximum` and their exclusive forms, pydantic's ge/le):
integers with bounds get a rule of their own here (`_int_range`, digit by digit as llama.cpp's converter
does), so a sampled number lies within them. A schema the converter cannot take (an unknown type, a remote
$ref, a bad pattern) is a 400 naming the request field; the engine then checks that the GBNF parses before the request is queued.
"""

from __future__ import annotations

import json
import math
from typing import Optional

from llama_cpp.llama_grammar import BuiltinRule, SchemaConverter

from hypura.serve.http.errors import bad_request

ANY_OBJECT = {"type": "object"}  # JSON mode: any object (OpenAI's json_object, Ollama's "json")


MAX_DIGITS = 16  # an unbounded side of an integer: up to this many digits (past 2^53, JSON's exact integers)
# a string's character as llama.cpp's converter writes it: the port lets control characters in, which JSON
# forbids raw (sampled replies held newlines inside strings, and did not parse)
CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


class _Converter(SchemaConverter):
    def _add_primitive(self, name, rule):
        return super()._add_primitive(name, BuiltinRule(CHAR, rule.deps) if name == "char" else rule)

    def visit(self, schema, name):
        if isinstance(schema, dict) and schema.get("type") == "integer" and _bounds(schema) != (None, None):
            lo, hi = _bounds(schema)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"integer bounds {lo} > {hi}: no integer satisfies them")
            return self._add_rule(f"{name or 'root'}-int" if name else "root", f"({_int_range(lo, hi)}) space")
        return super().visit(schema, name)


def _bounds(schema: dict) -> tuple:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if isinstance(schema.get("exclusiveMinimum"), (int, float)) and not isinstance(schema["exclusiveMinimum"], bool):
        lo = math.floor(schema["exclusiveMinimum"]) + 1
    if isinstance(schema.get("exclusiveMaximum"), (int, float)) and not isinstance(schema["exclusiveMaximum"], bool):
        hi = math.ceil(schema["exclusiveMaximum"]) - 1
    return (None if lo is None else math.ceil(lo)), (None if hi is None else math.floor(hi))


def _int_range(lo: Optional[int], hi: Optional[int]) -> str:
    """GBNF alternatives for the integers lo..hi (None: unbounded, up to MAX_DIGITS digits)."""
    parts = []
    if lo is None or lo < 0:  # the negative side: "-" and the magnitudes
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= 0 else -hi
        parts.append(f'"-" ({_natural(bottom, top)})')
    if hi is None or hi >= 0:
        parts.append(_natural(max(lo or 0, 0), hi))
    return " | ".join(parts)


def _natural(lo: int, hi: Optional[int]) -> str:
    """lo..hi (lo >= 0) in decimal without leading zeros: one alternative per digit count."""
    alts, digits = [], len(str(lo))
    while hi is None or 10 ** (digits - 1) <= hi:
        if digits > MAX_DIGITS:
            break
        first = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        last = 10 ** digits - 1 if hi is None else min(hi, 10 ** digits - 1)
        alts.append(_same_length(str(first), str(last)))
        digits += 1
    return " | ".join(alts)


def _same_length(a: str, b: str) -> str:
    """The numbers a..b of equal length, digit by digit."""
    if a == b:
        return f'"{a}"'
    if len(a) == 1:
        return f"[{a}-{b}]"
    if a[0] == b[0]:
        return f'"{a[0]}" ({_same_length(a[1:], b[1:])})'
    rest, alts = len(a) - 1, []
    alts.append(f'"{a[0]}" ({_same_length(a[1:], "9" * rest)})')
    if int(b[0]) - int(a[0]) > 1:
        alts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + " [0-9]" * rest)
    alts.append(f'"{b[0]}" ({_same_length("0" * rest, b[1:])})')
    return " | ".join(alts)


def _converter() -> SchemaConverter:
    return _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def schema_rules(schema, field: str, rule: str = "root") -> str:
    """GBNF rules for `schema` whose start rule is `rule` (other rules may be added around it)."""
    if not isinstance(schema, dict):
        raise bad_request(f"'{field}' must be a JSON schema (an object)")
    try:
        json.dumps(schema)
        converter = _converter()
        # the converter names its start rule "root" for the name "" (and "root-" for "root")
        converter.visit(converter.resolve_refs(schema, "request"), "" if rule == "root" else rule)
        return converter.format_grammar()
    except Exception as e:  # the converter raises whatever its input provokes: the schema is at fault
        raise bad_request(f"'{field}' is not a JSON schema this server can follow: "
                          f"{type(e).__name__}: {_one_line(e)}") from None


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


def response_format_grammar(response_format) -> Optional[str]:
    """OpenAI's response_format: text (None), json_object, or json_schema {name, schema, strict}."""
    if response_format in (None, {}):
        return None
    if not isinstance(response_format, dict):
        raise bad_request("'response_format' must be an object like {\"type\": \"json_object\"}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_rules(ANY_OBJECT, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request("'response_format.json_schema' must be an object with a 'schema'")
        schema = spec.get("schema", ANY_OBJECT)
        return schema_rules(schema if schema is not None else ANY_OBJECT, "response_format.json_schema.schema")
    raise bad_request(f"'response_format.type' {str(kind)[:50]!r} is not one of text, json_object, json_schema")


def ollama_format_grammar(fmt) -> Optional[str]:
    """Ollama's `format`: "json" or a JSON schema."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return schema_rules(ANY_OBJECT, "format")
    if isinstance(fmt, dict):
        return schema_rules(fmt, "format")
    raise bad_request("'format' must be \"json\" or a JSON schema")
