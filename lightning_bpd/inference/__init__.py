"""Inference: a model prepared for decoding once, from explicit options. Torch only.

    from lightning_bpd.inference import InferenceOptions, build_runtime
    runtime = build_runtime(model, InferenceOptions(precision="int8"))
    greedy_decode(runtime, src, max_len=...); blockwise_decode(runtime, src, Exact(), max_len=...)

A model passed to the decoders directly decodes in its own dtype through the reference products.
"""

from lightning_bpd.inference.options import InferenceOptions
from lightning_bpd.inference.runtime import Runtime, build_runtime

__all__ = ["InferenceOptions", "Runtime", "build_runtime"]
