"""Models where they already are: Ollama's store, LM Studio's folder and a plain folder of GGUFs, by name.

    names.py     Ollama's model names (registry/namespace/name:tag) and the names files get
    ollama.py    $OLLAMA_MODELS (~/.ollama/models): manifests -> the GGUF blob, its params layer
    lmstudio.py  ~/.lmstudio/models/<publisher>/<repo>/*.gguf
    folder.py    a folder of GGUFs (--models-dir, $HYPURA_MODELS)
    stored.py    what the readers find: a StoredModel, a StoreProblem (an entry that cannot be used)
    catalog.py   every model found, looked up by name (close matches when none)
    resolve.py   what a user types (-m, Llama(...), inspect): a path, else a name

Everything here only reads: no store is ever written.
"""

from hypura.store.catalog import Catalog
from hypura.store.stored import StoredModel, StoreProblem
from hypura.store.resolve import resolve_model, resolve_path

__all__ = ["Catalog", "StoreProblem", "StoredModel", "resolve_model", "resolve_path"]
