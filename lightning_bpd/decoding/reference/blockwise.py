"""The slow, obviously correct blockwise parallel decoder: the oracle for the fast one. Torch only.

Section 3 of the paper taken literally, one row at a time, no padding, no KV cache: predict k
tokens with p_1..p_k at the end of the prefix; verify them by running the whole extended prefix
through the model and computing every head at every position (the naive k*k projections); accept
the longest prefix the criterion allows. Two full model passes per iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.generation_rules import BoundRules, reference_rules, ruled_at
from lightning_bpd.decoding.greedy import strip_padding
from lightning_bpd.decoding.proposers.heads import check_stop_below
from lightning_bpd.decoding.protocol import (
    BlockwiseModel,
    DecodeResult,
    Source,
    chain_source,
    check_decode_args,
    pack_rows,
    resolve_k,
    source_room,
)


def chained(model: BlockwiseModel) -> bool:
    return bool(model.chained_heads)


def reference_proposals(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int,
                        source: Source | None = None, stop_below: float | None = None,
                        rule: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """The k proposals (1, k) at hidden state h (1, D). Chained heads: head i is evaluated through the
    teacher-forced (training) path, fed the proposals of heads 1..i-1 made so far (and the source).
    ``stop_below``: the proposals end before the first head (2..k) that gives its own token less
    probability (the confidence stop; (1, <= k)). ``rule``: the generation rules on p_1's logits (1, 1, V) of
    token 1."""
    restrict = model.restrict_draft or (lambda logits: logits)  # heads 2..k: the draft vocabulary, when offered
    rule = rule or (lambda logits: logits)
    if not chained(model):
        logits = model.logits_heads(h, range(k))  # (1, k, V)
        heads = [restrict(logits[:, i : i + 1]) for i in range(1, k)]
        tokens = criterion.propose(rule(logits[:, :1]))  # (1, 1)
    else:
        tokens, heads = criterion.propose(rule(model.logits_heads(h, [0]))), []
    for i in range(1, k):
        if chained(model):
            heads.append(restrict(model.logits_heads(h, [i], prev_tokens=tokens, source=source)))  # (1, 1, V)
        token = criterion.propose(heads[i - 1])  # (1, 1)
        if stop_below is not None and float(torch.softmax(heads[i - 1].double(), -1)[0, 0, token[0, 0]]) < stop_below:
            break
        tokens = torch.cat([tokens, token], dim=1)  # (1, i + 1)
    return tokens


@torch.no_grad()
def blockwise_decode_reference(
    model: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int | None = None,
    stop_below: float | None = None,
) -> DecodeResult:
    """Same contract and results as :func:`~lightning_bpd.decoding.blockwise.blockwise_decode`."""
    criterion = criterion if criterion is not None else Exact()
    check_decode_args(model, src, max_len)
    k = resolve_k(model, k)
    criterion.validate(k)
    check_stop_below(stop_below, criterion)
    bound, stops, befores = reference_rules(model, src, max_len)  # befores: what the rules see before token 0
    room = source_room(model, src) or [k + max_len] * src.shape[0]  # inputs each row's context holds
    rows, blocks = [], []
    for row, (before, row_src) in enumerate(zip(befores, strip_padding(src, model.pad_id))):
        context = model.encode(row_src)
        out: list[int] = []
        row_blocks: list[int] = []
        while len(out) < max_len and (not out or out[-1] not in stops):
            prefix = [model.bos_id, *out]
            # Predict: every head at the last prefix position.
            h = model.decode_full(torch.tensor([prefix], device=src.device), context)  # (1, T, D)
            rule = None if bound is None else ruled_at(bound, [*before, *out], len(out))
            width = min(k, room[row] - len(out))  # fewer proposals where the row's context ends
            proposals = reference_proposals(model, criterion, h[:, -1], width, chain_source(model, context),
                                            stop_below, rule)  # (1, m), m <= width
            if bound is not None and not criterion.stochastic:  # the forced token where a rule forces one
                proposals = bound.force(proposals, len(out) + torch.arange(proposals.shape[1], device=src.device))
            # Verify: the extended prefix, every head everywhere (the paper's head; head 1 only for
            # chained heads, whose other heads need proposals), then keep p_1 after each proposal.
            m = proposals.shape[1]
            extended = torch.tensor([prefix + proposals[0].tolist()], device=src.device)
            h = model.decode_full(extended, context)  # (1, T + m, D)
            all_heads = model.logits_heads(h, [0] if chained(model) else range(k))  # (1, T + m, k or 1, V)
            verify = all_heads[:, len(prefix) : len(prefix) + m - 1, 0]  # (1, m - 1, V)
            verify = ruled_verify(bound, [*before, *out], proposals[0].tolist(), verify, len(out))
            n = min(int(criterion.accept(proposals, verify)[0]), m)
            # Accept: up to n tokens, stopping after an EOS id and at max_len.
            block = accepted_block(proposals[0, :n].tolist(), stops, max_len - len(out))
            out.extend(block)
            row_blocks.append(len(block))
        rows.append(out)
        blocks.append(row_blocks)
    return reference_result(rows, blocks, model.pad_id, src.device, calls_per_iteration=2)


def ruled_verify(bound: BoundRules | None, history: list[int], candidate: list[int], verify: Tensor,
                 done: int) -> Tensor:
    """p_1's logits (1, m - 1, V) after each token but the last of ``candidate`` (m tokens after ``done`` generated
    ones), under the generation rules as greedy would have seen them there: after ``history`` (what the rules see
    before the candidate) and the candidate's tokens so far. ``bound`` None: as they are."""
    if bound is None or len(candidate) < 2:
        return verify
    return torch.cat([ruled_at(bound, history + candidate[: j + 1], done + j + 1)(verify[:, j : j + 1])
                      for j in range(len(candidate) - 1)], dim=1)


def accepted_block(block: list[int], stops: tuple[int, ...], room: int) -> list[int]:
    """An accepted block cut after its first EOS id and to the ``room`` left before max_len."""
    ends = [i for i, t in enumerate(block) if t in stops]
    return (block[: ends[0] + 1] if ends else block)[:room]


def reference_result(rows: list[list[int]], blocks: list[list[int]], pad_id: int, device: torch.device,
                     calls_per_iteration: int = 0, calls: int | None = None) -> DecodeResult:
    """The references' :class:`DecodeResult` of decoded ``rows`` and their accepted ``blocks``."""
    lengths = torch.tensor([len(r) for r in rows], device=device)
    iterations = torch.tensor([len(b) for b in blocks], device=device)
    made = calls if calls is not None else calls_per_iteration * int(iterations.sum())
    return DecodeResult(pack_rows(rows, pad_id, device), lengths, iterations, made, blocks)
