"""What a proposer hands the loop: candidates for one verify pass, a path or a tree. Torch only.

Each kind knows its own verify pass, its verdict and what the cache keeps afterwards; the loop
(:mod:`~lightning_bpd.decoding.loop`) never asks which kind it holds::

    hidden, feats = candidates.verify_pass(target, context, cache, layers)  # one call of the target, (b, N, D)
    outcome = candidates.judge(target, criterion, rules, book, hidden)
    ...commit outcome.tokens[:, :outcome.accepted], drop finished rows...
    candidates.keep(cache, outcome, book)                      # crop (a path) or keep the accepted path (a tree)

The verify pass also returns, where the proposer reads them (``layers``: target layer ids), the hidden states of
those layers at every input (b, N, A * D); else None.

``target``: the narrow :class:`~lightning_bpd.decoding.target.Target` (its ``verify`` and p_1).

- :class:`Path`: a block (b, w) of tokens, verified as a path (the heads' chain, a draft model, prompt
  lookup, a drafter's block or chain); the cache is cropped back to what each row accepted.
- :class:`SharedTree`: one :class:`~lightning_bpd.decoding.trees.tree.Tree` for every row (static trees of the heads).
- :class:`RowTree`: one tree per row (dynamic trees, EAGLE-2; an EAGLE-3 drafter's trees). Both verify as a tree
  (depths, ancestors) and keep the accepted path's cache entries (``cache.keep_path``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.protocol import Cache, Context
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.target import Layers, Target
from lightning_bpd.decoding.tree_sampling import judge_tree
from lightning_bpd.decoding.trees.rows import RowTrees
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.decoding.verify import verify, verify_rows, verify_tree


@dataclass
class Outcome:
    """A verdict in the loop's terms: the candidates' tokens along each row's accepted path (b, w), how many of them
    it keeps (b,), the token that opens its next proposal (b,; -1 where a sampling rule draws it afresh from p_1),
    the index of the accepted input in the verify pass (b,) and, for a tree, the accepted path's nodes (b, w)."""

    tokens: Tensor
    accepted: Tensor
    first: Tensor | None
    at: Tensor
    path: Tensor | None = None

    def select(self, rows: Tensor) -> Outcome:
        """The live rows ``rows`` (b',) of this outcome."""
        return Outcome(self.tokens[rows], self.accepted[rows], None if self.first is None else self.first[rows],
                       self.at[rows], None if self.path is None else self.path[rows])


class Candidates(Protocol):
    """One verify pass's candidates (see the module docstring)."""

    def verify_pass(self, target: Target, context: Context, cache: Cache,
                    layers: Layers = ()) -> tuple[Tensor, Tensor | None]: ...

    def forced(self, rules: RuleBook, book: RowBook) -> Candidates: ...

    def judge(self, target: Target, criterion: Criterion, rules: RuleBook, book: RowBook,
              hidden: Tensor) -> Outcome: ...

    def keep(self, cache: Cache, outcome: Outcome, book: RowBook) -> None: ...


@dataclass
class Path:
    """A block of candidates per row, token 1 first (:class:`~lightning_bpd.decoding.acceptance.Block`: tokens (b, w),
    for sampling the distributions they were drawn from, and where a row proposes fewer, its ``widths``). ``lazy``:
    prefix rules check position by position (:func:`~lightning_bpd.decoding.verify.verify_lazily`)."""

    block: Block
    lazy: bool = False

    def verify_pass(self, target: Target, context: Context, cache: Cache,
                    layers: Layers = ()) -> tuple[Tensor, Tensor | None]:
        return target.verify(self.block.tokens, context, cache, None, layers)  # (b, w, D), (b, w, A * D) | None

    def forced(self, rules: RuleBook, book: RowBook) -> Path:
        """Deterministic rules: the token a generation rule forces put in place wherever one does (a proposal's
        other guess there could only be rejected)."""
        tokens = rules.forced_proposals(book, self.block.tokens)
        return self if tokens is self.block.tokens else replace(self, block=replace(self.block, tokens=tokens))

    def judge(self, target: Target, criterion: Criterion, rules: RuleBook, book: RowBook,
              hidden: Tensor) -> Outcome:
        tokens = self.block.tokens
        accepted, first = verify(target, criterion, self.block, hidden, self.lazy, rules.verifying(book, tokens))
        return Outcome(tokens, accepted, first, accepted - 1)

    def keep(self, cache: Cache, outcome: Outcome, book: RowBook) -> None:
        """Keep BOS and every committed token (a live row kept all it accepted)."""
        width = self.block.tokens.shape[1]
        cache.crop(cache.lengths - width + outcome.accepted, bounds=book.length_bounds(offset=1), check=False)


@dataclass
class SharedTree:
    """The same tree for every row: its ``tokens`` (b, N), the tree and its depths (N,), ancestor mask (N, N) and
    root-to-node table (N, depth + 1); for speculative sampling, the distributions q (b, M, V) its children were
    drawn from (:func:`~lightning_bpd.decoding.tree_sampling.propose_sampled_tree`) and whether the heads are chained."""

    tokens: Tensor
    tree: Tree
    depths: Tensor
    ancestors: Tensor
    table: Tensor
    q: Tensor | None = None
    chained: bool = False

    def verify_pass(self, target: Target, context: Context, cache: Cache,
                    layers: Layers = ()) -> tuple[Tensor, Tensor | None]:
        return target.verify(self.tokens, context, cache, (self.depths, self.ancestors), layers)  # (b, N, D), ...

    def forced(self, rules: RuleBook, book: RowBook) -> SharedTree:
        """A tree's nodes stay as proposed: its verdict applies the rules at every node."""
        return self

    def judge(self, target: Target, criterion: Criterion, rules: RuleBook, book: RowBook,
              hidden: Tensor) -> Outcome:
        reader: Any = rules.on_tree(book, self.tokens, self.depths, self.table) or target  # p_1 at every node
        if criterion.stochastic:  # SpecInfer's walk: the accepted node and the next token, from its residual
            p = criterion.distribution(reader.logits_first(hidden))  # (b, N, V)
            node, first = judge_tree(criterion, self.tree, self.tokens, p, self.q, self.chained)
        else:
            node, first = verify_tree(reader, criterion, self.tree, self.tokens, hidden)  # (b,), (b,)
        path = self.table[node]  # (b, depth + 1)
        return Outcome(self.tokens.gather(1, path), self.depths[node] + 1, first, node, path)

    def keep(self, cache: Cache, outcome: Outcome, book: RowBook) -> None:
        """The accepted nodes' K/V move up after each row's prefix; the rest is dropped."""
        cache.keep_path(outcome.path, outcome.accepted, self.tree.size, bounds=book.length_bounds(offset=1))


@dataclass
class RowTree:
    """One tree per row (:class:`~lightning_bpd.decoding.trees.rows.RowTrees`), exact acceptance."""

    trees: RowTrees

    def verify_pass(self, target: Target, context: Context, cache: Cache,
                    layers: Layers = ()) -> tuple[Tensor, Tensor | None]:
        t = self.trees
        return target.verify(t.tokens, context, cache, (t.depths, t.ancestors), layers)  # (b, N, D), (b, N, A * D)

    def forced(self, rules: RuleBook, book: RowBook) -> RowTree:
        """A tree's nodes stay as proposed: its verdict applies the rules at every node."""
        return self

    def judge(self, target: Target, criterion: Criterion, rules: RuleBook, book: RowBook,
              hidden: Tensor) -> Outcome:
        t = self.trees
        reader: Any = rules.on_tree(book, t.tokens, t.depths, t.paths) or target  # p_1 at every node
        node, first = verify_rows(reader, t, hidden)  # (b,), (b,)
        path = t.paths.gather(1, node[:, None, None].expand(-1, 1, t.paths.shape[-1]))[:, 0]  # (b, depth + 1)
        accepted = t.depths.gather(1, node[:, None])[:, 0] + 1  # (b,)
        return Outcome(t.tokens.gather(1, path), accepted, first, node, path)

    def keep(self, cache: Cache, outcome: Outcome, book: RowBook) -> None:
        cache.keep_path(outcome.path, outcome.accepted, self.trees.tokens.shape[1], bounds=book.length_bounds(offset=1))
