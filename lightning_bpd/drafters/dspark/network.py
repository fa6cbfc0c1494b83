"""The DSpark drafter (DeepSeek, arXiv 2607.05147): the DFlash backbone
(:class:`~lightning_bpd.drafters.dflash.network.DFlashDrafter`, unchanged) run anchor-first, plus two small heads.

* Anchor-first: the block ``[x_a, mask x (K - 1)]`` at positions ``a .. a + K - 1`` (context: the target's features
  at positions ``< a``, as DFlash) is all predictions: slot j predicts the token at ``a + j + 1``, so one pass gives K
  drafts (DFlash's slot j predicts the token AT ``a + j``, slot 0 unused).
* Markov head (vanilla, low rank r): with ``p_j`` the token before slot j's (the anchor for slot 0, then the token
  drafted or, in training, the data's at ``a + j``), ``e_j = W1[p_j]`` (r,) and slot j's logits are
  ``U_j + W2 e_j``, U the target's LM head on the backbone's final-normed state ``h_j``. At inference the bias is
  applied slot by slot, left to right, each slot conditioned on the token chosen before it.
* Confidence head: ``c_j = sigmoid(proj([h_j ; e_j]))`` (``[h_j]`` alone without ``confidence_head_with_markov``),
  trained toward the probability that slot j is accepted given the slots before it were.

Names are speculators' = DeepSpec's = vLLM's: ``markov_head.markov_w1`` (Embedding(V, r)), ``markov_head.markov_w2``
(Linear(r, V), no bias), ``confidence_head.proj`` (Linear(H + r, 1)), besides DFlash's ``fc``, ``hidden_norm``,
``layers.*``, ``norm``. Torch only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter


@dataclass
class DSparkConfig(DFlashConfig):
    """A DFlash drafter's shapes plus the heads': ``vocab_size`` (the target's: W1 reads its tokens, W2 writes its
    logits), ``markov_rank`` r, and whether there is a confidence head and whether it reads ``W1[prev]`` too."""

    vocab_size: int = 0
    markov_rank: int = 256
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True

    def validate(self) -> DSparkConfig:
        super().validate()
        if self.vocab_size < 1 or self.markov_rank < 1:
            raise ValueError(f"DSparkConfig needs vocab_size >= 1 and markov_rank >= 1, got {self.vocab_size}, "
                             f"{self.markov_rank}")
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(f"DSparkConfig.mask_token_id {self.mask_token_id} is outside the vocabulary "
                             f"[0, {self.vocab_size})")
        return self


class MarkovHead(nn.Module):
    """``markov_w1`` embeds the previous token (V -> r), ``markov_w2`` maps it to a logit bias (r -> V)."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def forward(self, prev: Tensor) -> tuple[Tensor, Tensor]:
        """Previous tokens (...) -> their embeddings (..., r) and the logit biases (..., V)."""
        e = self.markov_w1(prev)
        return e, self.markov_w2(e)


class ConfidenceHead(nn.Module):
    """``proj``: one logit of acceptance from ``[h ; e]`` (or ``h``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, x: Tensor) -> Tensor:
        """(..., width) -> (...) logits."""
        return self.proj(x)[..., 0]


class DSparkDrafter(DFlashDrafter):
    """The DFlash backbone (same modules, same ``extend``/``draft``/``train_forward``) with ``markov_head`` and, when
    enabled, ``confidence_head``; see the module's notes for the anchor-first layout."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        c = self.config
        self.markov_head = MarkovHead(c.vocab_size, c.markov_rank)
        width = c.hidden_size + (c.markov_rank if c.confidence_head_with_markov else 0)
        self.confidence_head = ConfidenceHead(width) if c.enable_confidence_head else None
        for module in (self.markov_head, self.confidence_head):  # DeepSpec's init: N(0, 0.02), biases 0
            for name, p in (module.named_parameters() if module is not None else ()):
                nn.init.normal_(p, std=0.02) if name.endswith("weight") else nn.init.zeros_(p)

    def confidence(self, h: Tensor, e: Tensor) -> Tensor | None:
        """Confidence logits (...) of final-normed states h (..., H) after previous tokens embedded as e (..., r);
        None without a confidence head."""
        if self.confidence_head is None:
            return None
        x = torch.cat([h, e.to(h.dtype)], dim=-1) if self.config.confidence_head_with_markov else h
        return self.confidence_head(x)

    def heads(self, h: Tensor, base: Tensor, prev: Tensor) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced heads, all slots at once: states h (..., H), the target's LM head on them ``base``
        (..., V) and the previous tokens ``prev`` (...) -> the biased logits (..., V) and confidence logits (...)
        (None without a confidence head)."""
        e, bias = self.markov_head(prev)
        return base + bias.to(base.dtype), self.confidence(h, e)

    def chain(self, h: Tensor, base: Tensor, anchor: Tensor, pick: Callable[[Tensor], Tensor],
              confidence: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        """The Markov bias applied slot by slot: states h (b, n, H), base logits (b, n, V), the anchors (b,);
        ``pick`` turns slot j's biased logits (b, V) into its token (b,) (argmax, or a draw), which is slot j + 1's
        previous token. Returns the tokens (b, n), the biased logits (b, n, V) and, when ``confidence``, the
        confidence logits (b, n) (else None)."""
        prev, tokens, logits, conf = anchor, [], [], []
        for j in range(h.shape[1]):
            e, bias = self.markov_head(prev)  # (b, r), (b, V)
            logits.append(base[:, j] + bias.to(base.dtype))
            if confidence:
                conf.append(self.confidence(h[:, j], e))
            prev = pick(logits[-1])  # (b,)
            tokens.append(prev)
        c = torch.stack(conf, dim=1) if confidence and self.confidence_head is not None else None
        return torch.stack(tokens, dim=1), torch.stack(logits, dim=1), c


__all__ = ["ConfidenceHead", "DSparkConfig", "DSparkDrafter", "MarkovHead"]
