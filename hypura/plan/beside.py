"""A model kept resident beside the planned one (a speculative draft): its memory is reserved within the
budgets before the plan is made, on the GPU or in RAM, whichever gives the faster speculative pass.

A draft decodes once per drafted token, so where it lives sets the drafting time: a pass drafting k tokens
reads about k times the draft's weights (the CPU at ~70 GB/s, 20 ms a token for a 70B's 1.4 GB synthetic
draft; the GPU ~1 ms). On the GPU, though, it takes bytes the target's plan would have used: the plan is
made both ways and the pass time compared (the target's step of k + 1 tokens, from its plan, plus the
drafting). A draft larger than the GPU's budget goes to RAM.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypura.plan import knobs
from hypura.units import model_units


@dataclass(frozen=True)
class Beside:
    """What a model resident beside the planned one holds: its weights, its KV cache per context cell (its
    context is the planned model's, as llama.cpp's speculative examples and llama-server give a draft) and
    its compute buffer; and the bytes a drafted token reads (all but the input embeddings' rows)."""

    name: str
    weights: int
    kv_per_cell: int
    buffer: int
    read_per_token: int

    @classmethod
    def of(cls, header, n_ubatch: int = knobs.N_UBATCH,
           kv_bytes_per_element: float = knobs.KV_BYTES_PER_ELEMENT) -> "Beside":
        mu = model_units(header)
        d = mu.dims
        return cls(header.path.name, mu.weight_bytes, d.kv_bytes_per_layer(1, kv_bytes_per_element) * d.n_layer,
                   d.compute_buffer_bytes(n_ubatch), sum(u.nbytes for u in mu.units if not u.host_only))

    def nbytes(self, n_ctx: int) -> int:
        return self.weights + self.kv_per_cell * n_ctx + self.buffer

    def reserved(self, on_gpu: bool, n_ctx: int, unified: bool = False) -> tuple[int, int]:
        """(GPU bytes, RAM bytes) it holds at n_ctx; with unified memory GPU bytes are RAM bytes too."""
        n = self.nbytes(n_ctx)
        if not on_gpu:
            return 0, n
        return n, n if unified else 0

    def options(self, gpu_budget: int, n_ctx: int) -> tuple[bool, ...]:
        """Where it may go (True: the GPU), the GPU first: it must fit the GPU's budget whole."""
        return (True, False) if 0 < self.nbytes(n_ctx) <= gpu_budget else (False,)

    def pass_seconds(self, plan, on_gpu: bool) -> float:
        """A speculative pass drafting knobs.DRAFT_TOKENS_PLANNED tokens: the target's step of that many plus one,
        at the plan's predicted rate for the step, and the draft's reads at the rate of where it is."""
        k = knobs.DRAFT_TOKENS_PLANNED
        return plan.step_seconds(k + 1) + k * self.token_seconds(plan, on_gpu)

    def token_seconds(self, plan, on_gpu: bool) -> float:
        """A drafted token: the draft's weights read at the rate of where it is (the plan's machine rates)."""
        r = plan.rates
        return self.read_per_token / (r.gpu_read if on_gpu and r.gpu_read else r.cpu_read)


__all__ = ["Beside"]
