"""Model building blocks (torch only): attention, KV cache, Transformer stacks, blockwise head, loss."""

from lightning_bpd.nn.blockwise_head import BlockwiseHead
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.loss import BlockwiseLoss, blockwise_loss, choose_heads
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.nn.warm_start import CheckpointMismatchError, freeze_base, load_base_weights

__all__ = [
    "BlockwiseHead",
    "BlockwiseLoss",
    "BlockwiseTransformer",
    "CheckpointMismatchError",
    "KVCache",
    "ModelConfig",
    "blockwise_loss",
    "choose_heads",
    "freeze_base",
    "load_base_weights",
]
