"""A GGUF file as a Hugging Face causal LM: dequantized once into a cached checkpoint folder that every loader reads.

transformers reads a GGUF (``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``, with ``accelerate`` and
``gguf`` installed) but its model refuses ``save_pretrained``. So :func:`resolve_pretrained` loads it dequantized
once, copies the weights into a plain ``AutoModelForCausalLM.from_config`` model and saves that, with the GGUF's own
tokenizer (``AutoTokenizer.from_pretrained(folder, gguf_file=name)``) and the generation config its model carries,
into ``$XDG_CACHE_HOME/lightning_bpd/gguf/<file stem>-<key>`` (default ``~/.cache``; the key hashes the file's size,
first and last MiB): the folder's model, ``generate`` and tokenizer behave as the GGUF's do. The folder is written
under a temporary name and renamed when complete, so an interrupted run leaves none half-made, and every later call
(any command) finds it. Any other path is returned as it is.

    python -m lightning_bpd fit --config conf/lm/dflash.yaml --model.init_args.pretrained=model.Q4_1.gguf
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["cache_folder", "file_key", "is_gguf", "resolve_pretrained"]

SUFFIX = ".gguf"
EXTRAS = ("accelerate", "gguf")  # what transformers' GGUF loader imports
INSTALL = "pip install 'lightning_bpd[gguf]'"
MIB = 1 << 20


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a GGUF file (its suffix, not a directory)."""
    return os.fspath(path).lower().endswith(SUFFIX) and not os.path.isdir(path)


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/lightning_bpd/gguf`` (default ``~/.cache/lightning_bpd/gguf``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lightning_bpd" / "gguf"


def file_key(path: Path) -> str:
    """12 hex digits of SHA-256 over the file's size, its first and its last MiB."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(MIB))
        f.seek(max(0, size - MIB))
        digest.update(f.read(MIB))
    return digest.hexdigest()[:12]


def cache_folder(path: str | os.PathLike) -> Path:
    """Where the GGUF file ``path`` is (or will be) dequantized."""
    path = Path(path)
    return cache_root() / f"{path.stem}-{file_key(path)}"


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def require_extras() -> None:
    """One-line ValueError naming the extra to install where ``accelerate`` or ``gguf`` is missing."""
    missing = []
    for name in EXTRAS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ValueError(f"reading a .gguf model needs {' and '.join(missing)}: {INSTALL} (or pip install "
                         f"{' '.join(missing)})")


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers dequantizes (its legacy reader's and its fast reader's)."""
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        names.update(GGUF_SUPPORTED_ARCHITECTURES)
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        names.update(GGUF_CONFIG_ARCHS)
    except ImportError:
        pass
    return sorted(names - {"general", "tokenizer"})


def read_architecture(path: Path) -> str:
    """The GGUF's ``general.architecture``; one-line ValueError for a file that is no complete GGUF."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as err:  # noqa: BLE001 (a truncated or foreign file fails anywhere in the reader: say so once)
        raise ValueError(f"{path}: not a readable GGUF file ({first_line(err)}): truncated or corrupt? download it "
                         "again") from None
    if end > path.stat().st_size:
        raise ValueError(f"{path}: truncated GGUF file ({path.stat().st_size} bytes, its tensors need {end}): "
                         "download it again")
    return arch


def load_failure(path: Path, arch: str, err: BaseException) -> ValueError:
    """The one line for transformers failing on the GGUF ``path`` of architecture ``arch``."""
    known = supported_architectures()
    if "not supported" in str(err) or isinstance(err, NotImplementedError):  # transformers' words for an architecture
        return ValueError(f"{path}: transformers cannot dequantize a GGUF of architecture {arch!r} (it can: "
                          f"{', '.join(known)}); convert the original Hugging Face checkpoint instead")
    return ValueError(f"{path}: transformers could not read this {arch} GGUF as a causal LM ({first_line(err)})")


def dequantize_into(path: Path, out: Path) -> None:
    """The GGUF ``path`` dequantized into the Hugging Face folder ``out``: weights, tokenizer, generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(path.parent), path.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True,
                                                     quantization_config=GgufConfig(dequantize=True))
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights saved are plain ones
    plain = AutoModelForCausalLM.from_config(config, dtype=quantized.dtype)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(quantized.generation_config)
    plain.eval().save_pretrained(out)
    tokenizer: Any = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tokenizer.save_pretrained(out)
    drop_phantom_tokens(out, plain.get_input_embeddings().num_embeddings)


def drop_phantom_tokens(out: Path, rows: int) -> None:
    """Added tokens of the tokenizer saved in ``out`` at ids past the model's ``rows`` embeddings removed: transformers
    builds a byte-level GGUF vocabulary as a GPT-2 tokenizer, whose default ``<|endoftext|>`` is added after the file's
    tokens where they lack it (a Llama 3 file does). The file has no such token (llama.cpp splits that text into
    bytes) and the model no row for it: kept, the tokenizer would be longer than the model's vocabulary."""
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        file = out / name
        data = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
        added = data.get(key)
        if isinstance(added, list):
            kept: Any = [token for token in added if int(token["id"]) < rows]
        elif isinstance(added, dict):
            kept = {i: token for i, token in added.items() if int(i) < rows}
        else:
            continue
        if len(kept) != len(added):
            data[key] = kept
            file.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def resolve_pretrained(path: str | os.PathLike) -> str:
    """A causal LM path as the Hugging Face loaders take it: a ``.gguf`` file -> its dequantized folder in the cache
    (made on the first call, one line printed to stderr); any other path as it is (a ``PathLike`` as its string).
    One-line ValueError for a missing file, a missing extra, a truncated or corrupt GGUF, or an architecture
    transformers cannot dequantize."""
    if not is_gguf(path):
        return os.fspath(path)
    source = Path(path).expanduser().absolute()
    if not source.is_file():
        raise ValueError(f"{source}: no such file (a .gguf model file is expected)")
    target = cache_folder(source)
    if (target / "config.json").is_file():
        return str(target)
    require_extras()
    arch = read_architecture(source)
    print(f"dequantizing {source} into {target} (once)", file=sys.stderr, flush=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    except OSError as err:
        raise ValueError(f"{target.parent}: cannot write the dequantized model's cache folder ({err.strerror or err}): "
                         "set XDG_CACHE_HOME to a writable folder") from None
    try:
        try:
            dequantize_into(source, partial)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, NotImplementedError) as err:
            raise load_failure(source, arch, err) from None
        try:
            os.rename(partial, target)
        except OSError:
            if not (target / "config.json").is_file():  # not another process's finished copy
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return str(target)
