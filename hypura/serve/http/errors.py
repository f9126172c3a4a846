"""What a failed request answers: one status and one message, in the shape of the API it called.

Ollama's routes answer `{"error": "message"}` (its docs/api/errors.mdx); OpenAI's (everything under
/v1/) `{"error": {"message", "type", "param", "code"}}`, with the types llama.cpp's server uses. A
stream that already started reports an error as its last chunk instead (routes do that).
"""

from __future__ import annotations

import json
from typing import Optional

from starlette.responses import Response

# status -> OpenAI error type (llama.cpp tools/server: format_error_response)
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error",
                 501: "not_supported_error", 503: "unavailable_error"}


class ApiError(Exception):
    """A request the server refuses or could not serve; `code` is OpenAI's machine-readable reason."""

    def __init__(self, status: int, message: str, code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


def bad_request(message: str, code: Optional[str] = None) -> ApiError:
    return ApiError(400, message, code)


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def error_body(error: ApiError, openai: bool) -> dict:
    if openai:
        return {"error": {"message": error.message, "type": _OPENAI_TYPES.get(error.status, "server_error"),
                          "param": None, "code": error.code}}
    return {"error": error.message}


def error_response(error: ApiError, openai: bool) -> Response:
    return Response(json.dumps(error_body(error, openai)), status_code=error.status, headers=error.headers,
                    media_type="application/json")
