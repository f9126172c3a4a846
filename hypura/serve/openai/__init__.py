"""OpenAI's API.

    routes.py   /v1/models, /v1/chat/completions, /v1/completions
    shapes.py   tool calls, reasoning content and logprobs in OpenAI's shapes
"""
