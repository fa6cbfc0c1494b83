"""llama.cpp as the CPU server of our drafters: its ``llama-speculative-simple`` (built by ``build-llamacpp``)
decoding prompts greedily with the target alone and with the target + our drafter (DFlash: ``--spec-type
draft-dflash``, EAGLE-3: ``--spec-type draft-eagle3``), one process per prompt, on the same GGUFs (``export-heads
--format llamacpp``).

Both rows run the same binary and loop: ``llama-speculative-simple`` needs a speculator, so "alone" is its
``ngram-simple`` speculator with a 1024-token key and value, which never drafts at these lengths (each loop step is then
one target call and one token; its report of 0 drafted tokens is checked). Both use ``threads`` threads (target and
drafter, prompt and steps), float32 weights and KV caches, greedy sampling (``--temp 0 --top-k 1``), the drafter's whole
block (``--spec-draft-n-max B-1``: a DFlash block of B, an EAGLE-3 chain of B - 1 drafts; no probability cut-off:
``--spec-draft-p-min 0``), ``max_new`` new tokens (``-n max_new - 1``: the loop makes one token more than ``-n``),
stopping at the GGUF's end-of-generation tokens. The drafted loop may run past the cap by up to ``B - 1`` tokens (its
speculators draft ``B - 1`` tokens whatever the budget left): those are timed, and only its first ``max_new`` tokens
are compared. llama.cpp's EAGLE-3 speculator drafts its chain greedily (the most likely of its top 10, over the draft
vocabulary mapped to target ids), as ours does.

Timing: llama.cpp's own clock as the binary reports it: "encoded" (the prompt's prefill in the target, and the
drafter fed its features) plus "decoded" (the generation loop: drafting, verification, sampling); model loading and
process start are excluded from both rows. Acceptance: its ``n_drafted`` / ``n_accept``; each loop step is one target
call that commits ``accepted + 1`` tokens, so target calls = ``n_predict - n_accept``.

Outputs: the binary prints text, not ids (``"\\n\\n" + prompt + new text + "\\n\\n\\n\\n"`` on stdout, its
end-of-generation token not printed), so rows are compared as bytes: the prompt's bytes (its ids' pieces, as
llama.cpp prints them) are cut off the front. The prompt goes in as text (``-f``, escapes off); :func:`tokenization_check` first checks that
llama.cpp tokenizes every prompt to the checkpoint tokenizer's ids (``llama-tokenize``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.registry import kinds

__all__ = ["ALONE", "DFLASH", "EAGLE3", "LlamaCppRun", "SpecReport", "SpeculativeSimple", "drafted_name", "new_bytes",
           "parse_report", "spec_types", "token_bytes", "tokenization_check"]

ALONE = "llamacpp_f32"  # the row of the target alone


def drafted_name(kind: str) -> str:
    """The row of the target + our drafter of kind ``kind`` (``llamacpp_dflash``)."""
    return f"llamacpp_{kind}"


def spec_types() -> list[str]:
    """llama.cpp's ``--spec-type`` of every registered drafter kind llama.cpp runs (``draft-dflash``, ...)."""
    return [k.llamacpp_spec_type for k in kinds() if k.llamacpp_spec_type]


DFLASH, EAGLE3 = drafted_name("dflash"), drafted_name("eagle3")  # two kinds' rows (the tests name them)
ATTEMPTS = 5  # runs of one prompt before its lost output is an error (see SpeculativeSimple.run)
NEVER_DRAFTS = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024", "--spec-ngram-simple-size-m",
                "1024")  # a key of 1024 tokens and 1024 more to draft: no match before 2049 tokens of context
REPORT = {  # llama-speculative-simple's summary lines (its LOG_INF, on stderr)
    "encoded": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
    "n_predict": re.compile(r"n_predict\s*=\s*(\d+)"),
}


@dataclass(frozen=True)
class SpecReport:
    """What ``llama-speculative-simple`` reports of one prompt's decode."""

    prompt_tokens: int
    encode_seconds: float
    new_tokens: int  # n_predict: committed tokens (a drafted run may count accepted tokens past its EOS)
    decode_seconds: float
    drafted: int
    accepted: int

    @property
    def seconds(self) -> float:
        """Prefill + generation, as timed by llama.cpp (loading excluded)."""
        return self.encode_seconds + self.decode_seconds

    @property
    def target_calls(self) -> int:
        """Loop steps: each one target call committing its accepted drafts and one token of its own."""
        return self.new_tokens - self.accepted


def parse_report(log: str) -> SpecReport:
    """The summary of ``llama-speculative-simple``'s log (its stderr); ValueError naming the first missing line."""
    found: dict[str, tuple[str, ...]] = {}
    for key, pattern in REPORT.items():
        matches = pattern.findall(log)
        if not matches:
            raise ValueError(f"llama-speculative-simple reported no '{key}' line (its log ends: "
                             f"{log.strip().splitlines()[-1][:200] if log.strip() else 'nothing'})")
        found[key] = matches[-1] if isinstance(matches[-1], tuple) else (matches[-1],)
    return SpecReport(prompt_tokens=int(found["encoded"][0]), encode_seconds=float(found["encoded"][1]),
                      new_tokens=int(found["n_predict"][0]), decode_seconds=float(found["decoded"][1]),
                      drafted=int(found["n_drafted"][0]), accepted=int(found["n_accept"][0]))


@cache
def byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet: character -> the byte it stands for (GPT-2's map: printable bytes are
    themselves, the others the characters from U+0100 on, in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> bytes:
    """The bytes llama.cpp prints for ``ids`` of a byte-level BPE tokenizer: special and added tokens as their text,
    the others decoded from the byte alphabet."""
    decoder = byte_decoder()
    added = {int(i): t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()}
    out = bytearray()
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(list(ids)), strict=True):
        if int(token_id) in added:
            out += added[int(token_id)].encode("utf-8")
        else:
            out += bytes(decoder[c] for c in token)
    return bytes(out)


def new_bytes(stdout: bytes, prompt: bytes) -> bytes:
    """The new text of ``llama-speculative-simple``'s stdout (``\\n\\n`` + prompt + new text, then ``\\n\\n``
    before and after its report, which goes to stderr); ValueError when it does not have that shape."""
    head, tail = b"\n\n" + prompt, b"\n\n\n\n"
    if not stdout.startswith(head) or not stdout.endswith(tail) or len(stdout) < len(head) + len(tail):
        raise ValueError(f"llama-speculative-simple's output does not echo the prompt as expected (it starts "
                         f"{stdout[:60]!r})")
    return stdout[len(head):-len(tail)]


@dataclass(frozen=True)
class LlamaCppRun:
    """One prompt decoded by llama.cpp to ``max_new`` tokens: its new text (bytes, no end-of-generation token) and its
    report."""

    text: bytes
    report: SpecReport
    max_new: int

    def same(self, alone: LlamaCppRun) -> bool:
        """Whether this (drafted) run's first ``max_new`` tokens are ``alone``'s: the same text, or, where ``alone``
        reached the cap, its text continued by this run's overshoot."""
        if alone.report.new_tokens >= alone.max_new:
            return self.text.startswith(alone.text)
        return self.text == alone.text


class SpeculativeSimple:
    """``llama-speculative-simple`` on ``target`` (GGUF), alone or with ``drafter`` (a drafter's GGUF of
    ``spec_type``, one of :func:`spec_types`, drafting ``block_size - 1`` tokens per step):
    ``run(prompt, prompt_bytes, max_new)`` -> :class:`LlamaCppRun`."""

    def __init__(self, binary: str | Path, target: str | Path, threads: int, n_ctx: int,
                 drafter: str | Path | None = None, block_size: int | None = None, spec_type: str = "draft-dflash",
                 timeout: float = 600.0) -> None:
        if threads < 1 or n_ctx < 8:
            raise ValueError(f"llama.cpp needs threads >= 1 and a context >= 8, got {threads}, {n_ctx}")
        if drafter is not None and (block_size is None or block_size < 2):
            raise ValueError(f"a drafter needs its block size (>= 2), got {block_size}")
        if spec_type not in spec_types():
            raise ValueError(f"spec_type must be one of {', '.join(spec_types())}, got {spec_type!r}")
        self.binary, self.target, self.drafter = str(binary), str(target), None if drafter is None else str(drafter)
        self.threads, self.n_ctx, self.block_size, self.timeout = threads, n_ctx, block_size, timeout
        self.spec_type = spec_type
        self.retries = 0  # runs repeated because llama.cpp's output lost its end

    def speculator_args(self) -> list[str]:
        if self.drafter is None:
            return list(NEVER_DRAFTS)
        t = str(self.threads)
        return ["-md", self.drafter, "--spec-type", self.spec_type, "--spec-draft-n-max", str(self.block_size - 1),
                "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", t, "-tbd", t, "-ctkd", "f32",
                "-ctvd", "f32"]

    def args(self, prompt_file: str | Path, max_new: int) -> list[str]:
        """The command line decoding the prompt in ``prompt_file`` (written by :meth:`run`) to ``max_new`` tokens."""
        t = str(self.threads)
        return [self.binary, "-m", self.target, "-f", str(prompt_file), "--no-escape", "-n", str(max_new - 1),
                "-c", str(self.n_ctx), "-b", str(self.n_ctx), "-t", t, "-tb", t, "-ctk", "f32", "-ctv", "f32",
                "--temp", "0", "--top-k", "1", "--seed", "0", "--color", "off", "--fit", "off",
                *self.speculator_args()]

    def run(self, prompt: str, prompt_bytes: bytes, max_new: int) -> LlamaCppRun:
        """Decode ``prompt`` (text; ``prompt_bytes``: what llama.cpp prints of its ids) to at most ``max_new``
        tokens; RuntimeError (one line) when the binary fails. llama.cpp's log is written by a thread that the
        process does not wait for at exit, so the end of its output (report, text) is sometimes lost (more often on
        a busy machine): such a run is run again, up to :data:`ATTEMPTS` times (counted in ``retries``)."""
        if max_new < 1:
            raise ValueError(f"max_new must be >= 1, got {max_new}")
        with tempfile.TemporaryDirectory(prefix="lightning_bpd_llamacpp_") as tmp:
            path = Path(tmp) / "prompt.txt"
            path.write_bytes(prompt.encode("utf-8") + b"\n")  # -f drops one trailing newline
            for attempt in range(ATTEMPTS):
                stdout, log = self.call(path, max_new)
                try:
                    report = parse_report(log)
                    text = new_bytes(stdout, prompt_bytes)
                except ValueError as err:
                    if attempt + 1 == ATTEMPTS:
                        raise RuntimeError(f"{err} ({ATTEMPTS} runs: llama.cpp's asynchronous log lost the end of "
                                           "its output each time)") from None
                    self.retries += 1
                    continue
                break
        if self.drafter is None and report.drafted:
            raise RuntimeError(f"the target-alone run drafted {report.drafted} tokens (ngram-simple matched)")
        return LlamaCppRun(text, report, max_new)

    def call(self, prompt_file: Path, max_new: int) -> tuple[bytes, str]:
        """One run of the binary: its stdout and its log (stderr); RuntimeError when it fails or times out."""
        try:
            done = subprocess.run(self.args(prompt_file, max_new), capture_output=True, timeout=self.timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{Path(self.binary).name} took longer than {self.timeout:.0f} s") from None
        log = done.stderr.decode("utf-8", errors="replace")
        if done.returncode != 0:
            tail = log.strip().splitlines()[-1][:300] if log.strip() else "no output"
            raise RuntimeError(f"{Path(self.binary).name} failed (exit {done.returncode}): {tail}")
        return done.stdout, log


def tokenization_check(binary: str | Path, gguf: str | Path, tokenizer: Any, prompts: Sequence[str],
                       timeout: float = 120.0) -> list[int]:
    """Indices of the ``prompts`` that ``llama-tokenize`` (BOS as the GGUF says, special tokens parsed, as
    ``llama-speculative-simple`` tokenizes) turns into other ids than ``tokenizer`` does."""
    wrong = []
    with tempfile.TemporaryDirectory(prefix="lightning_bpd_llamacpp_") as tmp:
        path = Path(tmp) / "prompt.txt"
        for i, prompt in enumerate(prompts):
            path.write_bytes(prompt.encode("utf-8"))  # read verbatim by llama-tokenize
            done = subprocess.run([str(binary), "-m", str(gguf), "-f", str(path), "--ids", "--no-escape",
                                   "--log-disable"], capture_output=True, text=True, timeout=timeout, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{Path(binary).name} failed (exit {done.returncode}): "
                                   f"{done.stderr.strip()[-300:] or 'no output'}")
            ids = [int(x) for x in re.findall(r"-?\d+", done.stdout.strip().splitlines()[-1])]
            if ids != list(tokenizer(prompt)["input_ids"]):
                wrong.append(i)
    return wrong
