"""The ``transformers`` releases the adapter is tested on, and every private use of transformers, in one place.

``TESTED`` is the range of ``pyproject.toml``'s ``hf`` extra (a test keeps the two equal): the HF tests
(``tests/hf``, ``tests/benchmarks/test_hf_generate.py``) pass on its versions. Importing :mod:`lightning_bpd.hf`
with a version outside it warns once (:class:`UntestedTransformersWarning`), in one line that names the range: the
adapter may still run, but that exact decoding reproduces ``generate`` is not checked there. Run the HF tests on
the new release, then move the range (here and in ``pyproject.toml``) and the versions below.

What the adapter uses that is not transformers' public API (checked on 5.24.0):

- ``config._attn_implementation`` (:func:`attention_implementation`): the attention kernel decides the mask format
  (``sdpa`` booleans, ``eager`` additive floats); transformers has a setter (``set_attn_implementation``), no
  public getter.
- ``T5Attention._relative_position_bucket`` (:func:`relative_position_buckets`): T5's bias at each row's own
  positions; the public ``compute_bias`` takes one contiguous range of positions for the whole batch.
- :class:`~lightning_bpd.hf.base.StepCache` subclasses ``EncoderDecoderCache`` without running its ``__init__``:
  the attention layers read ``is_updated[layer]``, ``cross_attention_cache.layers[layer].keys / .values`` and
  call ``self_attention_cache.update(keys, values, layer)``.
- Call shapes of decoder layers (``HFSeq2SeqBlockwise.decode_step``): BART / Marian / mBART
  ``layer(hidden, mask, encoder_hidden, encoder_attention_mask=, cache=, use_cache=)`` returning the hidden
  states; T5 ``block(hidden, mask, position_bias, encoder_hidden, encoder_mask, None, cache=)[0]``; and the
  encoder layers' ``forward(hidden_states, attention_mask, **kwargs)`` that
  :class:`~lightning_bpd.hf.lean_layers.LeanEncoderLayer` replaces on a runtime's snapshot.
- Module attribute names read by :mod:`lightning_bpd.hf.base` and :mod:`lightning_bpd.hf.lean_layers`: the decoder's
  ``embed_tokens``, ``embed_positions`` (``weight``, ``offset``), ``embed_scale`` (Marian), ``layernorm_embedding``,
  ``layer_norm``, ``layers`` / ``block``; a BART layer's ``self_attn`` / ``encoder_attn`` (``q_proj``, ``k_proj``,
  ``v_proj``, ``out_proj``, ``num_heads``, ``head_dim``, ``scaling``), ``*_layer_norm``, ``fc1``, ``fc2``,
  ``activation_fn``; T5's ``SelfAttention`` / ``EncDecAttention`` (``k``, ``v``, ``n_heads``,
  ``key_value_proj_dim``, ``relative_attention_*``), ``final_layer_norm``, ``model_dim``; Marian's
  ``final_logits_bias`` buffer.
- The GGUF architectures transformers dequantizes (``modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES``,
  ``integrations.gguf.GGUF_CONFIG_ARCHS``), which :mod:`lightning_bpd.hf.gguf_target` names when it refuses a file
  (only for that message: without them the list is empty).
- ``generate``'s refusal of prompt lookup above one row ("assisted generate is only supported for batch_size = 1"),
  which ``bench-generate`` records as a skipped row.

Public API used where it exists: ``cache=`` (not the deprecated ``past_key_values=``, to be removed in 5.40) for a
model's forward, ``EncoderDecoderCache(DynamicCache(), DynamicCache())``, ``get_encoder`` / ``get_decoder`` /
``get_input_embeddings`` / ``get_output_embeddings``, ``generation_config``.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import Tensor

__all__ = ["TESTED", "UntestedTransformersWarning", "attention_implementation", "check_version", "installed",
           "relative_position_buckets", "untested"]

TESTED = (">=5.24", "<5.40")  # as pyproject.toml's hf extra; the HF tests pass on 5.24.0


class UntestedTransformersWarning(UserWarning):
    """The installed transformers lies outside :data:`TESTED`."""


def untested(version: str) -> str | None:
    """None if ``version`` lies in :data:`TESTED`, else one line saying what is tested and what to do."""
    from packaging.specifiers import SpecifierSet

    tested = ",".join(TESTED)
    if SpecifierSet(tested).contains(version, prereleases=True):
        return None
    return (f"lightning_bpd.hf is tested on transformers{tested}, not {version}: exact decoding may not reproduce "
            f"generate; pip install 'transformers{tested}', or run tests/hf and silence this with "
            "-W ignore::lightning_bpd.hf.compat.UntestedTransformersWarning")


def installed() -> str:
    """The installed transformers version."""
    import transformers

    return transformers.__version__


def check_version(version: str | None = None) -> None:
    """Warn once (:class:`UntestedTransformersWarning`) if transformers (or ``version``) is outside :data:`TESTED`."""
    message = untested(installed() if version is None else version)
    if message is not None:
        warnings.warn(message, UntestedTransformersWarning, stacklevel=3)


def attention_implementation(config: Any) -> str:
    """The attention kernel a config selects (``eager`` when unset): private ``config._attn_implementation``."""
    return config._attn_implementation or "eager"


def relative_position_buckets(attn: Any, relative: Tensor) -> Tensor:
    """T5's decoder buckets of key-minus-query positions (any shape), through the private static
    ``T5Attention._relative_position_bucket`` (causal: not bidirectional)."""
    return attn._relative_position_bucket(relative, bidirectional=False,
                                          num_buckets=attn.relative_attention_num_buckets,
                                          max_distance=attn.relative_attention_max_distance)
