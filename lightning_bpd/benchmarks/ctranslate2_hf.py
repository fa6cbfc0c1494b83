"""CTranslate2 beside a Hugging Face base: its conversions, each decoding batches of the checkpoint's token ids.

The peers of ``bench-generate`` (:mod:`lightning_bpd.commands.bench_generate`), a library below the command: the
base is converted from its directory, or from a copy saved with ``save_pretrained`` (a fine-tuned base; a Marian
whose ``<pad>`` is not the last id, moved last by :mod:`lightning_bpd.hf.pad_last`, since the converter drops the
last row). :func:`start_ct2` never raises: a missing package or a refused conversion is a reason per peer.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.benchmarks.ctranslate2_peer import (
    PeerUnavailableError,
    ct2_device,
    failure,
    quiet_transformers,
    require,
)
from lightning_bpd.hf.pad_last import move_pad_last, pad_is_last

CT2_HINT = "pip install ctranslate2"


def cut(rows: Sequence[Sequence[int]], eos: int | Sequence[int] | None) -> list[list[int]]:
    """Each row up to and including its first EOS (``eos``: an id, several, or None)."""
    stops = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    out = []
    for row in rows:
        row = list(row)
        end = next((i for i, t in enumerate(row) if t in stops), None)
        out.append(row if end is None else row[: end + 1])
    return out


@contextlib.contextmanager
def base_directory(module) -> Iterator[Path]:
    """A directory holding the base exactly as the module decodes it, with its tokenizer: the pretrained directory
    of a frozen base; a fine-tuned base saved with ``save_pretrained`` beside a copy of the tokenizer otherwise; a
    Marian whose ``<pad>`` is not last (CTranslate2 drops the last row) saved, then ``<pad>`` moved last."""
    pretrained = Path(module.hparams.pretrained)
    config = module.model.base.config
    pad_last = config.model_type != "marian" or pad_is_last(config)
    if module.model.frozen and pad_last:
        yield pretrained
        return
    with tempfile.TemporaryDirectory(prefix="lightning_bpd_hfbase_") as tmp:
        with quiet_transformers():
            module.model.base.save_pretrained(tmp)
            module.tokenizer.hf.save_pretrained(tmp)
            if not pad_last:
                move_pad_last(tmp)
        for extra in pretrained.glob("*.spm"):  # Marian's sentencepiece models, which its tokenizer reads
            if not (Path(tmp) / extra.name).exists():
                shutil.copy(extra, tmp)
        yield Path(tmp)


@dataclass
class CT2Translator:
    """One CTranslate2 conversion of the base and the tokenizer that maps ids to its tokens."""

    name: str
    translator: Any
    tokenizer: Any  # the checkpoint's Hugging Face tokenizer
    pad_id: int
    eos_id: int | None

    def __call__(self, src: Tensor, max_len: int) -> list[list[int]]:
        sources = [self.tokenizer.convert_ids_to_tokens([i for i in row if i != self.pad_id]) for row in src.tolist()]
        results = self.translator.translate_batch(sources, beam_size=1, max_decoding_length=max_len,
                                                  min_decoding_length=0, return_end_token=True, max_input_length=0)
        rows = [self.tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]
        return cut(rows, self.eos_id)


def build_ct2(module, quantizations: Sequence[str], device: str) -> tuple[list[CT2Translator], dict[str, Any]]:
    """The CTranslate2 conversions of the module's base (raises :class:`PeerUnavailableError` without the package);
    a conversion refused is left out, its reason in ``info["failed"]``."""
    try:
        require("ctranslate2")
    except PeerUnavailableError:
        raise PeerUnavailableError(f"the ctranslate2 package is not installed ({CT2_HINT})") from None
    import ctranslate2

    model = module.model
    ct2_dev = ct2_device(device)
    peers, failed = [], {}
    with base_directory(module) as base, tempfile.TemporaryDirectory(prefix="lightning_bpd_ct2_") as tmp:
        for quantization in quantizations:
            out, name = Path(tmp) / quantization, f"ctranslate2_{quantization}"
            try:
                with quiet_transformers():
                    ctranslate2.converters.TransformersConverter(str(base)).convert(
                        str(out), quantization=None if quantization == "float32" else quantization)
                translator = ctranslate2.Translator(str(out), device=ct2_dev, intra_threads=torch.get_num_threads(),
                                                    inter_threads=1)
            except Exception as err:  # noqa: BLE001 (a refused conversion is a reason in the record)
                failed[name] = f"conversion failed: {failure(err)}"
                continue
            peers.append(CT2Translator(name, translator, module.tokenizer.hf, model.pad_id, model.eos_id))
        converted = converted_from(module, base)
    info = {"ctranslate2_version": ctranslate2.__version__, "device": ct2_dev, "intra_threads": torch.get_num_threads(),
            "converted_from": converted, "quantizations": list(quantizations), "failed": failed}
    return peers, info


def converted_from(module, base: Path) -> str:
    """What a CTranslate2 peer was converted from, for the record."""
    if base == Path(module.hparams.pretrained):
        return "the base directory"
    config = module.model.base.config
    moved = "" if config.model_type != "marian" or pad_is_last(config) else ", <pad> moved last"
    return f"the {'' if module.model.frozen else 'fine-tuned '}base{moved} (saved)"


def start_ct2(module, quantizations: Sequence[str], device: str) -> tuple[list[CT2Translator], dict[str, Any]]:
    """:func:`build_ct2`, where any failure is a reason per quantization (``info["failed"]``), never an exit."""
    try:
        return build_ct2(module, quantizations, device)
    except Exception as err:  # noqa: BLE001 (a peer that cannot run is a row and a reason, not the end of the bench)
        reason = str(err) if isinstance(err, PeerUnavailableError) else f"conversion failed: {failure(err)}"
        return [], {"skipped": reason, "failed": {f"ctranslate2_{q}": reason for q in quantizations}}
