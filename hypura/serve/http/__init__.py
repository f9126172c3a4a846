"""What every route of the server stands on.

    guard.py        ASGI layer: Host, Origin and CORS, API key, body bound and deadline, 503 while loading,
                    request counts
    origins.py      the Host allow-list, the Origin check and CORS
    lifecycle.py    shutdown ending streams, prompt work on threads of its own, the header deadline
    streaming.py    NDJSON / SSE responses and waits that cancel the request when the client leaves
    metrics.py      Prometheus text of engine.metrics()
    request_log.py  one log line per request, and the per-request figures of /metrics
    fields.py       request fields with types and ranges
    errors.py       error bodies in the shape of the API called
"""
