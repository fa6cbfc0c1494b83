"""What a runtime adds to the process beside its model: the bytes of its weight copies, and the resident memory it
grew by. Torch only."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from lightning_bpd.inference.product_kinds import CopiedProducts, WideProducts
from lightning_bpd.inference.shared_copy import own_bytes, tensor_bytes
from lightning_bpd.kernels.int8 import RowInt8

MB = 2**20


def copy_size(copy: Any) -> int:
    """Bytes of one product copy: a tensor (packed, float64), or an int8 weight (int8 values, a float32 scale and
    bias per row)."""
    if isinstance(copy, Tensor):
        return copy.numel() * copy.element_size()
    if isinstance(copy, RowInt8):
        return copy.out_features * copy.in_features + 8 * copy.out_features
    return 0


def products_bytes(products: Any) -> int:
    """Bytes of the weight copies a runtime's products made (float64 copies, packed or int8 weights)."""
    if isinstance(products, WideProducts):
        return sum(copy_size(wide) for _, wide in products.wide.values())
    if isinstance(products, CopiedProducts):
        return (sum(copy_size(entry[-1]) for book in (products.copies, products.made) for entry in book.values())
                + sum(copy_size(view) for view in products.views.values()))
    return 0  # plain products copy nothing


def resident_bytes() -> int:
    """The process's resident memory now (Linux; 0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def measured_build(build: Callable[[], Any], model: nn.Module) -> tuple[Any, dict[str, float]]:
    """``build()`` (a runtime of ``model``) and its memory record: the model's weights (``model_mb``), the weights
    the runtime's modules do not share with it (``runtime_cast_mb``: copies in another dtype), its products' copies
    (``runtime_products_mb``) and the resident memory the process grew by while building it (``runtime_added_mb``)."""
    before = resident_bytes()
    runtime = build()
    added = resident_bytes() - before
    return runtime, {"model_mb": round(tensor_bytes(model) / MB, 2),
                     "runtime_cast_mb": round(own_bytes(runtime.model, model) / MB, 2),
                     "runtime_products_mb": round(products_bytes(runtime.products) / MB, 2),
                     "runtime_added_mb": round(added / MB, 2)}
