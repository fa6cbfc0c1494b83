"""The argmax of a vocabulary projection without the float32 projection: an int8 screen of every token, then
float64 logits of the few candidates it cannot rule out. Torch only; CPU inference.

Greedy decoding and exact verification need only the argmax of p_1, and on CPU the 256 -> 8,000 float32
projection that feeds it is the largest weight a decoder step streams (8 MB). With the weight in int8 (per
output row, symmetric; fbgemm's ``quantized::linear_dynamic``) the product streams 2 MB and its cost hardly
grows with the rows: on an AMD EPYC core 1 / 8 / 32 rows take 0.20 / 0.26 / 0.60 ms against float32's
0.97 / 1.72 / 2.75 (cold weights, 1 thread).

The int8 logits are approximate, but their error has a bound that is known per row. The product is
:class:`~lightning_bpd.kernels.int8.RowInt8`'s: a row x is divided by its own max |x| (s), so its activations u
lie in [-1, 1] and are rounded to a grid of step 2/127; the weight row w of token v is quantized per row
(w^ = s_v q_v, q_v integers); the int32 accumulation is exact. So::

    |x.w - s u^.w^| <= s (|u - u^|_inf |w^|_1 + |u|_inf |w - w^|_1)
                    <= s (2/127 * max_v |w^_v|_1 + max_v |w_v - w^_v|_1)   (+ float rounding of the result)

(one step, not half, to be safe). Every token whose int8 logit is more than twice the bound below the best
one cannot be the argmax, and the argmax is the best of the rest, taken from their float64 logits (the rows
of W gathered for them; ties to the lowest id). Most rows of a trained model leave one candidate and need
no float64 at all.

What comes out is the argmax of the float64 logits: batch-invariant by construction (a row's int8 logits
and candidates are its own, and every candidate set holds the true argmax), so
the k-token verify pass and the 1-token greedy step pick the same token. It differs from the argmax of
float32 logits only where those were within float32 rounding of a tie. :meth:`ScreenedArgmax.reference`
is the slow, obviously correct version (the full float64 projection); the tests check that both agree.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.kernels.int8 import RowInt8, quantize_rows

SLACK = 1e-5  # relative allowance for the float32 rounding of the int8 product's output
STEP = 2 / 127  # the int8 product's activation grid on [-1, 1] (:mod:`lightning_bpd.kernels.int8`)


class ScreenedArgmax:
    """argmax_v (x . W_v + b_v) in float64 for rows x (..., D) float32, through an int8 screen of W (V, D).

    Built from the weights as they are now (a snapshot): rebuild after they change. ``candidates`` and
    ``rows`` count, over all calls, the candidates the screen left and the rows it was asked about.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        w_hat, _ = quantize_rows(weight)  # (V, D) float64: what the int8 product multiplies by
        self.vocab = weight.shape[0]
        self.product = RowInt8(weight, bias)  # per-row activation scales: a row's screen is its own
        self.weight64 = weight.detach().to(torch.float64)  # (V, D)
        self.bias64 = None if bias is None else bias.detach().to(torch.float64)  # (V,)
        self.hat_l1 = float(w_hat.abs().sum(dim=1).max())  # max_v |w^_v|_1
        self.err_l1 = float((self.weight64 - w_hat).abs().sum(dim=1).max())  # max_v |w_v - w^_v|_1
        self.candidates = 0
        self.rows = 0

    def approximate(self, x: Tensor) -> Tensor:
        """int8 logits (N, V) of rows x (N, D)."""
        return self.product(x)

    def bound(self, x: Tensor, approx: Tensor) -> Tensor:
        """Per row (N,), a bound on |int8 logit - exact logit| over every token (see the module docstring)."""
        inf = x.abs().amax(dim=1).double()  # (N,): the row's scale; its activations' step is inf * STEP
        top = approx.abs().amax(dim=1).double()  # (N,)
        return inf * (STEP * self.hat_l1 + self.err_l1) + SLACK * (top + 1)

    def __call__(self, x: Tensor) -> Tensor:
        """Token ids (...) of the largest float64 logit of each row x (..., D) (ties to the lowest id)."""
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1]).float()  # (N, D)
        if flat.shape[0] == 0:
            return torch.zeros(lead, dtype=torch.long, device=x.device)
        approx = self.approximate(flat)  # (N, V)
        best, token = approx.max(dim=1)  # (N,)
        keep = approx >= (best.double() - 2 * self.bound(flat, approx)).float()[:, None]  # (N, V): not ruled out
        counts = keep.sum(dim=1)  # (N,)
        most = int(counts.max())  # host read: how many candidates the widest row has
        self.rows += flat.shape[0]
        self.candidates += int(counts.sum())
        if most > 1:
            token = self.confirm(flat, approx, keep, most)
        return token.reshape(lead)

    def confirm(self, x: Tensor, approx: Tensor, keep: Tensor, most: int) -> Tensor:
        """The float64 argmax over each row's candidates ``keep`` (N, V), at most ``most`` per row."""
        masked = approx.masked_fill(~keep, float("-inf"))
        ids = masked.topk(most, dim=1).indices  # (N, m): every candidate (and -inf fillers past a row's count)
        real = keep.gather(1, ids)  # (N, m)
        ids = ids.masked_fill(~real, self.vocab).sort(dim=1).values  # ascending ids, fillers (= V) last
        real = ids < self.vocab
        safe = ids.clamp(max=self.vocab - 1)
        exact = (self.weight64[safe] * x.double()[:, None, :]).sum(dim=-1)  # (N, m) float64 logits
        if self.bias64 is not None:
            exact = exact + self.bias64[safe]
        pick = exact.masked_fill(~real, float("-inf")).max(dim=1).indices  # first maximum: the lowest id
        return ids.gather(1, pick[:, None])[:, 0]

    def reference(self, x: Tensor) -> Tensor:
        """The slow, obviously correct argmax: the whole projection in float64."""
        logits = x.double() @ self.weight64.t()
        if self.bias64 is not None:
            logits = logits + self.bias64
        return logits.argmax(dim=-1)
