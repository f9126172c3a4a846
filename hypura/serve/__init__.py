"""`hypura serve`: Ollama's and OpenAI's HTTP APIs over the batched engine (hypura.engine).

From the top down (each folder imports only those below it):

    server.py      bind, uvicorn, -m models loaded on a thread meanwhile (/health 503 -> 200), or the
                   stores' models offered; shutdown
    app.py         the Starlette app: routes, /health, /metrics, errors in each API's shape
    gate.py        ASGI layer: a request's model loaded (on demand) and leased while its answer runs
    ollama/        Ollama's routes (/api/...) and its `options`
    openai/        OpenAI's routes (/v1/...) and the shapes of its tool calls and logprobs
    tools/         a chat's tools, thinking and grammar; call formats per template family; the reply split as
                   it streams; whole replies (n of them sharing the prompt's KV)
    generate/      submission to the engine (prompt tokens, context check, engine errors -> HTTP), the
                   asyncio <-> engine-thread bridge, JSON schemas -> GBNF, embeddings
    models/        the models on offer and those loaded (the registry and its protocol), the room a load
                   makes, what is said about a model, the bounds its vocabulary puts on tokenizing
    settings.py    ServeSettings: the flags, and every bound the server enforces; keep_alive.py its durations
    http/          what every route stands on: the guard (Host, Origin, CORS, API key, bounds), shutdown and
                   deadlines, NDJSON/SSE streams, request fields, error bodies, /metrics' text

The GGUF's chat template renders in hypura.chat_template's bounded sandbox (hypura.Llama's chat completions
too). Needs the `server` extra (Starlette, uvicorn).
"""
