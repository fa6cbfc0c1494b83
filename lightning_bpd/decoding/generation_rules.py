"""The generation config's rules on p_1: what a checkpoint's own greedy ``generate`` applies. Torch only.

A Hugging Face checkpoint ships a generation config whose logits processors change greedy's output: a forced
first token (mBART-50, NLLB pick the target language so), a forced EOS at the last position the length cap
allows (opus-mt), a list of EOS ids (Llama 3, Qwen), suppressed tokens, banned words of one or more tokens, a
minimum length. :class:`GenerationRules` holds them, model-agnostic: an adapter reads its checkpoint's config
and hands the rules over as its ``generation_rules`` (:class:`~lightning_bpd.decoding.protocol.BlockwiseModel`).

Every decoder applies them to p_1 wherever p_1 is read (the first token, the verify pass, greedy's own step),
so exact blockwise decoding stays equal to greedy, and greedy to ``generate``, by construction. A rule depends
on the index of the generated token (``index``: 0 for the first) and, for banned words of several tokens, on
the tokens before it (``tail``: the last ``window`` tokens of the decoder's inputs, the start token included,
-1 before it). :class:`BoundRules` (the rules of one decode: its length cap, its device) applies them in
``generate``'s order (:meth:`BoundRules.apply`), and gives greedy's token cheaply (:meth:`BoundRules.argmax`):
the plain argmax wherever no rule touches it, the ruled logits' argmax where one does. A rule costs a table
lookup per position, not a pass.

History-dependent penalties (``no_repeat_ngram_size``, ``repetition_penalty``, ...) are not applied: an adapter
lists them in ``refused`` and every decoder refuses to run with one line naming the setting
(:meth:`GenerationRules.check`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.target import target_of
from lightning_bpd.nn.argmax import argmax


@dataclass(frozen=True)
class GenerationRules:
    """A checkpoint's rules on p_1, as ``generate`` counts them.

    ``start``: decoder inputs before the first generated token, as ``generate`` counts its ``input_ids`` (1 for
    an encoder-decoder: the decoder start token). ``min_length`` counts them too (``generate``'s ``min_length``);
    ``min_new_tokens`` does not. ``prompt_start``: ``start`` is the width of the padded sources of each decode (a
    causal LM's prompts, left-padded as ``generate`` takes them), set by :meth:`at_width`. ``forced_eos``: the EOS ids forced at the last index the cap allows (empty: no
    forced EOS). ``refused``: one line per setting that changes greedy's output and is not applied.
    """

    eos_ids: tuple[int, ...] = ()
    forced_bos: int | None = None
    forced_eos: tuple[int, ...] = ()
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    min_length: int = 0
    min_new_tokens: int = 0
    start: int = 1
    refused: tuple[str, ...] = ()
    prompt_start: bool = False

    def __post_init__(self) -> None:
        ids = [*self.eos_ids, *self.forced_eos, *self.suppress, *self.begin_suppress,
               *(t for w in self.bad_words for t in w), *([] if self.forced_bos is None else [self.forced_bos])]
        if any(not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"generation rules: token ids must be integers >= 0, got {ids}")
        if any(len(w) == 0 for w in self.bad_words):
            raise ValueError("generation rules: a banned word needs at least one token")
        for name, value in (("min_length", self.min_length), ("min_new_tokens", self.min_new_tokens),
                            ("start", self.start)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"generation rules: {name} must be an integer >= 0, got {value!r}")

    @property
    def active(self) -> bool:
        """Whether any rule can change p_1's argmax (a list of EOS ids alone does not)."""
        return bool(self.forced_bos is not None or self.forced_eos or self.suppress or self.begin_suppress
                    or self.bad_words or self.eos_ban_until > 0)

    @property
    def eos_ban_until(self) -> int:
        """EOS ids are banned at generated indices below this (``min_length`` and ``min_new_tokens``)."""
        return max(self.min_length - self.start, self.min_new_tokens, 0) if self.eos_ids else 0

    @property
    def window(self) -> int:
        """Tokens of history the banned words of several tokens look at (0: none)."""
        return max((len(w) - 1 for w in self.bad_words), default=0)

    def at_width(self, width: int) -> GenerationRules:
        """The rules of a decode of sources (B, ``width``): ``start`` is that width where ``prompt_start``."""
        return replace(self, start=width) if self.prompt_start else self

    def check(self) -> None:
        """Raise ValueError with the first setting that is not applied (see ``refused``)."""
        if self.refused:
            raise ValueError(self.refused[0])

    def bind(self, max_len: int, vocab_size: int, device: torch.device | str = "cpu") -> BoundRules:
        """The rules of one decode: at most ``max_len`` new tokens over a vocabulary of ``vocab_size``."""
        self.check()
        return BoundRules(self, max_len, vocab_size, torch.device(device))


def table(ids: tuple[int, ...] | list[int], vocab_size: int, device: torch.device) -> Tensor:
    """A (V,) bool table, True at ``ids`` (ids past the vocabulary are ignored, as a mask over it would)."""
    out = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    inside = [i for i in ids if i < vocab_size]
    if inside:
        out[torch.tensor(inside, dtype=torch.long, device=device)] = True
    return out


class BoundRules:
    """:class:`GenerationRules` for one decode of at most ``max_len`` new tokens, as tensors on ``device``."""

    def __init__(self, rules: GenerationRules, max_len: int, vocab_size: int, device: torch.device) -> None:
        self.rules, self.max_len, self.vocab_size, self.device = rules, max_len, vocab_size, device
        eos = set(rules.eos_ids)
        single = [w[0] for w in rules.bad_words if len(w) == 1 and w[0] not in eos]  # generate keeps [eos] allowed
        self.bad = table(single, vocab_size, device)  # (V,)
        self.suppress = table(rules.suppress, vocab_size, device)  # (V,)
        self.banned = self.bad | self.suppress  # (V,) at every index
        self.eos = table(rules.eos_ids, vocab_size, device)  # (V,)
        self.begin = table(rules.begin_suppress, vocab_size, device)  # (V,)
        self.forced_eos = table(rules.forced_eos, vocab_size, device)  # (V,)
        self.forced_bos = table([] if rules.forced_bos is None else [rules.forced_bos], vocab_size, device)  # (V,)
        self.eos_ban_until = rules.eos_ban_until
        # generate forces BOS where its input is 1 token long, and suppresses at the beginning where its input is
        # `start` long, one later after a forced BOS on a 1-token input
        self.bos_at = 1 - rules.start if rules.forced_bos is not None and rules.start <= 1 else -1
        self.begin_at = 1 if rules.start == 1 and rules.forced_bos is not None else 0
        self.eos_at = max_len - 1 if rules.forced_eos else -1
        # the tokens greedy emits there: the forced ids all score 0, then suppressed (and begin-suppressed) ones
        # -inf; ties go to the lowest id, and all -inf to id 0
        self.bos_token = self.forced_argmax([] if rules.forced_bos is None else [rules.forced_bos], self.bos_at)
        self.eos_token = self.forced_argmax(rules.forced_eos, self.eos_at)
        self.always = bool(self.banned.any()) or any(len(w) > 1 for w in rules.bad_words)  # rules at every index
        self.begin_any = bool(self.begin.any())
        self.window = rules.window
        groups: dict[int, list[tuple[int, ...]]] = {}
        for w in rules.bad_words:
            if len(w) > 1:
                groups.setdefault(len(w) - 1, []).append(w)
        # banned words of several tokens, by prefix length n: prefixes (g, n) and last tokens (g,)
        self.multi = [(torch.tensor([w[:-1] for w in ws], dtype=torch.long, device=device),
                       torch.tensor([w[-1] for w in ws], dtype=torch.long, device=device)) for ws in groups.values()]

    def forced_argmax(self, ids: Sequence[int], at: int) -> int:
        """Greedy's token where ``ids`` are forced at index ``at`` (suppressed afterwards, as generate orders it)."""
        gone = set(self.rules.suppress) | (set(self.rules.begin_suppress) if at == self.begin_at else set())
        kept = sorted(t for t in ids if t not in gone and t < self.vocab_size)
        return kept[0] if kept else 0

    def touches(self, lo: int, hi: int) -> bool:
        """Whether a rule changes p_1 (its logits, so greedy's token or a draw) at some generated index in [lo, hi]
        (host ints). Elsewhere :meth:`apply` leaves the logits as they are, so a decode skips the rules on passes
        they cannot touch (a forced EOS: only the pass that reaches the cap)."""
        if self.always or lo < self.eos_ban_until:
            return True
        if self.begin_any and lo <= self.begin_at <= hi:
            return True
        return self.forces_in(lo, hi)

    def forces_in(self, lo: int, hi: int) -> bool:
        """Whether a rule forces the token at some generated index in [lo, hi] (host ints)."""
        return any(at >= 0 and lo <= at <= hi for at in (self.bos_at, self.eos_at))

    @property
    def forces(self) -> bool:
        """Whether a rule forces a token somewhere (BOS first, EOS at the cap)."""
        return self.bos_at >= 0 or self.eos_at >= 0

    def forced_tokens(self, index: Tensor) -> Tensor:
        """The token greedy emits at generated ``index`` (...) where a rule forces one, -1 elsewhere (...)."""
        out = torch.full_like(index, -1)
        if self.bos_at >= 0:
            out = torch.where(index == self.bos_at, self.bos_token, out)
        if self.eos_at >= 0:
            out = torch.where(index == self.eos_at, self.eos_token, out)
        return out

    def force(self, tokens: Tensor, index: Tensor) -> Tensor:
        """Proposals ``tokens`` (...) at generated ``index`` (...) with the forced token put in place wherever a
        rule forces one: another guess there could only be rejected."""
        forced = self.forced_tokens(index)
        return torch.where(forced >= 0, forced, tokens)

    # ---- the rules on logits, in generate's order: the reference ----------------------------------------------
    def apply(self, logits: Tensor, index: Tensor, tail: Tensor | None = None) -> Tensor:
        """p_1's logits (..., V) under the rules at generated ``index`` (...) after ``tail`` (..., window)."""
        out = logits.masked_fill(self.bad, float("-inf"))  # banned words of one token
        for prefixes, last in self.multi:  # banned words of several tokens, where the tail ends with their prefix
            hit = (self.need_tail(tail)[..., None, -prefixes.shape[1]:] == prefixes).all(dim=-1)  # (..., g)
            out = out.masked_fill(self.words_hit(hit, last, out.shape), float("-inf"))
        index = index[..., None]  # (..., 1)
        out = out.masked_fill(self.eos & (index < self.eos_ban_until), float("-inf"))  # minimum lengths
        if self.bos_at >= 0:
            out = torch.where(index == self.bos_at, torch.where(self.forced_bos, 0.0, float("-inf")).to(out.dtype), out)
        if self.eos_at >= 0:
            out = torch.where(index == self.eos_at, torch.where(self.forced_eos, 0.0, float("-inf")).to(out.dtype), out)
        out = out.masked_fill(self.suppress, float("-inf"))
        return out.masked_fill(self.begin & (index == self.begin_at), float("-inf"))

    def words_hit(self, hit: Tensor, last: Tensor, shape: torch.Size) -> Tensor:
        """(..., V) True at the last token of every banned word (..., g) whose prefix the tail ends with."""
        out = torch.zeros(shape, dtype=torch.bool, device=hit.device)
        rows, flat = hit.reshape(-1, hit.shape[-1]), out.view(-1, shape[-1])  # (N, g), (N, V)
        for g, token in enumerate(last.tolist()):  # a few words: a loop over them, not over positions
            flat[:, token] |= rows[:, g]
        return out

    def need_tail(self, tail: Tensor | None) -> Tensor:
        if tail is None:
            raise ValueError("banned words of several tokens need the tokens before each position (tail)")
        return tail

    # ---- greedy's token, cheaply ------------------------------------------------------------------------------
    def touched(self, tokens: Tensor, index: Tensor, tail: Tensor | None = None) -> Tensor:
        """Where a rule may change greedy's token: (...) bool for the plain argmax ``tokens`` (...) at ``index``.

        Elsewhere the rules only set other tokens' logits to -inf, so the plain argmax stays greedy's token."""
        out = self.banned[tokens] if self.always else torch.zeros_like(tokens, dtype=torch.bool)
        if self.eos_ban_until > 0:
            out |= self.eos[tokens] & (index < self.eos_ban_until)
        if self.begin_any:
            out |= self.begin[tokens] & (index == self.begin_at)
        for prefixes, last in self.multi:
            n = prefixes.shape[1]
            hit = (self.need_tail(tail)[..., None, -n:] == prefixes).all(dim=-1)  # (..., g)
            out |= (hit & (tokens[..., None] == last)).any(dim=-1)
        return out

    def argmax(self, plain: Tensor, logits_of: Callable[[Tensor], Tensor], index: Tensor, tail: Tensor | None = None) -> Tensor:
        """Greedy's tokens (...) under the rules, from the plain argmax ``plain`` (...): where a rule touches one
        (:meth:`touched`), the argmax of the ruled logits ``logits_of(where)`` (n, V) of those positions."""
        forced = self.forced_tokens(index) if self.forces else None  # (...): -1 where nothing is forced
        where = self.touched(plain, index, tail)  # (...)
        if forced is not None:
            where &= forced < 0  # a forced position's token is known without its logits
        out = plain if forced is None else torch.where(forced >= 0, forced, plain)
        if not bool(where.any()):
            return out
        out = out.clone()
        chosen = tail[where] if tail is not None else None
        out[where] = argmax(self.apply(logits_of(where), index[where], chosen))
        return out


def bind_rules(rules: GenerationRules | None, max_len: int, vocab_size: int | None,
               device: torch.device | str) -> BoundRules | None:
    """The rules of one decode, or None where there are none that change p_1's argmax (EOS ids alone)."""
    if rules is None:
        return None
    rules.check()
    if not rules.active:
        return None
    if vocab_size is None:
        raise ValueError("generation rules need the model's vocab_size")
    return rules.bind(max_len, vocab_size, device)


def rules_of(model: Any, src: Tensor) -> GenerationRules | None:
    """The target's generation rules (``rules.generation``: a base's ``generation_rules``) for a decode of the
    sources ``src`` (B, S) (a causal LM counts their padded width as generate's ``start``:
    :meth:`GenerationRules.at_width`). ``model``: a :class:`~lightning_bpd.decoding.target.Target` or a base."""
    rules = target_of(model).rules.generation
    return None if rules is None else rules.at_width(src.shape[1])


def stop_ids(eos_id: int | None, rules: GenerationRules | None) -> tuple[int, ...]:
    """The ids that end a row: the rules' EOS ids when given, else the model's own EOS (none: no id)."""
    if rules is not None and rules.eos_ids:
        return rules.eos_ids
    return () if eos_id is None else (eos_id,)


def tails(before: Tensor, block: Tensor, window: int) -> Tensor:
    """The last ``window`` tokens before each position of a verify pass: ``before`` (b, window) the tokens up to
    and excluding the block (-1 where none), block (b, m) -> (b, m, window), the tail after block token j at j."""
    seq = torch.cat([before, block], dim=1)  # (b, window + m)
    return seq.unfold(1, window, 1)[:, 1:]  # (b, m, window)


class RuledFirst:
    """A model's p_1 under ``rules`` at generated indices ``index`` (...) after ``tail`` (..., window): the members
    the criteria read (:meth:`logits_first`, :attr:`argmax_first`) for hidden states h (..., D) of that shape."""

    def __init__(self, model: Any, rules: BoundRules, index: Tensor, tail: Tensor | None = None) -> None:
        self.model, self.rules, self.index, self.tail = model, rules, index, tail

    def logits_first(self, h: Tensor) -> Tensor:
        """p_1's logits (..., V) under the rules."""
        return self.rule(self.model.logits_first(h))

    def rule(self, logits: Tensor) -> Tensor:
        """Logits of p_1 (..., V) at these positions, under the rules."""
        return self.rules.apply(logits, self.index.expand(logits.shape[:-1]), self.tail)

    def argmax_first(self, h: Tensor) -> Tensor:
        """Greedy's tokens (...) under the rules: the model's own argmax, corrected where a rule touches it."""
        own = self.model.argmax_first  # as protocol.first_argmax, which imports these rules' type: not imported
        plain = own(h) if own is not None else argmax(self.model.logits_first(h))  # (...)
        index = self.index.expand(plain.shape)
        tail = None if self.tail is None else self.tail.expand(*plain.shape, self.tail.shape[-1])
        return self.rules.argmax(plain, lambda where: self.model.logits_first(h[where]), index, tail)


def start_tail(model: Any, src: Tensor, window: int) -> Tensor | None:
    """The ``window`` tokens before the first generated token of each row of a decode of ``src`` (B, S), as the
    rules see them (B, window): the target's ``rules.history`` (a base's ``rules_history``) where offered, else the
    start token, -1 before it; None without a window."""
    if window == 0:
        return None
    target = target_of(model)
    own = target.rules.history
    return own(src, window) if own is not None else opening_tail(src.shape[0], target.spec.bos_id, window, src.device)


def histories(model: Any, src: Tensor, window: int) -> list[list[int]]:
    """Each row's tokens before its first generated token as the references' rules read them (a list per row: the
    start token alone without a window)."""
    tail = start_tail(model, src, window)
    return [[target_of(model).spec.bos_id] for _ in range(src.shape[0])] if tail is None else tail.tolist()


def opening_tail(batch: int, bos_id: int, window: int, device: torch.device | str) -> Tensor | None:
    """The tail before the first generated token (batch, window): the start token, -1 before it (None: no window)."""
    if window == 0:
        return None
    tail = torch.full((batch, window), -1, dtype=torch.long, device=device)
    tail[:, -1] = bos_id
    return tail


class RuleBook:
    """The generation rules of one decode of ``model`` (a :class:`~lightning_bpd.decoding.target.Target` or a base:
    its ``rules.generation``) with at most ``max_len`` new tokens: the ids that end a row (``stops``, for
    :meth:`~lightning_bpd.decoding.row_book.RowBook.commit`) and what reads p_1 at each read site of a blockwise
    loop (None everywhere when no rule changes p_1's argmax)."""

    def __init__(self, model: Any, max_len: int, device: torch.device | str, src: Tensor | None = None) -> None:
        target = target_of(model)
        given = target.rules.generation if src is None else rules_of(target, src)  # src: the sources (B, S)
        spec = target.spec
        self.bound = bind_rules(given, max_len, spec.vocab_size, device)
        ids = stop_ids(spec.eos_id, given)
        self.stops: int | Tensor | None = (None if not ids else ids[0] if len(ids) == 1
                                           else torch.tensor(ids, dtype=torch.long, device=device))
        self.model, self.bos_id, self.device = target, spec.bos_id, device  # model: p_1 under the rules reads it
        self.window = 0 if self.bound is None else self.bound.window
        self.start = None if src is None else start_tail(target, src, self.window)  # (B, window): before token 0

    def opening(self, batch: int) -> Any:
        """p_1 for the first generated token of every row (index 0)."""
        if self.bound is None or not self.bound.touches(0, 0):
            return None
        index = torch.zeros(batch, dtype=torch.long, device=self.device)  # (B,)
        tail = self.start if self.start is not None else opening_tail(batch, self.bos_id, self.window, self.device)
        return RuledFirst(self.model, self.bound, index, tail)

    def forced_proposals(self, book: Any, tokens: Tensor) -> Tensor:
        """A block's proposals ``tokens`` (b, m) (token j at generated index committed + j) with the token a rule
        forces put in place wherever one does: a head's other guess there could only be rejected (the cap's forced
        EOS would cost an iteration of its own). Verification decides as before."""
        lo, hi = book.length_bounds()  # host: committed tokens of the live rows
        if self.bound is None or not self.bound.forces_in(lo, hi + tokens.shape[1] - 1):
            return tokens
        index = book.committed()[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # (b, m)
        return self.bound.force(tokens, index)

    def verifying(self, book: Any, block: Tensor) -> Any:
        """p_1 at every position of a verify pass over ``block`` (b, m): position j predicts the token after
        block token j (generated index: committed + j + 1)."""
        m = block.shape[1]
        lo, hi = book.length_bounds()  # host: committed tokens of the live rows
        if self.bound is None or not self.bound.touches(lo + 1, hi + m):
            return None
        index = book.committed()[:, None] + 1 + torch.arange(m, device=block.device)  # (b, m)
        tail = tails(book.tail(self.window, self.bos_id, self.start), block, self.window) if self.window else None
        return RuledFirst(self.model, self.bound, index, tail)

    def next(self, book: Any) -> Any:
        """p_1 for the next token of every live row, after what it committed."""
        if self.bound is None or not self.bound.touches(*book.length_bounds()):
            return None
        tail = book.tail(self.window, self.bos_id, self.start) if self.window else None
        return RuledFirst(self.model, self.bound, book.committed(), tail)

    def on_tree(self, book: Any, tokens: Tensor, depths: Tensor, paths: Tensor) -> Any:
        """p_1 at every node of a tree verify pass over ``tokens`` (b, N): node j (``depths`` (N,), root-to-node
        ``paths`` (N, depth + 1)) predicts the token after it, at generated index committed + depth_j + 1, after
        the tokens of its own path. A tree per row: ``depths`` (b, N), ``paths`` (b, N, depth + 1)."""
        lo, hi = book.length_bounds()
        if self.bound is None or not self.bound.touches(lo + 1, hi + 1 + int(depths.max())):
            return None
        index = book.committed()[:, None] + 1 + depths  # (b, N)
        tail = None
        if self.window:
            w, (b, n) = self.window, tokens.shape
            depths, paths = depths.expand(b, n), paths.expand(b, n, paths.shape[-1])  # (b, N), (b, N, depth + 1)
            at = depths[..., None] - (w - 1) + torch.arange(w, device=tokens.device)  # (b, N, w): depth along the path
            slot = torch.where(at >= 0, w + paths.gather(2, at.clamp(min=0)), w + at)  # (b, N, w): before ++ tokens
            every = torch.cat([book.tail(w, self.bos_id, self.start), tokens], dim=1)  # (b, w + N)
            tail = every.gather(1, slot.reshape(b, n * w)).view(b, n, w)  # (b, N, w)
        return RuledFirst(self.model, self.bound, index, tail)


def history_tail(prefix: list[int], window: int, device: torch.device | str) -> Tensor | None:
    """The last ``window`` tokens of a decoder input ``prefix`` (start token first) as (1, window), -1 before
    it; None without a window (the references' tail)."""
    if window == 0:
        return None
    last = ([-1] * window + prefix)[-window:]
    return torch.tensor([last], dtype=torch.long, device=device)


def ruled_at(bound: BoundRules, prefix: list[int], index: int) -> Callable[[Tensor], Tensor]:
    """The generation rules on p_1's logits (..., V) of the token at generated ``index`` after ``prefix``: what the
    rules see before the first generated token (the start token, or a prompt's tail) and the tokens since (the
    references' form of :meth:`BoundRules.apply`)."""
    at = torch.tensor(index)
    return lambda logits: bound.apply(logits, at.to(logits.device), history_tail(prefix, bound.window, logits.device))


def reference_rules(model: Any, src: Tensor, max_len: int) -> tuple[BoundRules | None, tuple[int, ...],
                                                                      list[list[int]]]:
    """What the slow references read of the rules of a decode of ``src`` (B, S): the bound rules (None: none that
    change p_1's argmax), the ids that end a row, and each row's tokens before its first generated one."""
    target = target_of(model)
    rules = rules_of(target, src)
    bound = bind_rules(rules, max_len, target.spec.vocab_size, src.device)
    befores = histories(target, src, 0 if bound is None else bound.window)
    return bound, stop_ids(target.spec.eos_id, rules), befores
