"""A Marian directory laid out as opus-mt is: ``<pad>`` the last id, so that CTranslate2 converts it.

CTranslate2's Marian converter (``MarianMTLoader`` in ``ctranslate2/converters/transformers.py``) takes the last
vocabulary entry for the ``<pad>`` that transformers appends to Marian's vocabulary (opus-mt: pad id = vocab - 1):
it drops the last row of the embeddings and of the output projection, and drops the last token of the vocabulary
only if that token is ``<pad>``. ``make-base`` puts ``<pad>`` at id 2 (the ``tokenizers`` trainer gives the special
tokens the first ids), so the converter dropped a real token's row and kept 8,000 tokens for 7,999 rows: "Source
vocabulary 0 has size 8000 but the model expected a vocabulary of size 7999".

:func:`move_pad_last` swaps ``<pad>`` with the last token in a saved directory (weights, config, generation config,
tokenizer): the same model up to the names of two ids, its outputs unchanged as token strings.
CTranslate2 also starts the decoder from a zero embedding where transformers starts from ``<pad>``'s row. The row
starts at zero, and a Marian trained here keeps it there (:func:`lightning_bpd.hf.base.keep_start_row_zero`: the
tied output projection would move it); :func:`move_pad_last` reports its norm (``start_row_norm``): above 0 (a base
trained elsewhere or before), CTranslate2's translations may differ from ``generate``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["move_pad_last", "pad_is_last"]

GENERATION_IDS = ("pad_token_id", "decoder_start_token_id", "bos_token_id", "eos_token_id", "forced_bos_token_id",
                  "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens", "bad_words_ids")


def pad_is_last(config: Any) -> bool:
    """Whether a (Marian) config's pad id is its last vocabulary id (or it has no pad id)."""
    return config.pad_token_id is None or config.pad_token_id == config.vocab_size - 1


def swap_ids(value: Any, a: int, b: int) -> Any:
    """``value`` (an id, a list of ids, nested lists) with ids ``a`` and ``b`` exchanged."""
    if isinstance(value, list | tuple):
        return [swap_ids(v, a, b) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return b if value == a else a if value == b else value
    return value


def swap_tokenizer_json(path: Path, a: int, b: int) -> None:
    """Exchange ids ``a`` and ``b`` in a ``tokenizer.json`` (model vocabulary, added tokens, post-processor)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    if isinstance(vocab, dict):  # BPE, WordLevel, WordPiece: token -> id
        data["model"]["vocab"] = {token: swap_ids(i, a, b) for token, i in vocab.items()}
    else:  # Unigram: [piece, score] by id
        vocab[a], vocab[b] = vocab[b], vocab[a]
    for token in data.get("added_tokens") or []:
        token["id"] = swap_ids(token["id"], a, b)
    swap_post_processor(data.get("post_processor"), a, b)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def swap_post_processor(processor: dict | None, a: int, b: int) -> None:
    """The special tokens' ids of a (template, or sequence of) post-processor(s), in place."""
    if processor is None:
        return
    for inner in processor.get("processors") or []:
        swap_post_processor(inner, a, b)
    for special in (processor.get("special_tokens") or {}).values():
        special["ids"] = swap_ids(special["ids"], a, b)
    for key in ("sep", "cls"):  # Bert / Roberta processors: [token, id]
        if key in processor:
            processor[key] = [processor[key][0], swap_ids(processor[key][1], a, b)]


def swap_rows(model: Any, a: int, b: int) -> None:
    """Exchange vocabulary rows ``a`` and ``b`` of every embedding, the output projection and the logits bias."""
    tensors = {id(t): t for t in vocabulary_tensors(model)}
    with torch.no_grad():
        for t in tensors.values():
            dim = t.dim() - 1 if t.dim() == 2 and t.shape[0] == 1 else 0  # final_logits_bias is (1, V)
            index = torch.tensor([a, b])
            t.index_copy_(dim, index, t.index_select(dim, index.flip(0)))
    for embedding in (model.get_input_embeddings(), model.get_decoder().embed_tokens,
                      model.get_encoder().embed_tokens):
        if getattr(embedding, "padding_idx", None) is not None:
            embedding.padding_idx = b


def vocabulary_tensors(model: Any) -> list[torch.Tensor]:
    """The tensors indexed by the vocabulary (shared ones once per module that holds them)."""
    out = [model.get_input_embeddings().weight, model.get_encoder().embed_tokens.weight,
           model.get_decoder().embed_tokens.weight, model.get_output_embeddings().weight]
    bias = getattr(model, "final_logits_bias", None)  # Marian's (1, V) buffer
    return [*out, bias] if bias is not None else out


def swap_configs(model: Any, a: int, b: int) -> None:
    """The model's config and generation config with ids ``a`` and ``b`` exchanged."""
    for key in ("pad_token_id", "decoder_start_token_id", "bos_token_id", "eos_token_id", "forced_eos_token_id",
                "forced_bos_token_id"):
        if getattr(model.config, key, None) is not None:
            setattr(model.config, key, swap_ids(getattr(model.config, key), a, b))
    generation = model.generation_config
    for key in GENERATION_IDS:
        if getattr(generation, key, None) is not None:
            setattr(generation, key, swap_ids(getattr(generation, key), a, b))


def move_pad_last(folder: str | Path) -> dict[str, Any] | None:
    """Swap ``<pad>`` with the last token in the Marian directory ``folder`` (rewritten in place); None when the
    model is no Marian or its pad is already last, else what was done. ValueError when it cannot be done."""
    from transformers import AutoConfig, AutoTokenizer, MarianMTModel

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    if config.model_type != "marian" or pad_is_last(config):
        return None
    pad, last = config.pad_token_id, config.vocab_size - 1
    if getattr(config, "decoder_vocab_size", None) not in (None, config.vocab_size):
        raise ValueError(f"{folder}: separate source and target vocabularies; <pad> (id {pad}) cannot be moved last")
    tokenizer_json = folder / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise ValueError(f"{folder}: no tokenizer.json (a fast tokenizer) to move <pad> (id {pad}) to id {last}")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if len(tokenizer) != config.vocab_size or tokenizer.pad_token_id != pad:
        raise ValueError(f"{folder}: the tokenizer ({len(tokenizer)} tokens, pad {tokenizer.pad_token_id}) does not "
                         f"index the model's vocabulary ({config.vocab_size}, pad {pad})")
    moved = tokenizer.convert_ids_to_tokens(last)
    model = MarianMTModel.from_pretrained(folder)
    swap_rows(model, pad, last)
    swap_configs(model, pad, last)
    model.save_pretrained(folder)
    swap_tokenizer_json(tokenizer_json, pad, last)
    check = AutoTokenizer.from_pretrained(folder)
    if check.pad_token_id != last or check.convert_ids_to_tokens(pad) != moved:
        raise ValueError(f"{folder}: moving <pad> last left the tokenizer inconsistent (pad {check.pad_token_id})")
    start = float(model.get_decoder().embed_tokens.weight[last].detach().norm())
    return {"pad": [pad, last], "swapped_with": moved, "start_row_norm": start}
