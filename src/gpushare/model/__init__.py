"""Domain types and the allocation ledger: the pure core every component shares."""

from gpushare.model.ledger import Ledger
from gpushare.model.types import (
    FULL_CORE_PERCENT,
    Allocation,
    CapacityError,
    Gpu,
    GpuShare,
    ModelError,
    Node,
    Request,
)

__all__ = [
    "FULL_CORE_PERCENT",
    "Allocation",
    "CapacityError",
    "Gpu",
    "GpuShare",
    "Ledger",
    "ModelError",
    "Node",
    "Request",
]
