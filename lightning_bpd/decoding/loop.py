"""The one speculative decoding loop: propose -> verify -> judge -> commit -> keep. Torch only.

Every speculative method runs here; only the proposer changes (:mod:`~lightning_bpd.decoding.proposers`: the
model's own heads, a static or dynamic tree of them, a draft model, prompt lookup, or one written outside the
package). Setup once, then per iteration::

    candidates = drafter.propose(run, last, first)           # a path (b, w) or a tree (b, N) per row
    hidden     = candidates.verify_pass(model, context, cache)  # ONE call of the target
    outcome    = candidates.judge(model, criterion, rules, book, hidden)  # the criterion's verdict
    n, done    = book.commit(outcome.tokens, outcome.accepted)
    keep       = book.settle(n, done)                        # the iteration's one device-to-host read
    candidates.keep(cache, outcome, book)                    # crop the cache to what each row accepted
    drafter.advance(run, outcome, rows)                      # the proposer's own state (a draft model's cache)

``first`` is the token that opens the next proposal: greedy's token at the last accepted position (it comes with
the verdict, so a proposer never projects p_1 for it), or for sampling the residual draw (-1 where p_1 must still be
sampled). Rows that finish leave the batch. Greedy decoding (:func:`~lightning_bpd.decoding.greedy.greedy_decode`)
stays the baseline and beam search apart; fixed shapes live in :mod:`~lightning_bpd.decoding.static`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.heads import Heads
from lightning_bpd.decoding.protocol import BlockwiseModel, Context, DecodeResult, check_decode_args, source_room
from lightning_bpd.decoding.row_book import RowBook


@dataclass
class Run:
    """The state of one decode that proposers may read: the target ``model``, the sources ``src`` (B, S), the rule,
    the generation ``rules``, each row's ``room`` (None: no bound), the live rows' ``context`` (once encoded) and, once the loop
    made it, the ``book`` of committed tokens (:class:`~lightning_bpd.decoding.row_book.RowBook`: ``book.live`` maps
    the live rows to the original ones)."""

    model: BlockwiseModel
    src: Tensor
    criterion: Criterion
    max_len: int
    rules: RuleBook
    room: list[int] | None
    context: Context = field(init=False)
    book: RowBook = field(init=False)
    opened: bool = False

    @property
    def device(self) -> torch.device:
        return self.src.device

    def p1(self) -> Any:
        """What reads p_1 for each live row's next token under the generation rules (None: the model itself): the
        opening's at the first proposal, then after each row's committed tokens."""
        if not self.opened:
            return self.rules.opening(self.src.shape[0])
        return self.rules.next(self.book)


@torch.no_grad()
def decode(model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None, proposer: Proposer | None = None,
           max_len: int = 256) -> DecodeResult:
    """Decode ``src`` (B, S) with ``proposer``'s candidates (default: the model's own heads,
    :class:`~lightning_bpd.decoding.proposers.Heads`), each iteration verified in one call of ``model``.

    ``criterion`` defaults to :class:`~lightning_bpd.decoding.acceptance.Exact`, which reproduces greedy decoding of
    p_1 (under the model's generation rules) token for token, whatever the proposer. ``model_calls`` counts the
    target's decoder calls: the first on the start token, then one per iteration."""
    criterion = Exact() if criterion is None else criterion
    proposer = Heads() if proposer is None else proposer
    check_decode_args(model, src, max_len)
    criterion = proposer.check(model, criterion)
    criterion.reset(src.device)
    batch, device = src.shape[0], src.device
    run = Run(model, src, criterion, max_len, RuleBook(model, max_len, device, src), source_room(model, src))
    drafter = proposer.start(run)
    run.context = drafter.encode(run)  # the model's own encode, or one the proposer also reads (a drafter's features)
    cache = model.new_cache(batch, capacity=1 + max_len + drafter.width, extra_slots=drafter.extra_slots)
    run.book = book = RowBook(batch, max_len, drafter.width, model.pad_id, device)
    bos = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=device)
    candidates = drafter.propose(run, model.decode_step(bos, run.context, cache)[:, -1], None)
    run.opened = True
    calls = 1
    while True:
        hidden = candidates.verify_pass(model, run.context, cache)  # (b, N, D)
        calls += 1
        outcome = candidates.judge(model, criterion, run.rules, book, hidden)
        n, done = book.commit(outcome.tokens, outcome.accepted, run.rules.stops)
        last = hidden.gather(1, outcome.at[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (b, D)
        keep = book.settle(n, done)  # the one host read of the iteration
        rows = None
        if keep is not None:
            if not keep:
                break
            rows = torch.tensor(keep, dtype=torch.long, device=device)
            run.context, last, outcome = run.context.select(rows), last[rows], outcome.select(rows)
            cache.select(rows)
        candidates.keep(cache, outcome, book)
        drafter.advance(run, outcome, rows)
        candidates = drafter.propose(run, last, outcome.first)
    return book.result(calls)
