"""What both APIs ask of the engine.

    generation.py     prompt tokens, context check, submission (engine errors -> HTTP)
    bridge.py         the asyncio <-> engine-thread protocol (EngineStream)
    mailbox.py        events from engine threads to one asyncio loop, one wake-up per batch
    grammars.py       JSON schemas (structured outputs, forced calls) -> GBNF
    embed_routes.py   /api/embed, /api/embeddings, /v1/embeddings
"""
