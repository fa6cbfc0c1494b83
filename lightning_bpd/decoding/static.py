"""Fixed-shape greedy and blockwise decoding, the shape CUDA graphs need. Torch only.

The eager decoders (:func:`~lightning_bpd.decoding.blockwise.blockwise_decode`,
:func:`~lightning_bpd.decoding.greedy.greedy_decode`) drop finished rows and read the cache only up
to the longest row, so their tensors change shape from one iteration to the next. Here every tensor
keeps its shape for the whole decode, so one iteration is the same sequence of kernels every time:

- the batch never shrinks: a finished row keeps riding along, commits nothing, and its cache
  length stops moving (its verify writes are cropped away again);
- the KV cache is a static one (:attr:`~lightning_bpd.nn.kv_cache.KVCache.static`): every slot is
  read under a mask built from the per-row length tensor, with no host-side bounds;
- the block is always (B, k); positions, lengths, the output buffer and the per-iteration block
  sizes live on the device and are updated in place.

An iteration is therefore free of host reads, and :class:`StaticDecoder` can record it once as a
``torch.cuda.CUDAGraph`` and replay it (``graphs=True``, CUDA only). The loop reads one flag per
``sync_every`` iterations (have all rows finished?); finished rows waste the remaining replays of that
window, which cost only GPU time. Greedy decoding is the k = 1 case: a one-token block is always
accepted and p_1's argmax after it opens the next.

Outputs, lengths, iteration counts and block sizes equal the eager decoders' token for token (the
tests check it against :func:`blockwise_decode` and the uncached references); ``model_calls`` counts
the calls made, the wasted ones included.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion, Exact
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.proposers.heads import propose
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, chain_source, check_decode_args, resolve_k
from lightning_bpd.decoding.row_book import ends_row
from lightning_bpd.decoding.verify import verify


class StaticDecoder:
    """One batch of sources decoded with fixed shapes: :meth:`run` returns the :class:`DecodeResult`.

    ``graphs``: record one iteration as a CUDA graph and replay it (None: on CUDA devices only).
    ``sync_every``: iterations between reads of the all-finished flag (the loop's only host reads).
    """

    def __init__(self, model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None, max_len: int = 256,
                 k: int | None = None, graphs: bool | None = None, sync_every: int = 1) -> None:
        criterion = criterion if criterion is not None else Exact()
        check_decode_args(model, src, max_len)
        if criterion.stochastic:
            raise ValueError(f"fixed-shape decoding takes deterministic rules (exact, topN, epsX, minL_...), "
                             f"not {criterion.name}: use blockwise_decode for sampling")
        if not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(f"sync_every must be an integer >= 1, got {sync_every!r}")
        rules = RuleBook(model, max_len, src.device, src)
        if rules.bound is not None:
            raise ValueError("fixed-shape decoding does not apply the generation config's rules on p_1 (forced "
                             "BOS/EOS, suppressed or banned tokens, minimum lengths) yet: use blockwise_decode")
        self.stops = rules.stops
        self.k = resolve_k(model, k)
        criterion.validate(self.k)
        criterion.reset(src.device)
        self.graphs = src.device.type == "cuda" if graphs is None else graphs
        if self.graphs and src.device.type != "cuda":
            raise ValueError(f"graphs=True needs a CUDA device (the sources are on {src.device})")
        self.model, self.criterion, self.max_len, self.sync_every = model, criterion, max_len, sync_every
        batch, device = src.shape[0], src.device
        self.context = model.encode(src)
        self.source = chain_source(model, self.context)
        self.cache = model.new_cache(batch, capacity=1 + max_len + self.k)
        self.cache.make_static()
        self.tokens = torch.full((batch, max_len + self.k), model.pad_id, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # committed tokens per row
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.sizes = torch.zeros(max_len + 1, batch, dtype=torch.long, device=device)  # tokens kept per iteration
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # iterations run, as a device index
        self.arange = torch.arange(self.k, device=device)
        bos = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=device)
        self.block = propose(model, criterion, model.decode_step(bos, self.context, self.cache)[:, -1], self.k,
                             source=self.source).tokens.clone()  # (B, k), rewritten in place
        self.first = torch.zeros(batch, dtype=torch.long, device=device)  # greedy's next token per row
        self.calls = 1
        self.graph: torch.cuda.CUDAGraph | None = None

    def iterate(self) -> None:
        """One verify-accept-propose iteration on the fixed shapes, in place, with no host read."""
        model, k = self.model, self.k
        hidden = model.decode_step(self.block, self.context, self.cache)  # (B, k, D)
        accepted, first = verify(model, self.criterion, Block(self.block), hidden)  # (B,), (B,)
        n = accepted
        if self.stops is not None:  # an EOS inside the accepted prefix ends the row there
            first_eos = torch.where(ends_row(self.block, self.stops), self.arange, k).amin(dim=1)  # (B,): k when none
            n = torch.minimum(n, first_eos + 1)
        n = torch.minimum(n, self.max_len - self.lengths).masked_fill(self.done, 0)  # (B,) tokens kept
        # the whole block at each row's length (lengths <= max_len, the buffer holds max_len + k): what
        # lies past the kept tokens, and everything a finished row writes, is masked by result()
        self.tokens.scatter_(1, self.lengths[:, None] + self.arange, self.block)
        self.sizes.index_copy_(0, self.step.clamp(max=self.max_len), n[None])  # iterations after the last
        # live one write zeros, into the spare last row once past it
        self.step.add_(1)
        self.lengths.add_(n)
        ended = self.lengths >= self.max_len
        if self.stops is not None:
            ended = ended | (first_eos < n)
        # BOS and the kept tokens stay (n = accepted for a row that goes on); finished rows drop this
        # call's k writes, so a row's cache never passes 1 + max_len and a call writes at most k more
        self.cache.crop(self.cache.lengths - k + n, check=False)
        self.done.logical_or_(ended)
        last = hidden.gather(1, (accepted - 1)[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (B, D)
        self.first.copy_(first)
        self.block.copy_(propose(model, self.criterion, last, k, self.first, self.source).tokens)

    def capture(self) -> None:
        """Record :meth:`iterate` as a CUDA graph: a few eager iterations on a side stream first (the
        allocator and lazy inits settle), then one captured iteration; replays run the captured kernels
        on the same tensors. The warm-up iterations are real ones (they decode)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.iterate()
                self.calls += 1
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.iterate()  # recorded, not run
        # the recording did not run the kernels: nothing committed, no call made

    @torch.no_grad()
    def run(self) -> DecodeResult:
        """Iterate until every row finished; return what the eager decoders return."""
        if self.graphs and self.graph is None:
            self.capture()
        while not bool(self.done.all()):  # the loop's host read, once per sync_every iterations
            for _ in range(self.sync_every):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self.iterate()
                self.calls += 1
        return self.result()

    def result(self) -> DecodeResult:
        lengths = self.lengths
        width = max(1, int(lengths.max()))
        past = torch.arange(width, device=lengths.device) >= lengths[:, None]  # (B, width)
        tokens = self.tokens[:, :width].masked_fill(past, self.model.pad_id)
        sizes = self.sizes[: min(int(self.step), self.max_len + 1)].T  # (B, iterations): 0 once a row finished
        blocks = [[m for m in row if m > 0] for row in sizes.tolist()]
        iterations = (sizes > 0).sum(dim=1)
        return DecodeResult(tokens, lengths.clone(), iterations, self.calls, blocks)


@torch.no_grad()
def static_decode(model: BlockwiseModel, src: Tensor, criterion: Criterion | None = None, max_len: int = 256,
                  k: int | None = None, graphs: bool | None = None, sync_every: int = 1) -> DecodeResult:
    """Blockwise decoding of ``src`` (B, S) with fixed shapes (:class:`StaticDecoder`); ``k = 1`` is greedy."""
    return StaticDecoder(model, src, criterion, max_len, k, graphs, sync_every).run()
