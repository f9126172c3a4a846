"""Hypura inside other tools' APIs: LangChain's `LlamaCpp` with Hypura's placement (langchain.py).

Tools that speak HTTP (LangChain's ChatOllama / ChatOpenAI, the ollama and openai clients, Open WebUI)
need nothing here: they talk to `hypura serve` (docs/serve.md).
"""
