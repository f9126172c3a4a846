"""What the placement search needs of the model alone (plan/solve.py), made once for all its problems: the orders
the fills walk, a layer's experts as one group, the split's per-unit sums (plan/unit_sums.py) and the stacks' moves
cached by step."""

from __future__ import annotations

from collections import defaultdict

from hypura.plan import knobs
from hypura.plan.latest import Latest
from hypura.plan.unit_sums import UnitSums
from hypura.units import ModelUnits


class ModelOrders:
    """What the search needs of the model alone, made once for all its problems (`of`): the contexts, micro-batches
    and budgets a decision tries, the optimizer and the greedy baseline, the RAM floor's bisection."""

    def __init__(self, mu: ModelUnits):
        self.mu = mu
        self.stacks_moves: dict[tuple[int, int], tuple[float, float, float]] = {}  # solve._Problem.stacks_move's sums
        self.sums = UnitSums(mu)  # the split's step loads over every unit at once
        # a layer's experts are one stacked tensor, in one buffer: the GPU holds all of them or none (the
        # runtime computes a stack split across tiers from RAM), so they are placed together, by their mean p
        self.expert_groups: dict[int, list[int]] = defaultdict(list)
        for i, u in enumerate(mu.units):
            if u.expert >= 0 and not u.host_only:
                self.expert_groups[u.stage].append(i)
        mean_p = {s: sum(mu.units[i].p for i in g) / len(g) for s, g in self.expert_groups.items()}
        density = lambda i: mean_p[mu.units[i].stage] if mu.units[i].expert >= 0 else mu.units[i].p  # noqa: E731
        self.density_order = sorted(
            range(len(mu.units)),
            key=lambda i: (-density(i), knobs.ROLE_RANK[mu.units[i].role], mu.units[i].stage, i))
        # in host memory experts are placed one by one: by their own p
        self.host_order = sorted(
            range(len(mu.units)),
            key=lambda i: (-mu.units[i].p, knobs.ROLE_RANK[mu.units[i].role], mu.units[i].stage, i))
        # the fills' walks: fill_by_density's GPU candidates (a unit, or a layer's experts where the first of them
        # comes) and RAM ones, fill_like_ngl's whole layers from the last, each with its bytes
        self.gpu_moves: list[tuple[int, int, int]] = []  # (first unit, past the last, bytes)
        placed: set[int] = set()
        for i in self.density_order:
            u = mu.units[i]
            if not (u.host_only or i in placed):
                group = self.expert_groups[u.stage] if u.expert >= 0 else [i]
                # units are in graph order (model_units), a layer's experts one after the other
                assert group == list(range(group[0], group[-1] + 1)), "a layer's experts apart in graph order"
                placed.update(group)
                self.gpu_moves.append((group[0], group[-1] + 1, sum(mu.units[j].nbytes for j in group)))
        # a unit that cannot stream (Unit.resident) takes RAM first: disk is no place for it
        self.ram_moves = sorted(((i, mu.units[i].nbytes) for i in self.host_order if not mu.units[i].host_only),
                                key=lambda move: not mu.units[move[0]].resident)
        by_stage: dict[int, list[int]] = defaultdict(list)
        for i, u in enumerate(mu.units):
            if not u.host_only:
                by_stage[u.stage].append(i)
        self.layers_down = [(by_stage[s], sum(mu.units[i].nbytes for i in by_stage[s]))
                            for s in sorted(by_stage, reverse=True)]

    @classmethod
    def of(cls, mu: ModelUnits) -> ModelOrders:
        """The model's, made again only for another model (a ModelUnits is never changed)."""
        return _latest.get(lambda orders: orders.mu is mu, lambda: cls(mu))


_latest: Latest[ModelOrders] = Latest()  # the model of this thread's latest problem
