"""What every route of the server stands on.

    guard.py      ASGI layer: Host, Origin and CORS (origins.py), API key, body bound and deadline,
                  503 while loading, request counts
    lifecycle.py  shutdown ending streams, prompt work on threads of its own, the header deadline
    streaming.py  NDJSON / SSE responses and waits that cancel the request when the client leaves
    metrics.py    Prometheus text of engine.metrics()
    fields.py, errors.py  request fields with types and ranges; error bodies
"""
