"""`hypura serve`: Ollama's and OpenAI's HTTP APIs over the batched engine (hypura.engine).

    settings.py       ServeSettings: the flags, and every bound the server enforces
    server.py         bind, uvicorn, -m models loaded on a thread meanwhile (/health 503 -> 200), or the
                      stores' models offered; shutdown
    app.py            the Starlette app: routes, /health, /metrics, errors in each API's shape
    guard.py          ASGI layer: Host, Origin and CORS (origins.py), API key, body bound and deadline,
                      503 while loading, request counts
    lifecycle.py      shutdown ending streams, prompt work on threads of its own, the header deadline
    gate.py           ASGI layer: a request's model loaded (on demand) and leased while its answer runs
    ollama_routes.py  /, /api/version, /api/tags, /api/ps, /api/show, /api/generate, /api/chat
    ollama_options.py Ollama's `options` -> SamplingParams
    openai_routes.py  /v1/models, /v1/chat/completions, /v1/completions; openai_shapes.py tool calls, logprobs
    embed_routes.py   /api/embed, /api/embeddings, /v1/embeddings
    chat.py           a chat's tools, thinking and grammar: the prompt, and the reply's splitter
    tools/            tool calls: the tools of a request, formats per template family, the reply split as it streams
    grammars.py       JSON schemas (structured outputs, forced calls) -> GBNF
    replies.py        whole replies (n of them sharing the prompt's KV), with thinking, calls and logprobs
    generation.py     prompt tokens, context check, submission (engine errors -> HTTP)
    prompt_tokens.py  tokenizing in bounded time: refused before it when it cannot fit, in pieces, stoppable
    bridge.py         the asyncio <-> engine-thread protocol (EngineStream)
    streaming.py      NDJSON / SSE responses and waits that cancel the request when the client leaves
    registry.py       the models on offer and those loaded (at start, or on demand: its protocol), their names
    room.py           which idle models a load unloads, and the free memory it is planned within
    keep_alive.py     Ollama's keep_alive durations; model_info.py what is said about a model
    metrics.py        Prometheus text of engine.metrics()
    fields.py, errors.py  request fields with types and ranges; error bodies

The GGUF's chat template renders in hypura.chat_template's bounded sandbox (hypura.Llama's chat completions
too). Needs the `server` extra (Starlette, uvicorn).
"""
