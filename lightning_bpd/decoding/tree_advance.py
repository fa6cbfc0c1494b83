"""The end of a tree-decoding iteration, shared by static trees (:mod:`~lightning_bpd.decoding.tree_decode`) and
dynamic ones (:mod:`~lightning_bpd.decoding.dynamic_tree`). Torch only."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.row_book import RowBook


def advance(book: RowBook, stops: Any, cache: Any, context: Any, tokens: Tensor, hidden: Tensor, node: Tensor,
            first: Tensor, path: Tensor, accepted: Tensor, width: int) -> tuple[Any, Tensor, Tensor] | None:
    """The end of a tree iteration, static or dynamic: commit each row's accepted path (``path`` (b, depth + 1) node
    indices, ``accepted`` (b,) tokens), drop the rows that ended (from the context and the cache), keep the accepted
    path's cache entries. Returns the live rows' ``(context, last, first)``: the hidden state (b, D) at the accepted
    node and the next first token (b,); None when every row has ended."""
    n_kept, done = book.commit(tokens.gather(1, path), accepted, stops)
    last = hidden.gather(1, node[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (b, D)
    keep = book.settle(n_kept, done)  # the one host read of the iteration
    if keep is not None:
        if not keep:
            return None
        rows = torch.tensor(keep, dtype=torch.long, device=first.device)
        context, last, first, path, accepted = (context.select(rows), last[rows], first[rows], path[rows],
                                                accepted[rows])
        cache.select(rows)
    cache.keep_path(path, accepted, width, bounds=book.length_bounds(offset=1))  # BOS and every committed one
    return context, last, first
