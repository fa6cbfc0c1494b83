"""DSpark through the registry (lightning_bpd/drafters/dspark/kind.py): the kind of a DSparkModule, its proposer under
its spellings (blocks of token 1 and up to K drafts), its bench row, ``decode --ckpt`` on a DSpark run, and what it
cannot take is one line."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("transformers")

from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import Exact, decode, greedy_decode
from lightning_bpd.drafters.dspark.module import DSparkModule
from lightning_bpd.drafters.dspark.proposer import DSpark
from lightning_bpd.drafters.registry import kind, kind_of
from tests.drafters.dspark.tiny import fit_dspark, save_module
from tests.tasks.lm.tiny_lm import PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(checkpoint, tmp_path_factory):
    module = fit_dspark(checkpoint, steps=40)
    return save_module(module, tmp_path_factory.mktemp("dspark") / "last.ckpt"), module


def test_the_registry_knows_dspark(run):
    _, module = run
    k = kind("dspark")
    assert kind_of(module) is k and k.module_class() is DSparkModule and k.speculators_type == "dspark"
    assert k.llamacpp_spec_type == "draft-dspark" and k.default_k(module) == 5
    drafter = k.load_drafter(run[0])
    assert drafter.config == module.drafter.config


def test_the_kinds_proposer_decodes_as_greedy_and_refusals_are_one_line(run):
    _, module = run
    k = kind("dspark")
    src = module.encode_prompts(PROMPTS)
    want = greedy_decode(module.model, src, 10).sequences()
    for spelling, width in (("", 5), ("dspark", 5), ("heads", 5)):
        proposer = k.proposer(module.drafter, module.model, spelling)
        assert isinstance(proposer, DSpark) and proposer.width == width
        assert decode(module.model, src, Exact(), proposer, max_len=10).sequences() == want
    assert k.proposer(module.drafter, module.model, "", k=3).width == 3
    rows = k.bench_rows(module, module.model)
    assert list(rows) == ["dspark"] and rows["dspark"].width == 5
    for call, match in ((lambda: k.proposer(module.drafter, module.model, "dynamic:4"), "proposes blocks"),
                        (lambda: k.bench_rows(module, module.model, k=6), r"holds 2\.\.5 tokens"),
                        (lambda: k.bench_rows(module, module.model, tree_nodes=[4]), "no heads to build trees")):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert "\n" not in str(info.value)


def test_decode_reads_a_dspark_run(run, capsys, monkeypatch):
    """``decode --ckpt`` on a DSpark run: the drafter proposes, the completions are greedy's."""
    ckpt, module = run
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)))
    capsys.readouterr()
    main(["decode", "--ckpt", str(ckpt), "--max-new-tokens", "8", "--device", "cpu"])
    result = capsys.readouterr()
    want = module.detokenize(greedy_decode(module.model, module.encode_prompts(PROMPTS), 8).sequences())
    assert [json.loads(line) for line in result.out.splitlines()] == [{"completion": t} for t in want]
    assert "mean_accepted_block_size" in result.err
