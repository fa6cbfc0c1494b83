"""One name per idea across the commands (issue 52 item 6): the new spellings, the old ones still parsing to the same
value with one deprecation line on stderr, ``--proposer`` as the one choice of what proposes, ``decode --help`` at
most 12 options, and the ``lightning-bpd`` console script."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch

from lightning_bpd.commands import bench, bench_peers, decode, distill, make_base
from lightning_bpd.commands.proposer_option import ProposerChoice, proposer_arg
from lightning_bpd.decoding import Tree
from lightning_bpd.decoding.trees.tree import DynamicTree
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.inference.arguments import draft_vocab_of

REPO = Path(__file__).resolve().parents[1]

# (parser, the arguments every parse needs, old option, new option, value given, the namespace key, the value read)
RENAMED = [
    (decode, ["--ckpt", "c"], "--output", "--out", "o.txt", "output", "o.txt"),
    (decode, ["--ckpt", "c"], "--tree-nodes", "--proposer", "16", "proposer", proposer_arg("tree:16")),
    (decode, ["--ckpt", "c"], "--tree", "--proposer", "0;1;0,0", "proposer", proposer_arg("tree:0;1;0,0")),
    (decode, ["--ckpt", "c"], "--draft", "--proposer", "d.ckpt", "proposer", proposer_arg("draft:d.ckpt")),
    (distill, ["--ckpt", "c", "--out", "o"], "--new-tokens", "--max-new-tokens", "7", "new_tokens", 7),
    (bench, ["--ckpt", "c"], "--inputs", "--limit", "9", "inputs", 9),
    (make_base, ["--out", "o"], "--data", "--data-root", "corpus", "data", "corpus"),
]
NEW_VALUE = {"--proposer": {"16": "tree:16", "0;1;0,0": "tree:0;1;0,0", "d.ckpt": "draft:d.ckpt"}}


@pytest.mark.parametrize(("command", "needed", "old", "new", "given", "key", "value"), RENAMED,
                         ids=[f"{c.__name__.rsplit('.', 1)[-1]}{o}" for c, _, o, *_ in RENAMED])
def test_an_old_spelling_reads_the_same_value_and_says_once_what_to_use(capsys, command, needed, old, new, given,
                                                                      key, value):
    new_given = NEW_VALUE.get(new, {}).get(given, given)
    by_new = command.build_parser().parse_args([*needed, new, new_given])
    assert getattr(by_new, key) == value
    assert capsys.readouterr().err == ""  # the new spelling: no notice
    by_old = command.build_parser().parse_args([*needed, old, given])
    assert getattr(by_old, key) == value
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{old} is deprecated: use {new}"), err


def test_bench_generate_and_bench_drafters_map_their_options_onto_bench(capsys):
    """The two old benches' command lines in ``bench``'s spelling (what their one deprecation line prints and runs):
    prompt lookup, the assistant, llama.cpp's binaries and CTranslate2's conversions as ``--peers``."""
    from lightning_bpd.commands.old_benches import drafters_argv
    from lightning_bpd.commands.old_benches import generate_argv as new_argv

    argv = new_argv(["--ckpt", "c", "--inputs", "9", "--prompt-lookup-tokens", "4", "--assistant", "d", "--peers",
                     "llamacpp", "ctranslate2", "--llamacpp-bin=b", "--ct2-quantizations", "int8", "float16", "--k", "3"])
    assert argv == ["--ckpt", "c", "--limit", "9", "--k", "3", "--peers",
                    "generate,prompt-lookup:2:4,assisted:d,llamacpp:b,ctranslate2:int8,ctranslate2:float16"]
    args = bench.build_parser().parse_args(argv)
    peers = bench_peers.peer_choice(args.peers)
    assert (peers.ngram, peers.tokens, peers.assistant, peers.llamacpp_bin) == (2, 4, "d", "b")
    assert peers.quantizations == ("int8", "float16") and args.inputs == 9 and args.k == [3]
    assert new_argv(["--ckpt", "c"]) == ["--ckpt", "c", "--peers", "generate,prompt-lookup"]
    assert new_argv(["--ckpt", "c", "--peers", "ctranslate2"])[-1] == "generate,prompt-lookup,ctranslate2"
    with pytest.raises(ValueError, match="add --peers llamacpp"):
        new_argv(["--ckpt", "c", "--llamacpp-bin", "b"])
    old = drafters_argv(["--run", "a=x", "--k", "a=3", "--max-matching-ngram", "3"])
    assert old == ["--run", "a=x", "--k", "a=3", "--peers", "generate,prompt-lookup:3:10", "--limit", "64",
                   "--batch-sizes", "1", "--device", "cpu"]
    bench.build_parser().parse_args(old)
    assert capsys.readouterr().err == ""
    for bad in ("llama", "generate:x", "assisted", "prompt-lookup:2", "prompt-lookup:0:3"):
        with pytest.raises(ValueError, match=r"^--peers "):
            bench_peers.peer_item(bad)
    with pytest.raises(ValueError, match="given twice"):
        bench_peers.peer_choice(["assisted:a,assisted:b"])


def test_old_spellings_are_hidden_from_help():
    text = decode.build_parser().format_help()
    for old in ("--output", "--tree ", "--tree-nodes", "--draft ", "--draft-vocab-from"):
        assert old not in text, old
    assert "--proposer" in text and "--out" in text


def test_decode_help_lists_at_most_twelve_options():
    options = [a for a in decode.build_parser()._actions
               if a.option_strings and a.help != argparse.SUPPRESS and "--help" not in a.option_strings]
    assert len(options) <= 12, [a.option_strings for a in options]
    listed = re.findall(r"^\s{2}(--[a-z-]+)", decode.build_parser().format_help(), re.MULTILINE)
    assert len(listed) - ("--help" in listed) == len(options)


def test_decode_lists_base_and_reads_the_seed_from_the_criterion(capsys):
    from lightning_bpd.commands.decode import criterion_and_seed

    assert "--base" in decode.build_parser().format_help()  # nothing that works is hidden
    args = decode.build_parser().parse_args(["--ckpt", "c", "--criterion", "sample_t0.7@3"])
    assert criterion_and_seed(args) == ("sample_t0.7", 3) and capsys.readouterr().err == ""
    assert criterion_and_seed(decode.build_parser().parse_args(["--ckpt", "c"])) == ("exact", 0)
    old = decode.build_parser().parse_args(["--ckpt", "c", "--criterion", "sample_t1", "--seed", "5"])
    assert criterion_and_seed(old) == ("sample_t1", 5)
    assert capsys.readouterr().err.strip() == "--seed is deprecated: use --criterion RULE@SEED"
    with pytest.raises(ValueError, match="the seed after @ is an integer"):
        criterion_and_seed(decode.build_parser().parse_args(["--ckpt", "c", "--criterion", "sample_t1@x"]))


def test_an_old_spelling_and_the_new_one_together_is_one_error(capsys):
    with pytest.raises(SystemExit):
        decode.build_parser().parse_args(["--ckpt", "c", "--proposer", "tree:8", "--tree-nodes", "4"])
    assert "give one" in capsys.readouterr().err


def test_the_draft_vocabulary_is_one_option_and_the_old_pair_still_reads(capsys):
    new = decode.build_parser().parse_args(["--ckpt", "c", "--draft-vocab", "100:train.de"])
    assert draft_vocab_of(new) == (100, "train.de") and capsys.readouterr().err == ""
    old = decode.build_parser().parse_args(["--ckpt", "c", "--draft-vocab", "100", "--draft-vocab-from", "train.de"])
    assert draft_vocab_of(old) == (100, "train.de")
    assert capsys.readouterr().err.strip() == "--draft-vocab-from is deprecated: use --draft-vocab N:TEXT"
    assert draft_vocab_of(decode.build_parser().parse_args(["--ckpt", "c"])) == (None, None)


def test_an_alias_of_a_flag_and_of_a_list_keeps_their_action(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("--fast", action="store_true")
    p.add_argument("--sizes", nargs="+", type=int, default=[1])
    deprecated_alias(p, "--quick", "--fast")
    deprecated_alias(p, "--batch-sizes", "--sizes")
    args = p.parse_args(["--quick", "--batch-sizes", "2", "3"])
    assert args.fast is True and args.sizes == [2, 3]
    assert capsys.readouterr().err.splitlines() == ["--quick is deprecated: use --fast",
                                                    "--batch-sizes is deprecated: use --sizes"]
    assert p.parse_args([]).sizes == [1]


@pytest.mark.parametrize(("text", "fields"), [
    ("heads", {"kind": "heads"}),
    ("tree:16", {"kind": "tree", "nodes": 16}),
    ("tree:0", {"kind": "tree", "nodes": 0}),
    ("tree:auto", {"kind": "tree", "auto": "auto"}),
    ("tree:auto:8", {"kind": "tree", "auto": "auto:8"}),
    ("tree:0;1;0,0", {"kind": "tree", "paths": "0;1;0,0"}),
    ("tree:path:3", {"kind": "tree", "paths": "path:3"}),
    ("dynamic:16", {"kind": "tree", "dynamic": (16, 0)}),
    ("dynamic:16:3:2", {"kind": "tree", "dynamic": (16, 3, 2)}),
    ("draft:runs/d/last.ckpt", {"kind": "draft", "ckpt": "runs/d/last.ckpt"}),
    ("prompt-lookup", {"kind": "prompt-lookup", "ngram": 2, "tokens": 10}),  # one default: transformers' (2:10)
    ("prompt-lookup:2:10", {"kind": "prompt-lookup", "ngram": 2, "tokens": 10}),
])
def test_proposer_parses_each_kind(text, fields):
    proposer = proposer_arg(text)
    assert {key: getattr(proposer, key) for key in fields} == fields
    assert proposer.text == text


@pytest.mark.parametrize("text", ["", "tree", "tree:-1", "tree:auto:0", "dynamic:", "dynamic:0",
                                  "dynamic:1:2:3:4", "draft:", "prompt-lookup:3", "prompt-lookup:0:8", "medusa"])
def test_a_bad_proposer_is_one_line(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--proposer"):
        proposer_arg(text)


def test_a_proposer_builds_the_tree_and_criterion_the_old_options_did():
    table = torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.2, 0.1]], dtype=torch.float64)
    assert proposer_arg("tree:5").tree(table, 4) == Tree.from_budget(5, table[:3])
    assert proposer_arg("tree:0").tree(table, 4) is None
    assert proposer_arg("tree:0;1;0,0").tree(table, 4) == Tree.from_paths([(0,), (1,), (0, 0)])
    assert proposer_arg("dynamic:6").tree(table, 4) == DynamicTree(6, 3)  # default depth: k - 1
    assert proposer_arg("dynamic:6:2:3").tree(table, 4) == DynamicTree(6, 2, 3)
    assert proposer_arg("heads").tree(table, 4) is None and proposer_arg("heads").criterion("top2") == "top2"
    assert proposer_arg("draft:d.ckpt").criterion("exact") == "draft:exact"
    assert proposer_arg("draft:d.ckpt").criterion("draft:sample_t1") == "draft:sample_t1"
    assert ProposerChoice("heads").method_kwargs() == {} and proposer_arg("tree:4").method_kwargs() == {}
    with pytest.raises(ValueError, match=r"^--proposer tree:0;x: invalid literal"):
        proposer_arg("tree:0;x").tree(table, 4)
    with pytest.raises(ValueError, match=r"^--proposer tree:N must lie in .*, got 9$"):
        proposer_arg("tree:9").tree(table[:1, :2], 4)


def test_prompt_lookup_is_passed_to_make_method_as_its_proposer():
    proposers = pytest.importorskip("lightning_bpd.decoding.proposers")
    kwargs = proposer_arg("prompt-lookup:2:10").method_kwargs()
    assert set(kwargs) == {"proposer"} and isinstance(kwargs["proposer"], proposers.PromptLookup)
    assert (kwargs["proposer"].max_ngram, kwargs["proposer"].num_tokens) == (2, 10)
    default = proposer_arg("prompt-lookup").method_kwargs()["proposer"]
    assert (default.max_ngram, default.num_tokens) == (2, 10)  # the benches' and transformers' default


def test_the_console_script_runs_the_cli(capsys):
    pyproject = (REPO / "pyproject.toml").read_text()  # tomllib is Python 3.11+: the one line, read plainly
    section = pyproject.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    (target,) = re.findall(r'^lightning-bpd = "([\w.]+:\w+)"$', section, re.MULTILINE)
    module, _, name = target.partition(":")
    entry = getattr(__import__(module, fromlist=[name]), name)
    assert entry(["--help"]) == 0
    assert "recipe" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        entry(["decode", "--help"])
    assert stop.value.code == 0 and "--proposer" in capsys.readouterr().out


def test_every_recipe_stage_parses_in_the_new_spellings(capsys):
    """The recipes' command lines (conf/recipes) are in the new vocabulary: each stage of a plain command parses with
    that command's parser and prints no deprecation line."""
    import importlib

    from lightning_bpd.commands.cli import PLAIN_COMMANDS
    from lightning_bpd.commands.recipe import available, load_recipe

    parsed = 0
    for name in available():
        for stage in load_recipe(name).stages:
            if stage.command not in PLAIN_COMMANDS or stage.command == "recipe":
                continue
            argv = [re.sub(r"\{[a-z_0-9]+\}", "x", arg) for arg in stage.args]
            importlib.import_module(PLAIN_COMMANDS[stage.command]).build_parser().parse_args(argv)
            assert "deprecated" not in capsys.readouterr().err, (name, stage.name)
            parsed += 1
    assert parsed >= 10


def test_a_recipe_finds_the_stage_input_inside_a_prefixed_value(tmp_path):
    """``--draft-vocab N:PATH`` and ``--proposer draft:PATH`` still name their input stage (run that stage first)."""
    from lightning_bpd.commands.recipe import load_recipe, stage_inputs

    recipe = load_recipe("multi30k-k8", runs=str(tmp_path))
    stages = {stage.name: stage for stage in recipe.stages}
    text, ckpt = f"{stages['distill'].folder}/train.de", f"{stages['base'].folder}/last.ckpt"
    argv = ["--draft-vocab", f"1000:{text}", "--proposer", f"draft:{ckpt}", "--k", "4"]
    assert stage_inputs(argv, stages["bench_int8"], recipe) == [(text, "distill"), (ckpt, "base")]
