"""JSON schemas as llama.cpp grammars (GBNF), through llama-cpp-python's converter (llama_cpp.llama_grammar,
a port of llama.cpp's json_schema_to_grammar): what structured outputs and forced tool calls sample with.

A schema the converter cannot take (an unknown type, a remote $ref, a bad pattern) is a 400 naming the
request field; the engine then checks that the GBNF parses before the request is queued.
"""

from __future__ import annotations

import json
from typing import Optional

from llama_cpp.llama_grammar import SchemaConverter

from hypura.serve.errors import bad_request

ANY_OBJECT = {"type": "object"}  # JSON mode: any object (OpenAI's json_object, Ollama's "json")


def _converter() -> SchemaConverter:
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


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
