"""``python -m lightning_bpd recipe``: the plan (--dry-run), skipping and resuming stages, budgets and overrides, the
one-line errors, a run with a fake stage command, the recipes' stage configs against the records they reproduce, and
a tiny real recipe (fit + test on the synthetic default) end to end."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from lightning_bpd.commands import recipe as rc
from lightning_bpd.commands.cli import CONF_DIR, REPO_ROOT, moved_option, to_plain
from tests.test_config_bases import differences
from tests.test_configs import parse


@pytest.fixture
def repo(monkeypatch):
    """Run from the repository root (conf/ paths print relative to it)."""
    monkeypatch.chdir(REPO_ROOT)


def dry_run(capsys, *args: str) -> list[str]:
    assert rc.main([*args, "--dry-run"]) == 0
    return capsys.readouterr().out.splitlines()


def commands(lines: list[str]) -> list[list[str]]:
    """The commands the plan prints (those to run and, commented, those skipped), as argument lists."""
    out = []
    for line in lines:
        text = line[4:] if line.startswith("#   python") else line
        if text.startswith("python -m lightning_bpd"):
            out.append(shlex.split(text)[3:])
    return out


def one_line_error(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        rc.main(argv)
    message = str(exc.value.code)
    assert message.startswith("recipe: ") and "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------------- the plan


def test_dry_run_prints_the_commands_in_order_and_writes_nothing(repo, capsys, tmp_path):
    runs = tmp_path / "runs"
    lines = dry_run(capsys, "multi30k-k8", "--runs", str(runs))
    cmds = commands(lines)
    out = f"{runs}/multi30k-k8"
    assert [c[0] for c in cmds] == ["fit", "distill", "fit", "fit", "test", "bench", "bench", "test", "bench"]
    # the base is exactly the command a user types for it (a base trained by hand with it is adopted)
    assert cmds[0] == ["fit", "--config", "conf/recipes/multi30k_k8/base.yaml", "--run_dir", f"{out}/base"]
    assert cmds[1] == ["distill", "--ckpt", f"{out}/base/last.ckpt", "--data-root", "../shared/data/translation/multi30k",
                       "--out", f"{out}/distill", "--beam", "1", "--batch-size", "250", "--shard-size", "5000"]
    assert cmds[2][:5] == ["fit", "--config", "conf/recipes/multi30k_k8/frozen.yaml", "--run_dir", f"{out}/frozen"]
    assert f"--model.init_args.training.init_from={out}/base/last.ckpt" in cmds[2]
    assert f"--data.init_args.root={out}/distill" in cmds[2]
    assert f"--model.init_args.training.init_from={out}/frozen/last.ckpt" in cmds[3]
    assert cmds[4] == ["test", "--config", f"{out}/finetune/config.yaml", "--ckpt_path", f"{out}/finetune/last.ckpt",
                       "--run_dir", f"{out}/test", "--decode_eval.batch_size=50", "--decode_eval.criteria=[exact]",
                       "--trainer.logger=false"]
    assert cmds[5][-2:] == ["--json", f"{out}/bench/bench.json"]
    assert cmds[6][-2:] == ["--json", f"{out}/bench_int8/bench.json"] and "int8" in cmds[6]
    assert f"1000:{out}/distill/train.de" in cmds[6]
    assert "--decode_eval.tree_nodes=[16,32,64]" in cmds[7] and cmds[8][cmds[8].index("--tree-nodes") + 1:][:4] == [
        "0", "8", "16", "auto"]
    assert sum("would run" in line for line in lines) == 9
    assert not runs.exists()


def test_the_paper_recipes_reuse_the_base_and_targets_of_multi30k_k8(repo, capsys, tmp_path):
    runs = tmp_path / "runs"
    cmds = commands(dry_run(capsys, "multi30k-paper-k8", "--runs", str(runs)))
    assert cmds[0][:5] == ["fit", "--config", "conf/recipes/multi30k_k8/base.yaml", "--run_dir", f"{runs}/multi30k-k8/base"]
    assert cmds[1][0] == "distill" and f"{runs}/multi30k-k8/distill" in cmds[1]
    assert f"--data.init_args.root={runs}/multi30k-k8/distill" in cmds[2]
    assert f"--run_dir={runs}/multi30k-paper-k8/frozen" in " ".join(cmds[2]).replace("--run_dir ", "--run_dir=")
    gold = commands(dry_run(capsys, "multi30k-paper-k8-gold", "--runs", str(runs)))
    assert [c[0] for c in gold] == ["fit", "fit", "test", "fit", "test"]
    assert not any("distill" in arg for c in gold for arg in c)  # gold targets: the data root of the stage config


def test_budget_scales_fit_stages_and_set_overrides_one_stage(repo, capsys, tmp_path):
    cmds = commands(dry_run(capsys, "multi30k-k8", "--runs", str(tmp_path), "--budget", "0.5",
                            "--set", "frozen.trainer.max_steps=300", "distill.batch-size=100"))
    base, distill, frozen, finetune = cmds[:4]
    assert base[-2:] == ["--trainer.max_time=00:00:25:00", "--trainer.max_steps=50000"]  # 50 minutes, 100k steps
    assert distill[-1] == "--batch-size=100" and not any("trainer" in a for a in distill)
    assert frozen[-2:] == ["--trainer.max_steps=500", "--trainer.max_steps=300"]  # --set comes last: it wins
    assert finetune[-1] == "--trainer.max_steps=500"  # max_time null in the stage config: steps only
    # a validation interval in steps scales with them: the finetune stage still validates at its last step
    assert "--trainer.val_check_interval=500" in finetune and "--trainer.val_check_interval=250" in frozen
    celeba = commands(dry_run(capsys, "celeba-table2", "--runs", str(tmp_path), "--budget", "0.1"))
    assert "--trainer.max_time=00:00:06:00" in celeba[0] and "--trainer.max_time=00:00:00:30" in celeba[1]
    assert not any(a.startswith("--trainer.max") for a in celeba[3])  # validate: no budget


def test_a_finished_stage_is_skipped_and_an_interrupted_fit_resumes(repo, capsys, tmp_path):
    runs = tmp_path / "runs"
    (runs / "multi30k-k8/base").mkdir(parents=True)
    (runs / "multi30k-k8/base/last.ckpt").write_text("")
    (runs / "multi30k-k8/base/stage_done.json").write_text(json.dumps({"seconds": 60}))
    (runs / "multi30k-k8/frozen").mkdir(parents=True)
    (runs / "multi30k-k8/frozen/last.ckpt").write_text("")
    lines = dry_run(capsys, "multi30k-k8", "--runs", str(runs))
    assert any("base: done" in line and "skipped" in line for line in lines)
    assert any(line.startswith("#   python -m lightning_bpd fit") for line in lines)  # printed, commented out
    frozen = commands(lines)[2]
    assert frozen[-2:] == ["--ckpt_path", f"{runs}/multi30k-k8/frozen/last.ckpt"]
    assert any(f"frozen: would run, resuming from {runs}/multi30k-k8/frozen/last.ckpt" in line for line in lines)
    # --from-stage: possible once the frozen stage's inputs (the base, the distilled data) exist
    (runs / "multi30k-k8/distill").mkdir()
    lines = dry_run(capsys, "multi30k-k8", "--runs", str(runs), "--from-stage", "frozen", "--until-stage", "frozen")
    assert sum("would run" in line for line in lines) == 1


def test_the_summary_reads_the_key_numbers_of_test_and_bench_records():
    record = json.loads((REPO_ROOT / "results/multi30k/acceptance/k8_chainedattn_self_finetune_test.json").read_text())
    assert rc.decode_summary(record) == "greedy BLEU 35.44; exact: block 3.83, BLEU 35.44"
    trees = {**record, "tree_nodes": [16], "metrics": {**record["metrics"], "exact+nodes16/mean_accepted_block_size": 4.5,
                                                       "exact+nodes16/bleu": 35.44}}
    assert rc.decode_summary(trees) == "greedy BLEU 35.44; exact: block 3.83, BLEU 35.44; exact+nodes16: block 4.50, BLEU 35.44"
    record = json.loads((REPO_ROOT / "results/superres/table2g_k8_frozen.json").read_text())
    assert rc.decode_summary(record) == "greedy PSNR 21.45; exact: block 1.04, PSNR 21.44; eps2: block 1.09, PSNR 21.43"
    bench = json.loads((REPO_ROOT / "results/speed/default_translation_bench_eager.json").read_text())
    text = rc.bench_summary(bench)
    assert text.startswith("speedup bs1: exact ") and "top2" in text and "bs32: exact " in text and "greedy" not in text


# ------------------------------------------------------------------------------------------------- errors


def test_errors_are_one_line(repo, tmp_path):
    runs = ["--runs", str(tmp_path / "runs")]
    assert "unknown recipe 'nope' (available: celeba-table2, celeba-table2-chained, celeba-table2-neighbours, code-lm, code-lm-mtp, multi30k-hf-marian, multi30k-k8," in one_line_error(["nope"])
    assert "has no stage 'bogus' (stages: base, distill, frozen" in one_line_error(
        ["multi30k-k8", *runs, "--set", "bogus.trainer.max_steps=1"])
    assert "expected <stage>.<option>=<value>" in one_line_error(["multi30k-k8", *runs, "--set", "frozen=1"])
    message = one_line_error(["multi30k-k8", *runs, "--from-stage", "frozen", "--dry-run"])
    assert f"stage frozen needs {tmp_path}/runs/multi30k-k8/base/last.ckpt (made by stage base)" in message
    assert "run stage base first" in message
    # the same without --dry-run: nothing runs, nothing is written
    one_line_error(["multi30k-k8", *runs, "--from-stage", "frozen"])
    assert not (tmp_path / "runs").exists()
    assert "--from-stage 'nowhere'" in one_line_error(["multi30k-k8", *runs, "--from-stage", "nowhere"])
    assert "--budget must be > 0" in one_line_error(["multi30k-k8", *runs, "--budget", "0"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages:\n  - name: a\n    command: fit\n    args: --x={nothing}\n")
    assert "unknown placeholder {nothing}" in one_line_error([str(bad)])
    bad.write_text("stages:\n  - {name: a, command: train}\n")
    assert "command must be one of fit, validate" in one_line_error([str(bad)])
    bad.write_text("stages:\n  - {reuse: bad/base}\n")
    assert "reuse cycle bad -> bad" in one_line_error([str(bad)])
    bad.write_text("stages:\n  - {reuse: multi30k-k8/base}\n")  # other recipes are looked for beside the file
    assert "unknown recipe 'multi30k-k8'" in one_line_error([str(bad)])
    (tmp_path / "other.yaml").write_text("stages:\n  - {name: base, command: fit}\n")
    bad.write_text("stages:\n  - {reuse: other/nothing}\n")
    assert "recipe other has no stage 'nothing' (its stages: base)" in one_line_error([str(bad)])


# ------------------------------------------------------------------------------------------------- running

FAKE = '''
import json, sys, time
from pathlib import Path
argv = sys.argv[1:]
command = argv[0]
opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
for i, a in enumerate(argv[:-1]):
    if a.startswith("--") and "=" not in a:
        opts[a] = argv[i + 1]
run_dir = Path(opts["--run_dir"])
run_dir.mkdir(parents=True, exist_ok=True)
with open(run_dir.parent.parent / "calls.txt", "a") as f:
    f.write(" ".join(argv) + "\\n")
print(f"fake {command} into {run_dir}", flush=True)
if command == "fit":
    (run_dir / "last.ckpt").write_text("weights")
    (run_dir / "config.yaml").write_text("run_dir: x")
    (run_dir / "decode_val_step4.json").write_text(json.dumps(
        {"criteria": ["exact"], "metrics": {"greedy/bleu": 20.0, "exact/bleu": 20.0,
                                             "exact/mean_accepted_block_size": 1.5}}))
if opts.get("--fail") == "1":
    print("failing on purpose", file=sys.stderr)
    sys.exit(3)
if command == "test":
    assert Path(opts["--ckpt_path"]).is_file()
    (run_dir / "decode_test.json").write_text(json.dumps(
        {"criteria": ["exact"], "metrics": {"greedy/bleu": 30.5, "exact/bleu": 30.5,
                                             "exact/mean_accepted_block_size": 2.75}}))
'''

TWO_STAGES = """description: a fit and a test
stages:
  - name: base
    command: fit
    config: tiny.yaml
  - name: test
    command: test
    args: --config {base}/config.yaml --ckpt_path {runs}/{recipe}/base/last.ckpt --run_dir {out} --trainer.logger=false
"""


def stand_in(tmp_path: Path, monkeypatch, script: str, files: dict[str, str]) -> Path:
    """``tmp_path`` as the working folder, holding ``files`` (name -> text), with every stage's command run as the
    stand-in ``script`` (no Lightning): the runner's own logic, fast."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "stand_in.py"
    path.write_text(script)
    monkeypatch.setattr(rc, "PYTHON_M", [sys.executable, str(path)])
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A recipe of two stages whose command is a stub script."""
    return stand_in(tmp_path, monkeypatch, FAKE, {"tiny.yaml": "trainer:\n  max_steps: 8\n", "two.yaml": TWO_STAGES})


def calls(root: Path) -> list[str]:
    path = root / "runs" / "calls.txt"
    return path.read_text().splitlines() if path.is_file() else []


def test_run_writes_markers_logs_and_summary_then_skips_finished_stages(fake, capsys):
    assert rc.main(["two.yaml", "--budget", "0.5"]) == 0
    out = capsys.readouterr().out
    assert [c.split()[0] for c in calls(fake)] == ["fit", "test"]
    assert "--trainer.max_steps=4" in calls(fake)[0]
    for stage in ("base", "test"):
        marker = json.loads((fake / f"runs/two/{stage}/stage_done.json").read_text())
        assert marker["argv"][0] == ("fit" if stage == "base" else "test")
        assert marker["command"].startswith(f"python -m lightning_bpd {marker['argv'][0]} ")
        assert {"started", "ended", "seconds", "cpu_seconds"} <= set(marker)
        assert f"fake {marker['argv'][0]}" in (fake / f"runs/two/{stage}/stage.log").read_text()
        assert not (fake / f"runs/two/{stage}/stage_running.json").exists()
    assert json.loads((fake / "runs/two/base/stage_done.json").read_text())["last_ckpt"] == "runs/two/base/last.ckpt"
    assert "fake fit into runs/two/base" in out  # the stage's output is tee'd to ours
    table = out[out.index("recipe two (runs/two):"):].splitlines()
    assert table[1].split() == ["stage", "status", "minutes", "cpu-min", "metrics"]
    assert table[2].split()[:2] == ["base", "ran"] and "val@4: greedy BLEU 20.00" in table[2]
    assert table[3].split()[:2] == ["test", "ran"] and "greedy BLEU 30.50; exact: block 2.75, BLEU 30.50" in table[3]
    summary = json.loads((fake / "runs/two/summary.json").read_text())
    assert [(r["stage"], r["status"]) for r in summary["rows"]] == [("base", "ran"), ("test", "ran")]
    assert summary["rows"][1]["metrics"]["exact/mean_accepted_block_size"] == 2.75

    assert rc.main(["two.yaml"]) == 0  # everything done: nothing runs
    out = capsys.readouterr().out
    assert len(calls(fake)) == 2
    table = out[out.index("recipe two (runs/two):"):].splitlines()
    assert [line.split()[:2] for line in table[1:4]] == [["stage", "status"], ["base", "done"], ["test", "done"]]
    assert "exact: block 2.75" in out


def test_a_failed_stage_has_no_marker_and_the_next_run_resumes_it(fake, capsys):
    with pytest.raises(SystemExit) as exc:
        rc.main(["two.yaml", "--set", "base.fail=1"])
    assert exc.value.code == 1
    captured = capsys.readouterr()
    assert "recipe: stage base failed (exit 3)" in captured.err and "runs/two/base/stage.log" in captured.err
    assert "failing on purpose" in (fake / "runs/two/base/stage.log").read_text()
    assert not (fake / "runs/two/base/stage_done.json").exists()
    assert [line.split()[:2] for line in captured.out.splitlines() if line.startswith(("base ", "test "))] == [
        ["base", "failed"], ["test", "not"]]
    assert rc.main(["two.yaml"]) == 0  # the fit left a last.ckpt: the next run resumes from it
    fit_calls = [c for c in calls(fake) if c.startswith("fit")]
    assert fit_calls[-1].endswith("--ckpt_path runs/two/base/last.ckpt")
    marker = json.loads((fake / "runs/two/base/stage_done.json").read_text())
    assert marker["resumed_from"] == "runs/two/base/last.ckpt" and "--ckpt_path" not in marker["argv"]
    assert len((fake / "runs/two/base/stage_attempts.jsonl").read_text().splitlines()) == 2


def test_a_stage_whose_input_vanished_is_one_line(fake, capsys):
    assert rc.main(["two.yaml", "--until-stage", "base"]) == 0
    (fake / "runs/two/base/last.ckpt").unlink()
    message = one_line_error(["two.yaml"])
    assert "stage test needs runs/two/base/last.ckpt (made by stage base)" in message
    assert "stage base is marked done: delete runs/two/base/stage_done.json" in message


# Two stages that can only both finish when they run at the same time: each says it started, then waits for the
# other's word (a stage run after the other would wait in vain and fail)
RENDEZVOUS = r"""
import os, sys, time
from pathlib import Path
argv = sys.argv[1:]
out = Path(argv[argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
(out.parent / f"{out.name}.started").write_text(os.environ.get("OMP_NUM_THREADS", "unset"))
other = out.parent / (argv[argv.index("--other") + 1] + ".started")
for _ in range(400):
    if other.exists():
        break
    time.sleep(0.05)
else:
    print("the other stage never started", flush=True)
    sys.exit(4)
print(f"{out.name}: first line\rprogress 50%\rprogress 100%", flush=True)
if any(a.startswith("--fail") for a in argv):
    sys.exit(3)
time.sleep(0.3)
print(f"{out.name}: done", flush=True)
"""

BESIDE = """description: two stages side by side, then one after them
stages:
  - name: a
    command: store
    args: --out {out} --other b
  - name: b
    command: store
    beside: a
    args: --out {out} --other a
  - name: c
    command: store
    args: --out {out} --other a
"""


@pytest.fixture
def rendezvous(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return stand_in(tmp_path, monkeypatch, RENDEZVOUS, {"beside.yaml": BESIDE})


def test_stages_beside_each_other_run_at_the_same_time_on_a_share_of_the_cores(rendezvous, capsys, monkeypatch):
    monkeypatch.setattr(rc.os, "cpu_count", lambda: 2)
    assert rc.main(["beside.yaml"]) == 0
    out = capsys.readouterr().out
    runs = rendezvous / "runs" / "beside"
    assert all((runs / f"{stage}/stage_done.json").is_file() for stage in "abc")
    assert (runs / "a.started").read_text() == (runs / "b.started").read_text() == "1"  # 2 cores, 2 stages
    assert (runs / "c.started").read_text() == "unset"  # alone: the cores are its own
    lines = out.splitlines()
    for stage in "ab":  # line by line after the stage's name; a progress bar's \r ends a line
        assert f"[{stage}] {stage}: first line" in lines and f"[{stage}] progress 100%" in lines
        assert f"[{stage}] {stage}: done" in lines
        assert f"{stage}: first line\rprogress 50%".encode() in (runs / stage / "stage.log").read_bytes()  # as written
    assert "c: first line" in out and "[c]" not in out


def test_one_failing_beside_another_lets_it_finish(rendezvous, capsys):
    with pytest.raises(SystemExit) as exc:
        rc.main(["beside.yaml", "--set", "b.fail=1"])  # b's stand-in fails once both have started
    assert exc.value.code == 1
    captured = capsys.readouterr()
    runs = rendezvous / "runs" / "beside"
    assert (runs / "a/stage_done.json").is_file() and not (runs / "b/stage_done.json").exists()
    assert not (runs / "c").exists()  # nothing after the failed group
    assert "recipe: stage b failed (exit 3)" in captured.err
    assert [line.split()[:2] for line in captured.out.splitlines() if line.startswith(("a ", "b ", "c "))] == [
        ["a", "ran"], ["b", "failed"], ["c", "not"]]


def test_beside_is_checked_when_the_recipe_loads(tmp_path, capsys):
    for text, match in (
            (BESIDE.replace("beside: a", "beside: c"), r"stage 2 .b.: beside 'c': a stage runs beside the stage just before"),
            (BESIDE.replace("--out {out} --other a\n  - name: c", "--out {out} --other {a}\n  - name: c"),
             "stage b reads the folder of stage a, which it runs beside"),
            (BESIDE.replace("  - name: a\n", "  - name: a\n    beside: z\n", 1), "stage 1 .a.: beside 'z': .*.no stage.")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(rc.RecipeError, match=match):
            rc.load_recipe(str(tmp_path / "bad.yaml"))
    (tmp_path / "ok.yaml").write_text(BESIDE)
    assert [s.beside for s in rc.load_recipe(str(tmp_path / "ok.yaml")).stages] == [None, "a", None]
    assert rc.main([str(tmp_path / "ok.yaml"), "--dry-run", "--runs", str(tmp_path / "runs")]) == 0
    assert "# [2/3] b (beside a): would run" in capsys.readouterr().out


# A stage that prints --lines lines, then sleeps --sleep seconds
SLEEPER = r"""
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C stops it even where the test's SIGINT is ignored
argv = sys.argv[1:]
opt = {a.split("=")[0]: a.split("=")[1] for a in argv if "=" in a}
Path(argv[argv.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
for i in range(int(opt.get("--lines", "1"))):
    print(f"line {i} " + "x" * 60)
sys.stdout.flush()
time.sleep(float(opt.get("--sleep", "0")))
print("done", flush=True)
"""

SLOW_BESIDE_QUICK = """description: a slow stage and a quick one beside it
stages:
  - name: a
    command: store
    args: --out {out} --sleep=30
  - name: b
    command: store
    beside: a
    args: --out {out} --sleep=0.2
"""


@pytest.fixture
def sleeper(tmp_path, monkeypatch):
    return stand_in(tmp_path, monkeypatch, SLEEPER, {"r.yaml": SLOW_BESIDE_QUICK})


def test_an_interrupt_keeps_what_a_stage_beside_finished_and_each_stage_its_own_time(sleeper, capsys):
    import os
    import signal
    import threading

    done = sleeper / "runs/r/b/stage_done.json"

    def interrupt_once_b_is_done() -> None:
        for _ in range(400):
            if done.is_file():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # the recipe's handler: as Ctrl-C

    threading.Thread(target=interrupt_once_b_is_done, daemon=True).start()
    with pytest.raises(SystemExit) as exc:
        rc.main(["r.yaml"])
    assert exc.value.code == 130
    marker = json.loads(done.read_text())
    assert marker["seconds"] < 10  # its own time, not the slow stage's
    assert not (sleeper / "runs/r/a/stage_done.json").exists()
    stopped = [json.loads(line) for line in (sleeper / "runs/r/a/stage_attempts.jsonl").read_text().splitlines()]
    assert len(stopped) == 1 and stopped[0]["returncode"] != 0  # stopped and reaped before the recipe returned
    rows = json.loads((sleeper / "runs/r/summary.json").read_text())["rows"]
    assert [(r["stage"], r["status"]) for r in rows] == [("a", "interrupted"), ("b", "ran")]
    assert "stages beside others overlap" in capsys.readouterr().out


def test_a_closed_stdout_never_blocks_stages_beside_each_other(sleeper, monkeypatch):
    class Closed:
        def write(self, data: bytes) -> None:
            raise BrokenPipeError

        def flush(self) -> None:
            raise BrokenPipeError

    monkeypatch.setattr(rc, "out_stream", lambda: Closed())
    (sleeper / "r.yaml").write_text(SLOW_BESIDE_QUICK.replace("--sleep=30", "--lines=3000").replace(
        "--sleep=0.2", "--lines=3000"))
    assert rc.main(["r.yaml"]) == 0  # a child blocked on a full pipe would hang here
    for stage in "ab":
        assert (sleeper / f"runs/r/{stage}/stage.log").read_text().count("line ") == 3000


def test_beside_stages_that_cannot_start_or_read_each_other_are_one_line(sleeper):
    (sleeper / "r.yaml").write_text(SLOW_BESIDE_QUICK.replace("--sleep=30", "--sleep=0"))
    (sleeper / "runs/r").mkdir(parents=True)
    (sleeper / "runs/r/b").write_text("a file where the stage's folder goes")
    message = one_line_error(["r.yaml"])
    assert message.startswith("recipe: stage b: cannot make its folder runs/r/b")
    assert not (sleeper / "runs/r/a/stage_done.json").exists()  # nothing of the group started
    message = one_line_error(["r.yaml", "--set", "b.init={runs}/r/a/model.ckpt", "--dry-run"])
    assert message == ("recipe: stage b reads runs/r/a/model.ckpt, made by stage a, which it runs beside: it cannot "
                       "wait for it")


# ------------------------------------------------------------------------------------------------- stage configs


def fit_args(command: str) -> list[str]:
    """The options of the fit in a record's command line, without its run folder; a model option of the flat layout
    it was written in is named as it is now (``--model.init_args.k`` is ``--model.init_args.architecture.k``)."""
    for part in command.replace("&&", ";").split(";"):
        words = shlex.split(part)
        if "fit" in words:
            args = words[words.index("fit") + 1:]
            i = args.index("--run_dir")
            return [grouped(arg) for arg in args[:i] + args[i + 2:]]
    raise AssertionError(f"no fit in {command}")


def grouped(arg: str) -> str:
    """A ``--model.init_args.<option>=value`` of the flat layout with the option's key of now."""
    prefix = "--model.init_args."
    name, _, value = arg.removeprefix(prefix).partition("=")
    moved = moved_option(name) if arg.startswith(prefix) else None
    return f"{prefix}{moved}={value}" if moved else arg


def resolved_args(*args: str) -> dict:
    values = to_plain(parse(*args).config)
    for key in ("config", "_base_", "run_dir"):
        values.pop(key, None)
    return values


@pytest.mark.parametrize("stage_config, record, allowed", [
    ("multi30k_k8/base.yaml", "multi30k/acceptance/base_k1_test.json", set()),
    ("multi30k_k8/frozen.yaml", "multi30k/acceptance/k8_chainedattn_self_frozen_test.json",
     {"model.init_args.training.init_from", "data.init_args.root"}),
    ("multi30k_k8/finetune.yaml", "multi30k/acceptance/k8_chainedattn_self_finetune_test.json",
     {"model.init_args.training.init_from", "data.init_args.root"}),
    ("multi30k_paper_k8/frozen.yaml", "multi30k/acceptance/k8_paper_self_frozen_test.json",
     {"model.init_args.training.init_from", "data.init_args.root"}),
    ("multi30k_paper_k8_gold/frozen.yaml", "multi30k/acceptance/k8_paper_gold_frozen_test.json",
     {"model.init_args.training.init_from"}),
    ("celeba_table2/base.yaml", "superres/i14_gaussian_base_60min_val64.json", {"trainer.logger"}),
    ("celeba_table2/frozen.yaml", "superres/table2g_k8_frozen.json", {"model.init_args.training.init_from"}),
    ("celeba_table2/finetune.yaml", "superres/table2g_k8_finetune.json", {"model.init_args.training.init_from"}),
])
def test_stage_configs_are_the_recorded_commands(repo, stage_config, record, allowed):
    """Each stage config resolves to the values of the fit that made its record, up to the paths of the runs."""
    command = json.loads((REPO_ROOT / "results" / record).read_text())["command"]
    ours = resolved_args("--config", str(CONF_DIR / "recipes" / stage_config))
    theirs = resolved_args(*fit_args(command))
    assert differences(ours, theirs) == allowed


def test_paper_finetune_stages_are_the_chained_joint_schedule_with_the_paper_head(repo):
    chained = resolved_args("--config", str(CONF_DIR / "recipes/multi30k_k8/finetune.yaml"))
    for name in ("multi30k_paper_k8", "multi30k_paper_k8_gold"):
        paper = resolved_args("--config", str(CONF_DIR / f"recipes/{name}/finetune.yaml"))
        expected = {"model.init_args.training.init_from", "model.init_args.architecture.head_type", "model.init_args.architecture.head_hidden"}
        if name.endswith("gold"):
            expected.add("data.init_args.root")
        assert differences(chained, paper) == expected
        assert paper["model"]["init_args"]["architecture"]["head_type"] == "paper"


# ------------------------------------------------------------------------------------------------- end to end

TINY_CONFIG = f"""_base_: {CONF_DIR / "translation/default.yaml"}
trainer:
  max_steps: 4
  val_check_interval: 4
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
decode_eval:
  criteria: [exact]
  subset: 4
  num_samples: 0
model:
  init_args:
    architecture: {{d_model: 32, n_heads: 2, d_ff: 64, n_encoder_layers: 1, n_decoder_layers: 1, head_hidden: 16}}
    training: {{warmup_steps: 2}}
data:
  init_args:
    vocab_size: 120
    max_tokens: 600
    synthetic_sizes: {{train: 200, val: 8, test: 8}}
"""


def test_a_tiny_recipe_runs_fit_then_test_for_real(tmp_path, monkeypatch, capsys):
    """Two real stages (python -m lightning_bpd fit, then test) on the synthetic default: markers and summary."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    (tmp_path / "two.yaml").write_text(TWO_STAGES)
    start = time.perf_counter()
    assert rc.main(["two.yaml"]) == 0
    out = capsys.readouterr().out
    base = json.loads((tmp_path / "runs/two/base/stage_done.json").read_text())
    assert base["last_ckpt"] == "runs/two/base/last.ckpt" and Path(base["last_ckpt"]).is_file()
    test = json.loads((tmp_path / "runs/two/test/stage_done.json").read_text())
    assert test["metrics"]["examples"] == 8 and "exact/mean_accepted_block_size" in test["metrics"]
    assert (tmp_path / "runs/two/test/decode_test.json").is_file()
    rows = json.loads((tmp_path / "runs/two/summary.json").read_text())["rows"]
    assert [(r["stage"], r["status"]) for r in rows] == [("base", "ran"), ("test", "ran")]
    assert "greedy BLEU" in rows[1]["summary"] and "exact: block" in rows[1]["summary"]
    assert [line.split()[:2] for line in out.splitlines() if line.startswith(("base ", "test "))][-2:] == [
        ["base", "ran"], ["test", "ran"]]
    print(f"tiny recipe: {time.perf_counter() - start:.1f} s")
