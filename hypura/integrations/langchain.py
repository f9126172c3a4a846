"""LangChain's `LlamaCpp` LLM with a `hypura.Llama` as its client, so a chain runs under Hypura's placement.

langchain-community's `LlamaCpp` builds its client in a validator from `llama_cpp.Llama`: a `client=`
given is replaced, and Hypura's keywords in `model_kwargs` (plan, gpu_mem, ram, ...) are silently
ignored by llama_cpp.Llama. `HypuraLlamaCpp` is the same class with that validator replaced:

    from hypura.integrations.langchain import HypuraLlamaCpp
    llm = HypuraLlamaCpp(model_path="model.gguf", n_ctx=2048, model_kwargs={"gpu_mem": "8GiB", "ram": "16GiB"})
    llm = HypuraLlamaCpp(client=hypura.Llama("model.gguf", plan="plan.json"))   # a Llama made elsewhere

Every other field (temperature, top_k, stop, streaming, grammar...) behaves as in `LlamaCpp`, whose
calls go through the client's llama-cpp-python API, which hypura.Llama keeps.
"""

from __future__ import annotations

from typing import Any

from hypura.errors import HypuraError

try:
    from langchain_community.llms import LlamaCpp
    from langchain_core.utils import pre_init
except ImportError as e:  # an optional integration: say what to install
    raise HypuraError(f"hypura.integrations.langchain needs langchain-community: pip install langchain-community "
                      f"({e.name} is missing)") from None

# the LlamaCpp fields that are llama_cpp.Llama constructor keywords (LlamaCpp.validate_environment)
_LLAMA_FIELDS = ("rope_freq_scale", "rope_freq_base", "lora_path", "lora_base", "n_ctx", "n_parts", "seed", "f16_kv",
                 "logits_all", "vocab_only", "use_mlock", "n_threads", "n_batch", "use_mmap", "last_n_tokens_size",
                 "verbose")


class HypuraLlamaCpp(LlamaCpp):
    """`LlamaCpp` whose client is a hypura.Llama: `model_kwargs` take Hypura's keywords too."""

    @pre_init
    def validate_environment(cls, values: dict) -> dict:
        client = values.get("client")
        if client is not None:
            values.setdefault("model_path", client.model_path)
        else:
            from hypura import Llama

            kwargs: dict[str, Any] = {name: values[name] for name in _LLAMA_FIELDS if name in values}
            if values.get("n_gpu_layers") is not None:
                kwargs["n_gpu_layers"] = values["n_gpu_layers"]
            kwargs.update(values.get("model_kwargs") or {})
            values["client"] = Llama(values["model_path"], **kwargs)
        if values.get("grammar") and values.get("grammar_path"):
            raise ValueError("give one of grammar and grammar_path")
        from llama_cpp import LlamaGrammar

        if isinstance(values.get("grammar"), str):
            values["grammar"] = LlamaGrammar.from_string(values["grammar"])
        elif values.get("grammar_path"):
            values["grammar"] = LlamaGrammar.from_file(values["grammar_path"])
        return values
