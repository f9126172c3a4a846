"""Ollama's API.

    routes.py   /, /api/version, /api/tags, /api/ps, /api/show, /api/generate, /api/chat
    options.py  Ollama's `options` -> SamplingParams
"""
