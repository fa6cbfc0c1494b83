"""CelebA (or built-in synthetic faces) 8x8 -> 32x32 pairs as token batches.

``src`` (B, 192) are the 8x8x3 input intensities, ``tgt`` (B, 3072) the 32x32x3 target intensities,
both in raster order with R, G, B interleaved (see :mod:`.pixels`). Targets have a fixed length, so
there is no EOS. With ``root: null`` the procedurally drawn faces of :mod:`.synthetic_faces` are used.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_bpd.tasks import STAGE_SPLITS
from lightning_bpd.tasks.eval_sampler import UnrepeatedSampler
from lightning_bpd.tasks.resumable import ResumableLoader, ShuffledSampler
from lightning_bpd.tasks.superres.celeba import check_split, load_split
from lightning_bpd.tasks.superres.pixels import image_to_tokens
from lightning_bpd.tasks.superres.self_distilled import load_targets, targets_file
from lightning_bpd.tasks.superres.synthetic_faces import synthetic_split


class ImagePairDataset(Dataset):
    """(low (N, 8, 8, 3), high (N, 32, 32, 3)) uint8 -> items (src tokens, tgt tokens, index)."""

    def __init__(self, low: Tensor, high: Tensor) -> None:
        self.src = image_to_tokens(low)  # (N, 192)
        self.tgt = image_to_tokens(high)  # (N, 3072)

    def __len__(self) -> int:
        return self.src.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, int]:
        return self.src[i], self.tgt[i], i


def collate_images(batch: list[tuple[Tensor, Tensor, int]]) -> dict[str, Tensor]:
    src, tgt, index = zip(*batch)
    return {"src": torch.stack(src), "tgt": torch.stack(tgt), "index": torch.tensor(index)}


class SuperResolutionDataModule(pl.LightningDataModule):
    """Args:
        root: CelebA folder (torchvision's layout or ``img_align_celeba/`` + ``list_eval_partition.txt``);
            ``None`` uses synthetic faces.
        train_split, val_split, test_split: partition names (the shared 5,340-image copy has no test
            partition: point ``test_split`` at ``val`` there).
        limits: optional image caps per split, e.g. ``{val: 64}``.
        synthetic_sizes: images per split of the synthetic faces.
        batch_size, eval_batch_size: images per training / validation batch.
        cache_dir: where preprocessed tensors are cached (JPEGs are decoded once).
        distilled: a folder made by ``python -m lightning_bpd distill`` from a base checkpoint: the training
            targets become that base's greedy outputs (self-distillation, :mod:`.distill`); inputs,
            validation and test stay gold.
    """

    def __init__(
        self,
        root: str | None = None,
        train_split: str = "train",
        val_split: str = "val",
        test_split: str = "test",
        limits: dict[str, int] | None = None,
        synthetic_sizes: dict[str, int] | None = None,
        batch_size: int = 8,
        eval_batch_size: int = 16,
        cache_dir: str = "runs/cache",
        seed: int = 0,
        num_workers: int = 0,
        distilled: str | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1 or eval_batch_size < 1:
            raise ValueError("data.batch_size and data.eval_batch_size must be >= 1")
        self.save_hyperparameters()
        self.root, self.cache_dir, self.seed, self.distilled = root, cache_dir, seed, distilled
        self.split_names = {"train": train_split, "val": val_split, "test": test_split}
        self.limits = dict(limits or {})
        self.synthetic_sizes = synthetic_sizes or {"train": 4000, "val": 64, "test": 64}
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.images: dict[str, tuple[Tensor, Tensor]] = {}
        self.datasets: dict[str, ImagePairDataset] = {}

    def split_images(self, split: str) -> tuple[Tensor, Tensor]:
        """(low (N, 8, 8, 3), high (N, 32, 32, 3)) uint8 of ``split`` (train / val / test)."""
        if split not in self.images:
            name, limit = self.split_names[split], self.limits.get(split)
            if self.root is None:
                n = self.synthetic_sizes[split] if limit is None else min(limit, self.synthetic_sizes[split])
                self.images[split] = synthetic_split(name, n, self.seed, self.cache_dir)
            else:
                low, high, _ = load_split(self.root, name, self.cache_dir, limit)
                self.images[split] = (low, high)
            if split == "train" and self.distilled is not None:
                low = self.images[split][0]
                self.images[split] = (low, load_targets(self.distilled, low))
        return self.images[split]

    def dataset(self, split: str) -> ImagePairDataset:
        if split not in self.datasets:
            self.datasets[split] = ImagePairDataset(*self.split_images(split))
        return self.datasets[split]

    def check_data(self, stage: str | None = "fit") -> None:
        """Fail now, with one line, if the CelebA images of ``stage`` (fit: train and val) are missing: no folder, no
        partition file, or no image of a split. The CLI calls this before it builds the trainer, so that nothing
        (W&B, the run folder) is written first. Decodes nothing; the synthetic faces need no check."""
        if self.root is not None:
            for split in STAGE_SPLITS.get(stage or "fit", []):
                check_split(self.root, self.split_names[split])
        if self.distilled is not None and "train" in STAGE_SPLITS.get(stage or "fit", []):
            targets_file(self.distilled)

    def setup(self, stage: str | None = None) -> None:
        for split in STAGE_SPLITS.get(stage or "fit", []):
            self.dataset(split)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        """Training: a new order per epoch from ``seed`` (:class:`ShuffledSampler`, DDP-aware) in a
        :class:`ResumableLoader`, which a resumed run continues at the batch after the last one trained.
        Evaluation: every example exactly once over all ranks (:class:`UnrepeatedSampler`). No loader draws
        from torch's global RNG (the model's dropout does)."""
        ds = self.dataset(split)
        sampler = ShuffledSampler(len(ds), self.seed) if shuffle else UnrepeatedSampler(len(ds))
        return (ResumableLoader if shuffle else DataLoader)(
            ds, batch_size=self.batch_size if shuffle else self.eval_batch_size, sampler=sampler,
            collate_fn=collate_images, num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
            drop_last=shuffle, generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)

    def eval_examples(self, split: str, limit: int | None) -> tuple[Tensor, Tensor]:
        """The first ``limit`` (all when None) images of a split: (low, high) uint8."""
        low, high = self.split_images(split)
        n = low.shape[0] if limit is None else min(limit, low.shape[0])
        return low[:n], high[:n]
