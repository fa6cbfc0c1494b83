"""Acceptance rules for blockwise parallel decoding (Stern et al., 2018, sections 3 and 5). Torch only.

Every iteration proposes k tokens ``y_1..y_k``; y_1 always comes from the scoring model p_1 at a
verified position, so it is always accepted. Token y_{i+1} (i >= 1) is checked against p_1 at the
position after y_i (``verify_logits[:, i - 1]``), and the accepted block is the longest prefix
whose checks all pass:

- :class:`Exact`: y_{i+1} is the argmax of p_1 (reproduces greedy decoding exactly);
- :class:`TopK`: y_{i+1} is among the n most likely tokens of p_1;
- :class:`Distance`: |value(y_{i+1}) - value(argmax p_1)| <= eps (pixel intensities);
- :class:`MinBlock`: accept at least l tokens per iteration, whatever an inner rule says;
- :class:`SpeculativeSampling`: lossless sampling; the output is distributed exactly as ancestral
  sampling from p_1 (with a temperature and top-p).

A decode loop talks to a rule through two calls per iteration: :meth:`Criterion.draft` turns the
proposal logits into a :class:`Block` (the tokens, and for sampling rules the distributions they
were drawn from), and :meth:`Criterion.judge` turns the block and the verify logits into a
:class:`Verdict` (the accepted sizes and, for sampling rules, the token that must open each row's
next block). The deterministic rules only define :meth:`Criterion.matches`; ``draft`` and
``judge`` then reduce to ``propose`` and ``accept``.

A rule also owns its verdict where the decoders read a model's hidden states for it:
:meth:`Criterion.first_token` (token 1 of a block), :meth:`Criterion.verify` (a whole verify pass)
and :meth:`Criterion.check_position` (one position of it, for the lazy check). By default they
project p_1 and apply ``propose``, ``accept`` and ``matches``; :class:`Exact` takes greedy's token
instead (:func:`~lightning_bpd.decoding.protocol.first_argmax`: the model's own argmax when it
offers one), which decides the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import BlockwiseModel, first_argmax
from lightning_bpd.decoding.sampling import (
    accept_draws,
    check_sampling_args,
    new_generator,
    probabilities,
    residual,
    sample,
)
from lightning_bpd.nn.argmax import argmax


@dataclass
class Block:
    """The k proposals of each row and, for sampling rules, the distribution each was drawn from."""

    tokens: Tensor  # (B, k) long
    probs: Tensor | None = None  # (B, k, V): q_i for token i (column 0, from p_1 or a carried token, is unused)
    widths: Tensor | None = None  # (B,) long: tokens each row proposes (the rest fills the block); None: all

    @staticmethod
    def cat(parts: list[Block]) -> Block:
        """Join blocks of the same rows along the token axis (e.g. one per draft-model step)."""
        tokens = torch.cat([b.tokens for b in parts], dim=1)  # (B, sum m)
        given = [b.probs for b in parts if b.probs is not None]
        if not given:
            return Block(tokens)
        # a part without distributions (a carried token) gets zeros: its column is never judged
        probs = [b.probs if b.probs is not None else given[0].new_zeros(*b.tokens.shape, given[0].shape[-1])
                 for b in parts]
        return Block(tokens, torch.cat(probs, dim=1))  # (B, sum m, V)


@dataclass
class Verdict:
    """What a rule decided about a block: how many tokens each row keeps, and what opens its next block."""

    accepted: Tensor  # (B,) long in [1, k]
    next_first: Tensor | None = None  # (B,) long: the next block's first token, -1 where p_1 draws it afresh


def with_first(tokens: Tensor, first: Tensor | None) -> Tensor:
    """``tokens`` (B, m) with column 0 replaced by ``first`` (B,) wherever ``first`` >= 0."""
    if first is None:
        return tokens
    out = tokens.clone()
    out[:, 0] = torch.where(first >= 0, first, tokens[:, 0])
    return out


class Criterion(ABC):
    """Decides how many of the k proposed tokens each row accepts."""

    stochastic: bool = False  # whether draft/judge draw random numbers (then accept/matches are unusable)
    # whether the verdict is the longest prefix of independent per-position checks (``matches``) with
    # y_1 always the argmax of p_1: the decoder may then check positions one at a time and stop at the
    # first failure (see ``lightning_bpd.decoding.verify.verify_lazily``)
    prefix_checks: bool = False

    def validate(self, k: int) -> None:
        """Raise ValueError if this rule cannot run with block size ``k``."""

    def reset(self, device: torch.device | str = "cpu") -> None:
        """Called by the decoders at the start of every decode (sampling rules reseed here)."""

    def draft(self, logits: Tensor, first: Tensor | None = None) -> Block:
        """The block proposed by logits (B, m, V); ``first`` (B,), where >= 0, overrides token 1."""
        return Block(with_first(self.propose(logits), first))

    def judge(self, block: Block, verify_logits: Tensor) -> Verdict:
        """The verdict on ``block`` (B, k) given p_1 logits (B, k-1, V) after tokens 1..k-1."""
        return Verdict(self.accept(block.tokens, verify_logits))

    def propose(self, logits: Tensor) -> Tensor:
        """Proposals from the heads' logits (B, k, V) -> tokens (B, k): the argmax of each head."""
        return argmax(logits)

    @abstractmethod
    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        """Per-position checks: proposals (B, m), verify_logits (B, m, V) -> bool (B, m)."""

    def accept(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        """Accepted block sizes (B,) in [1, k] for proposals (B, k) and p_1 logits (B, k-1, V)."""
        ok = self.matches(proposals[:, 1:], verify_logits)  # (B, k-1)
        return 1 + ok.long().cumprod(dim=-1).sum(dim=-1)

    # ---- the verdict from a model's hidden states (deterministic rules) ---------------------------------------
    def first_token(self, model: BlockwiseModel, h: Tensor) -> Tensor:
        """Token 1 of the block proposed at hidden states h (b, D): from p_1 -> (b,)."""
        return self.propose(model.logits_first(h)[:, None])[:, 0]

    def verify(self, model: BlockwiseModel, tokens: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """The verdict on a block ``tokens`` (b, m) from its verify pass ``hidden`` (b, m, D): accepted sizes
        (b,) in [1, m] (:meth:`accept`) and greedy's token after each position (b, m), whose entry at the
        last accepted position opens the row's next block."""
        logits = model.logits_first(hidden)  # (b, m, V): p_1 after each proposed token
        return self.accept(tokens, logits[:, :-1]), argmax(logits)

    def check_position(self, model: BlockwiseModel, token: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """One check of a prefix rule: whether ``token`` (a,) passes against p_1 at the hidden state h (a, D)
        of the position before it (:meth:`matches`), and greedy's token there (a,)."""
        logits = model.logits_first(h)[:, None]  # (a, 1, V)
        return self.matches(token[:, None], logits)[:, 0], argmax(logits[:, 0])

    @property
    def name(self) -> str:
        return type(self).__name__.lower()


class Exact(Criterion):
    """Accept while the proposal equals the argmax of p_1: the output equals greedy decoding.

    Its verdict needs only greedy's token at each position (:func:`first_argmax`), not p_1's logits."""

    prefix_checks = True

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return proposals == argmax(verify_logits)

    def first_token(self, model: BlockwiseModel, h: Tensor) -> Tensor:
        return first_argmax(model, h)  # (b,): greedy's token

    def verify(self, model: BlockwiseModel, tokens: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        best = first_argmax(model, hidden)  # (b, m): greedy's token after each proposed one
        return 1 + (tokens[:, 1:] == best[:, :-1]).long().cumprod(dim=-1).sum(dim=-1), best

    def check_position(self, model: BlockwiseModel, token: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        best = first_argmax(model, h)  # (a,)
        return token == best, best

    @property
    def name(self) -> str:
        return "exact"


class TopK(Criterion):
    """Accept while the proposal is among the ``n`` highest-scoring tokens of p_1 (section 5.1)."""

    prefix_checks = True

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"TopK n must be an integer >= 1, got {n!r}")
        self.n = n

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        n = min(self.n, verify_logits.shape[-1])
        top = verify_logits.topk(n, dim=-1).indices  # (B, m, n)
        return (top == proposals.unsqueeze(-1)).any(dim=-1)

    @property
    def name(self) -> str:
        return f"top{self.n}"


class Distance(Criterion):
    """Accept while |value(proposal) - value(argmax p_1)| <= eps (section 5.2).

    ``values`` (V,) maps token ids to the quantity compared (e.g. pixel intensity); by default a
    token's value is its id. Give special tokens a value far from every other (or NaN) so they
    are only ever accepted on an exact match.
    """

    prefix_checks = True

    def __init__(self, eps: float, values: Tensor | None = None) -> None:
        if eps < 0:
            raise ValueError(f"Distance eps must be >= 0, got {eps}")
        self.eps = eps
        self.values = values

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        best = argmax(verify_logits)  # (B, m)
        if self.values is None:
            u, v = proposals.to(torch.float64), best.to(torch.float64)
        else:
            values = self.values.to(device=proposals.device, dtype=torch.float64)
            u, v = values[proposals], values[best]
        return (proposals == best) | ((u - v).abs() <= self.eps)

    @property
    def name(self) -> str:
        return f"eps{self.eps:g}"


class MinBlock(Criterion):
    """Accept at least ``l`` tokens per iteration, more when ``inner`` accepts more (section 5.3)."""

    def __init__(self, l: int, inner: Criterion | None = None) -> None:
        if not isinstance(l, int) or l < 1:
            raise ValueError(f"MinBlock l must be an integer >= 1, got {l!r}")
        self.l = l
        self.inner = inner if inner is not None else Exact()

    def validate(self, k: int) -> None:
        if self.l > k:
            raise ValueError(f"MinBlock l must lie in [1, k] = [1, {k}], got l={self.l}")
        if self.inner.stochastic:
            raise ValueError(f"MinBlock needs a deterministic inner rule, got {self.inner.name}")
        self.inner.validate(k)

    def propose(self, logits: Tensor) -> Tensor:
        return self.inner.propose(logits)

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return self.inner.matches(proposals, verify_logits)

    def accept(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return self.inner.accept(proposals, verify_logits).clamp(min=min(self.l, proposals.shape[1]))

    @property
    def name(self) -> str:
        return f"min{self.l}_{self.inner.name}"


class SpeculativeSampling(Criterion):
    """Lossless sampling: the output is distributed exactly as ancestral sampling from p_1.

    Every distribution is :func:`~lightning_bpd.decoding.sampling.probabilities` of the logits with
    this ``temperature`` and ``top_p``. Token 1 of a block is drawn from p_1 (always accepted) or
    is the residual token carried over from the previous block; token i >= 2 is drawn from q_i
    (head i, or a draft model's step i) and accepted with probability min(1, p(x) / q_i(x)), p
    being p_1 after token i-1. At the first rejection a token is drawn from normalize(max(0, p - q_i))
    and returned as :attr:`Verdict.next_first`: it opens the next block. Temperature 0 is greedy
    (exactly :class:`Exact`). Random numbers come from a generator reseeded with ``seed`` at every
    decode (a fresh random seed when None), or from ``generator`` when one is given (never reseeded).
    With a tree of candidates the children are drawn and judged by SpecInfer's walk instead
    (:mod:`~lightning_bpd.decoding.tree_sampling`).
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = 0,
                 generator: torch.Generator | None = None) -> None:
        check_sampling_args(temperature, top_p)
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), seed
        self.given = generator
        self.generator = generator
        self.greedy = Exact() if temperature == 0 else None
        self.stochastic = self.greedy is None

    def reset(self, device: torch.device | str = "cpu") -> None:
        if self.given is None:
            self.generator = new_generator(self.seed, device)

    def rng(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.reset(device)
        return self.generator  # type: ignore[return-value]

    def distribution(self, logits: Tensor) -> Tensor:
        """Sampling distribution (..., V) of logits (..., V)."""
        return probabilities(logits, self.temperature, self.top_p)

    def propose(self, logits: Tensor) -> Tensor:
        return self.draft(logits).tokens

    def draft(self, logits: Tensor, first: Tensor | None = None) -> Block:
        if self.greedy is not None:
            return self.greedy.draft(logits, first)
        probs = self.distribution(logits)  # (B, m, V)
        return Block(with_first(sample(probs, self.rng(logits.device)), first), probs)

    def judge(self, block: Block, verify_logits: Tensor) -> Verdict:
        if self.greedy is not None:
            return self.greedy.judge(block, verify_logits)
        if block.probs is None:
            raise ValueError("SpeculativeSampling.judge needs the block's proposal distributions (use its draft)")
        b, k = block.tokens.shape
        accepted = torch.ones(b, dtype=torch.long, device=block.tokens.device)  # (B,)
        next_first = torch.full_like(accepted, -1)  # (B,)
        if k == 1:
            return Verdict(accepted, next_first)
        g = self.rng(block.tokens.device)
        p = self.distribution(verify_logits)  # (B, k-1, V): p_1 after tokens 1..k-1
        q = block.probs[:, 1:]  # (B, k-1, V): q_2..q_k
        ok = accept_draws(block.tokens[:, 1:], p, q, g)  # (B, k-1)
        accepted = accepted + ok.long().cumprod(dim=-1).sum(dim=-1)
        rejected = (accepted < k).nonzero().squeeze(1)  # (r,) rows that rejected a draft token
        if rejected.numel() > 0:
            j = accepted[rejected] - 1  # (r,): index into p, q of the rejected token
            next_first[rejected] = sample(residual(p[rejected, j], q[rejected, j]), g)
        return Verdict(accepted, next_first)

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        if self.greedy is not None:
            return self.greedy.matches(proposals, verify_logits)
        raise TypeError("SpeculativeSampling decides in judge(), from the distributions its draft() drew from")

    def accept(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        if self.greedy is not None:
            return self.greedy.accept(proposals, verify_logits)
        raise TypeError("SpeculativeSampling decides in judge(), from the distributions its draft() drew from")

    @property
    def name(self) -> str:
        return f"sample_t{self.temperature:g}_p{self.top_p:g}"


def parse_sampling(spec: str) -> SpeculativeSampling:
    """``sample``, ``sample_t0.7``, ``sample_p0.9`` or ``sample_t0.7_p0.9`` (seed 0)."""
    kwargs: dict[str, float] = {}
    for part in spec.split("_")[1:]:
        if part[:1] not in ("t", "p") or part[0] in kwargs:
            raise ValueError(f"bad sampling option {part!r}")
        kwargs[part[0]] = float(part[1:])
    return SpeculativeSampling(temperature=kwargs.get("t", 1.0), top_p=kwargs.get("p", 1.0))


def parse_criterion(spec: str, values: Tensor | None = None) -> Criterion:
    """Build a criterion from a short name: ``exact``, ``top3``, ``eps2``, ``min2``, ``min2_top3`` or
    ``sample_t0.7_p0.9``."""
    s = spec.strip().lower()
    try:
        if s == "exact":
            return Exact()
        if s == "sample" or s.startswith("sample_"):
            return parse_sampling(s)
        if s.startswith("top"):
            return TopK(int(s[3:]))
        if s.startswith("eps"):
            return Distance(float(s[3:]), values)
        if s.startswith("min"):
            head, _, rest = s.partition("_")
            return MinBlock(int(head[3:]), parse_criterion(rest, values) if rest else Exact())
    except ValueError as err:
        if "must" in str(err):
            raise
    raise ValueError(
        f"unknown criterion {spec!r}: use exact, topN (e.g. top2), epsX (e.g. eps2), minL, minL_<rule> "
        "or sample[_tT][_pP] (e.g. sample_t0.7_p0.9)"
    )
