"""Retrieval as a proposer: a tree of continuations found in a datastore of tokens and in the row's own history.
Torch only.

REST (He et al., "REST: Retrieval-Based Speculative Decoding", NAACL 2024) with prompt lookup folded in: at each
iteration a row's history (its prompt, what it committed, then greedy's next token ``first``) ends in some n-gram;

- the **datastore** (:class:`Datastore`: a token stream, e.g. the training split tokenized by the target's own
  tokenizer) is searched for the longest of its ``orders`` (16, 12, 8, 6, 4, 3, 2, 1 tokens) that ends the history,
  and up to ``cap`` of its occurrences (evenly spaced through the sorted index) give what followed them;
- the **history** itself is searched for its last n tokens (n from ``history_ngram`` down to 1), and the last
  ``history_matches`` earlier occurrences give what followed them (prompt lookup, every match instead of one).

- a second datastore, ``greedy`` (the target's own greedy continuations of prompts like the user's, made by
  ``datastore --greedy N``), is searched the same way on its own, so that its few tokens are not outnumbered by the
  text's: the self-distilled part, what the model itself writes after such text.

Each continuation (up to ``depth`` tokens) carries a weight: the datastore's together weigh 1 + n (n: the order that
matched), the greedy datastore's together ``greedy_weight`` x (1 + n), each of the history's ``history_weight`` x
(1 + n). A node of the trie of continuations scores the weight of
the continuations through it, so it never outscores its parent; the ``nodes`` best (ties to the shallower, then to
the first seen) form the row's tree under greedy's token ``first`` (its root), one tree per row
(:class:`~lightning_bpd.decoding.trees.rows.RowTrees`), and the loop verifies it in one pass of the target. The pass is
as wide as the largest row's tree, so an iteration with few candidates costs less.

Exact acceptance only (:func:`~lightning_bpd.decoding.verify.verify_rows`): a node passes when its token is greedy's
after its parent and the deepest accepted node wins, so the output is greedy's, whatever the datastore holds. The
datastore and the tries live on the host: each iteration reads the live rows' histories once.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.candidates import RowTree
from lightning_bpd.decoding.proposers.base import Proposer, check_counts, opening_token
from lightning_bpd.decoding.proposers.prompt_lookup import HistoryRun, left_aligned
from lightning_bpd.decoding.protocol import BlockwiseModel
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of
from lightning_bpd.decoding.trees.rows import RowTrees

ORDERS = (1, 2, 3, 4, 6, 8, 12, 16)  # the n-gram lengths a datastore indexes
MULTIPLIER = 1_000_003  # of the n-gram keys' polynomial hash (wrapping in 64 bits; a collision is checked)


def ngram_keys(tokens: Tensor, n: int) -> Tensor:
    """The key of every n-gram of ``tokens`` (L,), in order (L - n + 1,) int64: a polynomial hash wrapping in 64 bits."""
    t = tokens.to(torch.int64)
    count = t.numel() - n + 1
    keys = torch.zeros(max(count, 0), dtype=torch.int64)
    for j in range(n):
        keys = keys * MULTIPLIER + t[j : j + count]
    return keys


def tail_key(tokens: list[int], n: int) -> int:
    """:func:`ngram_keys` of the last n of ``tokens`` as a host int, by the same arithmetic (int64, wrapping)."""
    key = 0
    for t in tokens[len(tokens) - n :]:
        key = (key * MULTIPLIER + t) & 0xFFFF_FFFF_FFFF_FFFF
    return key - (1 << 64) if key >= 1 << 63 else key


@dataclass(frozen=True, eq=False)
class Datastore:
    """A token stream ``tokens`` (L,) long and, for each n of ``orders``, its n-grams' keys sorted (``keys[n]``) and
    where each starts (``starts[n]``); build it with :meth:`of`."""

    tokens: Tensor
    orders: tuple[int, ...]
    keys: dict[int, Tensor] = field(repr=False)
    starts: dict[int, Tensor] = field(repr=False)

    @staticmethod
    def of(tokens: Tensor, orders: tuple[int, ...] = ORDERS) -> Datastore:
        """The datastore of ``tokens`` (L,) indexing the n-grams of each length in ``orders``; ValueError (one line) on
        orders that are not integers >= 1 or on an empty stream."""
        if not orders or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in orders):
            raise ValueError(f"a datastore's orders are n-gram lengths, integers >= 1, got {orders!r}")
        tokens = tokens.detach().flatten().to("cpu", torch.long)
        if tokens.numel() == 0:
            raise ValueError("a datastore needs at least one token")
        keys, starts = {}, {}
        for n in sorted(set(orders)):
            if tokens.numel() >= n + 1:  # an n-gram with a token after it
                k = ngram_keys(tokens[:-1], n)  # (L - n,): the n-grams that something follows
                keys[n], starts[n] = torch.sort(k, stable=True)
        return Datastore(tokens, tuple(sorted(set(orders))), keys, starts)

    def __len__(self) -> int:
        return self.tokens.numel()

    def continuations(self, history: list[int], depth: int, cap: int) -> tuple[int, Tensor]:
        """The longest order n whose n-gram ends ``history`` and occurs in the stream, and up to ``cap`` of the
        continuations that followed it (m, depth), -1 past the stream's end (occurrences evenly spaced over the sorted
        index, in the stream's order among equal keys); (0, an empty (0, depth)) where no order matches."""
        length = self.tokens.numel()
        step = torch.arange(depth)
        for n in reversed(self.orders):
            if n > len(history) or n not in self.keys:
                continue
            tail = torch.tensor(history[len(history) - n :])
            keys = self.keys[n]
            key = torch.tensor([tail_key(history, n)])  # (1,)
            lo, hi = int(torch.searchsorted(keys, key)), int(torch.searchsorted(keys, key, right=True))
            if hi == lo:
                continue
            take = min(hi - lo, cap)
            pick = lo + torch.arange(take) * (hi - lo) // take  # evenly spaced through the matches
            start = self.starts[n][pick]  # (m,)
            same = (self.tokens[start[:, None] + torch.arange(n)] == tail).all(dim=1)  # a hash collision is dropped
            at = (start + n)[same][:, None] + step  # (m, depth)
            found = torch.where(at < length, self.tokens[at.clamp(max=length - 1)], -1)
            if found.numel():
                return n, found
        return 0, torch.empty(0, depth, dtype=torch.long)


def history_continuations(history: list[int], max_ngram: int, matches: int, depth: int) -> tuple[int, list[list[int]]]:
    """The largest n <= ``max_ngram`` whose last n tokens of ``history`` occur earlier in it, and what followed its
    last ``matches`` earlier occurrences (each up to ``depth`` tokens); (0, []) where none occurs."""
    size = len(history)
    for n in range(min(max_ngram, size - 1), 0, -1):
        tail = history[-n:]
        found = [s + n for s in range(size - n) if history[s : s + n] == tail]  # s + n < size: a token follows
        if found:
            return n, [history[p : p + depth] for p in found[-matches:]]
    return 0, []


def best_nodes(weighted: list[tuple[list[int], float]], nodes: int, depth: int) -> list[tuple[int, ...]]:
    """The ``nodes`` prefixes (at most ``depth`` long) of highest weight over the ``weighted`` continuations (a
    continuation ends at its first -1), ties to the shorter, then to the first seen; in depth order, so a node's parent
    (its prefix less one token) comes before it."""
    score: dict[tuple[int, ...], float] = {}
    for tokens, weight in weighted:
        for d in range(1, min(len(tokens), depth) + 1):
            if tokens[d - 1] < 0:
                break
            key = tuple(tokens[:d])
            score[key] = score.get(key, 0.0) + weight
    ranked = heapq.nsmallest(nodes, ((-w, len(k), i, k) for i, (k, w) in enumerate(score.items())))  # ties: first seen
    return [k for *_, k in sorted(ranked, key=lambda r: (r[1], r[2]))]


@dataclass(frozen=True)
class Retrieval(Proposer):
    """Trees of ``nodes`` nodes (at most ``depth`` deep) from the continuations in the ``datastore``, the ``greedy``
    datastore (None: none) and the row's own history (see the module); exact acceptance only, on a target with a tree
    verify pass. ``inputs`` > 0 caps a verify pass's inputs over the live rows: with b rows each tree keeps its
    best ``min(nodes, inputs // b - 1)`` nodes (none: a greedy step), so a large batch does not verify b large
    trees in one pass (0: every row its ``nodes``)."""

    datastore: Datastore
    nodes: int = 8
    depth: int = 6
    cap: int = 256
    history_ngram: int = 4
    history_matches: int = 8
    history_weight: float = 0.5
    greedy: Datastore | None = None
    greedy_weight: float = 0.5
    inputs: int = 0

    deterministic_only = True

    def __post_init__(self) -> None:
        check_counts(self, ("nodes", "depth", "cap", "history_ngram", "history_matches"))
        for name in ("history_weight", "greedy_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Retrieval {name} must be >= 0, got {getattr(self, name)!r}")
        if self.inputs < 0:
            raise ValueError(f"Retrieval inputs must be >= 0 (0: no cap), got {self.inputs!r}")

    def nodes_for(self, rows: int) -> int:
        """A tree's nodes when ``rows`` rows share a verify pass (``inputs``' cap)."""
        return self.nodes if not self.inputs else max(0, min(self.nodes, self.inputs // rows - 1))

    @property
    def width(self) -> int:  # type: ignore[override]
        return min(self.depth, self.nodes) + 1

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.nodes + 1 - self.width

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        exact = isinstance(criterion, Exact)
        if not exact:  # the accepted path is unique only under exact acceptance
            raise ValueError(f"retrieval proposes trees, verified with exact acceptance, not {criterion.name}")
        if not target_of(model).spec.trees:
            raise ValueError(f"{type(model).__name__} has no tree verify pass (decode_tree): retrieval's trees cannot "
                             "be verified on it")
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> RetrievalRun:
        """This decode's state: every row's prompt left-aligned once (the rows' histories start with it)."""
        return RetrievalRun(self, *left_aligned(state.src, state.target.pad_id))

    def trie(self, history: list[int], nodes: int | None = None) -> list[tuple[int, ...]]:
        """The tree's nodes after ``history`` (its last token the root's), as paths of tokens below the root: its
        best ``nodes`` (default :attr:`nodes`)."""
        weighted: list[tuple[list[int], float]] = []
        n, found = history_continuations(history, self.history_ngram, self.history_matches, self.depth)
        weighted += [(tokens, self.history_weight * (1 + n)) for tokens in found]
        for store, mass in ((self.datastore, 1.0), (self.greedy, self.greedy_weight)):
            if store is not None:
                n, stored = store.continuations(history, self.depth, self.cap)
                weighted += [(tokens, mass * (1 + n) / len(stored)) for tokens in stored.tolist()]
        return best_nodes(weighted, self.nodes if nodes is None else nodes, self.depth)


@dataclass
class RetrievalRun(HistoryRun):
    """One decode of :class:`Retrieval`."""

    spec: Retrieval

    def propose(self, state: DecodeState, features: Features) -> RowTree:
        spec = self.spec
        first = opening_token(state, features)  # (b,)
        history, lengths = self.histories(state, first)  # (b, L), (b,)
        rows = [row[:n] for row, n in zip(history.tolist(), lengths.tolist())]  # the host read of the iteration
        deepest = max(0, min(spec.depth, state.width - 1))  # the room: a row's context may end sooner
        nodes = spec.nodes_for(len(rows))
        tries = [[p for p in spec.trie(row, nodes) if len(p) <= deepest] if deepest and nodes else [] for row in rows]
        return RowTree(row_trees(tries, first))


def row_trees(tries: list[list[tuple[int, ...]]], first: Tensor) -> RowTrees:
    """Each row's tree (b, N): the root ``first`` (b,) and the nodes of its trie (paths of tokens below the root, in
    depth order), N the largest tree's; a smaller tree is padded with copies of its root (depth 0, never the deepest)."""
    b = len(tries)
    size = 1 + max((len(t) for t in tries), default=0)
    root = first.tolist()
    tokens = [[r] * size for r in root]
    depths = [[0] * size for _ in range(b)]
    parents = [[0] * size for _ in range(b)]
    for i, paths in enumerate(tries):
        index = {(): 0}
        for j, path in enumerate(paths, start=1):
            index[path] = j
            tokens[i][j], depths[i][j], parents[i][j] = path[-1], len(path), index[path[:-1]]
    depth = max((len(p) for t in tries for p in t), default=0)
    made = [torch.tensor(rows, dtype=torch.long, device=first.device) for rows in (tokens, depths, parents)]
    return RowTrees.of(*made, depth)
