"""``bench-generate --peers llamacpp --llamacpp-bin DIR``: llama.cpp's own binaries (``build-llamacpp``) as rows of
the bench: ``llamacpp_f32``, the target alone, and, on a drafter's checkpoint, the target + our drafter:
``llamacpp_<kind>`` (``llamacpp_dflash``, ``llamacpp_eagle3``; ``--spec-type`` the kind's) (:mod:`lightning_bpd.benchmarks.llamacpp_speculative`:
how they run, are timed and are compared).

The checkpoint is written as ``target.gguf`` and ``drafter.gguf`` (``export-heads --format llamacpp``); every prompt
must tokenize in llama.cpp as in the checkpoint's tokenizer (else the peer is refused). A row is a
:class:`~lightning_bpd.benchmarks.lm_generate.SelfTimed` of llama.cpp's text, its seconds (llama.cpp's clock) and its
target calls; its text is compared with generate's (the bench's ``differs_from_hf_generate``) and the drafted row's
with the alone row's (:func:`agreement`).

A run whose target is a ``.gguf`` file (the user's own quantized GGUF, e.g. ``SmolLM2-135M-Instruct.Q4_1.gguf``) gets
two rows more on that very file, named by its weights' type (:func:`~lightning_bpd.drafters.common.llamacpp.gguf_type`):
``llamacpp_q4_1``, llama.cpp alone, and ``llamacpp_q4_1_dflash`` (or ``_eagle3``) with our drafter; the prompts must
tokenize alike there too. Their text differs from generate's (float32) as the weights do: what counts there is the
drafted row against the alone row on the same file (``q4_1_dflash_vs_alone`` in the record). The record's ``rows``
names the GGUF each row ran on, ``pairs`` the (alone, drafted) rows compared.

``bench --run`` (several runs of one base, :func:`start_llamacpp_runs`) runs the base alone once, on the runs' own GGUF
where their target is one (``llamacpp_q4_1``), else on ``target.gguf`` (``llamacpp_f32``), and each run's drafter on
that same target: ``llamacpp_q4_1+NAME`` / ``llamacpp_f32+NAME``; a retrieval run (``NAME=BASE@retrieval:FILE``) gets
``llama-lookup`` drafting chains from its datastore exported as llama.cpp's lookup cache
(:mod:`lightning_bpd.benchmarks.llamacpp_lookup`).

Where the build holds ``llama-bench``, the record's ``pass_cost`` says what a pass of n tokens costs llama.cpp on each
GGUF against a 1-token step (:mod:`lightning_bpd.benchmarks.llamacpp_pass_cost`): the tokens per call its drafted
rows must average to break even.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_bpd.benchmarks.llamacpp_build import BuildError, binaries, read_stamp
from lightning_bpd.benchmarks.llamacpp_lookup import LOOKUP, Lookup
from lightning_bpd.benchmarks.llamacpp_pass_cost import BENCH, pass_costs, pass_record
from lightning_bpd.benchmarks.llamacpp_speculative import (
    ALONE,
    NEVER_DRAFTS,
    LlamaCppRun,
    SpeculativeSimple,
    drafted_name,
    spec_types,
    token_bytes,
    tokenization_check,
)
from lightning_bpd.benchmarks.lm_generate import SelfTimed
from lightning_bpd.drafters.registry import kind_of

__all__ = ["LlamaCppBinary", "agreement", "agreement_line", "drafted_row", "pair_key", "start_llamacpp_bin",
           "start_llamacpp_runs"]

SPEC, TOKENIZE = "llama-speculative-simple", "llama-tokenize"


class LlamaCppBinary:
    """A bench method: each row of ``src`` (B, P) (pads left out) decoded by ``runner`` from its prompt's text;
    returns :class:`SelfTimed`. ``runs`` keeps each prompt's last run (by its ids)."""

    def __init__(self, runner: SpeculativeSimple, tokenizer: Any, texts: dict[tuple[int, ...], str], pad_id: int,
                 eos_ids: Sequence[int]) -> None:
        self.runner, self.tokenizer, self.texts, self.pad_id = runner, tokenizer, texts, pad_id
        self.eos_ids = frozenset(eos_ids)
        self.overshoots = runner.drafter is not None  # a drafted loop may run past the cap (compare its first tokens)
        self.runs: dict[tuple[int, ...], LlamaCppRun] = {}

    def same_text(self, text: bytes, row: list[int]) -> bool:
        """Whether ``text`` is what llama.cpp prints of ``row`` (its end-of-sequence token not printed), continued by
        a drafted run's overshoot where ``row`` ends at the cap."""
        if row and row[-1] in self.eos_ids:
            return text == token_bytes(self.tokenizer, row[:-1])
        want = token_bytes(self.tokenizer, row)
        return text.startswith(want) if self.overshoots else text == want

    def __call__(self, src: Tensor, max_new: int) -> SelfTimed:
        texts, counts, seconds, calls = [], [], 0.0, 0
        for row in src.tolist():
            ids = tuple(t for t in row if t != self.pad_id)
            if ids not in self.texts:
                raise ValueError("a prompt the llama.cpp peer was not started with")
            run = self.runner.run(self.texts[ids], token_bytes(self.tokenizer, ids), max_new)
            self.runs[ids] = run
            texts.append(run.text)
            counts.append(run.report.new_tokens)
            seconds += run.report.seconds
            calls += run.report.target_calls
        return SelfTimed(None, seconds, calls, texts, counts, self.same_text)


def agreement(alone: LlamaCppBinary, drafted: LlamaCppBinary, alone_row: str = ALONE) -> dict[str, Any]:
    """The drafted runs against the alone runs (row ``alone_row``) of the same prompts on the same GGUF: rows whose
    text differs, and llama.cpp's acceptance over them (drafted and accepted tokens, tokens per target call)."""
    keys = [k for k in drafted.runs if k in alone.runs]
    differ = [i for i, k in enumerate(keys) if not drafted.runs[k].same(alone.runs[k])]
    reports = [drafted.runs[k].report for k in keys]
    drafted_tokens, accepted = sum(r.drafted for r in reports), sum(r.accepted for r in reports)
    tokens, calls = sum(r.new_tokens for r in reports), sum(r.target_calls for r in reports)
    seconds = sum(r.seconds for r in reports)
    return {"gguf": drafted.runner.target, "prompts": len(keys), f"differs_from_{alone_row}": len(differ),
            "differing_rows": differ[:10],
            "runs_repeated": {"alone": alone.runner.retries, "drafted": drafted.runner.retries},
            "drafted": drafted_tokens, "accepted": accepted, "acceptance_rate": accepted / max(1, drafted_tokens),
            "tokens_per_target_call": tokens / max(1, calls), "llamacpp_tokens": tokens,
            "llamacpp_tokens_per_second": tokens / max(seconds, 1e-9),
            "alone_tokens_per_second": sum(alone.runs[k].report.new_tokens for k in keys) / max(
                1e-9, sum(alone.runs[k].report.seconds for k in keys))}


def drafted_row(module: Any) -> tuple[str, int, str] | None:
    """The drafted row of a drafter's run (``llamacpp_<kind>``), its drafter's default block (its kind's
    ``default_k``) and llama.cpp's ``--spec-type`` for it; None for a run without a drafter; ValueError (one line)
    for a kind llama.cpp does not run."""
    kind = kind_of(module)
    if kind is None:
        return None
    if kind.llamacpp_spec_type is None:
        raise ValueError(f"llama.cpp does not run {kind.title} drafters (no --spec-type for them)")
    return drafted_name(kind.name), kind.default_k(module), kind.llamacpp_spec_type


def own_rows(gguf: Path, drafted: str | None) -> tuple[str, str | None]:
    """The rows of llama.cpp on the run's own target GGUF ``gguf``: alone (``llamacpp_<type>``, e.g.
    ``llamacpp_q4_1``) and, with the drafted row ``drafted`` of the float32 target, with our drafter
    (``llamacpp_q4_1_dflash``)."""
    from lightning_bpd.drafters.common.llamacpp import gguf_type

    alone = f"llamacpp_{gguf_type(gguf)}"
    if alone == ALONE:
        alone += "_gguf"  # a float32 GGUF of the user's: not the float32 target.gguf written here
    return alone, None if drafted is None else f"{alone}_{drafted.removeprefix('llamacpp_')}"


def check_tokenization(binary: Path, gguf: Path, tokenizer: Any, prompts: Sequence[str]) -> None:
    """ValueError (one line) unless llama.cpp tokenizes every prompt with ``gguf`` as ``tokenizer`` does."""
    wrong = tokenization_check(binary, gguf, tokenizer, prompts)
    if wrong:
        raise ValueError(f"llama.cpp tokenizes {len(wrong)} of {len(prompts)} prompts with {gguf.name} otherwise than "
                         f"the checkpoint's tokenizer (first: prompt {wrong[0]}, {prompts[wrong[0]][:40]!r})")


def write_target(module: Any, folder: Path) -> Path:
    """``folder/target.gguf``: the base of the run ``module`` as a float32 GGUF with its tokenizer."""
    from lightning_bpd.drafters.common.llamacpp import TARGET_GGUF, target_gguf
    from lightning_bpd.hf.gguf_llama import write_llama_gguf

    name = Path(str(module.hparams.get("pretrained")))
    return write_llama_gguf(module.model.base, module.tokenizer, folder / TARGET_GGUF,
                            name=name.stem if target_gguf(module) is not None else name.name)


def binary_methods(module: Any, prompts: Sequence[str], rows: Sequence[tuple[str, SpeculativeSimple]]
                   ) -> dict[str, LlamaCppBinary]:
    """Each ``(row, runner)`` as a bench method decoding ``prompts`` of the run ``module`` (its tokenizer and ids)."""
    model, tokenizer = module.model, module.tokenizer
    texts = {tuple(t for t in module.encode_prompts([p])[0].tolist() if t != model.pad_id): p for p in prompts}
    eos = model.generation_rules.eos_ids or [model.eos_id]
    return {row: LlamaCppBinary(runner, tokenizer, texts, model.pad_id, eos) for row, runner in rows}


def binary_info(found: dict[str, Path], bin_dir: str | Path, threads: int, n_ctx: int, folder: Path,
                prompts: Sequence[str]) -> dict[str, Any]:
    """The record's settings of llama.cpp's binaries, shared by both benches."""
    stamp = read_stamp(bin_dir) or {}
    return {"binary": str(found[SPEC]), "llama_cpp_python_source": stamp.get("version"), "threads": threads,
            "n_ctx": n_ctx, "weights": "float32", "kv_cache": "float32", "folder": str(folder),
            "tokenization_checked_prompts": len(prompts), "tokenization_differs": 0,
            "alone": f"{SPEC} with {' '.join(NEVER_DRAFTS)} (never drafts; 0 drafted checked)",
            "timing": "llama-speculative-simple's own clock: encoded (prefill) + decoded (the loop); loading excluded",
            "outputs_compared_as": "text (the binary prints text): generate's rows decoded to bytes, EOS left out"}


def own_gguf_info(own: Path, alone: str, drafted: Any, prompts: Sequence[str], differs: list[int]) -> dict[str, Any]:
    """The record of llama.cpp's rows on the run's own GGUF ``own`` (``drafted``: its drafted row or rows)."""
    from lightning_bpd.drafters.common.llamacpp import gguf_type

    return {"gguf": str(own), "weights": gguf_type(own), "alone": alone, "drafted": drafted, "kv_cache": "float32",
            "tokenization_checked_prompts": len(prompts), "tokenization_differs": len(differs),
            "tokenization_differing_prompts": differs,
            "compared_as": "the drafted row against the alone row on this file (its text differs from the float32 "
                           "generate's as its weights do)"}


def agreement_line(agreed: dict[str, Any], alone: str) -> str:
    """What a bench prints of :func:`agreement`."""
    return (f"llama.cpp + our drafter on {Path(agreed['gguf']).name}: {agreed[f'differs_from_{alone}']} of "
            f"{agreed['prompts']} rows differ from llama.cpp alone on it; {agreed['accepted']} of "
            f"{agreed['drafted']} drafted tokens accepted, {agreed['tokens_per_target_call']:.2f} tokens per target "
            "call")


def pass_cost_info(bin_dir: str | Path, ggufs: Sequence[str | Path], threads: int, block: int,
                   module: Any, prompts: Sequence[str], repetitions: int = 3) -> dict[str, Any]:
    """The record's ``pass_cost``: on each GGUF of ``ggufs``, a pass of 1 to ``block`` tokens after a median
    prompt's tokens (:func:`~lightning_bpd.benchmarks.llamacpp_pass_cost.pass_costs`); why not, where the build has
    no ``llama-bench`` (``skipped``) or it failed (``failed``: the bench's rows still run)."""
    try:
        binary = binaries(bin_dir, (BENCH,))[BENCH]
    except BuildError as err:
        return {"skipped": str(err)}
    lengths = sorted(len(module.tokenizer(p)["input_ids"]) for p in prompts)
    depth = lengths[len(lengths) // 2] if lengths else 0
    sizes = list(range(1, max(2, block) + 1))
    try:
        return {Path(gguf).name: pass_record(pass_costs(binary, gguf, threads, sizes, depth, repetitions), depth,
                                             threads, repetitions) for gguf in dict.fromkeys(str(g) for g in ggufs)}
    except RuntimeError as err:
        return {"failed": str(err)}


def lookup_row(bin_dir: str | Path, target: Path, threads: int, n_ctx: int, exported: dict[str, Any], depth: int
               ) -> tuple[Lookup, dict[str, Any]]:
    """``llama-lookup`` on ``target`` drafting chains of up to ``depth`` tokens from a datastore's lookup cache
    (``exported``: :func:`~lightning_bpd.tasks.lm.lookup_cache.export_lookup_cache`'s record), and its record."""
    binary = binaries(bin_dir, (LOOKUP,))[LOOKUP]
    return Lookup(binary, target, threads, n_ctx, exported["lookup_cache"], depth), {
        **exported, "binary": str(binary), "spec_draft_n_max": depth,
        "proposer": "lookup cache of the retrieval datastore"}


def pair_key(drafted: str) -> str:
    """The record's key of a drafted row's :func:`agreement` (``dflash_vs_alone``, ``f32+a_vs_alone``)."""
    return f"{drafted.removeprefix('llamacpp_')}_vs_alone"


def start_llamacpp_bin(module: Any, prompts: Sequence[str], bin_dir: str | Path, threads: int,
                       folder: str | Path, block_size: int | None = None
                       ) -> tuple[dict[str, LlamaCppBinary], dict[str, Any]]:
    """The methods (``llamacpp_f32``; and ``llamacpp_dflash`` or ``llamacpp_eagle3`` for a drafter's checkpoint,
    drafting ``block_size - 1`` tokens per step, default the drafter's; and, where the run's target is a GGUF file,
    the same on that file: ``llamacpp_<type>`` and ``llamacpp_<type>_dflash`` or ``_eagle3``), their GGUFs written
    in ``folder``, and the record; ValueError (one line) when the binaries are missing, the checkpoint cannot be
    written or llama.cpp tokenizes a prompt otherwise."""
    from lightning_bpd.drafters.common.llamacpp import DRAFTER_GGUF, TARGET_GGUF, target_gguf, write_llamacpp

    found = binaries(bin_dir, (SPEC, TOKENIZE))
    model, tokenizer = module.model, module.tokenizer
    folder = Path(folder)
    drafted = drafted_row(module)
    own = target_gguf(module)
    if drafted:
        write_llamacpp(module, folder, float32_target=True)
    else:
        write_target(module, folder)
    rows = [(ALONE, folder / TARGET_GGUF, False)]  # (row, target GGUF, with our drafter)
    if drafted:
        rows.append((drafted[0], folder / TARGET_GGUF, True))
    if own is not None:
        alone_own, drafted_own = own_rows(own, drafted[0] if drafted else None)
        rows += [(alone_own, own, False)] + ([(drafted_own, own, True)] if drafted_own else [])
    check_tokenization(found[TOKENIZE], folder / TARGET_GGUF, tokenizer, prompts)  # the rows compared with generate
    # the user's own GGUF is compared with itself (drafted against alone): a prompt llama.cpp tokenizes otherwise
    # there (its own pre-tokenizer against transformers' reading of the file) is counted, not refused
    own_differs = tokenization_check(found[TOKENIZE], own, tokenizer, prompts) if own is not None else []
    n_ctx = model.n_positions or 2048
    block = (block_size or drafted[1]) if drafted else None
    spec_type = drafted[2] if drafted else spec_types()[0]  # alone: never read
    methods = binary_methods(module, prompts, [
        (row, SpeculativeSimple(found[SPEC], target, threads, n_ctx, folder / DRAFTER_GGUF if with_drafter else None,
                                block if with_drafter else None, spec_type)) for row, target, with_drafter in rows])
    info: dict[str, Any] = {
        **binary_info(found, bin_dir, threads, n_ctx, folder, prompts),
        "rows": {row: str(target) for row, target, _ in rows},
        "pairs": ([[ALONE, drafted[0]]] if drafted else []) + ([[alone_own, drafted_own]] if own and drafted else [])}
    if drafted:
        info["drafter"] = {"row": drafted[0], "gguf": str(folder / DRAFTER_GGUF), "spec_type": spec_type,
                           "block_size": block, "spec_draft_n_max": block - 1}
        info["pass_cost"] = pass_cost_info(bin_dir, [t for _, t, with_drafter in rows if with_drafter], threads,
                                           block, module, prompts)
    if own is not None:
        info["own_gguf"] = own_gguf_info(own, alone_own, drafted_own, prompts, own_differs)
    return methods, info


def start_llamacpp_runs(runs: dict[str, Any], prompts: Sequence[str], bin_dir: str | Path, threads: int,
                        folder: str | Path, blocks: dict[str, int] | None = None,
                        datastores: dict[str, tuple[str, int]] | None = None, float32: bool = False
                        ) -> tuple[dict[str, LlamaCppBinary], dict[str, Any]]:
    """``bench --run``'s llama.cpp rows of the runs ``runs`` (name -> module, all on one base): the base alone once,
    on the first run's own GGUF where its target is a .gguf file (``llamacpp_<type>``, e.g. ``llamacpp_q4_1``; with
    ``float32``, on its float32 ``target.gguf`` as well), else on its float32 ``target.gguf`` (``llamacpp_f32``), and,
    on each such target, for each run whose kind llama.cpp runs (its ``llamacpp_spec_type``), the run's drafter
    (``folder/NAME/drafter.gguf``), drafting ``blocks[NAME] - 1`` tokens per step (default: the drafter's block):
    ``<alone>+NAME``; each retrieval run of ``datastores`` (name -> its datastore file and tree depth) gets
    ``llama-lookup`` drafting chains of up to that depth from the datastore's lookup cache (:func:`lookup_row`; one export
    of each datastore):
    ``<alone>+NAME`` too. The methods and the record (``rows``: each row's GGUF, ``pairs``: (alone, drafted) rows,
    ``drafters``: each drafted row's run, drafter and block, ``no_drafter``: why a run has none, ``pass_cost``: a pass
    of n tokens on each target); ValueError (one line) when the binaries are missing, a GGUF cannot be written or
    llama.cpp tokenizes a prompt of the float32 target otherwise."""
    from lightning_bpd.drafters.common.llamacpp import DRAFTER_GGUF, TARGET_GGUF, target_gguf, write_llamacpp
    from lightning_bpd.tasks.lm.lookup_cache import export_lookup_cache

    found = binaries(bin_dir, (SPEC, TOKENIZE))
    first = next(iter(runs.values()))
    folder = Path(folder)
    own = target_gguf(first)
    targets: list[tuple[str, Path]] = []  # (the alone row, its GGUF)
    differs: list[int] = []
    if own is not None:  # compared with each other: a prompt tokenized otherwise there is counted (see start_llamacpp_bin)
        targets.append((own_rows(own, None)[0], own))
        differs = tokenization_check(found[TOKENIZE], own, first.tokenizer, prompts)
    if own is None or float32:
        targets.append((ALONE, write_target(first, folder)))
        check_tokenization(found[TOKENIZE], folder / TARGET_GGUF, first.tokenizer, prompts)  # compared with generate
    n_ctx = first.model.n_positions or 2048
    rows: list[tuple[str, SpeculativeSimple]] = []
    drafters: dict[str, Any] = {}
    no_drafter: dict[str, str] = {}
    pairs: list[list[str]] = []
    exported: dict[str, dict[str, Any]] = {}  # a datastore's lookup cache, written once for every run and target
    written: set[str] = set()  # the runs whose drafter.gguf is written (once for every target)
    for alone, target in targets:
        rows.append((alone, SpeculativeSimple(found[SPEC], target, threads, n_ctx)))
        for name, module in runs.items():
            kind, row = kind_of(module), f"{alone}+{name}"
            if name in (datastores or {}):
                datastore, depth = datastores[name]  # type: ignore[index]
                if datastore not in exported:
                    exported[datastore] = export_lookup_cache(datastore, folder / name / "lookup-cache.bin",
                                                              tokenizer=module.tokenizer)
                runner, drafters[row] = lookup_row(bin_dir, target, threads, n_ctx, exported[datastore], depth)
                drafters[row]["run"] = name
            elif kind is None or kind.llamacpp_spec_type is None:
                no_drafter[name] = ("heads, or a proposer of the base alone: llama.cpp runs drafters and retrieval "
                                    "datastores only" if kind is None else
                                    f"llama.cpp does not run {kind.title} drafters (no --spec-type for them)")
                continue
            else:
                drafter = folder / name / DRAFTER_GGUF
                if name not in written:
                    write_llamacpp(module, folder / name, float32_target=False)
                    written.add(name)
                block = (blocks or {}).get(name) or kind.default_k(module)
                runner = SpeculativeSimple(found[SPEC], target, threads, n_ctx, drafter, block,
                                           kind.llamacpp_spec_type)
                drafters[row] = {"run": name, "gguf": str(drafter), "spec_type": kind.llamacpp_spec_type,
                                 "block_size": block, "spec_draft_n_max": block - 1}
            rows.append((row, runner))
            pairs.append([alone, row])
    info: dict[str, Any] = {**binary_info(found, bin_dir, threads, n_ctx, folder, prompts),
                            "rows": {row: str(runner.target) for row, runner in rows}, "pairs": pairs,
                            "drafters": drafters, "no_drafter": no_drafter}
    if drafters:
        block = max(d["spec_draft_n_max"] for d in drafters.values()) + 1
        info["pass_cost"] = pass_cost_info(bin_dir, [target for _, target in targets], threads, block, first, prompts)
    if own is not None:
        info["own_gguf"] = own_gguf_info(own, targets[0][0], [r for a, r in pairs if a == targets[0][0]], prompts,
                                         differs)
    if own is None or float32:
        info["target"] = str(folder / TARGET_GGUF)
    return binary_methods(first, prompts, rows), info
