"""llama.cpp on a drafter run whose target is the user's own GGUF file (issue 59; lightning_bpd/benchmarks/
llamacpp_bin_peer.py, llamacpp_files.py, commands/export_heads.py): ``bench --peers llamacpp:BIN``
adds the rows ``llamacpp_q8_0`` and ``llamacpp_q8_0_dflash`` on that file beside the float32 ones, checks its
tokenization and records which GGUF each row used; ``export-heads --format llamacpp`` names that file as the target
to serve. Stand-in binaries here; slow: the real ones of the build-llamacpp folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from lightning_bpd.benchmarks.llamacpp_bin_peer import start_llamacpp_bin
from lightning_bpd.benchmarks.llamacpp_speculative import ALONE, DFLASH
from lightning_bpd.benchmarks.lm_generate import GENERATE
from lightning_bpd.commands.cli import main
from lightning_bpd.drafters.common.llamacpp import gguf_type
from lightning_bpd.hf.gguf_llama import write_llama_gguf
from tests.benchmarks.test_llamacpp_speculative import bench_llamacpp, saved_run, stand_ins
from tests.drafters.dflash.test_speculators import trained
from tests.llamacpp_build import llamacpp_binaries
from tests.tasks.lm.tiny_lm import PROMPTS, tiny_llama, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

Q8, Q8_DFLASH = "llamacpp_q8_0", "llamacpp_q8_0_dflash"
LOGGED_TOKENIZE = r"""#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
here = Path(sys.argv[0]).parent
model = args[args.index("-m") + 1]
with open(here / "tokenized.log", "a") as log:
    log.write(model + "\n")
ids = json.loads((here / "book.json").read_text())[Path(args[args.index("-f") + 1]).read_bytes().decode()]["ids"]
print(ids[:-1] if model.endswith("{wrong}") else ids)
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """An empty dequantization cache of this module's own (``$XDG_CACHE_HOME``), for all its tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        yield


@pytest.fixture(scope="module")
def gguf_run(cache, tmp_path_factory) -> tuple[Path, object, Path]:
    """A DFlash run (moved off its initial weights) whose target is a tiny Llama's Q8_0 GGUF: (its checkpoint, the
    module, the GGUF)."""
    root = tmp_path_factory.mktemp("gguf_dflash")
    tok = tokenizer()
    target = write_llama_gguf(tiny_llama(len(tok)), tok, root / "tiny.Q8_0.gguf", name="tiny", weights="q8_0")
    module = trained(target, target_layer_ids=[0])  # llama.cpp: not the last layer
    ckpt, module = saved_run(module, root)
    return ckpt, module, target


def logged_stand_ins(folder: Path, module, n: int, corrupt: int, wrong: str = "none") -> Path:
    """:func:`stand_ins` whose llama-tokenize logs each GGUF it was given (``tokenized.log``) and drops the last id
    of every prompt for a GGUF whose name ends with ``wrong``."""
    fake = stand_ins(folder, module, PROMPTS, n, corrupt)
    script = LOGGED_TOKENIZE.replace("{python}", sys.executable).replace("{wrong}", wrong)
    (fake / "llama-tokenize").write_text(script)
    return fake


def test_the_weights_type_of_a_gguf(gguf_run, tmp_path):
    _, module, target = gguf_run
    assert gguf_type(target) == "q8_0"
    tensors = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(target)).tensors}
    assert tensors["blk.0.attn_q.weight"] == "Q8_0" and tensors["output_norm.weight"] == "F32"
    f32 = write_llama_gguf(module.model.base, module.tokenizer, tmp_path / "f32.gguf")
    assert gguf_type(f32) == "f32"
    (tmp_path / "junk.gguf").write_text("junk")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        gguf_type(tmp_path / "junk.gguf")


def test_llama_cpp_rows_on_the_runs_own_gguf(gguf_run, tmp_path, capsys):
    ckpt, module, target = gguf_run
    n = 6
    fake = logged_stand_ins(tmp_path / "bin", module, n, corrupt=1)
    result = bench_llamacpp(ckpt, fake, n, "--batch-sizes", "1", "--gguf", str(tmp_path / "gguf"))
    assert result["methods"][-4:] == [ALONE, DFLASH, Q8, Q8_DFLASH]
    one, record = result["batch_sizes"]["1"], result["llamacpp"]
    assert one[Q8]["differs_from_hf_generate"] == 0 and one[Q8_DFLASH]["differing_rows"] == [1]
    assert one[Q8]["timed_by"] == "its own clock" and one[Q8_DFLASH]["mean_accepted_block_size"] > 1.0
    written = tmp_path / "gguf" / "target.gguf"
    assert record["rows"] == {ALONE: str(written), DFLASH: str(written), Q8: str(target), Q8_DFLASH: str(target)}
    assert record["pairs"] == [[ALONE, DFLASH], [Q8, Q8_DFLASH]]
    assert record["own_gguf"]["gguf"] == str(target) and record["own_gguf"]["weights"] == "q8_0"
    assert record["own_gguf"]["alone"] == Q8 and record["own_gguf"]["drafted"] == Q8_DFLASH
    agreed = record["q8_0_dflash_vs_alone"]
    assert agreed["gguf"] == str(target) and agreed["differs_from_llamacpp_q8_0"] == 1 and agreed["drafted"] > 0
    assert record["dflash_vs_alone"]["differs_from_llamacpp_f32"] == 1  # the float32 rows as before
    assert gguf_type(written) == "f32" and (tmp_path / "gguf" / "drafter.gguf").is_file()
    checked = (fake / "tokenized.log").read_text().split()
    assert sorted(set(checked)) == sorted({str(written), str(target)}) and len(checked) == 2 * len(PROMPTS)
    captured = capsys.readouterr()
    assert "1 of 3 rows differ from llama.cpp alone on it" in captured.out and f"on {target.name}" in captured.out
    assert f"tokenizes all 3 prompts with target.gguf, {target.name} as" in captured.err


def test_bench_runs_rows_of_llama_cpp_on_the_runs_own_gguf(gguf_run, tmp_path, capsys):
    from tests.benchmarks.test_llamacpp_speculative import bench_runs

    ckpt, module, target = gguf_run
    n = 6
    fake = logged_stand_ins(tmp_path / "bin", module, n, corrupt=1)
    result = bench_runs({"a": ckpt}, ckpt.parent / "prompts.jsonl", f"generate,llamacpp:{fake}", n, "--batch-sizes",
                        "1", "--llamacpp-threads", "1", "--gguf", str(tmp_path / "gguf"))
    drafted = f"{Q8}+a"
    assert result["methods"][-2:] == [Q8, drafted] and ALONE not in result["methods"]
    record = result["llamacpp"]
    assert record["rows"] == {Q8: str(target), drafted: str(target)} and record["pairs"] == [[Q8, drafted]]
    assert record["own_gguf"]["weights"] == "q8_0" and record["own_gguf"]["drafted"] == [drafted]
    assert not (tmp_path / "gguf" / "target.gguf").exists() and (tmp_path / "gguf" / "a" / "drafter.gguf").is_file()
    assert set((fake / "tokenized.log").read_text().split()) == {str(target)}
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows[drafted]["differs_from_llamacpp_alone"] == 1 and rows[Q8]["proposer"] == f"llama.cpp alone ({target.name})"
    assert record["q8_0+a_vs_alone"]["differs_from_llamacpp_q8_0"] == 1


def test_bench_runs_rows_on_the_float32_target_too_when_asked(gguf_run, tmp_path, capsys):
    """``--llamacpp-float32``: the rows on the run's own GGUF and on the float32 target.gguf written from it, each
    drafted row paired with the alone row of its own GGUF, the drafter written once."""
    from tests.benchmarks.test_llamacpp_speculative import bench_runs

    ckpt, module, target = gguf_run
    n = 6
    fake = logged_stand_ins(tmp_path / "bin", module, n, corrupt=1)
    result = bench_runs({"a": ckpt}, ckpt.parent / "prompts.jsonl", f"generate,llamacpp:{fake}", n, "--batch-sizes",
                        "1", "--llamacpp-threads", "1", "--gguf", str(tmp_path / "gguf"), "--llamacpp-float32")
    f32 = tmp_path / "gguf" / "target.gguf"
    assert result["methods"][-4:] == [Q8, f"{Q8}+a", ALONE, f"{ALONE}+a"]
    record = result["llamacpp"]
    assert record["rows"] == {Q8: str(target), f"{Q8}+a": str(target), ALONE: str(f32), f"{ALONE}+a": str(f32)}
    assert record["pairs"] == [[Q8, f"{Q8}+a"], [ALONE, f"{ALONE}+a"]] and record["own_gguf"]["drafted"] == [f"{Q8}+a"]
    assert record["target"] == str(f32) and set((fake / "tokenized.log").read_text().split()) == {str(target), str(f32)}
    one = result["batch_sizes"]["1"]
    assert one[ALONE]["differs_from_hf_generate"] == 0 and one[f"{ALONE}+a"]["differing_rows"] == [1]
    assert record["f32+a_vs_alone"]["differs_from_llamacpp_f32"] == 1
    assert "skipped" in record["pass_cost"]  # the stand-ins have no llama-bench
    with pytest.raises(SystemExit, match="^bench: --llamacpp-float32 sets llama.cpp's binaries' rows: add --peers "
                                         "llamacpp:BIN"):
        bench_runs({"a": ckpt}, ckpt.parent / "prompts.jsonl", "generate", n, "--llamacpp-float32")


def test_the_own_gguf_runs_with_its_file_and_its_tokenization_is_counted(gguf_run, tmp_path):
    _, module, target = gguf_run
    fake = logged_stand_ins(tmp_path / "bin", module, 4, corrupt=0)
    methods, info = start_llamacpp_bin(module, PROMPTS, fake, 1, tmp_path / "gguf", block_size=3)
    assert methods[Q8].runner.target == str(target) and methods[Q8].runner.drafter is None
    assert methods[Q8_DFLASH].runner.target == str(target)
    assert methods[Q8_DFLASH].runner.drafter == str(tmp_path / "gguf" / "drafter.gguf")
    assert methods[Q8_DFLASH].runner.block_size == 3 == info["drafter"]["block_size"]
    assert methods[DFLASH].runner.target == str(tmp_path / "gguf" / "target.gguf")
    # the user's own GGUF tokenizing otherwise (llama.cpp's pre-tokenizer against transformers' reading of the file):
    # counted, its rows compared with each other; the float32 target.gguf compared with generate must agree
    wrong = logged_stand_ins(tmp_path / "wrong", module, 4, corrupt=0, wrong=target.name)
    methods, info = start_llamacpp_bin(module, PROMPTS, wrong, 1, tmp_path / "gguf2")
    assert info["own_gguf"]["tokenization_differs"] == len(PROMPTS) and Q8_DFLASH in methods
    wrong = logged_stand_ins(tmp_path / "wrong2", module, 4, corrupt=0, wrong="target.gguf")
    with pytest.raises(ValueError, match="prompts with target.gguf otherwise than") as err:
        start_llamacpp_bin(module, PROMPTS, wrong, 1, tmp_path / "gguf3")
    assert "\n" not in str(err.value)


def test_export_heads_names_the_runs_own_gguf_as_the_target(gguf_run, tmp_path, capsys):
    ckpt, _, target = gguf_run
    main(["export-heads", "--ckpt", str(ckpt), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    err = capsys.readouterr().err
    assert f"the target to serve is the run's own GGUF {target}" in err
    assert f"llama-server -m {target} -md {tmp_path / 'out' / 'drafter.gguf'} --spec-type draft-dflash" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["drafter.gguf", "export_heads.json"]
    record = json.loads((tmp_path / "out" / "export_heads.json").read_text())
    assert record["serve_target"] == str(target) and record["target"] == str(target)
    main(["export-heads", "--ckpt", str(ckpt), "--out", str(tmp_path / "f32"), "--format", "llamacpp",
          "--float32-target"])
    assert gguf_type(tmp_path / "f32" / "target.gguf") == "f32" and "its float32 copy" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--float32-target goes with --format llamacpp, not speculators"):
        main(["export-heads", "--ckpt", str(ckpt), "--out", str(tmp_path / "x"), "--format", "speculators",
              "--float32-target"])


# ---- slow: the real binaries -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_llama_cpp_with_our_drafter_on_the_runs_own_gguf_decodes_as_alone(gguf_run):
    build = llamacpp_binaries()
    ckpt, _, target = gguf_run
    result = bench_llamacpp(ckpt, build, 12, "--batch-sizes", "1")
    one, record = result["batch_sizes"]["1"], result["llamacpp"]
    agreed = record["q8_0_dflash_vs_alone"]
    assert agreed["differs_from_llamacpp_q8_0"] == 0 and agreed["drafted"] > 0, agreed
    assert record["dflash_vs_alone"]["differs_from_llamacpp_f32"] == 0
    assert one[ALONE]["differs_from_hf_generate"] == 0  # the float32 copy of the dequantized weights
    assert one[Q8]["tokens"] > 0 and one[Q8_DFLASH]["tokens"] >= one[Q8]["tokens"] and GENERATE in one
    assert record["rows"][Q8] == str(target)
