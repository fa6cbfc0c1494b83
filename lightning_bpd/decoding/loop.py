"""The one speculative decoding loop: propose -> verify -> judge -> commit -> keep. Torch only.

Every speculative method runs here; only the proposer changes (:mod:`~lightning_bpd.decoding.proposers`: the
model's own heads, a static or dynamic tree of them, a draft model, prompt lookup, a drafter of its own folder
(:mod:`lightning_bpd.drafters`), or one written outside the package). The loop owns the target and reads it through
the narrow :class:`~lightning_bpd.decoding.target.Target` (``target = target_of(model)``, once per decode): it runs
the prefill and every verify pass, and hands the proposer the hidden states of the layers it reads
(``drafter.reads``). Setup once (the prefill, the proposer's start on the prompts' features, the first call on the
start token), then per iteration::

    state.width = book.block_width(drafter.width, room)        # the room clamp, once for every proposer
    candidates  = drafter.propose(state, Features(last, first))  # a path (b, w) or a tree (b, N) per row
    candidates  = candidates.forced(rules, book)               # deterministic rules: the forced tokens, once
    hidden, fts = candidates.verify_pass(target, context, cache, drafter.reads)  # ONE call: target.verify
    outcome     = candidates.judge(target, criterion, rules, book, hidden)  # the criterion's verdict
    n, done     = book.commit(outcome.tokens, outcome.accepted)
    keep        = book.settle(n, done)                         # the iteration's one device-to-host read
    candidates.keep(cache, outcome, book)                      # crop the cache to what each row accepted
    drafter.advance(state, outcome, Features(layers=fts), rows)  # the proposer's own state (a drafter's cache)

``first`` is the token that opens the next proposal: greedy's token at the last accepted position (it comes with
the verdict, so a proposer never projects p_1 for it), or for sampling the residual draw (-1 where p_1 must still be
sampled). Rows that finish leave the batch. Greedy decoding (:func:`~lightning_bpd.decoding.greedy.greedy_decode`)
stays the baseline and beam search apart; fixed shapes live in :mod:`~lightning_bpd.decoding.static`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.candidates import Candidates
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.heads import Heads
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args, source_room
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.state import DecodeState, Features, Readout
from lightning_bpd.decoding.target import Target, target_of


def ask(drafter: Proposer, state: DecodeState, last: Tensor, first: Tensor | None) -> Candidates:
    """The proposer's candidates at each live row's tip (``last`` (b, D), ``first`` (b,)), under the room clamp
    and, for deterministic rules, with the tokens the generation rules force."""
    state.width = state.book.block_width(drafter.width, state.room)  # fewer where a row's context ends
    candidates = drafter.propose(state, Features(last=last, first=first))
    if state.criterion.stochastic:  # a draw keeps its own distribution
        return candidates
    return candidates.forced(state.rules, state.book)


@torch.no_grad()
def decode(model: BlockwiseModel | Target, src: Tensor, criterion: Criterion | None = None,
           proposer: Proposer | None = None, max_len: int = 256) -> DecodeResult:
    """Decode ``src`` (B, S) with ``proposer``'s candidates (default: the model's own heads,
    :class:`~lightning_bpd.decoding.proposers.Heads`), each iteration verified in one call of ``model``: a base
    (read through :func:`~lightning_bpd.decoding.target.target_of`) or a :class:`~lightning_bpd.decoding.target.Target`
    (with the :class:`~lightning_bpd.decoding.protocol.HeadsNetwork` where the proposer reads the model's heads).

    ``criterion`` defaults to :class:`~lightning_bpd.decoding.acceptance.Exact`, which reproduces greedy decoding of
    p_1 (under the model's generation rules) token for token, whatever the proposer. ``model_calls`` counts the
    target's decoder calls: the first on the start token, then one per iteration."""
    criterion = Exact() if criterion is None else criterion
    proposer = Heads() if proposer is None else proposer
    target = target_of(model)
    check_decode_args(target, src, max_len)
    criterion = proposer.check(model, criterion)
    criterion.reset(src.device)
    batch, device, spec = src.shape[0], src.device, target.spec
    rules = RuleBook(target, max_len, device, src)
    readout = Readout(target, getattr(model, "restrict_draft", None))  # the heads network's draft vocabulary
    state = DecodeState(criterion, rules, src, max_len, source_room(target, src), readout, model)
    layers = tuple(proposer.reads)
    context, prompt = target.prefill(src, layers)
    state.context = context
    drafter = proposer.start(state, Features() if prompt is None else prompt)
    cache = target.new_cache(batch, capacity=1 + max_len + drafter.width, extra_slots=drafter.extra_slots)
    state.book = book = RowBook(batch, max_len, drafter.width, spec.pad_id, device)
    bos = torch.full((batch, 1), spec.bos_id, dtype=torch.long, device=device)
    candidates = ask(drafter, state, target.verify(bos, context, cache)[0][:, -1], None)
    state.opened = True
    calls = 1
    while True:
        hidden, features = candidates.verify_pass(target, context, cache, layers)  # (b, N, D), (b, N, A * D)
        calls += 1
        outcome = candidates.judge(target, criterion, rules, book, hidden)
        n, done = book.commit(outcome.tokens, outcome.accepted, rules.stops)
        last = hidden.gather(1, outcome.at[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (b, D)
        keep = book.settle(n, done)  # the one host read of the iteration
        rows = None
        if keep is not None:
            if not keep:
                break
            rows = torch.tensor(keep, dtype=torch.long, device=device)
            context, last, outcome = context.select(rows), last[rows], outcome.select(rows)
            features = None if features is None else features[rows]
            state.context = context
            cache.select(rows)
        candidates.keep(cache, outcome, book)
        drafter.advance(state, outcome, Features(layers=features), rows)
        candidates = ask(drafter, state, last, outcome.first)
    return book.result(calls)
