"""How a plan's non-resident tensors move: whole, through the slots of a pool (include/hypura.h,
"Pools"), or expert by expert, as routers select them."""

from hypura.tiers.names import DISK

GPU_POOL, HOST_POOL = "gpu", "host"


def paged_by_expert(t) -> bool:
    """A stacked expert tensor (a Plan's TensorPlacement) with experts on disk: paged, never streamed whole."""
    return bool(t.experts) and DISK in t.experts
