"""`hypura serve`: Ollama's and OpenAI's HTTP APIs over the batched engine (hypura.engine).

    settings.py       ServeSettings: the flags, and every bound the server enforces
    server.py         bind, uvicorn, models loaded on a thread meanwhile (/health 503 -> 200), shutdown
    app.py            the Starlette app: routes, /health, /metrics, errors in each API's shape
    guard.py          ASGI layer: API key, body size bound, 503 while loading, request counts
    ollama_routes.py  /, /api/version, /api/tags, /api/ps, /api/show, /api/generate, /api/chat
    ollama_options.py Ollama's `options` -> SamplingParams
    openai_routes.py  /v1/models, /v1/chat/completions, /v1/completions; openai_shapes.py tool calls, logprobs
    embed_routes.py   /api/embed, /api/embeddings, /v1/embeddings
    chat.py           a chat's tools, thinking and grammar: the prompt, and the reply's splitter
    tools/            tool calls: the tools of a request, formats per template family, the reply split as it streams
    grammars.py       JSON schemas (structured outputs, forced calls) -> GBNF
    replies.py        whole replies (n of them sharing the prompt's KV), with thinking, calls and logprobs
    generation.py     prompt tokens, context check, submission (engine errors -> HTTP)
    bridge.py         the asyncio <-> engine-thread protocol (EngineStream)
    streaming.py      NDJSON / SSE responses and waits that cancel the request when the client leaves
    registry.py       the models loaded at start and their names; model_info.py what is said about them
    chat_template.py  the GGUF's Jinja chat template, rendered in a bounded sandbox
    metrics.py        Prometheus text of engine.metrics()
    fields.py, errors.py  request fields with types and ranges; error bodies

Needs the `server` extra (Starlette, uvicorn); chat_template.py needs only jinja2 (llama-cpp-python's).
"""
