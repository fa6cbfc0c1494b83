"""The slow, obviously correct reference of tree decoding (:mod:`lightning_bpd.decoding.proposers.tree`). Torch only.

One row at a time, no cache, no tree mask: at every iteration the whole prefix is re-run to propose the tree's
tokens (each node's token from its head's logits, a chained head evaluated through the teacher-forced path fed the
tokens of the node's own path), then every root-to-leaf candidate is checked on its own by re-running the prefix
extended with it (p_1 after each of its tokens, the rule's ``accept``). The longest accepted prefix of any
candidate wins (ties to the lowest node index of its last accepted node); it is cut after an EOS and at max_len.

Sampling (:class:`~lightning_bpd.decoding.acceptance.SpeculativeSampling`): the children's distributions come from the
uncached prefix (chained heads: teacher-forced on each node's own path), the target at every node on the walk from
the uncached prefix extended with that node's path, and the walk is SpecInfer's, one child at a time in plain
Python (:func:`walk_reference`). It draws its random numbers in the fast decoder's order and shapes (one row), so
at batch 1 and the same seed both draw the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact, SpeculativeSampling
from lightning_bpd.decoding.generation_rules import BoundRules, reference_rules, ruled_at
from lightning_bpd.decoding.greedy import strip_padding
from lightning_bpd.decoding.proposers.tree import check_tree_args
from lightning_bpd.decoding.protocol import (
    BlockwiseModel,
    Context,
    DecodeResult,
    chain_source,
    check_decode_args,
    source_room,
)
from lightning_bpd.decoding.reference.blockwise import accepted_block, reference_result, ruled_verify
from lightning_bpd.decoding.sampling import residual, sample
from lightning_bpd.decoding.tree_sampling import draw_children, expanded
from lightning_bpd.decoding.trees.tree import Tree


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


# A tree proposer of the references: (the hidden state h (1, D) at the last prefix position, the row's context, the
# generation rules at that position or None) -> the tree and its tokens (N ints).
ProposeTree = Callable[[Tensor, Context, Callable[[Tensor], Tensor] | None], tuple[Tree, list[int]]]


def exact_tree_reference(model: BlockwiseModel, src: Tensor, criterion: Criterion, max_len: int,
                         propose: ProposeTree) -> DecodeResult:
    """The references' loop, one row at a time: re-run the prefix, ``propose`` a tree, check every candidate on its
    own (:func:`check_candidates`), keep the accepted path (cut after an EOS and at max_len)."""
    bound, stops, befores = reference_rules(model, src, max_len)  # befores: what the rules see before token 0
    room = room_of(model, src)
    rows, blocks, calls = [], [], 0
    for row, (before, row_src) in enumerate(zip(befores, strip_padding(src, model.pad_id))):
        context = model.encode(row_src)
        out: list[int] = []
        row_blocks: list[int] = []
        while len(out) < max_len and (not out or out[-1] not in stops):
            prefix = [model.bos_id, *out]
            h = model.decode_full(torch.tensor([prefix], device=src.device), context)[:, -1]  # (1, D)
            rule = None if bound is None else ruled_at(bound, [*before, *out], len(out))
            tree, tokens = propose(h, context, rule)
            tree = tree.cut(room[row] - len(out) - 1)  # shallower where the row's context ends
            tokens = tokens[: tree.size]  # a cut keeps the first nodes
            node = check_candidates(model, criterion, tree, prefix, tokens, context, src.device, bound,
                                    [*before, *out])
            calls += 1 + len(tree.leaves())
            block = accepted_block([tokens[i] for i in tree.root_path(node)], stops, max_len - len(out))
            out.extend(block)
            row_blocks.append(len(block))
        rows.append(out)
        blocks.append(row_blocks)
    return reference_result(rows, blocks, model.pad_id, src.device, calls=calls)


@torch.no_grad()
def tree_decode_reference(model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None, max_len: int = 256,
                          tree: Tree | None = None, k: int | None = None) -> DecodeResult:
    """Same contract and results as ``blockwise_decode(model, src, criterion, max_len, k, tree=tree)``."""
    criterion = criterion if criterion is not None else Exact()
    tree = tree if tree is not None else Tree.path(model.k - 1)
    check_decode_args(model, src, max_len)
    check_tree_args(model, criterion, tree, k, verify_pass=False)
    if isinstance(criterion, SpeculativeSampling):
        if criterion.greedy is None:
            return tree_sample_reference(model, src, criterion, max_len, tree)
        criterion = criterion.greedy  # temperature 0: exact

    def propose(h: Tensor, context: Context, rule: Callable[[Tensor], Tensor] | None) -> tuple[Tree, list[int]]:
        return tree, reference_tree_tokens(model, criterion, tree, h, context, rule)

    return exact_tree_reference(model, src, criterion, max_len, propose)


def room_of(model: BlockwiseModel, src: Tensor) -> list[int]:
    """The inputs each row of ``src`` may feed after its start token (:func:`source_room`; no bound: a number past
    any decode's)."""
    return source_room(model, src) or [1 << 30] * src.shape[0]


def sampled_tree_tokens(model: BlockwiseModel, rule: SpeculativeSampling, tree: Tree, h: Tensor, root: int,
                        context: Context) -> tuple[list[int], dict[int, Tensor]]:
    """The tree's tokens (N ints) drawn at the hidden state h (1, D) with ``root`` at the root, and each expanded
    node's children's distribution q (V,): head d at h (parallel heads, one per depth), or head d teacher-forced
    on the node's own path (chained heads); the draws depth by depth, as the fast decoder makes them."""
    g, source = rule.rng(h.device), chain_source(model, context)
    tokens, qs = [root] + [0] * (tree.size - 1), {}
    for d in range(1, tree.depth + 1):
        parents = [p for p in expanded(tree) if tree.depths[p] == d - 1]
        for p in parents:
            if model.chained_heads:
                prev = torch.tensor([[tokens[j] for j in tree.root_path(p)]], device=h.device)  # (1, d)
                qs[p] = rule.distribution(model.logits_heads(h, [d], prev_tokens=prev, source=source))[0, 0]
            else:
                qs[p] = rule.distribution(model.logits_heads(h, [d]))[0, 0]  # (V,)
        stack = [qs[p] for p in (parents if model.chained_heads else parents[:1])]
        widest = max(len(tree.children(p)) for p in parents)
        drawn = draw_children(torch.stack(stack)[None], widest, g)[0].tolist()  # (m, W): one race per q
        for j, p in enumerate(parents):
            for s, c in enumerate(tree.children(p)):
                tokens[c] = drawn[j if model.chained_heads else 0][s]
    return tokens, qs


def walk_reference(tree: Tree, tokens: list[int], target: Callable[[int], Tensor], qs: dict[int, Tensor],
                   u: list[float]) -> tuple[int, Tensor]:
    """SpecInfer's walk, one child at a time: the accepted node and the distribution (V,) the next token is drawn
    from. ``target(n)``: p after node n (V,); ``qs[n]``: what n's children were drawn from; ``u[c]``: child c's
    uniform."""
    node, r = 0, target(0)
    while True:
        q, moved = qs.get(node), False
        for c in tree.children(node):
            x = tokens[c]
            if q is None or float(q[x]) <= 0:  # past q's support: never drawn
                continue
            if u[c] * float(q[x]) < float(r[x]):
                node, r, moved = c, target(c), True
                break
            r = residual(r, q)
            q = q.clone()
            q[x] = 0.0
            q = q / q.sum().clamp(min=torch.finfo(q.dtype).tiny)
        if not moved:
            return node, r


def sampled_target(model: BlockwiseModel, rule: SpeculativeSampling, context: Context, prefix: list[int],
                   bound: BoundRules | None, history: list[int], index: int, device: torch.device) -> Tensor:
    """p after the decoder input ``prefix`` (V,): p_1 of the uncached decoder under the generation rules (at generated
    ``index``, after ``history``), through the rule's temperature and top-p."""
    h = model.decode_full(torch.tensor([prefix], device=device), context)[:, -1]  # (1, D)
    logits = model.logits_first(h)  # (1, V)
    if bound is not None:
        logits = ruled_at(bound, history, index)(logits)
    return rule.distribution(logits[0])


def tree_sample_reference(model: BlockwiseModel, src: Tensor, rule: SpeculativeSampling, max_len: int,
                          tree: Tree) -> DecodeResult:
    """Tree sampling one row at a time without a cache (see the module docstring); rows follow each other on one
    random stream."""
    rule.reset(src.device)
    g = rule.rng(src.device)
    bound, stops, befores = reference_rules(model, src, max_len)
    room = room_of(model, src)
    rows, blocks, calls = [], [], 0
    for row, (before, row_src) in enumerate(zip(befores, strip_padding(src, model.pad_id))):
        context = model.encode(row_src)
        out: list[int] = []
        row_blocks: list[int] = []
        root: int | None = None  # the token drawn after the last accepted node
        while len(out) < max_len and (not out or out[-1] not in stops):
            prefix, history = [model.bos_id, *out], [*before, *out]
            if root is None:  # the first token: drawn from p_1 after the start token
                p = sampled_target(model, rule, context, prefix, bound, history, len(out), src.device)  # (V,)
                root = int(sample(p[None], g)[0])
            h = model.decode_full(torch.tensor([prefix], device=src.device), context)[:, -1]  # (1, D)
            now = tree.cut(room[row] - len(out) - 1)  # shallower where the row's context ends
            tokens, qs = sampled_tree_tokens(model, rule, now, h, root, context)
            paths = [[tokens[i] for i in now.root_path(n)] for n in range(now.size)]
            targets = {n: sampled_target(model, rule, context, prefix + path, bound, history + path,
                                         len(out) + len(path), src.device)
                       for n, path in enumerate(paths)}  # p after every node (the walk reads those on its way)
            u = torch.rand((1, now.size), generator=g, dtype=targets[0].dtype, device=src.device)[0].tolist()
            node, r = walk_reference(now, tokens, targets.__getitem__, qs, u)
            root = int(sample(r[None], g)[0])
            calls += 1 + now.size
            block = accepted_block(paths[node], stops, max_len - len(out))
            out.extend(block)
            row_blocks.append(len(block))
        rows.append(out)
        blocks.append(row_blocks)
    return reference_result(rows, blocks, model.pad_id, src.device, calls=calls)
