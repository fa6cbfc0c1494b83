"""The slow reference of dynamic trees (:mod:`lightning_bpd.decoding.proposers.dynamic_tree`). Torch only.

One row at a time, no cache, no tree mask, no depth-by-depth pruning: at every iteration the whole ``width``-ary
tree ``depth`` deep is enumerated, each node's token and confidence from the uncached decoder (a chained head
teacher-forced on the node's own path), the ``nodes`` most confident (ties to the shallower, then the lower path)
become a :class:`~lightning_bpd.decoding.trees.tree.Tree`, and every root-to-leaf candidate is checked on its own
(:func:`~lightning_bpd.decoding.reference.tree.exact_tree_reference`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.proposers.dynamic_tree import check_dynamic_args, log_probs
from lightning_bpd.decoding.protocol import BlockwiseModel, Context, DecodeResult, chain_source, check_decode_args
from lightning_bpd.decoding.reference.tree import exact_tree_reference
from lightning_bpd.decoding.trees.tree import DynamicTree, Path, Tree


@torch.no_grad()
def reference_dynamic_tree(model: BlockwiseModel, spec: DynamicTree, h: Tensor, root: int,
                           context: Context) -> tuple[Tree, list[int]]:
    """The tree and its tokens (N ints) at the hidden state h (1, D) with ``root`` at the root: the ``spec.nodes``
    most confident nodes of the whole ``spec.width``-ary tree, a node's confidence the sum of its path's
    log-probabilities under the heads that propose them (its rank r: its head's (r+1)-th most likely token)."""
    restrict = model.restrict_draft or (lambda logits: logits)
    source = chain_source(model, context)
    found: dict[Path, tuple[int, float]] = {(): (root, 0.0)}
    for d in range(1, spec.depth + 1):
        for path in sorted(p for p in found if len(p) == d - 1):
            if model.chained_heads:
                walk = [path[:i] for i in range(d)]  # the nodes from the root to this one
                prev = torch.tensor([[found[p][0] for p in walk]], device=h.device)  # (1, d)
                logits = model.logits_heads(h, [d], prev_tokens=prev, source=source)  # (1, 1, V)
            else:
                logits = model.logits_heads(h, [d])  # (1, 1, V)
            logits = restrict(logits)[0, 0]
            order = logits.sort(descending=True, stable=True).indices
            logp = log_probs(logits)
            for r in range(spec.width):
                token = int(order[r])
                found[(*path, r)] = (token, found[path][1] + float(logp[token]))
    ranked = sorted((p for p in found if p), key=lambda p: (-found[p][1], len(p), p))
    tree = Tree.from_paths(ranked[: spec.nodes])
    return tree, [found[p][0] for p in tree.paths]


@torch.no_grad()
def dynamic_tree_reference(model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None,
                           max_len: int = 256, spec: DynamicTree | None = None, k: int | None = None) -> DecodeResult:
    """Same contract and results as ``blockwise_decode(model, src, Exact(), max_len, k, tree=spec)``."""
    criterion = criterion if criterion is not None else Exact()
    spec = spec if spec is not None else DynamicTree(nodes=model.k - 1, depth=model.k - 1)
    check_decode_args(model, src, max_len)
    check_dynamic_args(model, criterion, spec, k)

    def propose(h: Tensor, context: Context, rule: Callable[[Tensor], Tensor] | None) -> tuple[Tree, list[int]]:
        root = int(criterion.propose((rule or (lambda x: x))(model.logits_heads(h, [0])))[0, 0])
        return reference_dynamic_tree(model, spec, h, root, context)

    return exact_tree_reference(model, src, criterion, max_len, propose)
