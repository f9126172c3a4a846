"""A model Hypura loaded and owns: `load(path, ask) -> LoadedModel`.

- load.py: load(): the model file checked, the request (hypura.plan.ask.Ask, filled by Ask.of), the RPC servers
  registered, the one decision (hypura.plan.decision: the plan, the devices, the split), the Runtime, then llama.cpp's
  model and context through the Runtime's hooks.
- measured.py: Measured: what the decision reads of this machine (free memory, profile, routing, RPC devices),
  each measured once, where the decision first needs it.
- model.py: LoadedModel: the model, its context, vocabulary, runtime and decision; close() (or `with`) frees them.
- context.py: Context: a context's decodes (through the Runtime), logits and KV cache by sequence: the one place of
  llama.cpp's llama_memory_* calls.
- drafts.py: draft models loaded beside a target, and the drafters and verifiers speculation settings name.

hypura.Llama (llama-cpp-python's facade) is made from a LoadedModel; the engine, hypura-cli, bench and speculation
take one directly.
"""

from hypura.loaded.context import Context
from hypura.loaded.load import load
from hypura.loaded.model import LoadedModel
from hypura.plan.ask import Ask

__all__ = ["Ask", "Context", "LoadedModel", "load"]
