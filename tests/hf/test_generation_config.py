"""Exact against ``generate`` as the checkpoint configures it (issue 44): the generation config's rules (forced
BOS/EOS, EOS ids, suppressed and banned tokens, minimum lengths) on tiny random Marian / BART / mBART / T5 models,
each setting on its own and all together, on rows that end and rows that reach the cap; refused settings."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, MinBlock, TopK, blockwise_decode, blockwise_decode_reference, greedy_decode
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.hf import HFSeq2SeqBlockwise
from lightning_bpd.hf.generation_rules import ids
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf.test_base import FAMILIES, PAD, VOCAB, pick_eos, scramble_head, sources, tiny_base

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LEN = 12
SETTINGS = ("eos_list", "forced_bos", "forced_eos", "suppress_tokens", "begin_suppress_tokens", "bad_words",
            "bad_words_of_two", "min_new_tokens", "min_length", "all")


def hf_greedy(base, src: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
    """The checkpoint's own greedy ``generate`` (its generation config as it is), without the start token, each row
    cut after its first EOS id."""
    out = base.generate(input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False,
                        max_new_tokens=max_new_tokens)
    eos = ids(base.generation_config.eos_token_id)
    rows = []
    for row in out[:, 1:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if end is None else row[: end + 1])
    return rows


def configure(base, setting: str, src: torch.Tensor) -> None:
    """Set ``setting`` in the base's generation config, with tokens read off its plain greedy output so that the
    setting changes it."""
    eos = pick_eos(base, src, MAX_LEN)
    plain = hf_greedy(base, src, MAX_LEN)
    counts = Counter(t for row in plain for t in row if t != eos)
    common = [t for t, _ in counts.most_common()] + [t for t in range(3, VOCAB) if t not in counts and t != eos]
    firsts = {row[0] for row in plain}
    bigram = next((row[i], row[i + 1]) for row in plain for i in range(len(row) - 1) if eos not in row[i : i + 2])
    forced_bos = next(t for t in range(3, VOCAB) if t not in firsts and t not in common[:3])
    gc = base.generation_config
    if setting in ("eos_list", "all"):
        gc.eos_token_id = [eos, common[2]]
    if setting in ("forced_bos", "all"):
        gc.forced_bos_token_id = forced_bos
    if setting in ("forced_eos", "all"):
        gc.forced_eos_token_id = eos if setting != "all" else [common[2], eos]
    if setting in ("suppress_tokens", "all"):
        gc.suppress_tokens = [common[0]]
    if setting == "begin_suppress_tokens":
        gc.begin_suppress_tokens = sorted(firsts)[:2]
    if setting == "all":
        gc.begin_suppress_tokens = [common[3]]
    if setting in ("bad_words", "all"):
        gc.bad_words_ids = (gc.bad_words_ids or []) + [[common[1]]]
    if setting in ("bad_words_of_two", "all"):
        gc.bad_words_ids = (gc.bad_words_ids or []) + [list(bigram)]
    if setting in ("min_new_tokens", "all"):
        gc.min_new_tokens = 6 if setting != "all" else 3
    if setting == "min_length":
        gc.min_length = 7


def model_for(family: str, setting: str, head_type: str = "chained_attn", seed: int = 0):
    base = tiny_base(family, seed=seed)
    src = sources()
    configure(base, setting, src)
    model = HFSeq2SeqBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)  # heads that sometimes agree with p_1 and sometimes not
    return base, model, src


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_exact_equals_generate_under_each_setting(family, setting):
    base, model, src = model_for(family, setting)
    want = hf_greedy(base, src, MAX_LEN)
    if setting not in ("eos_list", "all"):  # rows that reach the cap (a second EOS id may end every row)
        assert any(len(row) == MAX_LEN for row in want)
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    out = blockwise_decode(model, src, Exact(), MAX_LEN)
    assert out.sequences() == want
    assert max(max(sizes) for sizes in out.block_sizes) > 1
    runtime = build_runtime(model, InferenceOptions())  # lean steps on the BART family
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == want


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_all_settings_at_batch_one_and_through_the_reference(family, head_type):
    base, model, src = model_for(family, "all", head_type, seed=1)
    want = hf_greedy(base, src, MAX_LEN)
    for row in range(src.shape[0]):
        one = src[row : row + 1, : int((src[row] != PAD).sum())]  # the row alone, unpadded
        assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == [want[row]]
        assert hf_greedy(base, one, MAX_LEN) == [want[row]]
    for criterion in (TopK(2), MinBlock(2, TopK(3))):  # approximate rules read the same ruled p_1
        fast = blockwise_decode(model, src, criterion, MAX_LEN)
        slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
        assert all(row[0] == base.generation_config.forced_bos_token_id for row in fast.sequences())


def test_speculative_sampling_applies_the_rules():
    base, model, src = model_for("bart", "all")
    want = hf_greedy(base, src, MAX_LEN)
    assert make_method("sample_t0", parse_criterion, model, seed=3)(model, src, MAX_LEN).sequences() == want
    gc = base.generation_config
    for seed in range(3):
        for row in make_method("sample_t1.5", parse_criterion, model, seed=seed)(model, src, MAX_LEN).sequences():
            assert row[0] == gc.forced_bos_token_id
            assert gc.suppress_tokens[0] not in row
            assert all(t not in gc.eos_token_id for t in row[:-1])
            if len(row) == MAX_LEN:
                assert row[-1] in gc.eos_token_id  # forced EOS at the cap


@pytest.mark.parametrize("setting, value", [("no_repeat_ngram_size", 3), ("repetition_penalty", 1.2),
                                            ("encoder_repetition_penalty", 1.1)])
def test_history_dependent_settings_are_refused_in_one_line(setting, value):
    base = tiny_base("marian")
    setattr(base.generation_config, setting, value)
    model = HFSeq2SeqBlockwise(base, k=2)
    for decode in (lambda: greedy_decode(model, sources(), MAX_LEN),
                   lambda: blockwise_decode(model, sources(), Exact(), MAX_LEN)):
        with pytest.raises(ValueError, match=f"generation_config.{setting}=.*set it to") as err:
            decode()
        assert "\n" not in str(err.value)


def test_sampling_settings_are_ignored_as_generate_ignores_them():
    base, model, src = model_for("marian", "forced_eos")
    want = hf_greedy(base, src, MAX_LEN)
    base.generation_config.temperature, base.generation_config.top_p, base.generation_config.top_k = 0.3, 0.5, 4
    base.generation_config.do_sample = True  # generate samples by default; do_sample=False is greedy
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want == hf_greedy(base, src, MAX_LEN)


def test_decode_command_equals_generate_with_the_checkpoints_forced_eos(tmp_path, capsys):
    """A heads folder on a Marian whose generation config forces EOS at the cap (as opus-mt's does): ``decode
    --max-new-tokens N`` writes what ``generate(max_new_tokens=N)`` decodes, capped rows ending in EOS."""
    from lightning_bpd.commands.cli import main
    from lightning_bpd.tasks.translation.hf_module import HFTranslationModule, save_heads
    from tests.hf.tiny_checkpoint import EOS, sentence_pairs, tiny_marian, tiny_tokenizer

    folder = tmp_path / "marian"
    tok = tiny_tokenizer()
    base = tiny_marian(len(tok), seed=2)
    base.generation_config.forced_eos_token_id = EOS
    base.generation_config.bad_words_ids = [[base.config.pad_token_id]]
    base.save_pretrained(folder)
    tok.save_pretrained(folder)
    module = HFTranslationModule(str(folder), k=3, head_type="chained")
    scramble_head(module.model, std=0.05)
    heads = save_heads(module, tmp_path / "heads")
    sentences = [en for en, _ in sentence_pairs(6, seed=5)]
    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n")
    src = module.encode_sources(sentences)
    for cap in (3, 9):
        want = hf_greedy(module.model.base, src, cap)
        assert all(row[-1] == EOS for row in want if len(row) == cap)
        capsys.readouterr()
        main(["decode", "--ckpt", str(heads), "--input", str(tmp_path / "in.en"), "--criterion", "exact",
              "--max-new-tokens", str(cap), "--device", "cpu"])
        assert capsys.readouterr().out.splitlines() == module.detokenize(want)
    with pytest.raises(SystemExit, match="decode: max_len too long"):
        main(["decode", "--ckpt", str(heads), "--input", str(tmp_path / "in.en"), "--max-new-tokens", "500",
              "--device", "cpu"])


def test_fit_refuses_a_history_dependent_setting_before_training(tmp_path):
    from lightning_bpd.tasks.translation.hf_module import HFTranslationModule
    from tests.hf.tiny_checkpoint import write_checkpoint

    folder = write_checkpoint(tmp_path / "marian")
    module = HFTranslationModule(str(folder), k=2)
    module.model.base.generation_config.no_repeat_ngram_size = 2
    with pytest.raises(ValueError, match="no_repeat_ngram_size=2 changes generate's greedy output"):
        module.on_fit_start()
