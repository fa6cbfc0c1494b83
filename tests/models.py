"""Small random models and hand-written stub models shared by the tests."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.model import BlockwiseTransformer

PAD, BOS, EOS = 0, 1, 2

ROUNDING = 1e-12  # relative: ~4500 float64 ulps of the largest value; a real bug moves values by far more


def assert_close_to_rounding(actual: Tensor, expected: Tensor, rel: float = ROUNDING) -> None:
    """``actual`` equals ``expected`` up to float rounding, for two computations of the same values along
    different kernel paths (other row counts through MKL, a step against the teacher-forced whole, cached
    against uncached): which way CPU vendors round differs (AVX-512 against AVX2 kernels), so an absolute
    tolerance is an ulp or less for large values and says nothing for small ones. Each element may differ by
    ``rel`` times its own magnitude or times the largest magnitude of ``expected`` (the rounding of a sum
    scales with its terms, so an element near zero from large terms is rounded like them), never more."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * max(scale, torch.finfo(expected.dtype).tiny))


def random_model(k: int, vocab: int = 16, seed: int = 0, window: int | None = None,
                 identity_first: bool = False, **overrides) -> BlockwiseTransformer:
    """A float64 random model with scrambled weights, so its greedy output varies and its heads
    disagree with p_1 often enough to exercise every acceptance rule."""
    torch.manual_seed(seed)
    cfg = {"src_vocab_size": vocab, "tgt_vocab_size": vocab, "d_model": 32, "n_heads": 4, "n_encoder_layers": 2,
               "n_decoder_layers": 2, "d_ff": 64, "dropout": 0.0, "k": k, "window": window, "identity_first": identity_first}
    cfg.update(overrides)
    model = BlockwiseTransformer(ModelConfig.from_dict(cfg)).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.tgt_embed.weight.mul_(0.1)
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                std = 0.01 if name.startswith("head.") else 3.0 / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model


def scramble_chain(model, seed: int = 5, std: float = 0.3) -> None:
    """Give the chain cells weights large enough to change the proposals (a random model's are ~0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


def float32_model(seed: int, head_type: str = "paper", vocab: int = 40, k: int = 4) -> BlockwiseTransformer:
    """A float32 :func:`random_model` whose chained heads (if any) propose tokens worth verifying
    (:func:`scramble_chain` at std 0.05): the models of the precision tests."""
    model = random_model(k=k, vocab=vocab, seed=seed, head_type=head_type).float()
    if model.chained_heads:
        scramble_chain(model, std=0.05)
    return model


def random_sources(batch: int, vocab: int = 12, seed: int = 1, max_len: int = 9) -> Tensor:
    """(batch, max_len) sources of different lengths (>= 2), padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (batch, max_len), generator=g)
    lengths = torch.randint(2, max_len + 1, (batch,), generator=g)
    src[torch.arange(max_len)[None, :] >= lengths[:, None]] = PAD
    return src


class StubContext:
    """The stub's 'encoding': the row id of every live row."""

    def __init__(self, rows: Tensor) -> None:
        self.rows = rows

    def select(self, rows: Tensor) -> StubContext:
        return StubContext(self.rows[rows])


class StubModel(OptionalCapabilities):
    """A model with hand-written logits: row r's greedy output is ``targets[r]`` (ending in EOS); it offers
    none of the protocol's optional members.

    The hidden state of position t is (t, row). p_1 at position t puts its mass on
    ``targets[r][t]`` (the second-highest score goes to ``runner_up(token)``). Head i (0-based)
    proposes ``targets[r][t + i]`` when ``right(i, t)`` and ``wrong(token)`` otherwise.
    """

    def __init__(self, targets: list[list[int]], k: int, vocab: int = 300, right=lambda i, t: True,
                 wrong=lambda tok: 3 + (tok - 3 + 1) % 200, runner_up=lambda tok: 3 + (tok - 3 + 1) % 200) -> None:
        self.targets, self.k, self.vocab = targets, k, vocab
        self.right, self.wrong, self.runner_up = right, wrong, runner_up
        self.pad_id, self.bos_id, self.eos_id = PAD, BOS, EOS
        self.calls = 0

    def encode(self, src: Tensor) -> StubContext:
        return StubContext(src[:, 0] - 3)  # the test puts the row id + 3 in src[:, 0]

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> KVCache:
        return KVCache(1, batch_size, capacity + extra_slots, 1, 1, dtype=torch.float64)

    def decode_step(self, tokens: Tensor, context: StubContext, cache: KVCache) -> Tensor:
        self.calls += 1
        pos = cache.positions(tokens.shape[1])
        cache.check_room(tokens.shape[1])
        cache.advance(tokens.shape[1])
        return torch.stack([pos.double(), context.rows[:, None].double().expand_as(pos)], dim=-1)  # (B, T, 2)

    def decode_full(self, tgt_in: Tensor, context: StubContext) -> Tensor:
        pos = torch.arange(tgt_in.shape[1]).expand_as(tgt_in)
        return torch.stack([pos.double(), context.rows[:, None].double().expand_as(pos)], dim=-1)

    def target(self, row: int, t: int) -> int:
        seq = self.targets[row]
        return seq[t] if t < len(seq) else EOS

    def one_hot(self, tok: int) -> Tensor:
        out = torch.zeros(self.vocab, dtype=torch.float64)
        out[tok] = 10.0
        out[self.runner_up(tok)] = 5.0
        return out

    def logits_first(self, h: Tensor) -> Tensor:
        return self.logits_heads(h, [0]).squeeze(-2)

    def logits_heads(self, h: Tensor, heads=None) -> Tensor:
        heads = list(range(self.k) if heads is None else heads)
        flat = h.reshape(-1, 2)
        if flat.shape[0] == 0:
            return torch.zeros(*h.shape[:-1], len(heads), self.vocab, dtype=torch.float64)
        rows = []
        for t, r in flat.long().tolist():
            per_head = []
            for i in heads:
                tok = self.target(r, t + i)
                per_head.append(self.one_hot(tok if (i == 0 or self.right(i, t)) else self.wrong(tok)))
            rows.append(torch.stack(per_head))
        return torch.stack(rows).view(*h.shape[:-1], len(heads), self.vocab)


def stub_sources(n_rows: int) -> Tensor:
    return (torch.arange(n_rows) + 3)[:, None]


def pick_eos(model, src: Tensor, max_len: int) -> int:
    """Choose as EOS a token that greedy emits mid-sequence in some rows but not all, so rows end
    at different times (some inside a block, some at ``max_len``); sets and returns it."""
    from lightning_bpd.decoding import greedy_decode

    model.eos_id = None
    seqs = greedy_decode(model, src, max_len).sequences()
    best, best_score = 3, -1
    for tok in range(3, model.config.tgt_vocab_size):
        ended = sum(1 for s in seqs if tok in s[1 : max_len - 1])
        score = ended if ended < len(seqs) else 0  # leave at least one row running to max_len
        if score > best_score:
            best, best_score = tok, score
    model.eos_id = best
    return best


class Wrapped:
    """A model with its logits changed: every logit times ``scale`` (sharper or flatter distributions)
    plus ``bump`` (V,) on p_1 (a nearby model, e.g. a draft that mostly agrees). Counts its decoder
    calls and records their batch sizes; everything else is the wrapped model's."""

    def __init__(self, model, scale: float = 1.0, bump: Tensor | None = None) -> None:
        self.model, self.scale, self.bump = model, scale, bump
        self.calls, self.batch_sizes = 0, []

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def decode_step(self, tokens: Tensor, context, cache) -> Tensor:
        self.calls += 1
        self.batch_sizes.append(tokens.shape[0])
        return self.model.decode_step(tokens, context, cache)

    def logits_first(self, h: Tensor) -> Tensor:
        out = self.model.logits_first(h) * self.scale
        return out + self.bump.to(out) if self.bump is not None else out

    def logits_heads(self, h: Tensor, heads=None, prev_tokens: Tensor | None = None) -> Tensor:
        if self.bump is not None:
            raise NotImplementedError("a bumped model is a k = 1 draft: only p_1 is used")
        return self.model.logits_heads(h, heads) * self.scale


class TreeStub(StubModel):
    """A :class:`StubModel` that verifies trees (``decode_tree``) and whose heads rank greedy's token where
    ``rank_of(i, t, row)`` says: 0 on top (as StubModel's right heads), 1 second under a wrong token, anything else
    nowhere in the top two. p_1 is greedy's token at every position, whatever path led there (only accepted
    paths, greedy's own, are ever read on)."""

    def __init__(self, targets: list[list[int]], k: int, rank_of=lambda i, t, row: 0, **kwargs) -> None:
        super().__init__(targets, k, **kwargs)
        self.rank_of = rank_of

    def decode_tree(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: StubContext,
                    cache: KVCache) -> Tensor:
        self.calls += 1
        pos = cache.lengths[:, None] + depths  # (B, N)
        cache.check_room(tokens.shape[1])
        cache.advance(tokens.shape[1])
        return torch.stack([pos.double(), context.rows[:, None].double().expand_as(pos)], dim=-1)  # (B, N, 2)

    def head_logits(self, tok: int, rank: int) -> Tensor:
        if rank == 0:
            return self.one_hot(tok)
        out = torch.zeros(self.vocab, dtype=torch.float64)
        out[self.wrong(tok)] = 10.0
        out[tok if rank == 1 else self.wrong(self.wrong(tok))] = 5.0
        return out

    def logits_heads(self, h: Tensor, heads=None) -> Tensor:
        heads = list(range(self.k) if heads is None else heads)
        flat = h.reshape(-1, 2).long().tolist()
        rows = [torch.stack([self.head_logits(self.target(r, t + i), 0 if i == 0 else self.rank_of(i, t, r))
                             for i in heads]) for t, r in flat]
        if not rows:
            return torch.zeros(*h.shape[:-1], len(heads), self.vocab, dtype=torch.float64)
        return torch.stack(rows).view(*h.shape[:-1], len(heads), self.vocab)
