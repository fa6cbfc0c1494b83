"""A CTranslate2 peer of a checkpoint's shape: float32 and int8 greedy decoding to forced lengths.

The peer is a Hugging Face ``transformers`` ``MarianMTModel`` with random weights of the model's shape
(d_model, encoder / decoder layers, heads, d_ff, vocabulary; ReLU feed-forward, tied embeddings),
saved with ``save_pretrained`` beside a word-level tokenizer and converted with CTranslate2's
``TransformersConverter`` (quantization none = float32, and int8). Random weights are enough: every
output length is forced, so both systems do the same work whatever the weights predict.

Facts the build relies on: the converter needs a tokenizer saved beside the model (a word-level
``PreTrainedTokenizerFast`` is enough); the Marian converter drops the last vocabulary row, taking it
for Marian's appended ``<pad>``, so ``<pad>`` is put last (id ``vocab``) and the real ids stay below it:
the converted model has exactly ``vocab`` rows, as ours. CTranslate2 starts the decoder from a zero
embedding (no BOS row), and ``min_decoding_length = max_decoding_length`` with ``beam_size=1`` forces an
exact output length (EOS is not produced before the minimum; the output holds no EOS).

Token ids map to peer tokens one to one (id 2 is ``</s>``, id 3 ``<unk>``, any other id ``w<id>``), so
a source row keeps its length, its EOS included; pad ids are dropped.

Lengths in a batch: CTranslate2 takes one ``min/max_decoding_length`` per call. Its per-token
``callback`` can stop a single row (and CTranslate2 then drops finished rows from the batch), but the
Python call per row and token costs ~10-15 microseconds (measured: an int8 step of the Multi30k base
shape at batch 32, 1 thread, took 11-13% longer with a callback that only returns False), which would
bias the peer. So a batch of more than one row is decoded with every row forced to the batch's longest
greedy length (ours: each row's own greedy length), and the peer's tokens are counted as produced:
``rows * longest`` (``tokens``; ``forced_tokens`` is the sum of greedy's lengths, our work). Its ms per
output token and tokens per second are thus its own rates at a batch that does not shrink (a slight
advantage to the peer); its seconds are not comparable with ours at batch > 1, only the per-token rates
are. At batch 1 the work is the same.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

INSTALL_HINT = "pip install -e '.[peers]'"
PEERS = ("ctranslate2",)
QUANTIZATIONS = ("float32", "int8")
EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = "</s>", "<unk>", "<pad>"
EOS_ID, UNK_ID = 2, 3


class PeerUnavailableError(ImportError):
    """A peer's package is not installed; the message says how to install it."""


def require(*packages: str) -> None:
    """Import ``packages`` or raise :class:`PeerUnavailableError` with the install hint (one line)."""
    import importlib

    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError:
            raise PeerUnavailableError(f"the {name} package is not installed ({INSTALL_HINT})") from None


@dataclass(frozen=True)
class MarianShape:
    """The shape of the peer Marian model."""

    vocab: int
    d_model: int = 256
    encoder_layers: int = 3
    decoder_layers: int = 3
    heads: int = 4
    d_ff: int = 1024
    max_positions: int = 1024

    @classmethod
    def of(cls, config: Any, max_positions: int = 1024) -> MarianShape:
        """The shape of a :class:`~lightning_bpd.nn.model.ModelConfig` (one vocabulary: the larger of the two)."""
        return cls(vocab=max(config.src_vocab_size, config.tgt_vocab_size), d_model=config.d_model,
                   encoder_layers=config.n_encoder_layers, decoder_layers=config.n_decoder_layers,
                   heads=config.n_heads, d_ff=config.d_ff, max_positions=max_positions)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def peer_token(i: int) -> str:
    """The peer's token for id ``i`` (below the shape's vocabulary)."""
    return EOS_TOKEN if i == EOS_ID else UNK_TOKEN if i == UNK_ID else f"w{i}"


def peer_vocabulary(vocab: int) -> list[str]:
    """``vocab`` tokens by id, then ``<pad>`` (id ``vocab``: the row the Marian converter drops)."""
    return [peer_token(i) for i in range(vocab)] + [PAD_TOKEN]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars or warnings from ``transformers`` while building and converting."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def build_marian(shape: MarianShape, seed: int = 0):
    """A random-weight ``MarianMTModel`` of ``shape`` in eval mode (``<pad>`` last, EOS id 2, ReLU)."""
    require("transformers")
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    pad = shape.vocab
    config = MarianConfig(vocab_size=shape.vocab + 1, d_model=shape.d_model, encoder_layers=shape.encoder_layers,
                          decoder_layers=shape.decoder_layers, encoder_attention_heads=shape.heads,
                          decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.d_ff, decoder_ffn_dim=shape.d_ff,
                          max_position_embeddings=shape.max_positions, activation_function="relu",
                          pad_token_id=pad, eos_token_id=EOS_ID, decoder_start_token_id=pad,
                          forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    with quiet_transformers():
        return MarianMTModel(config).eval()


def save_marian(model, folder: str | Path) -> Path:
    """``save_pretrained`` the model and a word-level tokenizer of its vocabulary into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    words = peer_vocabulary(model.config.vocab_size - 1)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with quiet_transformers():
        model.save_pretrained(folder)
        PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN,
                                pad_token=PAD_TOKEN).save_pretrained(folder)
    return folder


def ct2_device(device: torch.device | str) -> str:
    """``cuda`` when our model runs there and CTranslate2 sees a GPU, else ``cpu``."""
    import ctranslate2

    return "cuda" if torch.device(device).type == "cuda" and ctranslate2.get_cuda_device_count() > 0 else "cpu"


@dataclass
class CTranslate2Peer:
    """One converted model (``quantization`` float32 or int8) and its timings since :meth:`reset`."""

    name: str
    quantization: str
    translator: Any
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.seconds, self.tokens, self.rows, self.forced = [], [], [], []

    def translate(self, sources: Sequence[Sequence[str]], length: int) -> tuple[list[int], float]:
        """Greedy decoding of every source to exactly ``length`` tokens: output lengths and seconds."""
        start = time.perf_counter()
        results = self.translator.translate_batch(
            [list(s) for s in sources], beam_size=1, min_decoding_length=length, max_decoding_length=length,
            max_input_length=0, return_scores=False)
        seconds = time.perf_counter() - start
        return [len(r.hypotheses[0]) for r in results], seconds

    def run(self, sources: Sequence[Sequence[str]], lengths: Sequence[int], record: bool = True) -> list[int]:
        """Decode one batch forced to its longest length (see the module docstring); keep the timing
        when ``record``. Raises if the peer did not produce the forced lengths."""
        length = max(lengths)
        produced, seconds = self.translate(sources, length)
        if produced != [length] * len(sources):
            raise RuntimeError(f"{self.name}: forced length {length} not reached: {produced}")
        if record:
            self.seconds.append(seconds)
            self.tokens.append(sum(produced))
            self.rows.append(len(sources))
            self.forced.append(sum(lengths))
        return produced

    def report(self) -> dict[str, float]:
        """Totals since :meth:`reset`: ms per output token, tokens per second, seconds, tokens produced,
        the sum of the requested per-row lengths (``forced_tokens``) and the median seconds per input."""
        seconds, tokens = sum(self.seconds), sum(self.tokens)
        per_input = [s / n for s, n in zip(self.seconds, self.rows)] or [0.0]
        return {"ms_per_output_token": 1000 * seconds / max(1, tokens),
                "tokens_per_second": tokens / max(seconds, 1e-9), "seconds": seconds, "tokens": tokens,
                "forced_tokens": sum(self.forced),
                "seconds_per_input_median": statistics.median(per_input)}


def source_tokens(src: Tensor, pad_id: int | None) -> list[list[str]]:
    """(B, S) source ids -> the peer's token strings per row, pad ids dropped (EOS kept)."""
    return [[peer_token(i) for i in row if i != pad_id] for row in src.tolist()]


def build_ctranslate2_peers(shape: MarianShape, quantizations: Sequence[str] = QUANTIZATIONS,
                            device: str = "cpu", threads: int | None = None, model=None) -> list[CTranslate2Peer]:
    """Convert ``model`` (default: :func:`build_marian` of ``shape``) once per quantization and load each
    as a ``ctranslate2.Translator`` (``intra_threads`` = torch's thread count, one translation at a time)."""
    require("ctranslate2", "transformers")
    import ctranslate2

    threads = torch.get_num_threads() if threads is None else threads
    model = build_marian(shape) if model is None else model
    peers = []
    with tempfile.TemporaryDirectory(prefix="lightning_bpd_ct2_") as tmp:
        hf = save_marian(model, Path(tmp) / "marian")
        for quantization in quantizations:
            out = Path(tmp) / f"ct2_{quantization}"
            with quiet_transformers():
                ctranslate2.converters.TransformersConverter(str(hf)).convert(
                    str(out), quantization=None if quantization == "float32" else quantization)
            translator = ctranslate2.Translator(str(out), device=device, intra_threads=threads, inter_threads=1)
            peers.append(CTranslate2Peer(f"ctranslate2_{quantization}", quantization, translator))
    return peers


def failure(err: BaseException) -> str:
    """One line saying why a peer could not run: the exception's type and the first line of its message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


class Peers:
    """The peers that ``bench`` times beside its methods, batch by batch.

    ``Peers.build(["ctranslate2"], module)`` builds them for a checkpoint; :meth:`run` decodes one batch forced to
    the given per-row lengths; :meth:`report` gives each peer's totals since the last report. A peer that cannot
    run (its package missing, its conversion refused, an error while decoding) never ends the bench: it is left
    out from then on and :meth:`report` gives its reason (``{"skipped": reason}``) in its place.
    """

    def __init__(self, peers: list[CTranslate2Peer], info: dict[str, Any],
                 failed: dict[str, str] | None = None) -> None:
        self.peers, self.info, self.failed = peers, info, dict(failed or {})

    @classmethod
    def build(cls, names: Sequence[str], module) -> Peers | None:
        """The peers ``names`` for ``module``'s shape; ValueError for an unknown name (bad input)."""
        if not names:
            return None
        unknown = sorted(set(names) - set(PEERS))
        if unknown:
            raise ValueError(f"unknown peer(s) {unknown}: choose from {list(PEERS)}")
        wanted = [f"ctranslate2_{q}" for q in QUANTIZATIONS]
        try:
            require("ctranslate2", "transformers")
            import ctranslate2

            shape = MarianShape.of(module.model.config, max_positions=4096)
            device = ct2_device(module.device)
            peers = build_ctranslate2_peers(shape, device=device)
        except Exception as err:  # noqa: BLE001 (a peer that cannot run is a reason in the record, not the end)
            reason = str(err) if isinstance(err, PeerUnavailableError) else failure(err)
            return cls([], {"skipped": reason}, dict.fromkeys(wanted, reason))
        info = {"ctranslate2_version": ctranslate2.__version__, "device": device,
                "intra_threads": torch.get_num_threads(), "shape": shape.as_dict(), "weights": "random",
                "lengths": "every row forced to its batch's longest greedy output (tokens counted as produced)"}
        return cls(peers, info)

    def run(self, src: Tensor, pad_id: int | None, lengths: Sequence[int], record: bool = True) -> None:
        sources = source_tokens(src, pad_id)
        for peer in list(self.peers):
            try:
                peer.run(sources, lengths, record)
            except Exception as err:  # noqa: BLE001 (one peer's failure leaves the others and the bench running)
                self.failed[peer.name] = failure(err)
                self.peers.remove(peer)

    def report(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {peer.name: peer.report() for peer in self.peers}
        out.update({name: {"skipped": reason} for name, reason in self.failed.items()})
        for peer in self.peers:
            peer.reset()
        return out
