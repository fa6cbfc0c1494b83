"""The slow, obviously correct reference of tree decoding (:mod:`lightning_bpd.decoding.tree_decode`). Torch only.

One row at a time, no cache, no tree mask: at every iteration the whole prefix is re-run to propose the tree's
tokens (each node's token from its head's logits, a chained head evaluated through the teacher-forced path fed the
tokens of the node's own path), then every root-to-leaf candidate is checked on its own by re-running the prefix
extended with it (p_1 after each of its tokens, the rule's ``accept``). The longest accepted prefix of any
candidate wins (ties to the lowest node index of its last accepted node); it is cut after an EOS and at max_len.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_bpd.decoding.blockwise import chain_source
from lightning_bpd.decoding.criteria import Criterion, Exact
from lightning_bpd.decoding.greedy import strip_padding
from lightning_bpd.decoding.protocol import BlockwiseModel, Context, DecodeResult, check_decode_args
from lightning_bpd.decoding.reference import accepted_block, reference_result, ruled_verify
from lightning_bpd.decoding.rules import BoundRules, reference_rules, ruled_at
from lightning_bpd.decoding.tree import Tree
from lightning_bpd.decoding.tree_decode import check_tree_args


def reference_tree_tokens(model: BlockwiseModel, criterion: Criterion, tree: Tree, h: Tensor, context: Context,
                          rule: Callable[[Tensor], Tensor] | None = None) -> list[int]:
    """The tree's tokens (N ints) at the hidden state h (1, D): the root is the rule's token from p_1 (under the
    generation rules ``rule``), node i the rank-``tree.ranks[i]`` token of the head at its depth (a stable
    descending sort of its logits)."""
    restrict = model.restrict_draft or (lambda logits: logits)
    rule = rule or (lambda logits: logits)
    source = chain_source(model, context)
    tokens = [int(criterion.propose(rule(model.logits_heads(h, [0])))[0, 0])]
    for i in range(1, tree.size):
        d = tree.depths[i]
        if model.chained_heads:
            prev = torch.tensor([[tokens[j] for j in tree.root_path(tree.parents[i])]], device=h.device)  # (1, d)
            logits = model.logits_heads(h, [d], prev_tokens=prev, source=source)  # (1, 1, V)
        else:
            logits = model.logits_heads(h, [d])  # (1, 1, V)
        order = restrict(logits)[0, 0].sort(descending=True, stable=True).indices
        tokens.append(int(order[tree.ranks[i]]))
    return tokens


def check_candidates(model: BlockwiseModel, criterion: Criterion, tree: Tree, prefix: list[int], tokens: list[int],
                     context: Context, device: torch.device, bound: BoundRules | None = None,
                     history: list[int] | None = None) -> int:
    """The accepted node: every root-to-leaf candidate checked on its own through the uncached decoder (p_1 under
    the generation rules ``bound``, at each position as greedy would have seen it; ``history``: what the rules see
    in place of ``prefix``, default ``prefix``)."""
    history = prefix if history is None else history
    best = (0, 0)  # (accepted tokens, -node)
    for path in tree.leaf_paths():
        candidate = [tokens[i] for i in path]
        h = model.decode_full(torch.tensor([prefix + candidate], device=device), context)  # (1, T + m, D)
        verify = model.logits_first(h[:, len(prefix) : len(prefix) + len(candidate) - 1])  # (1, m - 1, V)
        verify = ruled_verify(bound, history, candidate, verify, len(prefix) - 1)
        n = int(criterion.accept(torch.tensor([candidate], device=device), verify)[0])
        best = max(best, (n, -path[n - 1]))
    return -best[1]


@torch.no_grad()
def tree_decode_reference(model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None, max_len: int = 256,
                          tree: Tree | None = None, k: int | None = None) -> DecodeResult:
    """Same contract and results as ``blockwise_decode(model, src, criterion, max_len, k, tree=tree)``."""
    criterion = criterion if criterion is not None else Exact()
    tree = tree if tree is not None else Tree.path(model.k - 1)
    check_decode_args(model, src, max_len)
    check_tree_args(model, criterion, tree, k, verify_pass=False)
    bound, stops, befores = reference_rules(model, src, max_len)  # befores: what the rules see before token 0
    rows, blocks, calls = [], [], 0
    for before, row_src in zip(befores, strip_padding(src, model.pad_id)):
        context = model.encode(row_src)
        out: list[int] = []
        row_blocks: list[int] = []
        while len(out) < max_len and (not out or out[-1] not in stops):
            prefix = [model.bos_id, *out]
            h = model.decode_full(torch.tensor([prefix], device=src.device), context)[:, -1]  # (1, D)
            rule = None if bound is None else ruled_at(bound, [*before, *out], len(out))
            tokens = reference_tree_tokens(model, criterion, tree, h, context, rule)
            node = check_candidates(model, criterion, tree, prefix, tokens, context, src.device, bound,
                                    [*before, *out])
            calls += 1 + len(tree.leaves())
            block = accepted_block([tokens[i] for i in tree.root_path(node)], stops, max_len - len(out))
            out.extend(block)
            row_blocks.append(len(block))
        rows.append(out)
        blocks.append(row_blocks)
    return reference_result(rows, blocks, model.pad_id, src.device, calls=calls)
