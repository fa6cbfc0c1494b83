"""Decoding methods by name, for the command line and the validation callback. Torch only.

A method spec is one of:

- ``greedy``: cached greedy decoding of p_1 (the baseline of every deterministic rule);
- ``ancestral``, ``ancestral_t0.7``, ``ancestral_t0.7_p0.9``: cached ancestral sampling from p_1
  (the baseline of speculative sampling with the same temperature and top-p);
- a criterion (``exact``, ``top2``, ``eps2``, ``min2_top3``, ``sample_t0.7``, ...): blockwise
  decoding, the model's own heads proposing;
- any of them with another proposer than the heads (``make_method(..., proposer=PromptLookup())``);
- ``draft:<criterion>``: a separate draft model proposes, the model verifies
  (:func:`~lightning_bpd.decoding.draft.draft_decode`);
- ``beam4``, ``beam4_a0.6``: beam search over p_1 with that beam size and length penalty alpha
  (default 0.6), e.g. for sequence-level distillation.

Every blockwise method has a baseline (:attr:`DecodeMethod.baseline`): what it must reproduce
(exact acceptance) or whose distribution it keeps (sampling), and what its speedup is measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact, SpeculativeSampling
from lightning_bpd.decoding.beam import beam_search
from lightning_bpd.decoding.blockwise import blockwise_decode
from lightning_bpd.decoding.draft import check_draft_args, draft_decode
from lightning_bpd.decoding.greedy import greedy_decode
from lightning_bpd.decoding.loop import decode
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.heads import check_stop_below
from lightning_bpd.decoding.proposers.tree import check_tree_args
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, resolve_k
from lightning_bpd.decoding.sampling import check_sampling_args, new_generator, sample_decode
from lightning_bpd.decoding.static import static_decode
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree

DRAFT_PREFIX = "draft:"


def parse_ancestral(spec: str) -> tuple[float, float]:
    """``ancestral[_tX][_pY]`` -> (temperature, top_p)."""
    options = {"t": 1.0, "p": 1.0}
    seen: set[str] = set()
    for part in spec.split("_")[1:]:
        if part[:1] not in options or part[0] in seen:
            raise ValueError(f"bad ancestral sampling option {part!r} in {spec!r} (use ancestral_t0.7_p0.9)")
        try:
            options[part[0]] = float(part[1:])
        except ValueError:
            raise ValueError(f"bad ancestral sampling option {part!r} in {spec!r} (use ancestral_t0.7_p0.9)") from None
        seen.add(part[0])
    check_sampling_args(options["t"], options["p"])
    return options["t"], options["p"]


def parse_beam(spec: str) -> tuple[int, float]:
    """``beam4`` or ``beam4_a0.6`` -> (beam size, length penalty alpha)."""
    size, _, rest = spec.removeprefix("beam").partition("_")
    try:
        beam = int(size)
        alpha = float(rest[1:]) if rest else 0.6
        if beam < 1 or alpha < 0 or (rest and not rest.startswith("a")):
            raise ValueError
    except ValueError:
        raise ValueError(f"bad beam method {spec!r}: use beamN or beamN_aX (N >= 1, X >= 0), e.g. beam4_a0.6") from None
    return beam, alpha


def ancestral_name(criterion: SpeculativeSampling) -> str:
    return f"ancestral_t{criterion.temperature:g}_p{criterion.top_p:g}"


@dataclass
class DecodeMethod:
    """One named way to decode. Call it like a decode function: ``method(model, src, max_len)``."""

    spec: str
    criterion: Criterion | None = None  # None: a baseline (greedy or ancestral sampling)
    k: int | None = None
    draft: BlockwiseModel | None = None
    temperature: float | None = None  # ancestral sampling only
    top_p: float = 1.0
    seed: int | None = 0
    lazy: bool = False  # blockwise prefix rules: verify position by position (see verify.verify_lazily)
    beam: int | None = None  # beam search with this beam size (and ``alpha``)
    alpha: float = 0.6
    fixed_shape: bool = False  # greedy / deterministic rules: fixed shapes, CUDA graphs on CUDA (decoding.static)
    stop_below: float | None = None  # deterministic rules: the confidence stop (proposers.heads.propose)
    tree: Tree | DynamicTree | None = None  # prefix rules and sampling: verify this tree of candidates
    # (proposers.HeadTree); exact: a DynamicTree grows one per row and iteration (proposers.DynamicHeadTree)
    proposer: Proposer | None = None  # blockwise rules: this proposer instead of the model's heads (decoding.loop)

    @property
    def is_baseline(self) -> bool:
        return self.criterion is None

    @property
    def is_sampling(self) -> bool:
        """Random outputs (temperature > 0): compared by distribution, not token for token."""
        if self.criterion is None:
            return self.temperature is not None and self.temperature > 0
        return isinstance(self.criterion, SpeculativeSampling) and self.criterion.stochastic

    @property
    def baseline(self) -> str:
        """Spec of the method this one is compared with: ``greedy`` or ``ancestral_t.._p..``."""
        if self.criterion is None:
            return self.spec
        if isinstance(self.criterion, SpeculativeSampling) and self.criterion.stochastic:
            return ancestral_name(self.criterion)
        return "greedy"

    def block_size(self, model: BlockwiseModel) -> int:
        """Tokens proposed per model call: the heads used, or the draft's block size."""
        if self.criterion is None:
            return 1
        if self.draft is not None:
            return int(self.k)  # type: ignore[arg-type]
        if self.proposer is not None:
            return self.proposer.width
        if self.tree is not None:
            return self.tree.depth + 1
        return resolve_k(model, self.k)

    def __call__(self, model: BlockwiseModel, src: Tensor, max_len: int) -> DecodeResult:
        if self.beam is not None:
            return beam_search(model, src, max_len, beam_size=self.beam, alpha=self.alpha)
        if self.fixed_shape:  # greedy (k = 1) or a deterministic rule with the model's own heads
            k = 1 if self.criterion is None else self.k
            return static_decode(model, src, self.criterion or Exact(), max_len, k=k)
        if self.criterion is None:
            if self.temperature is None:
                return greedy_decode(model, src, max_len)
            generator = new_generator(self.seed, src.device)
            return sample_decode(model, src, max_len, self.temperature, self.top_p, generator)
        if self.proposer is not None:
            return decode(model, src, self.criterion, self.proposer, max_len)
        if self.draft is not None:
            return draft_decode(model, self.draft, src, self.criterion, max_len, k=int(self.k))  # type: ignore[arg-type]
        return blockwise_decode(model, src, self.criterion, max_len, k=self.k, lazy=self.lazy,
                                stop_below=self.stop_below, tree=self.tree)


def make_method(
    spec: str,
    make_criterion: Callable[[str], Criterion],
    model: BlockwiseModel,
    k: int | None = None,
    draft: BlockwiseModel | None = None,
    seed: int | None = 0,
    lazy: bool = False,
    fixed_shape: bool = False,
    stop_below: float | None = None,
    tree: Tree | DynamicTree | None = None,
    proposer: Proposer | None = None,
) -> DecodeMethod:
    """Build (and check) the method named ``spec`` for ``model``; raise ValueError saying what to fix.

    ``make_criterion`` turns a criterion name into a rule (tasks add their intensity values for eps).
    ``k`` is the number of heads used (default: all) or, for a draft, the block size (default: the
    model's k, at least 2). ``seed`` seeds the random numbers of sampling methods (reseeded at
    every decode call). ``lazy`` makes blockwise prefix rules verify position by position;
    ``fixed_shape`` decodes greedy and the deterministic rules with fixed shapes
    (:mod:`~lightning_bpd.decoding.static`: CUDA graphs on CUDA, no row compaction). ``stop_below`` is the
    confidence stop of the deterministic rules with the model's own heads (:func:`~lightning_bpd.decoding.
    proposers.heads.propose`); other methods ignore it, so one value can apply to a whole list of methods. ``tree``
    (:class:`~lightning_bpd.decoding.trees.tree.Tree`): the deterministic prefix rules and speculative sampling of the
    model's own heads verify that tree of candidates (:class:`~lightning_bpd.decoding.proposers.HeadTree`); a
    :class:`~lightning_bpd.decoding.trees.tree.DynamicTree` grows one per row and iteration (exact only); other
    methods ignore it. ``proposer`` (:mod:`~lightning_bpd.decoding.proposers`, e.g.
    :class:`~lightning_bpd.decoding.proposers.PromptLookup`): the blockwise rules decode with it instead of the
    model's heads (the other methods ignore it); it takes no tree, fixed shapes, confidence stop or lazy verification.
    """
    s = spec.strip()
    method = build_method(s, make_criterion, model, k, draft, seed, lazy)
    if proposer is not None and method.criterion is not None and method.draft is None:
        if tree is not None or fixed_shape or stop_below is not None or lazy:
            raise ValueError(f"{type(proposer).__name__} proposes on its own: it takes no tree, fixed shapes, "
                             "confidence stop or lazy verification")
        method.criterion = proposer.check(model, method.criterion)
        method.proposer = proposer
        return method
    if tree is not None and method.criterion is not None and method.draft is None:
        check_tree_args(model, method.criterion, tree, k)
        if fixed_shape or stop_below is not None or lazy:
            raise ValueError("a tree of candidates takes neither fixed shapes, a confidence stop nor lazy verification")
        method.tree = tree
        return method
    if stop_below is not None and method.criterion is not None and method.draft is None and not method.is_sampling:
        check_stop_below(stop_below, method.criterion)
        if fixed_shape:
            raise ValueError("the confidence stop makes blocks shorter than k: fixed-shape decoding cannot take it")
        method.stop_below = stop_below
    if fixed_shape:
        if method.beam is not None or method.draft is not None or method.is_sampling or method.temperature is not None:
            raise ValueError(f"method {spec!r} has no fixed-shape decoder: fixed shapes cover greedy and the "
                             "deterministic rules of the model's own heads (exact, topN, epsX, minL_...)")
        method.fixed_shape = True
    return method


def build_method(s: str, make_criterion: Callable[[str], Criterion], model: BlockwiseModel, k: int | None,
                 draft: BlockwiseModel | None, seed: int | None, lazy: bool) -> DecodeMethod:
    """:func:`make_method` before the fixed-shape choice."""
    spec = s
    if s == "greedy":
        return DecodeMethod(s)
    if s.startswith("beam"):
        beam, alpha = parse_beam(s)
        return DecodeMethod(s, beam=beam, alpha=alpha)
    if s == "ancestral" or s.startswith("ancestral_"):
        temperature, top_p = parse_ancestral(s)
        return DecodeMethod(s, temperature=temperature, top_p=top_p, seed=seed)
    if s.startswith(DRAFT_PREFIX):
        if draft is None:
            raise ValueError(f"method {spec!r} needs a draft model (give --draft CKPT)")
        block = k if k is not None else max(2, model.k)
        check_draft_args(model, draft, block)
        criterion = seeded(make_criterion(s[len(DRAFT_PREFIX):]), seed)
        criterion.validate(block)
        return DecodeMethod(s, criterion, block, draft, seed=seed)
    criterion = seeded(make_criterion(s), seed)
    criterion.validate(resolve_k(model, k))
    return DecodeMethod(s, criterion, k, seed=seed, lazy=lazy)


def seeded(criterion: Criterion, seed: int | None) -> Criterion:
    """``criterion`` with its random seed set (sampling rules; the others draw no random numbers)."""
    if isinstance(criterion, SpeculativeSampling):
        criterion.seed = seed
    return criterion


def acceptance_rate(block_sizes: list[list[int]], k: int) -> float:
    """Share of proposed tokens 2..k that were accepted: sum(block - 1) / sum(k - 1).

    Each row's last block is left out, since EOS or the length limit may cut it short whatever the
    verdict (a draft identical to the model scores exactly 1). NaN when no row has two blocks.
    """
    inner = [b for row in block_sizes for b in row[:-1]]
    if k < 2 or not inner:
        return float("nan") if not inner else 1.0
    return sum(b - 1 for b in inner) / (len(inner) * (k - 1))


def with_baselines(specs: list[str], methods: dict[str, DecodeMethod], make: Callable[[str], DecodeMethod]) -> list[str]:
    """``specs`` with the baseline of each method put in front (once each), building the missing ones."""
    order: list[str] = []
    for spec in specs:
        base = methods[spec].baseline
        if base not in methods:
            methods[base] = make(base)
        if base not in order:
            order.append(base)
    return order + [s for s in specs if s not in order]
