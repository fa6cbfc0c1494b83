"""llama.cpp drafting from a retrieval datastore (lightning_bpd/benchmarks/llamacpp_lookup.py) and what its passes
cost (llamacpp_pass_cost.py): ``llama-lookup``'s command line on a fresh copy of the lookup cache each run,
``llama-bench``'s report read, and ``bench --run NAME=BASE@retrieval:FILE --peers llamacpp:BIN`` with stand-in
binaries (a ``llama-lookup`` row beside llama.cpp alone, compared with it, and the passes' cost in the record); slow:
the real binaries of the build-llamacpp folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from lightning_bpd.benchmarks.llamacpp_lookup import LOOKUP, Lookup
from lightning_bpd.benchmarks.llamacpp_pass_cost import BENCH, pass_costs, pass_record
from lightning_bpd.benchmarks.llamacpp_speculative import ALONE
from lightning_bpd.tasks.lm.datastore import save_datastore
from lightning_bpd.tasks.lm.lookup_cache import read_lookup_cache
from tests.benchmarks.test_llamacpp_speculative import (  # noqa: F401 - dflash_run: a fixture
    FAKE_SPEC,
    bench_llamacpp,
    bench_runs,
    dflash_run,
    saved_run,
    stand_ins,
)
from tests.llamacpp_build import llamacpp_binaries

pytestmark = pytest.mark.usefixtures("one_thread")

# llama-bench -o jsonl: one line per test; a pass of n tokens takes 10 + 4 (n - 1) ms
FAKE_BENCH = r"""#!{python}
import json, sys
args = sys.argv[1:]
if b"--fail" in open(args[args.index("-m") + 1], "rb").read():
    sys.stderr.write("error: failed to load model\n")
    sys.exit(1)
if b"--garble" in open(args[args.index("-m") + 1], "rb").read():
    print('{"n_prompt": 1, "avg_ns": 10')
for n in args[args.index("-p") + 1].split(","):
    n = int(n)
    print(json.dumps({"n_prompt": n, "n_gen": 0, "n_depth": int(args[args.index("-d") + 1]),
                      "avg_ns": (10 + 4 * (n - 1)) * 1e6, "stddev_ns": 1e5}))
"""
# llama-lookup: llama-speculative-simple's stand-in, drafting where it reads a lookup cache; it writes into that
# cache as the real one does when it ends
FAKE_LOOKUP = FAKE_SPEC.replace('drafted = "-md" in args', '''drafted = "--lookup-cache-dynamic" in args
cache = Path(args[args.index("--lookup-cache-dynamic") + 1])
assert cache.read_bytes() == Path(book["cache"]).read_bytes(), "a fresh copy of the exported cache"
cache.write_bytes(cache.read_bytes() + b"written back")''')


def write_fake(path: Path, text: str) -> None:
    path.write_text(text.replace("{python}", sys.executable).replace("{{", "{").replace("}}", "}"))
    path.chmod(0o755)


def test_the_command_line_and_a_fresh_cache_each_run(tmp_path):
    (tmp_path / "c.bin").write_bytes(b"\x00" * 28)
    runner = Lookup("bin/llama-lookup", "t.gguf", 1, 256, tmp_path / "c.bin", n_draft=6)
    args = runner.args(tmp_path / "p.txt", 64)
    assert args[0] == "bin/llama-lookup" and args[args.index("--spec-draft-n-max") + 1] == "6"
    assert args[args.index("--lookup-cache-dynamic") + 1] == str(tmp_path / "lookup-cache.bin")  # the run's copy
    assert args[args.index("-n") + 1] == "63" and args[args.index("-ctk") + 1] == "f32" and "-md" not in args
    assert args[args.index("--temp") + 1] == "0" and "--spec-type" not in args
    with pytest.raises(ValueError, match="no lookup cache there"):
        Lookup("b", "t.gguf", 1, 256, tmp_path / "none.bin", 6)
    with pytest.raises(ValueError, match="drafts >= 1 token"):
        Lookup("b", "t.gguf", 1, 256, tmp_path / "c.bin", 0)


def test_pass_costs_are_read_from_llama_bench(tmp_path):
    write_fake(tmp_path / BENCH, FAKE_BENCH)
    (tmp_path / "m.gguf").write_text("a model")
    costs = pass_costs(tmp_path / BENCH, tmp_path / "m.gguf", 1, [1, 2, 4], depth=40)
    assert costs == pytest.approx({1: 10.0, 2: 14.0, 4: 22.0})
    record = pass_record(costs, 40, 1, 3)
    assert record["over_one_token"] == {"1": 1.0, "2": 1.4, "4": 2.2}
    assert record["tokens_per_call_for_1.3x"] == {"2": 1.82, "4": 2.86} and "-d 40" in record["measured_by"]
    (tmp_path / "bad.gguf").write_text("--fail")
    with pytest.raises(RuntimeError, match="llama-bench failed on bad.gguf .exit 1.: error: failed to load model"):
        pass_costs(tmp_path / BENCH, tmp_path / "bad.gguf", 1, [1, 2], depth=0)
    (tmp_path / "garbled.gguf").write_text("--garble")
    with pytest.raises(RuntimeError, match="llama-bench wrote a line this reader cannot parse .JSONDecodeError"):
        pass_costs(tmp_path / BENCH, tmp_path / "garbled.gguf", 1, [1, 2], depth=0)
    with pytest.raises(ValueError, match="pass sizes >= 1"):
        pass_costs(tmp_path / BENCH, tmp_path / "m.gguf", 1, [0, 2], depth=0)


@pytest.fixture(scope="module")
def retrieval_run(tmp_path_factory) -> tuple[Path, object, Path]:
    """The tiny Llama (a base folder: ``NAME=BASE@retrieval:FILE`` needs no run), its module and a datastore of its
    prompts' text repeated (so that its n-grams are seen often enough for llama.cpp to draft from them)."""
    from lightning_bpd.tasks.lm.module import LMModule
    from tests.tasks.lm.tiny_lm import PROMPTS, write_checkpoint

    root = tmp_path_factory.mktemp("lookup")
    base = write_checkpoint(root / "llama")
    module = LMModule(str(base), k=2, max_new_tokens=6).eval()
    saved_run(module, root)  # writes root/prompts.jsonl
    ids = [t for p in PROMPTS for t in module.tokenizer(p)["input_ids"]] * 4
    store = save_datastore(root / "store.pt", ids, module.tokenizer, {"text_tokens": len(ids)})
    return base, module, store


def test_bench_runs_llama_lookup_with_a_retrieval_runs_datastore(retrieval_run, tmp_path, capsys):
    from tests.tasks.lm.tiny_lm import PROMPTS

    base, module, store = retrieval_run
    n = 6
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, n, corrupt=-1)
    gguf = tmp_path / "gguf"
    book = json.loads((fake / "book.json").read_text())
    (fake / "book.json").write_text(json.dumps({**book, "cache": str(gguf / "r" / "lookup-cache.bin")}))
    write_fake(fake / LOOKUP, FAKE_LOOKUP)
    write_fake(fake / BENCH, FAKE_BENCH)
    result = bench_runs({"r": f"{base}@retrieval:{store}:4:3", "s": f"{base}@retrieval:{store}:2:2"},
                        base.parent / "prompts.jsonl", f"generate,llamacpp:{fake}", n, "--batch-sizes", "1",
                        "--llamacpp-threads", "1", "--gguf", str(gguf))
    drafted = f"{ALONE}+r"
    assert result["methods"][-3:] == [ALONE, drafted, f"{ALONE}+s"]
    other = result["llamacpp"]["drafters"][f"{ALONE}+s"]  # the same datastore: exported once
    assert other["lookup_cache"] == str(gguf / "r" / "lookup-cache.bin") and other["spec_draft_n_max"] == 2
    assert not (gguf / "s").exists()
    one = result["batch_sizes"]["1"]
    assert one[ALONE]["differs_from_hf_generate"] == 0 and one[drafted]["differs_from_hf_generate"] == 0
    assert one[drafted]["mean_accepted_block_size"] > 1.0 and one[drafted]["timed_by"] == "its own clock"
    record = result["llamacpp"]
    lookup = record["drafters"][drafted]
    assert lookup["run"] == "r" and lookup["spec_draft_n_max"] == 3 and lookup["greedy_weight"] == 1
    assert read_lookup_cache(lookup["lookup_cache"]) and lookup["datastore"] == str(store)
    assert record["pairs"] == [[ALONE, drafted], [ALONE, f"{ALONE}+s"]]
    assert record["f32+r_vs_alone"]["differs_from_llamacpp_f32"] == 0
    cost = record["pass_cost"]["target.gguf"]
    assert list(cost["pass_ms"]) == ["1", "2", "3", "4"] and cost["over_one_token"]["4"] == 2.2
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows[drafted]["proposer"] == "llama.cpp + lookup cache of the retrieval datastore (target.gguf)"
    assert capsys.readouterr().out.count("0 of 3 rows differ from llama.cpp alone") == 2


def test_a_drafters_bench_records_llama_cpps_pass_cost(dflash_run, tmp_path):  # noqa: F811 - the imported fixture
    """``bench --ckpt`` on a DFlash run: the cost of llama.cpp's passes of 1 to the drafter's block."""
    from tests.tasks.lm.tiny_lm import PROMPTS

    ckpt, module = dflash_run
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, 4, corrupt=-1)
    write_fake(fake / BENCH, FAKE_BENCH)
    record = bench_llamacpp(ckpt, fake, 4, "--batch-sizes", "1", "--gguf", str(tmp_path / "gguf"))["llamacpp"]
    block = module.drafter.config.block_size
    assert list(record["pass_cost"]) == ["target.gguf"]
    assert record["pass_cost"]["target.gguf"]["pass_ms"] == {str(n): 10.0 + 4 * (n - 1) for n in range(1, block + 1)}
    write_fake(fake / BENCH, "#!{python}\nimport sys\nsys.stderr.write('out of memory\\n')\nsys.exit(3)\n")
    result = bench_llamacpp(ckpt, fake, 4, "--batch-sizes", "1", "--gguf", str(tmp_path / "gguf"))
    assert result["llamacpp"]["pass_cost"] == {"failed": "llama-bench failed on target.gguf (exit 3): out of memory"}
    assert result["batch_sizes"]["1"][ALONE]["differs_from_hf_generate"] == 0  # the rows ran all the same


def test_a_build_without_llama_lookup_is_one_line(retrieval_run, tmp_path):
    from tests.tasks.lm.tiny_lm import PROMPTS

    base, module, store = retrieval_run
    fake = stand_ins(tmp_path / "bin", module, PROMPTS, 4, corrupt=-1)
    with pytest.raises(SystemExit, match=r"^bench: llama.cpp peer refused: .*no llama-lookup \(build them"):
        bench_runs({"r": f"{base}@retrieval:{store}"}, base.parent / "prompts.jsonl", f"generate,llamacpp:{fake}", 4,
                   "--batch-sizes", "1", "--gguf", str(tmp_path / "gguf"))


@pytest.mark.slow
def test_llama_lookup_with_a_retrieval_datastore_decodes_as_llama_cpp_alone(retrieval_run, tmp_path):
    """The real binaries: llama-lookup reads the exported cache, drafts from it and writes llama.cpp alone's text."""
    base, _, store = retrieval_run
    folder = llamacpp_binaries()
    result = bench_runs({"r": f"{base}@retrieval:{store}:4:3"}, base.parent / "prompts.jsonl",
                        f"generate,llamacpp:{folder}", 8, "--batch-sizes", "1", "--llamacpp-threads", "1", "--gguf",
                        str(tmp_path / "gguf"))
    agreed = result["llamacpp"]["f32+r_vs_alone"]
    assert agreed["differs_from_llamacpp_f32"] == 0 and agreed["drafted"] > 0
    assert result["llamacpp"]["pass_cost"]["target.gguf"]["pass_ms"]["1"] > 0
