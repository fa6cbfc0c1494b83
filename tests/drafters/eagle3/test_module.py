"""EAGLE-3 drafter training (lightning_bpd/drafters/eagle3/module.py) on a tiny random Llama and on our own decoder-only
base: a step trains the drafter alone (the target and the copied embeddings untouched) toward the target's own
logits at the right positions, cached and uncached steps agree, the draft vocabulary comes from the data's counts,
``fit --config conf/lm/eagle3.yaml`` writes a checkpoint of the drafter alone that ``load_model`` reads and
``export-heads --format speculators`` exports, and whose drafter decodes as greedy
(:class:`~lightning_bpd.decoding.proposers.Eagle3`, in validation and after loading); bad input is one line."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.commands.export_heads import export_heads
from lightning_bpd.drafters.eagle3.module import (
    Eagle3Module,
    depth_labels,
    eagle3_proposer,
    load_eagle3_drafter,
    token_counts,
    ttt_loss,
)
from lightning_bpd.drafters.eagle3.network import vocab_mapping
from lightning_bpd.drafters.eagle3.speculators import read_speculators
from tests.tasks.lm.tiny_lm import write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = [0, 1]  # the tiny Llama has 2 layers: EAGLE-3's default needs 7


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code")


def random_src(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 200, (b, t), generator=torch.Generator().manual_seed(seed))


def test_ttt_loss_and_depth_labels_on_hand_written_cases():
    # one row, T = 3, 2 steps, vocabulary 2: step 0 slots 0, 1 read targets 1, 2; step 1 slot 0 reads target 2
    logits = torch.tensor([[[[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]], [[0.0, 2.0], [9.0, 9.0], [9.0, 9.0]]]])
    targets = torch.tensor([[[7.0, 7.0], [0.0, 0.0], [0.0, math.log(3.0)]]])  # p = (1/2, 1/2), (1/4, 3/4)
    valid = torch.ones(1, 2, 3, dtype=torch.bool)

    def kl(p: list[float], z: list[float]) -> float:
        q = torch.tensor(z).softmax(-1).tolist()
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))

    step0 = (kl([0.5, 0.5], [0.0, 0.0]) + kl([0.25, 0.75], [1.0, 0.0])) / 2
    step1 = kl([0.25, 0.75], [0.0, 2.0])
    loss, per_step = ttt_loss(logits, targets, valid, decay=0.5)
    assert per_step.tolist() == pytest.approx([step0, step1], rel=1e-4)
    assert float(loss) == pytest.approx(step0 + 0.5 * step1, rel=1e-4)
    valid[0, 0, 1] = False  # step 0's second slot masked out
    assert float(ttt_loss(logits, targets, valid)[1][0]) == pytest.approx(kl([0.5, 0.5], [0.0, 0.0]), rel=1e-4)
    ce = ttt_loss(logits, targets, torch.ones(1, 2, 3, dtype=torch.bool), kind="ce")[1]  # the targets' argmax 0, 1, 1
    assert ce.tolist() == pytest.approx([(math.log(2) + F.cross_entropy(torch.tensor([[1.0, 0.0]]),
                                                                        torch.tensor([1])).item()) / 2,
                                         F.cross_entropy(torch.tensor([[0.0, 2.0]]), torch.tensor([1])).item()], rel=1e-4)
    # labels: [:, s, t] = greedy[t + 1 + s] in draft ids; -1 past the end or outside the draft vocabulary
    greedy = torch.tensor([[4, 1, 3, 2]])
    t2d = torch.tensor([False, True, False, True, False])  # draft ids: 1 -> 0, 3 -> 1
    assert depth_labels(greedy, 2, t2d).tolist() == [[[0, 1, -1, -1], [1, -1, -1, -1]]]
    assert depth_labels(greedy, 1, None).tolist() == [[[1, 3, 2, -1]]]


def test_a_step_trains_the_drafter_only(checkpoint):
    module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, feature_noise=0.1, warmup_steps=1)
    target_weights = {k: v.clone() for k, v in module.model.base.state_dict().items()}
    embeddings = module.model.base.get_input_embeddings().weight
    assert torch.equal(module.drafter.embed_tokens.weight, embeddings)  # the target's, copied
    assert set(module.state_dict()) == {f"drafter.{k}" for k in module.drafter.state_dict()}  # no target weights
    assert "drafter.embed_tokens.weight" in module.state_dict()  # once, with the drafter (the export needs them)
    src = random_src(2, 24, 2)
    g = torch.Generator().manual_seed(0)
    out = module.step({"src": src}, g, module.feature_noise)
    assert math.isfinite(float(out["loss"].detach())) and out["acc"].shape == (3,) and 1.0 <= float(out["accepted"])
    out["loss"].backward()
    trained = [p for n, p in module.drafter.named_parameters() if n != "embed_tokens.weight"]
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in trained)
    assert module.drafter.embed_tokens.weight.grad is None and not module.drafter.embed_tokens.weight.requires_grad
    assert all(p.grad is None and not p.requires_grad for p in module.model.base.parameters())
    optimizer = module.configure_optimizers()["optimizer"]  # AdamW on the drafter's trainable parameters
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {id(p) for p in trained}
    before = [p.clone() for p in trained]
    optimizer.step()
    assert all(torch.equal(v, module.model.base.state_dict()[k]) for k, v in target_weights.items())
    assert torch.equal(module.drafter.embed_tokens.weight, embeddings)
    assert all(not torch.equal(a, b) for a, b in zip(before, trained))
    assert not module.model.base.training and module.training  # the target stays in eval mode


def test_the_loss_reads_the_target_logits_at_the_right_positions(checkpoint):
    module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, draft_vocab=40, ttt_steps=3,
                          ttt_step_loss_decay=0.7, feature_cache_gb=0.0)
    counts = torch.bincount(random_src(1, 400, 9).flatten(), minlength=module.drafter.config.vocab_size)
    module.set_draft_vocab(counts)
    t2d = module.drafter.t2d
    assert torch.equal(t2d, vocab_mapping(counts, 40)[1]) and int(t2d.sum()) == 40
    src = random_src(2, 12, 5)
    batch = {"src": src, "length": torch.tensor([11, 6])}  # row 1: its first 7 tokens only are data
    out = module.step(batch)
    with torch.no_grad():
        features, _ = module.target_pass(src)
        logits = module.drafter.train_forward(features, src, 3)  # (B, S, T, Vd)
    total, correct = 0.0, {}
    for s in range(3):
        kls = []
        for n, real in ((0, 12), (1, 7)):
            for t in range(12):
                p = t + 1 + s  # [:, s, t] drafts the token at t + 2 + s: the target's logits at position t + 1 + s
                if p >= real:
                    continue
                with torch.no_grad():  # the target alone, uncached, on the tokens up to p
                    full = module.model.base(input_ids=src[n : n + 1, : p + 1]).logits[0, -1]  # (V,)
                target = full[t2d].log_softmax(-1)
                kls.append(float((target.exp() * (target - logits[n, s, t].log_softmax(-1))).sum()))
                right = bool(t2d[full.argmax()]) and int(t2d.nonzero().flatten()[logits[n, s, t].argmax()]) == \
                    int(full.argmax())
                correct.setdefault(s, []).append(right)
        total += 0.7**s * sum(kls) / len(kls)
        assert float(out["loss_depth"][s]) == pytest.approx(sum(kls) / len(kls), rel=1e-4)
    assert float(out["loss"].detach()) == pytest.approx(total, rel=1e-4)
    assert out["acc"].tolist() == pytest.approx([sum(c) / len(c) for c in correct.values()])


def test_cached_target_features_give_the_step_the_uncached_target_gives(checkpoint):
    cached = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, draft_vocab=64)
    plain = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, draft_vocab=64, feature_cache_gb=0.0)
    counts = torch.bincount(random_src(1, 300, 3).flatten(), minlength=cached.drafter.config.vocab_size)
    cached.set_draft_vocab(counts)
    plain.drafter.load_state_dict(cached.drafter.state_dict())
    src = random_src(3, 20, 4)
    batch = {"src": src, "index": torch.tensor([7, 2, 9])}
    want = plain.step(batch)
    assert plain.feature_cache is None
    for _ in range(2):  # the first call fills the cache, the second reads it: the same loss and metrics both times
        got = cached.step(batch)
        assert torch.equal(got["loss"], want["loss"]) and torch.equal(got["acc"], want["acc"])
    assert (cached.feature_cache.misses, cached.feature_cache.hits, len(cached.feature_cache)) == (3, 3, 3)
    mixed = {"src": torch.cat([src[1:2], src[0:1] + 1]), "index": torch.tensor([2, 11])}
    features, last = cached.target_outputs(mixed)
    want_features, want_last = plain.target_pass(mixed["src"])
    # (rows computed alone or in a batch: equal up to the matmul's blocking)
    assert torch.allclose(features, want_features, rtol=1e-5, atol=1e-5 * float(want_features.abs().max()))
    assert torch.allclose(last, want_last, rtol=1e-5, atol=1e-5 * float(want_last.abs().max()))
    cached.eval()  # validation runs the target itself
    assert cached.target_outputs(mixed)[0].shape == want_features.shape and cached.feature_cache.hits == 4


def test_draft_vocabulary_counts_of_the_training_data(checkpoint, data):
    from lightning_bpd.tasks.lm import LMDataModule

    dm = LMDataModule(str(data), tokenizer_path=str(checkpoint), seq_len=32, batch_size=4)
    dm.setup("fit")
    stream = torch.tensor(dm.stream("train"))
    v = 300
    assert torch.equal(token_counts(dm, v), torch.bincount(stream, minlength=v))

    class Items:  # any data module whose training items carry src (and length)
        def dataset(self, split: str) -> list[dict[str, torch.Tensor]]:
            return [{"src": torch.tensor([5, 6, 6, 0]), "length": 2}, {"src": torch.tensor([7, 7, 7])}]

    assert token_counts(Items(), 10).tolist() == [0, 0, 0, 0, 0, 1, 2, 3, 0, 0]
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        token_counts(Items(), 7)
    with pytest.raises(ValueError, match="offers no dataset"):
        token_counts(object(), 10)


def test_a_draft_vocabulary_of_the_whole_vocabulary_or_more_is_the_whole_one_and_null_on_a_big_one_hints(
        checkpoint, monkeypatch, capsys):
    """conf/lm/eagle3.yaml's draft_vocab (8192) on a smaller vocabulary (300 here) is the whole one, not an error;
    null on a vocabulary above 32,768 tokens prints one hint naming the option and the parameters it saves."""
    from lightning_bpd.drafters.eagle3 import module as eagle3_module
    from tests.test_configs import resolved

    assert resolved(CONF_DIR / "lm" / "eagle3.yaml")["model"]["init_args"]["draft_vocab"] == 8192
    for given in (300, 8192):
        module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, draft_vocab=given)
        assert not module.drafter.config.uses_draft_vocab and module.drafter.config.draft_vocab_size == 300
        assert module.hparams.draft_vocab is None and module.vocab_counted and module.vocab_hint is None
    h = module.drafter.config.hidden_size
    config = eagle3_module.Eagle3Config.from_dict({**module.drafter.config.to_dict(), "vocab_size": 49152,
                                                     "draft_vocab_size": 49152})
    hint = eagle3_module.whole_vocab_hint(config, 33_400_000)
    assert hint.startswith("hint: model.init_args.draft_vocab is null: the drafter's LM head covers all 49,152 tokens")
    assert "(33.4M trained parameters); --model.init_args.draft_vocab=8192" in hint
    assert hint.endswith(f"trains {(49152 - 8192) * h / 1e6:.1f}M fewer") and "\n" not in hint
    assert eagle3_module.whole_vocab_hint(module.drafter.config, 10**6) is None  # 300 tokens: no hint
    monkeypatch.setattr(eagle3_module, "HINT_ABOVE", 100)  # the tiny vocabulary counts as a big one
    module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS)
    capsys.readouterr()
    module.setup("validate")
    assert capsys.readouterr().err == ""  # fitting only
    module.setup("fit")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("hint: model.init_args.draft_vocab is null")
    trained = sum(p.numel() for p in module.drafter.parameters() if p.requires_grad)
    assert f"({trained / 1e6:.1f}M trained parameters)" in err[0]
    assert Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, draft_vocab=300).vocab_hint is None  # not null


def test_the_decode_evaluation_states_the_drafters_block(checkpoint):
    """decode_val_*.json's k (proposed_block): a DFlash drafter's block_size, an EAGLE-3 chain's, not the target's
    k of 1."""
    from lightning_bpd.callbacks.decode_eval import build_methods, proposed_block
    from lightning_bpd.drafters.dflash.module import DFlashModule

    for module in (DFlashModule(str(checkpoint), block_size=5), Eagle3Module(str(checkpoint), target_layer_ids=LAYERS,
                                                                             block_size=3)):
        assert module.model.k == 1
        assert proposed_block(module, build_methods(module, ["exact"])[1]) == module.block_size
        assert proposed_block(module, build_methods(module, [])[1]) == 1  # greedy alone


def test_bad_options_are_one_line(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"target_layer_ids: EAGLE-3's default layers need a target of >= 7 layers, "
                                         r"this one has 2: give >= 2 distinct layers in \[0, 1\]$"):
        Eagle3Module(str(checkpoint))
    for layers in ([0], [1, 1], [0, 2]):
        with pytest.raises(ValueError, match=r"target_layer_ids .*: give >= 2 distinct decoder layers"):
            Eagle3Module(str(checkpoint), target_layer_ids=layers)
    for bad, match in (({"draft_vocab": 0}, "draft_vocab must be null"), ({"draft_vocab": 2.5}, "integer >= 1"),
                       ({"loss": "mse"}, "loss must be one of kl_div, ce"), ({"ttt_steps": 0}, "ttt_steps must be"),
                       ({"block_size": 1}, "block_size must be an integer >= 2"), ({"block_size": 65}, "at most 64"),
                       ({"feature_cache_gb": -1}, "feature_cache_gb >= 0"), ({"family": "gpt2"}, "family must be one"),
                       ({"norm_before_fc": True, "fc_norm": True}, "exclude each other")):
        with pytest.raises(ValueError, match=match) as err:
            Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, **bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not a directory"):
        Eagle3Module(str(tmp_path / "nowhere"), target_layer_ids=LAYERS)
    module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, ttt_steps=4)
    assert module.block_size == 5  # default: as deep as trained
    with pytest.raises(ValueError, match="not longer than model.ttt_steps 4"):
        module.step({"src": torch.full((1, 4), 5)})
    with pytest.raises(ValueError, match="whole vocabulary"):
        module.set_draft_vocab(torch.ones(300))


FAST = ["--trainer.max_steps=4", "--trainer.val_check_interval=4", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1", "--data.init_args.seq_len=32",
        "--data.init_args.batch_size=4", "--data.init_args.prompt_tokens=24", "--decode_eval.subset=2",
        "--decode_eval.batch_size=2", "--model.init_args.max_new_tokens=8", "--model.init_args.warmup_steps=2",
        f"--model.init_args.target_layer_ids={LAYERS}", "--model.init_args.draft_vocab=64",
        "--trainer.limit_val_batches=2"]


def logged(run: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in csv.DictReader(next(run.rglob("metrics.csv")).open()):
        out.update({key: float(value) for key, value in row.items() if value})
    return out


def fit(checkpoint: Path, data: Path, run: Path, *extra: str) -> Eagle3Module:
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "eagle3.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, f"--trainer.logger={logger}", *extra])
    return cli.model


@pytest.fixture(scope="module")
def fitted(checkpoint, data, tmp_path_factory) -> tuple[Eagle3Module, Path]:
    """A 4-step fit with conf/lm/eagle3.yaml (validation decodes greedily and with exact acceptance)."""
    run = tmp_path_factory.mktemp("eagle3") / "run"
    return fit(checkpoint, data, run), run


def test_fit_writes_a_drafter_checkpoint_that_load_model_reads(fitted, checkpoint, data):
    trained, run = fitted
    assert isinstance(trained, Eagle3Module) and trained.global_step == 4
    decoded = json.loads(next(run.rglob("decode_val_step4.json")).read_text())
    assert decoded["k"] == 4  # the drafter's chains (block_size 4), not the target's k of 1
    metrics = logged(run)
    assert {"train/acc_depth1", "train/acc_depth3", "val/acc_depth2", "val/accepted", "train/accepted"} <= set(metrics)
    assert 1.0 <= metrics["val/accepted"] <= 4.0 and math.isfinite(metrics["train/loss"]) and \
        math.isfinite(metrics["val/loss"])
    # the draft vocabulary: the training data's 64 most frequent tokens, counted at setup
    from lightning_bpd.tasks.lm import LMDataModule

    dm = LMDataModule(str(data), tokenizer_path=str(checkpoint), seq_len=32)
    dm.setup("fit")
    assert torch.equal(trained.drafter.t2d, vocab_mapping(token_counts(dm, 300), 64)[1])

    ckpt = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert set(ckpt["state_dict"]) == {f"drafter.{k}" for k in trained.drafter.state_dict()}  # the drafter alone
    assert ckpt["eagle3_config"]["draft_vocab_size"] == 64 and ckpt["eagle3_config"]["target_layer_ids"] == LAYERS
    loaded = lightning_bpd.load_model(run / "last.ckpt")
    assert isinstance(loaded, Eagle3Module) and loaded.drafter.config == trained.drafter.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.drafter.state_dict().values(),
                                                 trained.drafter.state_dict().values()))
    drafter = load_eagle3_drafter(run / "last.ckpt")
    assert torch.equal(drafter.d2t, trained.drafter.d2t) and torch.equal(drafter.fc.weight, trained.drafter.fc.weight)


def test_export_heads_writes_the_speculators_layout(fitted, checkpoint, tmp_path, capsys):
    trained, run = fitted
    out = export_heads(run / "last.ckpt", tmp_path / "spec", "speculators")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 64
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2]  # our layer outputs + 1
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3  # block 4: 3 drafts
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(checkpoint)
    back = read_speculators(out)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), trained.drafter.state_dict().values()))
    err = capsys.readouterr().err
    assert "2 target layers: llama.cpp's eagle3 takes exactly 3" in err  # serving_notes
    assert "target layer 1 is the target's last" in err and "EAGLE-3 drafter of" in err
    assert json.loads((out / "export_heads.json").read_text())["block_size"] == 4
    with pytest.raises(ValueError, match="an EAGLE-3 drafter run: use --format speculators"):
        export_heads(run / "last.ckpt", tmp_path / "z", "dflash-zlab")


def test_the_drafter_of_another_kind_of_checkpoint_is_one_line(fitted, checkpoint, tmp_path):
    from lightning_bpd.drafters.dflash.module import DFlashModule, load_drafter
    from tests.drafters.dflash.tiny import save_dflash

    dflash = save_dflash(DFlashModule(str(checkpoint), block_size=4), tmp_path / "dflash.ckpt")
    with pytest.raises(ValueError, match=r"dflash.ckpt is not an EAGLE-3 drafter checkpoint \(DFlashModule\): give "
                                         r"the .ckpt of a fit with conf/lm/eagle3.yaml$"):
        load_eagle3_drafter(dflash)
    with pytest.raises(ValueError, match=r"no EAGLE-3 drafter checkpoint there"):
        load_eagle3_drafter(tmp_path)
    with pytest.raises(ValueError, match=r"is not a DFlash drafter checkpoint \(Eagle3Module\)"):
        load_drafter(fitted[1] / "last.ckpt")
    from lightning_bpd.hf.causal import load_causal
    from tests.tasks.lm.tiny_lm import write_checkpoint

    other = load_causal(write_checkpoint(tmp_path / "other", vocab_extra=5))
    with pytest.raises(ValueError, match=r"^the drafter was trained on another target: vocab_size 300 \(target 305\)$"):
        eagle3_proposer(fitted[0].drafter, other)


def test_a_sequence_not_longer_than_the_ttt_steps_is_one_error_line(checkpoint, data, tmp_path):
    with pytest.raises(SystemExit, match=r"^error: data.seq_len 3 must exceed model.ttt_steps 3$"):
        main(["fit", "--config", str(CONF_DIR / "lm" / "eagle3.yaml"), f"--model.init_args.pretrained={checkpoint}",
              f"--data.init_args.root={data}", f"--run_dir={tmp_path / 'run'}", "--trainer.logger=false",
              "--trainer.accelerator=cpu", "--data.init_args.seq_len=3", f"--model.init_args.target_layer_ids={LAYERS}"])


def test_a_drafter_trains_on_our_own_base(tmp_path):
    from lightning_bpd.nn.causal_model import CausalTransformer
    from lightning_bpd.tasks.lm import LMModule
    from tests.drafters.dflash.tiny import save_dflash
    from tests.tasks.lm.test_lm_own_base import TINY, TRAIN
    from tests.tasks.lm.tiny_lm import tokenizer as tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "bpe")
    torch.manual_seed(0)
    own = save_dflash(LMModule(own={**TINY, "tokenizer": str(tmp_path / "bpe")}, training=TRAIN).eval(),
                      tmp_path / "own.ckpt")
    module = Eagle3Module(str(own), target_layer_ids=LAYERS, draft_vocab=50)
    assert isinstance(module.model, CausalTransformer) and module.drafter.config.hidden_size == TINY["d_model"]
    assert torch.equal(module.drafter.embed_tokens.weight, module.model.tgt_embed.weight.float())
    module.set_draft_vocab(torch.arange(module.drafter.config.vocab_size).flip(0))  # the lowest ids most frequent
    src = random_src(2, 16, 1)
    out = module.step({"src": src, "index": torch.tensor([0, 1])})
    out["loss"].backward()
    assert all(p.grad is not None for n, p in module.drafter.named_parameters() if n != "embed_tokens.weight")
    assert all(p.grad is None for p in module.model.parameters())
    loaded = lightning_bpd.load_model(save_dflash(module, tmp_path / "eagle3.ckpt"))
    assert isinstance(loaded, Eagle3Module) and torch.equal(loaded.drafter.t2d, module.drafter.t2d)
    assert torch.equal(loaded.step({"src": src})["loss"], module.eval().step({"src": src})["loss"])
    with pytest.raises(ValueError, match="not a Hugging Face directory"):
        export_heads(tmp_path / "eagle3.ckpt", tmp_path / "spec", "speculators")
    with pytest.raises(ValueError, match="is a Eagle3Module checkpoint, not a language-modelling run"):
        Eagle3Module(str(tmp_path / "eagle3.ckpt"), target_layer_ids=LAYERS)


def test_training_raises_the_expected_accepted_length(checkpoint, tmp_path):
    from lightning_bpd.tasks.lm import LMDataModule
    from tests.drafters.dflash.test_module import repetitive_corpus

    torch.manual_seed(0)
    module = Eagle3Module(str(checkpoint), target_layer_ids=LAYERS, ttt_steps=3)
    dm = LMDataModule(str(repetitive_corpus(tmp_path / "rep")), tokenizer_path=str(checkpoint), seq_len=48,
                      batch_size=4)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    optimizer = torch.optim.AdamW([p for p in module.drafter.parameters() if p.requires_grad], lr=3e-3,
                                  betas=(0.9, 0.95))
    curve = []
    for i in range(120):
        out = module.step(batches[i % len(batches)])
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        curve.append(float(out["accepted"]))
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10  # chains of 3 drafts: 1 (none right) to 4 (all)
    assert first < 1.5 and last > 2.8, (first, last)


def test_fit_decodes_exact_as_greedy_with_the_drafter(fitted):
    metrics = logged(fitted[1])
    assert metrics["val/exact/matches_greedy"] == 1.0 and metrics["val/exact/mean_accepted_block_size"] >= 1.0
    assert metrics["val/exact/model_calls"] > 0 and "val/exact/speedup" in metrics


def test_a_loaded_drafter_decodes_as_greedy(fitted):
    from lightning_bpd.decoding import Exact, decode, greedy_decode

    loaded = lightning_bpd.load_model(fitted[1] / "last.ckpt")
    src = loaded.encode_prompts(["def f_1(x, y):\n", "    return", "for items in range(3):\n"])
    want = greedy_decode(loaded.model, src, 12).sequences()
    with torch.no_grad():
        got = decode(loaded.model, src, Exact(), loaded.decode_eval_proposer(loaded.model), max_len=12)
    assert got.sequences() == want
