"""lightning_bpd: blockwise parallel decoding (Stern, Shazeer and Uszkoreit, NeurIPS 2018) in PyTorch Lightning.

The model and decoding core (:mod:`lightning_bpd.nn`, :mod:`lightning_bpd.decoding`) import torch only;
the tasks (:mod:`lightning_bpd.tasks`) wrap them in LightningModules.
"""

from lightning_bpd.version import __version__


def load_model(path, device="cpu", base=None):
    """The task module of a checkpoint (or of heads saved on their own, on ``base``), in eval mode; see
    :func:`lightning_bpd.checkpoints.load_model`."""
    from lightning_bpd.checkpoints import load_model as _load

    return _load(path, device, base)


__all__ = ["__version__", "load_model"]
