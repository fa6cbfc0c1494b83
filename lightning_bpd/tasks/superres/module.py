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
from lightning_bpd.nn.loss import gaussian_kernel
from lightning_bpd.tasks.blockwise_module import BlockwiseModule, options_of, split_flat
from lightning_bpd.tasks.superres.architecture import (
    DESIGN,
    HIGH,
    LOW,
    SuperResolutionConfig,
    check_architecture,
    design_of,
)
from lightning_bpd.tasks.superres.input_use import conditioning_diagnostic, nearest_upsample, smooth_upsample
from lightning_bpd.tasks.superres.pixels import (
    OFFSET,
    PAD_ID,
    VOCAB_SIZE,
    image_to_tokens,
    intensity_features,
    intensity_values,
    tokens_to_image,
)
from lightning_bpd.tasks.training_options import TrainingOptions

TARGET_LEN = HIGH[0] * HIGH[1] * HIGH[2]  # 3072
FACTOR = HIGH[0] // LOW[0]  # 4
GREY_ID = OFFSET + 128  # the constant source of the conditioning diagnostic
ARCHITECTURE = SuperResolutionConfig()  # the defaults (BlockwiseModule copies the config)
TRAINING = TrainingOptions(warmup_steps=500, label_smoothing=0.0)
# The image options before they existed, in the flat hyperparameters of old checkpoints (those that lack them were
# trained this way).
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
        architecture: the model (:class:`~lightning_bpd.tasks.superres.architecture.SuperResolutionConfig`, a
            ModelConfig with this task's defaults), its image options in ``image``
            (:class:`~lightning_bpd.nn.config.ImageOptions`). The task fixes the
            vocabulary (256 intensities after pad and BOS; no EOS) and the two rasters (8x8x3 -> 32x32x3); positions
            are ``image`` (row / column / channel tables for each raster) or ``grid`` (one shared table on the 32x32
            grid, a source pixel at the centre of its 4x4 block), the same for source and target; ``window``: the
            decoder's local self-attention window (the KV cache keeps only this much); ``tie_output_to_source``: the
            output layer is the embedding of the input intensities, a table of its own (``tie_output`` and
            ``share_embeddings`` off; it needs ``image.direct_conditioning``): the input intensity under the
            predicted position then votes for itself, so the model starts from the upsampling that
            ``image.conditioning`` names and learns the detail, instead of voting for the last token.
        training: the two-stage recipe and its optimization (:class:`~lightning_bpd.tasks.training_options.
            TrainingOptions`; ``input_noise`` replaces teacher-forced input intensities while the base trains,
            ``train_readout`` trains a Gaussian output's shift-and-width layer beside a frozen base).
        intensity_sigma: train towards a Gaussian of this width (intensity levels) around the true intensity
            instead of a one-hot target (0 = one-hot): intensities are ordinal, and the argmax of a
            distribution trained so is a smoothed mode, not a spike at a saturated value such as 0 or 255
            (whose copies greedy decoding spreads into blank regions). Validation scores plain NLL.
        smooth_intensities: initialize the intensity embeddings (and an untied output layer) with sin/cos
            features of the intensity, so that nearby intensities start alike (initialization only).
    """

    def __init__(
        self,
        architecture: SuperResolutionConfig = ARCHITECTURE,
        training: TrainingOptions = TRAINING,
        intensity_sigma: float = 0.0,
        smooth_intensities: bool = True,
    ) -> None:
        architecture, training = options_of(architecture, training)
        check_architecture(architecture)
        if intensity_sigma < 0:
            raise ValueError(f"model.intensity_sigma must be >= 0 (0 = one-hot targets), got {intensity_sigma}")
        super().__init__(architecture, training)
        self.save_options(architecture=architecture, training=training, intensity_sigma=intensity_sigma,
                          smooth_intensities=smooth_intensities)
        self.values = intensity_values()
        kernel = gaussian_kernel(VOCAB_SIZE, OFFSET, intensity_sigma) if intensity_sigma > 0 else None
        self.register_buffer("target_kernel", kernel, persistent=False)
        if smooth_intensities:
            self.init_smooth_intensities()

    @classmethod
    def flat_init_args(cls, flat: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's flat hyperparameters of before ``architecture``: the image options it lacks are the
        original design's (:meth:`legacy_hparams`), ``positions`` both rasters', ``source_output`` the output
        layer tied to a source embedding of its own."""
        flat = {**flat, **cls.legacy_hparams(flat)}
        positions, source_output = flat.pop("positions"), flat.pop("source_output")
        flat.update(src_positions=positions, tgt_positions=positions, tie_output_to_source=source_output,
                    share_embeddings=not source_output)
        return split_flat(flat, ARCHITECTURE, TRAINING)

    def init_smooth_intensities(self) -> None:
        """Intensity rows of the embedding <- :func:`intensity_features`; an untied output layer gets the
        same features in a random orthogonal basis: smooth in the intensity too, but not aligned with the
        input embedding (which would vote for repeating the input intensity again). With
        ``tie_output_to_source`` the source embedding (= output layer) gets the features and the decoder's
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
        """Image options a checkpoint's flat hyperparameters lack: it predates them, so it was trained with
        the original design (:data:`LEGACY_DESIGN`, :data:`LEGACY_HEADS`)."""
        return {key: value for key, value in {**LEGACY_DESIGN, **LEGACY_HEADS}.items() if key not in hparams}

    def design_mismatch(self, state: dict[str, Any], prefix: str = "model.") -> list[str]:
        """Keys of the image design (output layer, positions) that differ between ``state`` and this model."""
        ours = {prefix + key for key in self.model.state_dict() if key.startswith(DESIGN_KEYS)}
        theirs = {key for key in state if key.removeprefix(prefix).startswith(DESIGN_KEYS)}
        return sorted(ours ^ theirs)

    def design_error(self, path: str, keys: list[str]) -> str:
        ours = design_of(self.model.config)
        legacy = design_of(self.init_args_of_checkpoint({})["architecture"])  # a checkpoint of before the options
        return (f"{path}: the checkpoint was trained with another image design than this model "
                f"({', '.join(f'{k}={v}' for k, v in ours.items())}); differing: {', '.join(keys[:6])}. "
                f"Set model.init_args.architecture's {' / '.join(DESIGN)} as the checkpoint was trained "
                f"(before these options: {', '.join(f'{k}={v}' for k, v in legacy.items())}).")

    def design_differences(self, checkpoint: dict[str, Any]) -> list[str]:
        """The image options (from the checkpoint's hyperparameters, else its weights' keys) that differ
        from this model's; empty when the designs agree."""
        hp = checkpoint.get("hyper_parameters")
        differ = []
        if isinstance(hp, dict):
            theirs, ours = design_of(self.init_args_of_checkpoint(hp)["architecture"]), design_of(self.model.config)
            differ = [f"{key} {theirs[key]} vs {ours[key]}" for key in DESIGN if theirs[key] != ours[key]]
        return differ or self.design_mismatch(checkpoint.get("state_dict", checkpoint))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keys = self.design_differences(checkpoint)
        if keys:
            raise ValueError(self.design_error("checkpoint", keys))
        super().on_load_checkpoint(checkpoint)

    def check_warm_start(self, path: str, checkpoint: dict[str, Any]) -> None:
        """A base of another image design can't warm-start this model: one message that says which options."""
        keys = self.design_differences(checkpoint)
        if keys:
            raise ValueError(self.design_error(f"model.training.init_from={path}", keys))

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
