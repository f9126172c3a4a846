"""Request bodies: parsed as JSON objects, and their fields read with a type and a range.

Every problem is a 400 naming the field and what was expected; a JSON `null` reads as absent, as both
APIs' clients send unset fields as null. Unknown fields are ignored, as Ollama and OpenAI ignore them.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any, Optional

from starlette.requests import Request

from hypura.serve.http.errors import bad_request

_MISSING = object()


MAX_DEPTH = 64  # nesting of a request body; tools' JSON schemas stay far below
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff: only escapes make lone surrogates


async def json_body(request: Request) -> dict:
    """The body as a JSON object (the body-size bound is enforced below, by the middleware), of text that
    is valid Unicode and nested at most MAX_DEPTH deep."""
    raw = await request.body()
    if not raw.strip():
        raise bad_request("the request body is empty: want a JSON object")
    return await asyncio.to_thread(_parsed, raw)  # up to 8 MiB of JSON: a second of work, off the loop


def _parsed(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request(f"the request body is nested too deeply (at most {MAX_DEPTH} levels)") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise bad_request(f"the request body has a number out of range: {str(e)[:100]}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body is a JSON {type(body).__name__}: want an object")
    _check_values(body, strings=_SURROGATE_ESCAPE.search(raw) is not None)
    return body


def _check_values(body: dict, strings: bool) -> None:
    """Refuse what JSON allows but nothing downstream can use: nesting deeper than MAX_DEPTH and (`strings`:
    the body escapes a surrogate) lone surrogates ("\\ud800", which UTF-8 cannot encode). Iterative."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise bad_request(f"the request body is nested too deeply (at most {MAX_DEPTH} levels)")
        if isinstance(value, dict):
            stack += [(v, depth + 1) for v in value.values() if strings or isinstance(v, (dict, list))]
            stack += [(k, depth) for k in value] if strings else []
        elif isinstance(value, list):
            stack += [(v, depth + 1) for v in value if strings or isinstance(v, (dict, list))]
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise bad_request("the request body has a lone surrogate (\\ud800-\\udfff without its pair): "
                                  "text must be valid Unicode") from None


def _get(body: dict, key: str, default: Any) -> Any:
    value = body.get(key, _MISSING)
    return default if value is _MISSING or value is None else value


def string(body: dict, key: str, default: Optional[str] = None, required: bool = False) -> Optional[str]:
    value = _get(body, key, default)
    if required and value is None:
        raise bad_request(f"'{key}' is required")
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{key}' must be a string, not {_kind(value)}")
    return value


def boolean(body: dict, key: str, default: bool) -> bool:
    value = _get(body, key, default)
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be true or false, not {_kind(value)}")
    return value


def integer(body: dict, key: str, default: Optional[int], lo: Optional[int] = None, hi: Optional[int] = None,
            ) -> Optional[int]:
    value = _get(body, key, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON clients write 64 as 64.0 now and then
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer, not {_kind(value)}")
    _in_range(key, value, lo, hi)
    return value


def number(body: dict, key: str, default: Optional[float], lo: Optional[float] = None, hi: Optional[float] = None,
           ) -> Optional[float]:
    value = _get(body, key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{key}' must be a finite number, not {_kind(value)}")
    _in_range(key, value, lo, hi)
    return float(value)


def strings(body: dict, key: str, max_items: int) -> tuple[str, ...]:
    """A string or a list of strings (stop sequences), empty strings dropped."""
    value = _get(body, key, ())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{key}' must be a string or a list of strings")
    value = tuple(v for v in value if v)
    if len(value) > max_items:
        raise bad_request(f"'{key}' has {len(value)} entries (at most {max_items})")
    return value


def mapping(body: dict, key: str) -> dict:
    value = _get(body, key, {})
    if not isinstance(value, dict):
        raise bad_request(f"'{key}' must be a JSON object, not {_kind(value)}")
    return value


def _in_range(key: str, value, lo, hi) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        want = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"{lo} .. {hi}"
        raise bad_request(f"'{key}' is {value} (want {want})")


def _kind(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list",
             dict: "an object"}
    return names.get(type(value), type(value).__name__)
