import pytest
import torch

from lightning_bpd.callbacks.decode_eval import DecodeEval, EvalBatch, format_summary, run_decode_eval
from lightning_bpd.decoding import parse_criterion
from tests.models import EOS, StubModel, random_model, random_sources, stub_sources


class StubTask:
    """A DecodeEval task over the stub model: the 'quality' is the share of exact-match outputs."""

    def __init__(self, model):
        self.model = model

    def make_criterion(self, spec):
        return parse_criterion(spec)

    def decode_eval_batches(self, stage, limit, batch_size):
        refs = self.model.targets
        return [EvalBatch(stub_sources(len(refs)), 30, refs, ["src"] * len(refs), list(range(len(refs))))]

    def decode_eval_metrics(self, outputs, batches, greedy):
        refs = [r for b in batches for r in b.references]
        return {"acc": sum(o == r for o, r in zip(outputs, refs)) / len(refs)}


def test_metrics_per_method():
    targets = [[5, 6, 7, 8, 9, 10, 11, EOS], [12, 13, EOS]]
    # heads 3 and 4 (i >= 2) propose the runner-up: exact accepts 2 per iteration, top2 accepts 4
    model = StubModel(targets, k=4, right=lambda i, t: i < 2, wrong=lambda tok: 3 + (tok - 3 + 1) % 200)
    task = StubTask(model)
    metrics, runs = run_decode_eval(task, task.decode_eval_batches("val", None, 8), ["exact", "top2"])
    assert metrics["examples"] == 2
    assert metrics["greedy/acc"] == 1.0 and metrics["exact/acc"] == 1.0
    assert metrics["exact/matches_greedy"] == 1.0
    assert metrics["exact/mean_accepted_block_size"] == pytest.approx(11 / 6)  # blocks [2,2,2,2] and [2,1]
    assert runs["exact"].blocks == [[2, 2, 2, 2], [2, 1]]
    assert metrics["top2/mean_accepted_block_size"] > metrics["exact/mean_accepted_block_size"]
    assert metrics["top2/matches_greedy"] < 1.0  # runner-ups were accepted
    assert metrics["greedy/model_calls"] == 8 and metrics["exact/model_calls"] == 5
    assert metrics["greedy/speedup"] == 1.0
    assert metrics["exact/speedup"] == pytest.approx(metrics["greedy/seconds"] / metrics["exact/seconds"])
    # the block size is explained by each head's agreement with greedy's own output
    assert [metrics[f"greedy/head{i}_agreement"] for i in (1, 2, 3, 4)] == [1.0, 1.0, 0.0, 0.0]
    table = format_summary(metrics, ["greedy", "exact", "top2"], "acc").splitlines()
    assert table[0].startswith("(greedy = the baseline; block = tokens accepted per model call")
    assert table[3].split()[:3] == ["exact", "1.00", "1.83"]
    assert table[-1].endswith("h1=1.00 h2=1.00 h3=0.00 h4=0.00")


def test_invalid_callback_settings():
    with pytest.raises(ValueError, match="subset"):
        DecodeEval(subset=0)
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        DecodeEval(precision="fp16")
    assert DecodeEval(precision="bf16").precision == "bf16"


class RandomTask(StubTask):
    """The same hooks over a random float64 model (real distributions, so sampling has something to do)."""

    def decode_eval_batches(self, stage, limit, batch_size):
        src = random_sources(6, seed=1)
        return [EvalBatch(src, 10, [[]] * 6, ["src"] * 6, list(range(6)))]


def test_sampling_methods_run_against_ancestral_sampling_and_log_acceptance():
    model = random_model(k=4, seed=1)
    task = RandomTask(model)
    metrics, runs = run_decode_eval(task, task.decode_eval_batches("val", None, 6), ["sample_t0.7", "sample_t0"])
    assert list(runs) == ["greedy", "ancestral_t0.7_p1", "sample_t0.7", "sample_t0"]
    inner = [b for row in runs["sample_t0.7"].blocks for b in row[:-1]]  # each row's last block may be cut by EOS
    assert inner and metrics["sample_t0.7/acceptance_rate"] == pytest.approx(sum(b - 1 for b in inner) / (3 * len(inner)))
    assert metrics["sample_t0.7/speedup"] == pytest.approx(
        metrics["ancestral_t0.7_p1/seconds"] / metrics["sample_t0.7/seconds"])
    assert "sample_t0.7/matches_greedy" not in metrics
    assert metrics["sample_t0/matches_greedy"] == 1.0  # temperature 0 is greedy, timed against greedy
    assert metrics["sample_t0/speedup"] == pytest.approx(metrics["greedy/seconds"] / metrics["sample_t0/seconds"])


def test_unknown_method_is_rejected_before_decoding():
    task = RandomTask(random_model(k=2, seed=1))
    with pytest.raises(ValueError, match="draft"):
        run_decode_eval(task, task.decode_eval_batches("val", None, 6), ["draft:exact"])


def test_shards_of_two_ranks_give_the_single_process_metrics():
    from lightning_bpd.callbacks.decode_eval import decode_shard, summarize

    task = RandomTask(random_model(k=3, seed=4))
    batches = [EvalBatch(random_sources(2, seed=s), 10, [[]] * 2, ["src"] * 2, [2 * s, 2 * s + 1]) for s in range(5)]
    single, _ = run_decode_eval(task, batches, ["exact", "top2"])
    shards = [decode_shard(task, batches, ["exact", "top2"], rank=r, world_size=2) for r in range(2)]
    assert sorted(shards[0]) == [0, 2, 4] and sorted(shards[1]) == [1, 3]
    merged, _ = summarize(task, batches, ["exact", "top2"], shards)
    timing = ("seconds", "speedup", "tokens_per_second")
    assert {k: v for k, v in merged.items() if not k.endswith(timing)} == \
        {k: v for k, v in single.items() if not k.endswith(timing)}
    assert merged["examples"] == 10
    with pytest.raises(RuntimeError, match="decoded by two ranks"):
        summarize(task, batches, ["exact"], [shards[0], shards[0]])
    with pytest.raises(RuntimeError, match="no rank decoded batches"):
        summarize(task, batches, ["exact"], [shards[0]])


def test_a_screened_argmax_the_model_cannot_take_is_refused_at_setup():
    from types import SimpleNamespace

    from tests.nn.test_head_centres import image_model

    callback = DecodeEval(screened_argmax=True)
    with pytest.raises(ValueError, match="plain vocabulary projection"):
        callback.setup(None, SimpleNamespace(model=image_model("own", "chained", "gaussian")), "fit")
    model = random_model(k=2).float()
    before = {n: p.clone() for n, p in model.state_dict().items()}
    callback.setup(None, SimpleNamespace(model=model), "fit")  # a translation model: fine, and left as it was
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())


def test_int8_validation_decodes_are_refused_at_setup_off_the_cpu():
    from types import SimpleNamespace

    import torch

    callback = DecodeEval(precision="int8")
    model = SimpleNamespace(model=random_model(k=2).float())
    callback.setup(SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu"))), model, "fit")
    with pytest.raises(ValueError, match="int8 runs on the CPU"):
        callback.setup(SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0))), model, "fit")


def test_tree_budgets_decode_with_the_table_of_greedys_runs_on_every_shard():
    from lightning_bpd.callbacks.decode_eval import decode_shard, decode_trees, rank_agreement, summarize
    from lightning_bpd.decoding.trees.budget import measure_rank_agreement

    task = RandomTask(random_model(k=3, seed=4))
    batches = [EvalBatch(random_sources(2, seed=s), 10, [[]] * 2, ["src"] * 2, [2 * s, 2 * s + 1]) for s in range(3)]
    shards = [decode_shard(task, batches, ["exact"], rank=r, world_size=2) for r in range(2)]
    table = rank_agreement(shards)
    torch.testing.assert_close(table, measure_rank_agreement(task.model, batches))
    trees = DecodeEval(tree_nodes=[0, 6]).tree_methods(task, task.model, table, batches)
    assert list(trees) == ["exact+nodes0", "exact+nodes6"] and trees["exact+nodes6"].tree.size == 7
    shards = [decode_trees(batches, trees, shard, r, 2, task.model) for r, shard in enumerate(shards)]
    metrics, runs = summarize(task, batches, ["exact"], shards, extra=trees)
    assert list(runs) == ["greedy", "exact", "exact+nodes0", "exact+nodes6"]
    assert metrics["exact+nodes6/matches_greedy"] == 1.0 and metrics["exact+nodes0/matches_greedy"] == 1.0
    assert metrics["exact+nodes0/mean_accepted_block_size"] == metrics["exact/mean_accepted_block_size"]
    assert metrics["exact+nodes6/model_calls"] < metrics["greedy/model_calls"]
    for bad in ([-1], ["auto:0"], ["sometimes"], [True]):
        with pytest.raises(ValueError, match=r"tree_nodes must be integers >= 0 \(0 = the single path\), auto or"):
            DecodeEval(tree_nodes=bad)
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"^decode_eval.tree_nodes must lie in \[0, 8\] for a model with k=2 heads"):
        DecodeEval(tree_nodes=[4, 9]).setup(None, SimpleNamespace(model=random_model(k=2)), "fit")
    with pytest.raises(ValueError, match=r"^decode_eval.tree_nodes: this model verifies single paths only"):
        DecodeEval(tree_nodes=[4]).setup(None, SimpleNamespace(model=random_model(k=3, window=4)), "fit")


def test_an_auto_tree_budget_is_chosen_by_timing_and_rank_0s_choice_is_every_ranks():
    from lightning_bpd.callbacks.decode_eval import decode_shard, decode_trees, rank_agreement, summarize

    task = RandomTask(random_model(k=3, seed=4))
    batches = [EvalBatch(random_sources(2, seed=s), 10, [[]] * 2, ["src"] * 2, [2 * s, 2 * s + 1]) for s in range(2)]
    shard = decode_shard(task, batches, ["exact"])
    table = rank_agreement([shard])
    callback = DecodeEval(tree_nodes=["auto:6", 4])
    trees = callback.tree_methods(task, task.model, table, batches)
    assert list(trees) == ["exact+nodes-auto:6", "exact+nodes4"]
    choice = callback.tree_choices["exact+nodes-auto:6"]
    assert 0 <= choice.nodes <= 6 and set(choice.curve.widths) == {1, 2, 3, 4, 7}
    assert (trees["exact+nodes-auto:6"].tree is None) == (choice.nodes == 0)
    metrics, _ = summarize(task, batches, ["exact"], [decode_trees(batches, trees, shard, 0, 1, task.model)],
                           extra=trees)
    assert metrics["exact+nodes-auto:6/matches_greedy"] == metrics["exact+nodes4/matches_greedy"] == 1.0
    # under DDP rank 0's choice wins: a rank that timed otherwise decodes rank 0's tree
    forced = DecodeEval(tree_nodes=["auto:6"]).tree_methods(task, task.model, table, batches, lambda n: 5)
    assert forced["exact+nodes-auto:6"].tree.size == 6  # 5 nodes and the root
