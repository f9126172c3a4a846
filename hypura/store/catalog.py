"""Every model the stores hold, by name: `Catalog.scan()` reads them (read-only, headers only), `find(name)`
looks one up as Ollama does, with the unambiguous short forms other stores' models answer to."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Optional

from hypura.errors import HypuraError
from hypura.store import folder, lmstudio, names, ollama
from hypura.store.stored import StoredModel, StoreProblem

MODELS_DIR_ENV = "HYPURA_MODELS"  # the default of --models-dir, and where Llama("name") looks too


def locations(models_dir=None) -> list[tuple[str, Path]]:
    """(kind, folder) searched, in order: --models-dir ($HYPURA_MODELS), Ollama's, LM Studio's."""
    out = []
    folder = models_dir or os.environ.get(MODELS_DIR_ENV)
    if folder:
        out.append(("folder", Path(folder).expanduser()))
    out.append(("ollama", Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()))
    out.append(("lmstudio", Path.home() / ".lmstudio" / "models"))
    return out


class Catalog:
    def __init__(self, models: list[StoredModel], problems: list[StoreProblem], searched: list[tuple[str, Path]]):
        self.searched = searched
        self.problems = problems
        self.models: dict[str, StoredModel] = {}
        for m in models:  # the first found keeps a name (the order of `locations`)
            self.models.setdefault(m.name, m)
        claims: dict[str, set[str]] = {}
        for m in self.models.values():
            for alias in m.aliases:
                if alias not in self.models:
                    claims.setdefault(alias, set()).add(m.name)
        self._aliases = {a: next(iter(n)) for a, n in claims.items() if len(n) == 1}
        self._ambiguous = {a: sorted(n) for a, n in claims.items() if len(n) > 1}
        self._broken = {p.name: p for p in problems}

    @classmethod
    def scan(cls, models_dir=None) -> "Catalog":
        readers = {"folder": folder.scan, "ollama": ollama.scan, "lmstudio": lmstudio.scan}
        models, problems, searched = [], [], locations(models_dir)
        for kind, root in searched:
            found, broken = readers[kind](root)
            models += found
            problems += broken
        return cls(models, problems, searched)

    def __iter__(self):
        return iter(sorted(self.models.values(), key=lambda m: m.name))

    def lookup(self, text: str) -> Optional[StoredModel]:
        """The model `text` names, None when none; raises HypuraError for an ambiguous or broken one."""
        for key in _keys(text):
            if key in self.models:
                return self.models[key]
            if key in self._aliases:
                return self.models[self._aliases[key]]
            if key in self._ambiguous:
                raise HypuraError(f"'{text}' could be any of {', '.join(self._ambiguous[key])}: name one of them")
            if key in self._broken:
                raise HypuraError(f"model '{text}' cannot be used: {self._broken[key].line}")
        return None

    def find(self, text: str) -> StoredModel:
        """As lookup, with one line naming close matches when nothing matches."""
        found = self.lookup(text)
        if found is None:
            raise HypuraError(self.not_found(text))
        return found

    def not_found(self, text: str) -> str:
        known = list(self.models) + list(self._aliases)
        # the typed model's name inside a known one first (`gemma3` -> gemma3:270m), then spelling neighbours
        close = [k for k in known if names.parse(text).model in k]
        close += [k for k in difflib.get_close_matches(names.parse(text).short(), known, n=3, cutoff=0.5)
                  if k not in close]
        close = close[:3]
        where = ", ".join(str(root) for _, root in self.searched)
        hint = f"; close matches: {', '.join(close)}" if close else ("; `hypura list` shows what is there"
                                                                     if self.models else "")
        return f"no model file or model named '{text}' (searched {where}){hint}"


def _keys(text: str) -> list[str]:
    """The forms a typed name is looked up as: Ollama's short form, then as typed (tag defaulted)."""
    parsed = names.parse(text)
    typed = text.strip().lower()
    typed = typed if ":" in typed.rpartition("/")[2] else f"{typed}:{names.DEFAULT_TAG}"
    return list(dict.fromkeys([parsed.short(), typed]))
