"""8x8 -> 32x32 super-resolution with a blockwise Image Transformer: the LightningModule.

The encoder reads the 192 input intensities, the decoder writes the 3,072 target intensities in
raster order (R, G, B per pixel) with local 1D causal self-attention over the last ``window``
positions and row / column / channel position embeddings. Acceptance by distance
(``eps2``: |u - v| <= 2 intensity levels) is the paper's approximate rule for images.

Validation also logs the nearest-neighbour upsampling baseline (``nearest/psnr``, by the same PSNR
code over the same images) and how much the model uses its input (``cond/*``, see
:mod:`.conditioning`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

from lightning_bpd.decoding import Criterion, parse_criterion
from lightning_bpd.evaluation import EvalBatch
from lightning_bpd.nn.conditioning import CONDITIONING
from lightning_bpd.nn.config import HEAD_CENTRES, HEAD_PRIORS, INTENSITY_OUTPUTS, ImageOptions, ModelConfig
from lightning_bpd.nn.loss import gaussian_kernel
from lightning_bpd.tasks.blockwise_module import BlockwiseModule
from lightning_bpd.tasks.superres.conditioning import conditioning_diagnostic, nearest_upsample, smooth_upsample
from lightning_bpd.tasks.superres.pixels import (
    BOS_ID,
    OFFSET,
    PAD_ID,
    VOCAB_SIZE,
    image_to_tokens,
    intensity_features,
    intensity_values,
    tokens_to_image,
)

LOW, HIGH = (8, 8, 3), (32, 32, 3)
TARGET_LEN = HIGH[0] * HIGH[1] * HIGH[2]  # 3072
FACTOR = HIGH[0] // LOW[0]  # 4
GREY_ID = OFFSET + 128  # the constant source of the conditioning diagnostic
POSITIONS = ("image", "grid")
# The image options before they existed (checkpoints that lack them were trained this way).
LEGACY_DESIGN = {"tie_output": True, "positions": "image", "scale_positions": False, "direct_conditioning": False,
                 "source_output": False, "conditioning": "nearest", "intensity_prior": 0.0,
                 "intensity_output": "categorical"}
# Head options before they existed: heads 2..k centred their prior where p_1 does. Any base can warm-start
# either kind of head, so these are not compared with a base's design.
LEGACY_HEADS = {"head_centres": "first", "head_neighbours": False}
DESIGN_KEYS = ("out_proj.", "src_pos.", "tgt_pos.", "prior.")


def image_quality(pred: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """PSNR and SSIM of (N, 3, H, W) float images in [0, 255] (one PSNR over all pixels)."""
    return {
        "psnr": float(peak_signal_noise_ratio(pred, truth, data_range=255.0)),
        "ssim": float(structural_similarity_index_measure(pred, truth, data_range=255.0)),
    }


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
        tie_output: the vocabulary projection is the (shared) intensity embedding; off = its own layer,
            so the embedding of the input intensity no longer votes for repeating it.
        positions: ``image`` (separate row / column / channel tables for the 8x8 source and the 32x32
            target) or ``grid`` (one shared table on the 32x32 grid, a source pixel at the centre of
            its 4x4 block).
        scale_positions: position vectors at the size of the token vectors (RMS 1) instead of ~0.15.
        direct_conditioning: the decoder input at target (r, c, channel) adds the embedding of the
            input intensity at (r // 4, c // 4, channel).
        conditioning: which input intensity direct conditioning adds: ``nearest`` (the one under the pixel),
            ``bilinear`` (the bilinear interpolation of the 4 around the pixel's centre, rounded) or ``bicubic``
            (of the 16 around it, rounded and clipped): with ``source_output`` the untrained model's argmax is then
            that upsampling (with a Gaussian output, the untrained model's greedy image is it exactly).
        source_output: the output layer is the embedding of the input intensities, a table of its own
            apart from the decoder's input embedding (needs ``direct_conditioning``, ``tie_output`` off):
            the input intensity under the predicted position then votes for itself, so the model starts
            from nearest-neighbour upsampling and learns the detail, instead of voting for the last token.
        input_noise, input_noise_kind: share of the decoder's teacher-forced input intensities replaced while
            training the base: by intensities from elsewhere in the image (``shuffle``), uniform ones,
            runs copied from elsewhere (``span``) or the model's own greedy guesses (``self``: one extra
            forward pass per step) (:meth:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule.corrupt_inputs`).
        intensity_sigma: train towards a Gaussian of this width (intensity levels) around the true intensity
            instead of a one-hot target (0 = one-hot): intensities are ordinal, and the argmax of a
            distribution trained so is a smoothed mode, not a spike at a saturated value such as 0 or 255
            (whose copies greedy decoding spreads into blank regions). Validation scores plain NLL.
        intensity_prior: a Gaussian prior of this initial width (intensity levels, learned from there; 0 = off)
            in every output distribution, centred on the input intensity that direct conditioning adds
            (:mod:`~lightning_bpd.nn.intensity_prior`): the network's logits are added to it, so drifting
            into a blob of saturated values costs ``(distance / sigma)^2 / 2`` nats that its own context cannot
            take back.
        intensity_output: ``categorical`` (256-way softmax, the Image Transformer's) or ``gaussian`` (a discretized
            Gaussian per intensity whose shift from the input intensity and width the network predicts; needs
            ``intensity_prior``, its initial width): greedy decoding then writes the predicted mean.
        head_centres: ``own`` (default): head i's intensity prior (or Gaussian) is centred on the input intensity
            under the position it predicts, t + i, and each chain link reads that intensity; ``first``: every head
            centred where p_1 is, at t (checkpoints from before this option).
        head_neighbours: chained heads (with ``own`` centres) also read the decoded intensities left of, above-left,
            above and above-right of the pixel each one predicts (:mod:`~lightning_bpd.nn.pixel_neighbours`).
        head_prior: ``own`` gives heads 2..k a copy of the Gaussian output's shift-and-width layer, so that their
            losses cannot move p_1's mean (and with it their own targets under ``head_targets: own``); ``residual``
            reads them out through the prior's layer detached plus a correction of their own (starting at zero);
            ``shared`` (default) reads every head out through the prior's layer.
        head_targets, detach_heads: what heads 2..k train towards (the data or the model's own greedy choices)
            and whether their losses reach the base (see :class:`~lightning_bpd.tasks.translation.TranslationModule`).
        train_readout: with ``freeze_base``, the base's readout trains too: the Gaussian output's shift-and-width layer
            and precision, which act after the decoder states (``head_centres: own``). The decoder stays frozen and its
            states cached, so a step costs a frozen step, and the heads' losses can make p_1 easier to predict (a
            fine-tune of the readout alone; ``head1_weight`` keeps p_1's own loss in every minibatch).
        smooth_intensities: initialize the intensity embeddings (and an untied output layer) with sin/cos
            features of the intensity, so that nearby intensities start alike (initialization only).
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
        tie_output: bool = False,
        positions: str = "grid",
        scale_positions: bool = True,
        direct_conditioning: bool = True,
        conditioning: str = "nearest",
        smooth_intensities: bool = True,
        source_output: bool = True,
        input_noise: float = 0.0,
        input_noise_kind: str = "shuffle",
        intensity_sigma: float = 0.0,
        intensity_prior: float = 0.0,
        intensity_output: str = "categorical",
        head_centres: str = "own",
        head_neighbours: bool = False,
        head_prior: str = "shared",
        head_targets: str = "data",
        detach_heads: str = "none",
        train_readout: bool = False,
    ) -> None:
        if intensity_sigma < 0:
            raise ValueError(f"model.intensity_sigma must be >= 0 (0 = one-hot targets), got {intensity_sigma}")
        if conditioning not in CONDITIONING:
            raise ValueError(f"model.conditioning must be one of {CONDITIONING}, got {conditioning!r}")
        if intensity_output not in INTENSITY_OUTPUTS:
            raise ValueError(f"model.intensity_output must be one of {INTENSITY_OUTPUTS}, got {intensity_output!r}")
        if intensity_output == "gaussian" and intensity_prior <= 0:
            raise ValueError("model.intensity_output: gaussian needs model.intensity_prior > 0 (its initial width, "
                             "in intensity levels; 15 is a good start)")
        if head_centres not in HEAD_CENTRES:
            raise ValueError(f"model.head_centres must be one of {HEAD_CENTRES}, got {head_centres!r}")
        if head_prior not in HEAD_PRIORS:
            raise ValueError(f"model.head_prior must be one of {HEAD_PRIORS}, got {head_prior!r}")
        if positions not in POSITIONS:
            raise ValueError(f"model.positions must be one of {POSITIONS}, got {positions!r}")
        if source_output and (tie_output or not direct_conditioning):
            raise ValueError("model.source_output needs tie_output: false and direct_conditioning: true "
                             f"(got tie_output={tie_output}, direct_conditioning={direct_conditioning})")
        image = ImageOptions(
            src_image_shape=LOW, tgt_image_shape=HIGH, scale_positions=scale_positions,
            direct_conditioning=direct_conditioning, conditioning=conditioning, intensity_prior=intensity_prior,
            intensity_output=intensity_output, intensity_offset=OFFSET, head_centres=head_centres,
            head_neighbours=head_neighbours, head_prior=head_prior,
        )
        config = ModelConfig(
            src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE, d_model=d_model, n_heads=n_heads,
            n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers, d_ff=d_ff, dropout=dropout, k=k,
            head_hidden=head_hidden, identity_first=identity_first, head_type=head_type,
            share_embeddings=not source_output, tie_output_to_source=source_output,
            src_positions=positions, tgt_positions=positions, window=window, tie_output=tie_output, image=image,
            pad_id=PAD_ID, bos_id=BOS_ID, eos_id=None,
        )
        super().__init__(config, loss_mode, freeze_base, init_from, lr, warmup_steps, label_smoothing, weight_decay,
                         seed, loss_fraction, head1_weight, head_loss_decay, base_lr_scale, frozen_cache_gb,
                         input_noise, input_noise_kind, head_targets, detach_heads, train_readout)
        self.save_hyperparameters()
        self.values = intensity_values()
        kernel = gaussian_kernel(VOCAB_SIZE, OFFSET, intensity_sigma) if intensity_sigma > 0 else None
        self.register_buffer("target_kernel", kernel, persistent=False)
        if smooth_intensities:
            self.init_smooth_intensities()

    def init_smooth_intensities(self) -> None:
        """Intensity rows of the embedding <- :func:`intensity_features`; an untied output layer gets the
        same features in a random orthogonal basis: smooth in the intensity too, but not aligned with the
        input embedding (which would vote for repeating the input intensity again). With
        ``source_output`` the source embedding (= output layer) gets the features and the decoder's
        input embedding the rotated ones, for the same reason."""
        d, model = self.model.config.d_model, self.model
        features = intensity_features(d)  # (256, D)

        def rotated() -> torch.Tensor:
            rotation, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))  # (D, D) orthogonal
            return (features.double() @ rotation).float()

        with torch.no_grad():
            if model.config.tie_output_to_source:
                model.src_embed.weight[OFFSET:] = features
                model.tgt_embed.weight[OFFSET:] = rotated()
            else:
                model.tgt_embed.weight[OFFSET:] = features
                if not model.config.tie_output:
                    model.out_proj.weight[OFFSET:] = rotated()

    def train_kernel(self) -> torch.Tensor | None:
        """With ``intensity_sigma``: a Gaussian over neighbouring intensities."""
        return self.target_kernel

    def ordinary_tokens(self) -> tuple[int, int]:
        """The 256 intensity ids."""
        return OFFSET, VOCAB_SIZE

    # ---- checkpoints of another image design -------------------------------------------------------
    @classmethod
    def legacy_hparams(cls, hparams: dict[str, Any]) -> dict[str, Any]:
        """Image options a checkpoint's hyperparameters lack: it predates them, so it was trained with
        the original design (:data:`LEGACY_DESIGN`); :func:`~lightning_bpd.checkpoints.load_model` passes these."""
        return {key: value for key, value in {**LEGACY_DESIGN, **LEGACY_HEADS}.items() if key not in hparams}

    def design_mismatch(self, state: dict[str, Any], prefix: str = "model.") -> list[str]:
        """Keys of the image design (output layer, positions) that differ between ``state`` and this model."""
        ours = {prefix + key for key in self.model.state_dict() if key.startswith(DESIGN_KEYS)}
        theirs = {key for key in state if key.removeprefix(prefix).startswith(DESIGN_KEYS)}
        return sorted(ours ^ theirs)

    def design_error(self, path: str, keys: list[str]) -> str:
        hp = {key: self.hparams.get(key) for key in LEGACY_DESIGN}
        return (f"{path}: the checkpoint was trained with another image design than this model "
                f"({', '.join(f'{k}={v}' for k, v in hp.items())}); differing: {', '.join(keys[:6])}. "
                f"Set model.init_args.tie_output / positions / scale_positions / direct_conditioning / source_output / "
                f"conditioning / intensity_prior / intensity_output as the "
                f"checkpoint was trained (before these options: {LEGACY_DESIGN}).")

    def design_differences(self, checkpoint: dict[str, Any]) -> list[str]:
        """The image options (from the checkpoint's hyperparameters, else its weights' keys) that differ
        from this model's; empty when the designs agree."""
        hp = checkpoint.get("hyper_parameters")
        theirs = {**hp, **self.legacy_hparams(hp)} if isinstance(hp, dict) else None
        differ = [f"{key} {theirs[key]} vs {self.hparams[key]}" for key in LEGACY_DESIGN
                  if theirs is not None and theirs[key] != self.hparams[key]]
        return differ or self.design_mismatch(checkpoint.get("state_dict", checkpoint))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keys = self.design_differences(checkpoint)
        if keys:
            raise ValueError(self.design_error("checkpoint", keys))

    def check_warm_start(self, path: str, checkpoint: dict[str, Any]) -> None:
        """A base of another image design can't warm-start this model: one message that says which options."""
        keys = self.design_differences(checkpoint)
        if keys:
            raise ValueError(self.design_error(f"model.init_from={path}", keys))

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
        metrics = image_quality(pred, truth)
        if greedy is not None:
            ref = self.to_images(greedy)
            same = bool(torch.equal(pred, ref))
            metrics["psnr_vs_greedy"] = float("inf") if same else float(peak_signal_noise_ratio(pred, ref, data_range=255.0))
            metrics["ssim_vs_greedy"] = float(structural_similarity_index_measure(pred, ref, data_range=255.0))
        return metrics

    def decode_eval_extras(self, batches: list[EvalBatch]) -> dict[str, float]:
        """Beside the decoders' rows: nearest-neighbour, bilinear and bicubic upsampling scored by the same
        code on the same images (``nearest/psnr``, ``bilinear/ssim``, ...), and the conditioning diagnostic
        (``cond/*``)."""
        lows = torch.stack([s for b in batches for s in b.sources])  # (N, 8, 8, 3) uint8
        highs = torch.stack([r for b in batches for r in b.references])  # (N, 32, 32, 3) uint8
        up = nearest_upsample(lows, FACTOR).permute(0, 3, 1, 2).float()
        truth = highs.permute(0, 3, 1, 2).float()
        extras = {f"nearest/{key}": value for key, value in image_quality(up, truth).items()}
        for mode in ("bilinear", "bicubic"):
            smooth = smooth_upsample(lows, FACTOR, mode).permute(0, 3, 1, 2)
            extras.update({f"{mode}/{key}": value for key, value in image_quality(smooth, truth).items()})
        if lows.shape[0] >= 2:
            src, tgt = image_to_tokens(lows).to(self.device), image_to_tokens(highs).to(self.device)
            extras.update(conditioning_diagnostic(self.model, src, tgt, GREY_ID, batch_size=16))
        return extras

    def save_samples(self, path: Path, outputs: dict[str, list[list[int]]], batches: list[EvalBatch], n: int) -> None:
        """A PNG grid, one row per image: input (nearest-upsampled), each method's output, ground truth."""
        from torchvision.utils import save_image

        lows = torch.stack([s for b in batches for s in b.sources][:n])  # (n, 8, 8, 3) uint8
        highs = torch.stack([r for b in batches for r in b.references][:n])  # (n, 32, 32, 3) uint8
        up = nearest_upsample(lows, FACTOR).permute(0, 3, 1, 2).float()  # (n, 3, 32, 32)
        columns = [up] + [self.to_images(outputs[m][:n]) for m in outputs] + [highs.permute(0, 3, 1, 2).float()]
        grid = torch.stack(columns, dim=1).flatten(0, 1) / 255.0  # (n * columns, 3, 32, 32), row-major
        path.parent.mkdir(parents=True, exist_ok=True)
        save_image(grid, str(path), nrow=len(columns), padding=2, pad_value=1.0)

    def decode_eval_samples(self, outputs: dict[str, list[list[int]]], blocks: dict[str, list[list[int]]],
                            batches: list[EvalBatch], n: int) -> tuple[list[str], list[list[Any]]]:
        """Rows of (input, each method's output, truth) as (32, 32, 3) uint8 arrays, then mean block
        sizes; the callback wraps the arrays as W&B images (no W&B needed here)."""
        lows = [s for b in batches for s in b.sources]
        highs = [r for b in batches for r in b.references]
        methods = list(outputs)
        columns = ["input", *methods, "ground_truth", *[f"{m}_mean_block" for m in methods if m != "greedy"]]
        images = {m: self.to_images(outputs[m][:n]).permute(0, 2, 3, 1).byte() for m in methods}
        rows = []
        for i in range(min(n, len(lows))):
            up = nearest_upsample(lows[i], FACTOR)  # nearest 8x8 -> 32x32 for display
            row = [up.numpy()] + [images[m][i].numpy() for m in methods] + [highs[i].numpy()]
            row += [sum(blocks[m][i]) / max(1, len(blocks[m][i])) for m in methods if m != "greedy"]
            rows.append(row)
        return columns, rows
