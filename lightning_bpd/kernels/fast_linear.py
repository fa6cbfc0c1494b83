"""``F.linear`` with a faster memory layout for some row counts at inference on CPU. Torch only.

Decoding multiplies a handful of rows (the k tokens of a verify pass, the k heads of one position)
by matrices. On CPU, MKL's ``x @ W.T`` for small row counts processes the rows in small panels and
streams W once per panel (with torch 2.14's MKL: 2-3 rows cost what 1 does, 4-6 twice, 8 three
times); ``(W @ x.T).T`` streams W once for any count but has a higher fixed cost. Measured on these
CPUs (1 thread, medians, ``F.linear`` / ``(W @ x.T).T``): 8000 x 256 with 3 rows 346 / 687 us, with
8 rows 976 / 700 us; 1024 x 256 with 8 rows 44 / 86 us, with 16 rows 90 / 78 us. So the second
layout is used from 8 rows for a large W (>= 1M entries) and from 16 rows otherwise, up to 64
rows. Training, GPUs, other row counts and other dtypes keep ``F.linear`` (bfloat16's oneDNN products
are fast for several rows already, and batch-invariant: :mod:`lightning_bpd.inference.precision`). The result differs from
``F.linear`` only by float rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

MAX_ROWS = 64
LARGE = 1 << 20  # weight entries from which 8 rows already favour (W @ x.T).T


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: (..., in) -> (..., out), the plain products of
    :data:`~lightning_bpd.nn.products.FLOAT` (other kinds: :mod:`lightning_bpd.inference.product_kinds`)."""
    rows = x.numel() // max(1, x.shape[-1])
    if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32 or rows > MAX_ROWS or rows < (
            8 if weight.numel() >= LARGE else 16):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])  # (rows, in)
    out = torch.addmm(bias[:, None], weight, flat.t()) if bias is not None else weight @ flat.t()  # (out, rows)
    return out.t().reshape(*x.shape[:-1], weight.shape[0])
