"""8x8 -> 32x32 super-resolution with a blockwise Image Transformer: the LightningModule.

The encoder reads the 192 input intensities, the decoder writes the 3,072 target intensities in
raster order (R, G, B per pixel) with local 1D causal self-attention over the last ``window``
positions and row / column / channel position embeddings. Acceptance by distance
(``eps2``: |u - v| <= 2 intensity levels) is the paper's approximate rule for images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from lightning_bpd.callbacks.decode_eval import EvalBatch
from lightning_bpd.decoding import Criterion, parse_criterion
from lightning_bpd.nn.model import ModelConfig
from lightning_bpd.tasks.blockwise_module import BlockwiseModule
from lightning_bpd.tasks.superres.pixels import (
    BOS_ID,
    PAD_ID,
    VOCAB_SIZE,
    image_to_tokens,
    intensity_values,
    tokens_to_image,
)

LOW, HIGH = (8, 8, 3), (32, 32, 3)
TARGET_LEN = HIGH[0] * HIGH[1] * HIGH[2]  # 3072


class SuperResolutionModule(BlockwiseModule):
    """Blockwise Image Transformer for 8x8 -> 32x32 faces.

    Args:
        d_model, n_heads, n_encoder_layers, n_decoder_layers, d_ff, dropout: Transformer shape.
        window: local self-attention window of the decoder (the KV cache keeps only this much).
        k, head_hidden, identity_first, loss_mode, freeze_base, init_from: the blockwise recipe
            (see :class:`~lightning_bpd.tasks.translation.TranslationModule`).
        lr, warmup_steps, label_smoothing, weight_decay, seed: optimization.
        loss_fraction: share of target positions at which the training loss is evaluated (1.0 = all).
        head1_weight: when fine-tuning, p_1's loss is kept in every minibatch with this weight
            (``w * L_1 + (1 - w) * mean of the other heads``); 0 = the paper's loss.
        head_type: ``paper`` (the paper's parallel head, the default) or ``chained`` (head i also sees
            the token proposed for head i-1; Hydra-style, beyond the paper).
        head_loss_decay: head i (1-based) weighs ``head_loss_decay ** (i - 1)`` in the loss (Medusa-2's
            decaying head weights; in random mode the trained head is drawn with these odds); 1 = equal.
        base_lr_scale: when fine-tuning, the base's learning rate is ``lr * base_lr_scale`` (the heads
            keep ``lr``): Medusa-2's joint schedule after a frozen warm-up of the heads.
        frozen_cache_gb: with a frozen base, keep up to this many GiB of its decoder states per
            training example (computed once, no dropout) so that a head step skips the base; 0 = off.
    """

    def __init__(
        self,
        d_model: int = 128,
        n_heads: int = 4,
        n_encoder_layers: int = 2,
        n_decoder_layers: int = 3,
        d_ff: int = 512,
        dropout: float = 0.1,
        window: int = 256,
        k: int = 1,
        head_hidden: int | None = None,
        identity_first: bool = False,
        loss_mode: str = "random",
        freeze_base: bool = False,
        init_from: str | None = None,
        lr: float = 1e-3,
        warmup_steps: int = 500,
        label_smoothing: float = 0.0,
        weight_decay: float = 0.0,
        seed: int = 0,
        loss_fraction: float = 1.0,
        head1_weight: float = 0.0,
        head_type: str = "paper",
        head_loss_decay: float = 1.0,
        base_lr_scale: float = 1.0,
        frozen_cache_gb: float = 4.0,
    ) -> None:
        config = ModelConfig(
            src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE, d_model=d_model, n_heads=n_heads,
            n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers, d_ff=d_ff, dropout=dropout, k=k,
            head_hidden=head_hidden, identity_first=identity_first, head_type=head_type, share_embeddings=True,
            src_positions="image",
            tgt_positions="image", src_image_shape=LOW, tgt_image_shape=HIGH, window=window, pad_id=PAD_ID,
            bos_id=BOS_ID, eos_id=None,
        )
        super().__init__(config, loss_mode, freeze_base, init_from, lr, warmup_steps, label_smoothing, weight_decay,
                         seed, loss_fraction, head1_weight, head_loss_decay, base_lr_scale, frozen_cache_gb)
        self.save_hyperparameters()
        self.values = intensity_values()

    # ---- DecodeEval hooks --------------------------------------------------------------------------
    def max_decode_len(self, src: torch.Tensor) -> int:
        """Every image has exactly 3,072 target intensities."""
        return TARGET_LEN

    def make_criterion(self, spec: str) -> Criterion:
        return parse_criterion(spec, values=self.values)

    def decode_eval_batches(self, stage: str, limit: int | None, batch_size: int) -> list[EvalBatch]:
        low, high = self.trainer.datamodule.eval_examples(stage, limit)
        batches = []
        for start in range(0, low.shape[0], batch_size):
            lo, hi = low[start : start + batch_size], high[start : start + batch_size]
            src = image_to_tokens(lo).to(self.device)  # (B, 192)
            batches.append(EvalBatch(src, self.max_decode_len(src), list(hi), list(lo), list(range(start, start + lo.shape[0]))))
        return batches

    @staticmethod
    def to_images(outputs: list[list[int]]) -> torch.Tensor:
        """Decoded token lists -> (N, 3, 32, 32) float images in [0, 255]."""
        tokens = torch.tensor([o + [PAD_ID] * (TARGET_LEN - len(o)) for o in outputs])
        return tokens_to_image(tokens, HIGH[0], HIGH[1]).permute(0, 3, 1, 2).float()

    def decode_eval_metrics(
        self, outputs: list[list[int]], batches: list[EvalBatch], greedy: list[list[int]] | None = None
    ) -> dict[str, float]:
        pred = self.to_images(outputs)
        truth = torch.stack([r for b in batches for r in b.references]).permute(0, 3, 1, 2).float()
        metrics = {
            "psnr": float(peak_signal_noise_ratio(pred, truth, data_range=255.0)),
            "ssim": float(structural_similarity_index_measure(pred, truth, data_range=255.0)),
        }
        if greedy is not None:
            ref = self.to_images(greedy)
            same = bool(torch.equal(pred, ref))
            metrics["psnr_vs_greedy"] = float("inf") if same else float(peak_signal_noise_ratio(pred, ref, data_range=255.0))
            metrics["ssim_vs_greedy"] = float(structural_similarity_index_measure(pred, ref, data_range=255.0))
        return metrics

    def save_samples(self, path: Path, outputs: dict[str, list[list[int]]], batches: list[EvalBatch], n: int) -> None:
        """A PNG grid, one row per image: input (nearest-upsampled), each method's output, ground truth."""
        from torchvision.utils import save_image

        lows = torch.stack([s for b in batches for s in b.sources][:n])  # (n, 8, 8, 3) uint8
        highs = torch.stack([r for b in batches for r in b.references][:n])  # (n, 32, 32, 3) uint8
        up = lows.repeat_interleave(4, 1).repeat_interleave(4, 2).permute(0, 3, 1, 2).float()  # (n, 3, 32, 32)
        columns = [up] + [self.to_images(outputs[m][:n]) for m in outputs] + [highs.permute(0, 3, 1, 2).float()]
        grid = torch.stack(columns, dim=1).flatten(0, 1) / 255.0  # (n * columns, 3, 32, 32), row-major
        path.parent.mkdir(parents=True, exist_ok=True)
        save_image(grid, str(path), nrow=len(columns), padding=2, pad_value=1.0)

    def decode_eval_samples(self, outputs: dict[str, list[list[int]]], blocks: dict[str, list[list[int]]],
                            batches: list[EvalBatch], n: int) -> tuple[list[str], list[list[Any]]]:
        import wandb

        lows = [s for b in batches for s in b.sources]
        highs = [r for b in batches for r in b.references]
        methods = list(outputs)
        columns = ["input", *methods, "ground_truth", *[f"{m}_mean_block" for m in methods if m != "greedy"]]
        images = {m: self.to_images(outputs[m][:n]).permute(0, 2, 3, 1).byte() for m in methods}
        rows = []
        for i in range(min(n, len(lows))):
            up = lows[i].repeat_interleave(4, 0).repeat_interleave(4, 1)  # nearest 8x8 -> 32x32 for display
            row = [wandb.Image(up.numpy())] + [wandb.Image(images[m][i].numpy()) for m in methods]
            row += [wandb.Image(highs[i].numpy())]
            row += [sum(blocks[m][i]) / max(1, len(blocks[m][i])) for m in methods if m != "greedy"]
            rows.append(row)
        return columns, rows
