"""Room for a model loaded on demand, beside those that stay: which idle models to unload, and the free
memory the new one is planned within (hypura.Llama's default path, given that memory as `Fit.free`).

A model that would run as llama.cpp places it (every layer on the GPU, or in RAM without one) in what
the loaded models leave is loaded beside them; otherwise idle models are unloaded, least recently used
first, until it would, or none is idle; then the planner places it within what is left (disk for the
rest). "What they leave" is the default path's, in its order (plan/auto.py fits_in_order): the free memory
less the margins, then, where no unloading makes room within them, the free memory itself, as a direct load
would hold it (without a GPU; with one, the margins alone). --max-loaded bounds the count first. Free memory
is measured, with the models loaded here added back for those unloaded; under $HYPURA_FREE_MEMORY (a fixed
figure) the models that stay are taken off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypura.modelfile import read_header
from hypura.plan import knobs
from hypura.plan.auto import Fit, fits_free, fits_in_order, resident_need, summary
from hypura.plan.cost import GPU, RAM
from hypura.plan.decision import unified_memory
from hypura.profile.free import FreeMemory, free_memory
from hypura.serve.http.errors import ApiError
from hypura.sizes import fmt_size


@dataclass(frozen=True)
class Room:
    free: FreeMemory  # what the new model may take (before the fit margins)
    staying: tuple[str, ...]
    unloaded: tuple  # ModelEntry: taken out of the registry, to close before loading
    need: tuple[int, int]  # (GPU, RAM) bytes at full speed, as llama.cpp would hold it
    within: Fit = Fit()  # the margins it fits within (fits_in_order): none where only the free memory holds it

    def settings_for(self, settings, say):
        """The server's settings with this room as the default path's free memory, its line to `say`."""
        fit = settings.llama_kwargs.get("fit")
        fit = fit if isinstance(fit, Fit) else Fit(enabled=fit is not False)
        fit = dataclasses.replace(fit, free=self.free, say=say, ram_margin=min(fit.ram_margin, self.within.ram_margin))
        kwargs = {**settings.llama_kwargs, "fit": fit}
        return dataclasses.replace(settings, llama_kwargs=kwargs)

    def describe(self) -> str:
        beside = f"beside {', '.join(self.staying)}" if self.staying else "alone"
        gone = f"; unloaded {', '.join(e.name for e in self.unloaded)} for it" if self.unloaded else ""
        below = "" if self.within.ram_margin else ", below the RAM margin, as a load alone would hold it"
        return (f"{beside}{gone}; {self.free.describe()} for it, {fmt_size(sum(self.need))} needed at full "
                f"speed{below}")

    def footprint(self, entry) -> tuple[int, int]:
        """(GPU, RAM) bytes the loaded model holds: its plan's, or as llama.cpp holds it where it fitted."""
        plan = getattr(entry.llm, "plan", None)
        return (plan.used(GPU), plan.used(RAM)) if plan is not None else self.need

    def chosen(self, entry, said: list[str]) -> str:
        """What the planner chose, in one line (/api/ps): the default path's line, else the plan's summary."""
        if said:
            return said[-1].removeprefix("hypura: ")
        plan = getattr(entry.llm, "plan", None)
        return f"plan: {summary(plan)}" if plan is not None else f"llama.cpp's placement; {self.describe()}"


def _fit(settings) -> Fit:
    fit = settings.llama_kwargs.get("fit")
    return fit if isinstance(fit, Fit) else Fit()


def _room(measured: FreeMemory, loaded: list, staying: list, source: str) -> FreeMemory:
    if measured.source == "measured":  # the measurement already excludes every model loaded here
        delta = [(e.footprint[0], e.footprint[1]) for e in loaded if e not in staying]
        sign = 1
    else:
        delta = [(e.footprint[0], e.footprint[1]) for e in staying]
        sign = -1
    gpu = None if measured.gpu is None else max(0, measured.gpu + sign * sum(d[0] for d in delta))
    ram = max(0, measured.ram + sign * sum(d[1] for d in delta))
    return FreeMemory(gpu, ram, measured.gpu_total, measured.ram_total, source)


def make_room(registry, offer) -> Room:
    """Choose what to unload for `offer` and take it out of the registry (under the registry's `_mem`): the
    default path's test (plan/auto.py), on the memory the models that stay leave."""
    settings = registry.settings
    fit = _fit(settings)
    measured = free_memory()
    on_gpu = measured.gpu is not None
    header = read_header(offer.path)
    need = resident_need(header, settings.parallel * settings.ctx_per_seq(header), knobs.N_UBATCH, on_gpu,
                         on_gpu and unified_memory())
    loaded, idle = registry.loaded()
    # the fewest unloads that make room, the margins kept where they can be. With a GPU, the margins alone
    # (the placement on GPU machines stays as it was until measured there)
    for within in fits_in_order(fit) if not on_gpu else [fit]:
        candidates, chosen = list(idle), []
        while True:
            staying = [e for e in loaded if e not in chosen]
            fits = fits_free(need, _room(measured, loaded, staying, measured.source), within, on_gpu)
            if (fits and len(staying) < settings.max_loaded) or not candidates:
                break
            chosen.append(candidates.pop(0))
        if fits:
            break
    gone = registry.take_idle(chosen)
    staying = [e for e in loaded if e not in gone]
    if len(staying) >= settings.max_loaded:
        raise ApiError(503, f"{len(staying)} models are loaded and busy (--max-loaded {settings.max_loaded}): "
                            f"'{offer.name}' loads when one is idle", None, {"Retry-After": "5"})
    if measured.source == "measured":
        source = f"measured, with {len(gone)} unloaded for it" if gone else "measured"
    else:
        source = f"{measured.source}, less {len(staying)} loaded here" if staying else measured.source
    within = within if fits else fit  # nowhere: the planner, within the margins first (default_path)
    return Room(_room(measured, loaded, staying, source), tuple(e.name for e in staying), tuple(gone), need, within)
