"""llama.cpp's binaries as bench rows (lightning_bpd/benchmarks/llamacpp_speculative.py, llamacpp_bin_peer.py):
the report and output parsing, the bytes llama.cpp prints of ids, and ``bench --peers llamacpp:BIN`` (once
``bench-generate --llamacpp-bin``) on a DFlash and on an EAGLE-3 checkpoint with stand-in binaries (rows, timing by
their clock, text comparisons with generate and between the two rows); slow: the real binaries of the build-llamacpp folder on a tiny
DFlash run and a tiny EAGLE-3 run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from lightning_bpd.benchmarks.ctranslate2_hf import cut
from lightning_bpd.benchmarks.llamacpp_speculative import (
    ALONE,
    ATTEMPTS,
    DFLASH,
    EAGLE3,
    SpecReport,
    SpeculativeSimple,
    byte_decoder,
    new_bytes,
    parse_report,
    token_bytes,
)
from lightning_bpd.benchmarks.lm_generate import GENERATE
from lightning_bpd.commands.bench import main as bench
from tests.drafters.dflash.test_speculators import save_ckpt, trained
from tests.llamacpp_build import llamacpp_binaries
from tests.tasks.lm.tiny_lm import EOS, PROMPTS, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# the end of llama-speculative-simple's log (its LOG_INF lines, stderr), as llama-cpp-python 0.3.36's prints it
LOG = """common_perf_print: eval time = 12.00 ms
encoded   12 tokens in    0.015 seconds, speed:  800.000 t/s
decoded   64 tokens in    0.400 seconds, speed:  160.000 t/s

n_draft   = 7
n_predict = 64
n_drafted = 112
n_accept  = 44
accept    = 39.286%
"""


def test_the_report_and_the_output():
    report = parse_report(LOG)
    assert report == SpecReport(prompt_tokens=12, encode_seconds=0.015, new_tokens=64, decode_seconds=0.4,
                                drafted=112, accepted=44)
    assert report.seconds == pytest.approx(0.415) and report.target_calls == 20
    with pytest.raises(ValueError, match="no 'n_drafted' line"):
        parse_report(LOG.replace("n_drafted", "n_draft_"))
    assert new_bytes(b"\n\n<s>def f():\n    return 1\n\n\n\n\n", b"<s>def f():\n") == b"    return 1\n"
    assert new_bytes(b"\n\n<s>x\n\n\n\n", b"<s>x") == b""
    with pytest.raises(ValueError, match="does not echo the prompt"):
        new_bytes(b"\n\nother\n\n\n\n", b"<s>x")


def test_token_bytes_are_the_text_llama_cpp_prints():
    from tokenizers import pre_tokenizers

    assert sorted(byte_decoder()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(byte_decoder().values()) == list(range(256))
    tok = tokenizer()
    for text in [*PROMPTS, "naïve ünïcode → ok", "\t\ttabs\n\n"]:
        ids = tok(text)["input_ids"]
        assert token_bytes(tok, ids) == b"<s>" + text.encode("utf-8")


def test_the_command_lines():
    alone = SpeculativeSimple("bin/llama-speculative-simple", "t.gguf", threads=1, n_ctx=256)
    args = alone.args("p.txt", 64)
    assert args[args.index("-n") + 1] == "63" and "--no-escape" in args and args[args.index("-t") + 1] == "1"
    assert "ngram-simple" in args and "-md" not in args
    dflash = SpeculativeSimple("bin/llama-speculative-simple", "t.gguf", 2, 256, "d.gguf", block_size=8)
    args = dflash.args("p.txt", 64)
    assert args[args.index("--spec-type") + 1] == "draft-dflash" and args[args.index("--spec-draft-n-max") + 1] == "7"
    assert args[args.index("-td") + 1] == "2" and args[args.index("--spec-draft-p-min") + 1] == "0"
    with pytest.raises(ValueError, match="block size"):
        SpeculativeSimple("b", "t.gguf", 1, 256, "d.gguf")
    eagle3 = SpeculativeSimple("bin/llama-speculative-simple", "t.gguf", 1, 256, "d.gguf", 6, "draft-eagle3")
    args = eagle3.args("p.txt", 64)
    assert args[args.index("--spec-type") + 1] == "draft-eagle3" and args[args.index("--spec-draft-n-max") + 1] == "5"
    with pytest.raises(ValueError, match="spec_type must be one of draft-dflash, draft-eagle3"):
        SpeculativeSimple("b", "t.gguf", 1, 256, "d.gguf", 6, "draft-mtp")


LOSSY = r"""#!{python}
import sys
from pathlib import Path
count = Path(sys.argv[0]).with_suffix(".count")
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
sys.stdout.write("\n\n<s>x = 1\n")
if n >= {lost}:  # the first {lost} runs lose the end of their output, as llama.cpp's log thread may at exit
    sys.stdout.write("\n\n\n\n")
    sys.stderr.write("encoded 5 tokens in 0.010 seconds\ndecoded 3 tokens in 0.020 seconds\nn_predict = 3\n"
                     "n_drafted = 0\nn_accept = 0\n")
"""


@pytest.mark.parametrize("lost", [2, 9])
def test_a_run_that_lost_its_output_is_run_again(tmp_path, lost):
    binary = tmp_path / "spec"
    binary.write_text(LOSSY.replace("{python}", sys.executable).replace("{lost}", str(lost)))
    binary.chmod(0o755)
    runner = SpeculativeSimple(binary, "t.gguf", 1, 64)
    if lost < ATTEMPTS:
        run = runner.run("x = 1\n", b"<s>x = 1\n", 3)
        assert run.text == b"" and run.report.new_tokens == 3 and runner.retries == lost
    else:
        with pytest.raises(RuntimeError, match=f"{ATTEMPTS} runs: llama.cpp's asynchronous log lost"):
            runner.run("x = 1\n", b"<s>x = 1\n", 3)


# ---- bench-generate with stand-in binaries ---------------------------------------------------------------------------

FAKE_SPEC = r"""#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
book = json.loads((Path(sys.argv[0]).parent / "book.json").read_text())
prompt = Path(args[args.index("-f") + 1]).read_bytes().decode()[:-1]
entry = book[prompt]
drafted = "-md" in args
new = bytes.fromhex(entry["new"])
if drafted and entry["corrupt"]:
    new = b"!" + new
elif drafted and not entry["eos"]:
    new = new + b" past the cap"  # a drafted loop's overshoot
sys.stdout.buffer.write(b"\n\n" + bytes.fromhex(entry["echo"]) + new + b"\n\n\n\n")
n = entry["n"]
accept = n // 2 if drafted else 0
sys.stderr.write(f"encoded {{len(entry['ids'])}} tokens in 0.010 seconds\ndecoded {{n}} tokens in "
                 f"{{0.050 if drafted else 0.100}} seconds\nn_predict = {{n}}\nn_drafted = {{3 * accept if drafted else 0}}\n"
                 f"n_accept  = {{accept}}\n")
"""
FAKE_TOKENIZE = r"""#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
book = json.loads((Path(sys.argv[0]).parent / "book.json").read_text())
print(book[Path(args[args.index("-f") + 1]).read_bytes().decode()]["ids"])
"""


def stand_ins(folder: Path, module, prompts: list[str], n: int, corrupt: int) -> Path:
    """llama-speculative-simple and llama-tokenize stand-ins that print generate's continuation of each prompt (the
    drafted run of prompt ``corrupt`` puts a character before it, the others at the cap overshoot) and a report."""
    folder.mkdir()
    tok, book = module.tokenizer, {}
    for i, prompt in enumerate(prompts):
        ids = tok(prompt)["input_ids"]
        src = torch.tensor([ids])
        out = module.model.base.generate(input_ids=src, attention_mask=torch.ones_like(src), do_sample=False,
                                         num_beams=1, max_new_tokens=n, pad_token_id=0)
        row = cut(out[:, src.shape[1]:].tolist(), EOS)[0]
        eos = row[-1:] == [EOS]
        book[prompt] = {"ids": ids, "echo": token_bytes(tok, ids).hex(), "n": len(row), "corrupt": i == corrupt,
                        "eos": eos, "new": token_bytes(tok, row[:-1] if eos else row).hex()}
    assert not all(entry["eos"] for entry in book.values())  # some rows reach the cap: overshoots are compared
    (folder / "book.json").write_text(json.dumps(book))
    for name, text in (("llama-speculative-simple", FAKE_SPEC), ("llama-tokenize", FAKE_TOKENIZE)):
        (folder / name).write_text(text.replace("{python}", sys.executable).replace("{{", "{").replace("}}", "}"))
        (folder / name).chmod(0o755)
    return folder


def bench_llamacpp(ckpt: Path, bin_dir: Path, n: int, *extra: str) -> dict:
    """``bench --peers llamacpp:BIN`` on the run ``ckpt`` (its prompts.jsonl beside it) with llama.cpp's binaries of
    ``bin_dir``, one thread, at most ``n`` new tokens."""
    return bench(["--ckpt", str(ckpt), "--input", str(ckpt.parent / "prompts.jsonl"), "--warmup", "0", "--device",
                  "cpu", "--max-new-tokens", str(n), "--peers", f"generate,prompt-lookup,llamacpp:{bin_dir}",
                  "--llamacpp-threads", "1", *extra])


def saved_run(module, root: Path) -> tuple[Path, object]:
    """``module`` saved as ``root/last.ckpt`` with the prompts in ``root/prompts.jsonl``; the checkpoint and it."""
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return save_ckpt(module, root / "last.ckpt"), module


@pytest.fixture(scope="module")
def dflash_run(tmp_path_factory) -> tuple[Path, object]:
    from tests.tasks.lm.tiny_lm import write_checkpoint

    root = tmp_path_factory.mktemp("dflash")
    module = trained(write_checkpoint(root / "llama"), target_layer_ids=[0])  # llama.cpp: not the last layer
    return saved_run(module, root)


def test_bench_generate_rows_of_llama_cpp_binaries(dflash_run, tmp_path, capsys):
    ckpt, module = dflash_run
    n = 6
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, n, corrupt=1)
    result = bench_llamacpp(ckpt, fake, n, "--batch-sizes", "1", "2", "--gguf", str(tmp_path / "gguf"))
    assert ALONE in result["methods"] and DFLASH in result["methods"]
    one, two = result["batch_sizes"]["1"], result["batch_sizes"]["2"]
    alone, drafted = one[ALONE], one[DFLASH]
    assert alone["differs_from_hf_generate"] == 0 and alone["tokens"] == one[GENERATE]["tokens"]
    assert drafted["differs_from_hf_generate"] == 1 and drafted["differing_rows"] == [1]
    assert alone["seconds"] == pytest.approx(0.11 * len(PROMPTS)) and alone["timed_by"] == "its own clock"
    assert drafted["seconds"] == pytest.approx(0.06 * len(PROMPTS))
    assert alone["mean_accepted_block_size"] == 1.0 and drafted["mean_accepted_block_size"] > 1.0
    assert ALONE in one["dflash"]["speedup_over"] and DFLASH in one["dflash"]["speedup_over"]
    assert "batch 1 only" in two[ALONE]["skipped"] and "batch 1 only" in two[DFLASH]["skipped"]
    record = result["llamacpp"]
    assert record["dflash_vs_alone"]["differs_from_llamacpp_f32"] == 1 and record["threads"] == 1
    assert record["drafter"]["spec_draft_n_max"] == module.drafter.config.block_size - 1
    assert (tmp_path / "gguf" / "drafter.gguf").is_file() and (tmp_path / "gguf" / "target.gguf").is_file()
    assert "1 of 3 rows differ from llama.cpp alone" in capsys.readouterr().out
    # the one table's record (bench --run's), this checkpoint its one run
    assert result["runs"]["dflash"]["proposer"] == "DFlash" and result["runs"]["dflash"]["parameters"] > 0
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows[DFLASH]["differs_from_llamacpp_alone"] == 1 and rows[DFLASH]["proposer"] == "llama.cpp + DFlash "\
        "(target.gguf)"
    assert rows[ALONE]["proposer"] == "llama.cpp alone (target.gguf)" and rows["dflash"]["proposer"] == "DFlash"
    assert rows[DFLASH]["parameters"] == rows["dflash"]["parameters"] and ALONE not in result["tables"]["2"]


def bench_runs(runs: dict[str, Path], prompts: Path, peers: str, n: int, *extra: str) -> dict:
    """``bench --run NAME=CKPT ...`` of ``runs`` on the prompts ``prompts`` with ``--peers peers``, one thread, at most
    ``n`` new tokens."""
    pairs = [x for name, path in runs.items() for x in ("--run", f"{name}={path}")]
    return bench([*pairs, "--input", str(prompts), "--warmup", "0", "--device", "cpu", "--max-new-tokens", str(n),
                  "--peers", peers, *extra])


@pytest.fixture(scope="module")
def heads_run(dflash_run) -> Path:
    """Heads on the DFlash run's base, saved beside it."""
    from lightning_bpd.tasks.lm.module import LMModule
    from lightning_bpd.tasks.translation.hf_module import save_heads

    ckpt, _ = dflash_run
    return save_heads(LMModule(str(ckpt.parent / "llama"), k=3, max_new_tokens=8).eval(), ckpt.parent / "heads")


def test_bench_runs_rows_of_llama_cpp_alone_and_with_each_runs_drafter(dflash_run, heads_run, tmp_path, capsys):
    ckpt, module = dflash_run
    n = 6
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, n, corrupt=1)
    result = bench_runs({"a": ckpt, "h": heads_run}, ckpt.parent / "prompts.jsonl",
                        f"generate,prompt-lookup,llamacpp:{fake}", n, "--batch-sizes", "1", "2", "--k", "a=3",
                        "--llamacpp-threads", "1", "--gguf", str(tmp_path / "gguf"))
    drafted = f"{ALONE}+a"
    assert result["methods"][-2:] == [ALONE, drafted] and not any(m.startswith(f"{ALONE}+h") for m in result["methods"])
    one = result["batch_sizes"]["1"]
    assert one[ALONE]["differs_from_hf_generate"] == 0 and one[drafted]["differing_rows"] == [1]
    assert one[ALONE]["timed_by"] == "its own clock" and one[drafted]["mean_accepted_block_size"] > 1.0
    assert one[drafted]["seconds"] == pytest.approx(0.06 * len(PROMPTS))
    assert "batch 1 only" in result["batch_sizes"]["2"][drafted]["skipped"]
    record = result["llamacpp"]
    target, drafter = tmp_path / "gguf" / "target.gguf", tmp_path / "gguf" / "a" / "drafter.gguf"
    assert record["rows"] == {ALONE: str(target), drafted: str(target)} and record["pairs"] == [[ALONE, drafted]]
    assert record["drafters"][drafted] == {"run": "a", "gguf": str(drafter), "spec_type": "draft-dflash",
                                           "block_size": 3, "spec_draft_n_max": 2}
    assert "h" in record["no_drafter"] and drafter.is_file() and record["f32+a_vs_alone"]["differs_from_llamacpp_f32"] == 1
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows[drafted]["differs_from_llamacpp_alone"] == 1 and rows[drafted]["proposer"] == "llama.cpp + DFlash "\
        "(target.gguf)"
    assert rows[drafted]["parameters"] == rows["a"]["parameters"] and rows[ALONE]["parameters"] is None
    assert "differs_from_llamacpp_alone" not in rows[ALONE] and ALONE not in {r["row"] for r in result["tables"]["2"]}
    captured = capsys.readouterr()
    assert "| llamacpp_f32+a | llama.cpp + DFlash (target.gguf) |" in captured.out
    assert "1 of 3 rows differ from llama.cpp alone" in captured.out
    assert "run h: no llama.cpp row with its drafter (heads" in captured.err


def test_bench_runs_llama_cpp_refusals_are_one_line(dflash_run, heads_run, tmp_path):
    ckpt, _ = dflash_run
    runs, prompts = {"a": ckpt, "h": heads_run}, ckpt.parent / "prompts.jsonl"
    for peers, extra, want in (
            ("generate,ctranslate2", (), "CTranslate2 peers are for seq2seq bases"),
            ("generate", ("--gguf", str(tmp_path)), "add --peers llamacpp"),
            (f"llamacpp:{tmp_path / 'none'}", (), "llama.cpp peer refused: "),
            (f"llamacpp:{tmp_path}", ("--run", f"llamacpp_f32={heads_run}"), "taken by llama.cpp's rows")):
        with pytest.raises(SystemExit) as err:
            bench_runs(runs, prompts, peers, 4, "--batch-sizes", "1", *extra)
        message = str(err.value.code)
        assert want in message and "\n" not in message and message.startswith("bench: "), message


@pytest.fixture(scope="module")
def eagle3_run(tmp_path_factory) -> tuple[Path, object]:
    """A tiny EAGLE-3 run (chains of 4) on a 4-layer target (llama.cpp's eagle3 fuses exactly 3 layers), fitted to the
    target's own continuations."""
    from tests.drafters.eagle3.test_commands import fit_eagle3
    from tests.tasks.lm.tiny_lm import write_checkpoint

    root = tmp_path_factory.mktemp("eagle3")
    module = fit_eagle3(write_checkpoint(root / "llama", layers=4), steps=100, layers=(0, 1, 2))
    return saved_run(module, root)


def test_bench_generate_rows_of_llama_cpp_binaries_with_an_eagle3_drafter(eagle3_run, tmp_path, capsys):
    ckpt, module = eagle3_run
    n = 6
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, n, corrupt=2)
    result = bench_llamacpp(ckpt, fake, n, "--batch-sizes", "1", "--k", "3")
    assert result["methods"][-2:] == [ALONE, EAGLE3] and DFLASH not in result["methods"]
    one = result["batch_sizes"]["1"]
    assert one[ALONE]["differs_from_hf_generate"] == 0 and one["eagle3"]["differs_from_hf_generate"] == 0
    assert one[EAGLE3]["differing_rows"] == [2] and one[EAGLE3]["mean_accepted_block_size"] > 1.0
    assert ALONE in one["eagle3"]["speedup_over"] and EAGLE3 in one["eagle3"]["speedup_over"]
    record = result["llamacpp"]
    assert record["drafter"]["spec_type"] == "draft-eagle3" and record["drafter"]["spec_draft_n_max"] == 2  # --k 3
    assert record["eagle3_vs_alone"]["differs_from_llamacpp_f32"] == 1 and "dflash_vs_alone" not in record
    assert "1 of 3 rows differ from llama.cpp alone" in capsys.readouterr().out


def test_bench_generate_refusals_are_one_line(dflash_run, tmp_path):
    ckpt, _ = dflash_run
    base = ["--ckpt", str(ckpt), "--input", str(ckpt.parent / "prompts.jsonl"), "--batch-sizes", "1", "--device",
            "cpu", "--max-new-tokens", "4"]
    for extra, want in ((["--llamacpp-threads", "1"], "add --peers llamacpp"),
                        (["--peers", f"llamacpp:{tmp_path / 'none'}"], "not a folder"),
                        (["--peers", f"llamacpp:{tmp_path}"], "no llama-speculative-simple")):
        with pytest.raises(SystemExit) as err:
            bench([*base, *extra])
        message = str(err.value.code)
        assert want in message and "\n" not in message and message.startswith("bench: "), message


# ---- slow: the real binaries -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_llama_cpp_with_our_drafter_decodes_as_llama_cpp_alone(dflash_run, tmp_path):
    build = llamacpp_binaries()
    ckpt, _ = dflash_run
    result = bench_llamacpp(ckpt, build, 12, "--batch-sizes", "1")
    one = result["batch_sizes"]["1"]
    assert one[ALONE]["differs_from_hf_generate"] == 0, one[ALONE]["differing_rows"]
    assert one[DFLASH]["differs_from_hf_generate"] == 0, one[DFLASH]["differing_rows"]
    agreed = result["llamacpp"]["dflash_vs_alone"]
    assert agreed["differs_from_llamacpp_f32"] == 0 and agreed["drafted"] > 0
    assert one[ALONE]["mean_accepted_block_size"] == 1.0 and one[DFLASH]["tokens"] == one[GENERATE]["tokens"]


@pytest.mark.slow
def test_llama_cpp_with_our_eagle3_drafter_decodes_as_llama_cpp_alone(eagle3_run):
    build = llamacpp_binaries()
    ckpt, _ = eagle3_run
    result = bench_llamacpp(ckpt, build, 12, "--batch-sizes", "1")
    one = result["batch_sizes"]["1"]
    for row in (ALONE, EAGLE3, "eagle3"):
        assert one[row]["differs_from_hf_generate"] == 0, (row, one[row]["differing_rows"])
    agreed = result["llamacpp"]["eagle3_vs_alone"]
    assert agreed["differs_from_llamacpp_f32"] == 0 and agreed["drafted"] > 0 and agreed["accepted"] > 0
    assert one[EAGLE3]["mean_accepted_block_size"] > 1.0 and one[EAGLE3]["tokens"] == one[GENERATE]["tokens"]


@pytest.mark.slow
def test_bench_runs_llama_cpp_with_a_runs_drafter_decodes_as_alone(dflash_run, heads_run):
    build = llamacpp_binaries()
    ckpt, _ = dflash_run
    result = bench_runs({"a": ckpt, "h": heads_run}, ckpt.parent / "prompts.jsonl", f"generate,llamacpp:{build}", 12,
                        "--batch-sizes", "1", "--llamacpp-threads", "1")
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows[ALONE]["differs_from_hf_generate"] == 0 and rows[f"{ALONE}+a"]["differs_from_llamacpp_alone"] == 0
    assert result["llamacpp"]["f32+a_vs_alone"]["drafted"] > 0 and not any(row.startswith(f"{ALONE}+h") for row in rows)
