"""A Hugging Face generation config read as the decoding core's rules on p_1.

``generate(do_sample=False, num_beams=1)`` runs the checkpoint's ``generation_config`` through logits processors
before each argmax. The ones that change greedy's output become a
:class:`~lightning_bpd.decoding.generation_rules.GenerationRules`, which every decoder applies wherever it reads p_1:
``eos_token_id`` (one id or several), ``forced_bos_token_id``, ``forced_eos_token_id``, ``suppress_tokens``,
``begin_suppress_tokens``, ``bad_words_ids`` (of one token or several), ``min_length`` and ``min_new_tokens``.
History-dependent penalties and the other settings that change greedy's output are refused, each with one line
that names it and says how to turn it off (:data:`REFUSED`). Sampling settings (``temperature``, ``top_p``,
``top_k``, ...) do not change greedy's output and are ignored, as ``generate`` ignores them without
``do_sample``.
"""

from __future__ import annotations

from typing import Any

from lightning_bpd.decoding.generation_rules import GenerationRules

# setting -> (whether a value changes greedy's output)
REFUSED = {
    "no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "encoder_no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "repetition_penalty": lambda v: v is not None and v != 1.0,
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "sequence_bias": lambda v: bool(v),
    "exponential_decay_length_penalty": lambda v: v is not None,
    "guidance_scale": lambda v: v is not None and v != 1,
    "forced_decoder_ids": lambda v: bool(v),
    "watermarking_config": lambda v: v is not None,
    "stop_strings": lambda v: bool(v),
}
OFF = {"no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
       "encoder_repetition_penalty": 1.0, "guidance_scale": None, "sequence_bias": None,
       "exponential_decay_length_penalty": None, "forced_decoder_ids": None, "watermarking_config": None,
       "stop_strings": None}


def ids(value: Any) -> tuple[int, ...]:
    """An id, a list of ids or None -> a tuple of ints."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    if hasattr(value, "tolist"):  # a tensor
        return ids(value.tolist())
    return (int(value),)


def refusals(config: Any) -> tuple[str, ...]:
    """One line per setting of ``config`` that changes greedy's output and is not applied."""
    out = []
    for name, changes in REFUSED.items():
        value = getattr(config, name, None)
        if changes(value):
            out.append(f"generation_config.{name}={value!r} changes generate's greedy output and lightning_bpd does "
                       f"not apply it: set it to {OFF[name]!r} (model.generation_config.{name} = {OFF[name]!r}, or "
                       f"in the checkpoint's generation_config.json) to decode")
    return tuple(out)


def rules_from_config(config: Any, fallback_eos: int | None = None, start: int = 1,
                      prompt_start: bool = False) -> GenerationRules:
    """The rules of a transformers ``GenerationConfig`` (``start``: decoder inputs before the first generated
    token, 1 for an encoder-decoder; ``prompt_start``: the padded prompt width of each decode, for a causal LM).
    ``fallback_eos``: the model config's EOS id where the generation config has none."""
    eos = ids(getattr(config, "eos_token_id", None)) or ids(fallback_eos)
    forced_bos = getattr(config, "forced_bos_token_id", None)
    bad = getattr(config, "bad_words_ids", None) or []
    return GenerationRules(
        eos_ids=eos,
        forced_bos=None if forced_bos is None else int(forced_bos),
        forced_eos=ids(getattr(config, "forced_eos_token_id", None)),
        suppress=ids(getattr(config, "suppress_tokens", None)),
        begin_suppress=ids(getattr(config, "begin_suppress_tokens", None)),
        bad_words=tuple(tuple(int(t) for t in word) for word in bad),
        min_length=int(getattr(config, "min_length", None) or 0),
        min_new_tokens=int(getattr(config, "min_new_tokens", None) or 0),
        start=start,
        refused=refusals(config),
        prompt_start=prompt_start,
    )
