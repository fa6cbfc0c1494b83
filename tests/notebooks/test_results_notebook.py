"""notebooks/results.ipynb runs top to bottom on result files the test writes, and draws its plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from lightning_bpd.commands.results import load, markdown_tables

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "results.ipynb"


def write_results(folder: Path) -> None:
    decode = {"label": "toy translation k=4", "command": "python -m lightning_bpd test ...", "stage": "test", "k": 4,
              "metrics": {"greedy/bleu": 30.0, "greedy/mean_accepted_block_size": 1.0, "greedy/speedup": 1.0,
                          "exact/bleu": 30.0, "exact/mean_accepted_block_size": 2.5, "exact/matches_greedy": 1.0,
                          "top2/bleu": 29.1, "top2/mean_accepted_block_size": 3.25, "examples": 10.0}}
    superres = {"label": "toy super-resolution k=4", "command": "python -m lightning_bpd test ...", "stage": "val",
                "k": 4, "metrics": {"greedy/psnr": 20.0, "greedy/mean_accepted_block_size": 1.0,
                                    "eps2/psnr": 19.5, "eps2/mean_accepted_block_size": 3.5, "examples": 4.0}}
    bench = {"label": "toy bench", "command": "python -m lightning_bpd bench ...", "k": 4, "threads": 2,
             "batch_sizes": {"1": {
                 "greedy": {"baseline": "greedy", "seconds_per_input_median": 0.1, "mean_accepted_block_size": 1.0,
                            "speedup": 1.0, "efficiency": 1.0},
                 "exact": {"baseline": "greedy", "seconds_per_input_median": 0.05, "mean_accepted_block_size": 2.5,
                           "speedup": 2.0, "efficiency": 0.8, "equals_greedy": True},
                 "sample_t1": {"baseline": "ancestral_t1_p1", "seconds_per_input_median": 0.06,
                               "mean_accepted_block_size": 2.0, "speedup": 1.5, "efficiency": 0.75,
                               "acceptance_rate": 0.333}}}}
    (folder / "mt").mkdir(parents=True)
    (folder / "mt/decode.json").write_text(json.dumps(decode))
    (folder / "sr.json").write_text(json.dumps(superres))
    (folder / "mt/bench.json").write_text(json.dumps(bench))
    cell = {"label": "toy Table 2 cell", "command": "python -m lightning_bpd validate ...", "stage": "val", "k": 4,
            "metrics": {"greedy/psnr": 20.0, "exact/psnr": 20.0, "exact/mean_accepted_block_size": 2.0,
                        "eps2/psnr": 19.9, "eps2/mean_accepted_block_size": 3.0, "examples": 4.0}}
    (folder / "superres").mkdir()
    (folder / "superres/table2c_k4_finetune.json").write_text(json.dumps(cell))
    (folder / "notes.json").write_text(json.dumps({"something": "else"}))  # not a record: skipped
    from torchvision.utils import save_image

    save_image(torch.rand(6, 3, 32, 32), str(folder / "samples_val.png"), nrow=3)


def test_tables_come_from_the_records(tmp_path):
    write_results(tmp_path)
    records = load(tmp_path)
    assert sorted(r.kind for r in records) == ["bench", "decode", "decode", "decode"]
    table = markdown_tables(records)
    assert "| toy translation k=4 | test | top2 | BLEU 29.10 | 3.25 |  |" in table
    assert "| toy bench | 1 | exact (vs greedy) | 0.0500 | 2.50 | 2.00 | 0.80 | yes |" in table
    assert "| toy bench | 1 | sample_t1 (vs ancestral_t1_p1) | 0.0600 | 2.00 | 1.50 | 0.75 | 0.333 |" in table
    assert "greedy (vs greedy)" not in table


def test_notebook_executes_and_draws(tmp_path, monkeypatch):
    write_results(tmp_path)
    monkeypatch.setenv("BPD_RESULTS", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # BLEU plot, speedup plot, PSNR plot, Table 2 bars, one sample grid
    text = "".join(o.get("text", "") for o in outputs)
    assert "4 records" in text and "1 sample grid(s)" in text
    assert any("toy bench" in o.get("data", {}).get("text/markdown", "") for o in outputs)


ROOT = NOTEBOOK.parents[1]


def test_readme_and_docs_are_generated_from_the_repository_results():
    from lightning_bpd.commands.results import GENERATED, readme_block

    records = load(ROOT / "results")
    stale = "out of date: run `python -m lightning_bpd results readme`"
    docs = (ROOT / "docs" / "results.md").read_text()
    assert readme_block(docs) == markdown_tables(records), f"docs/results.md {stale}"
    readme = (ROOT / "README.md").read_text()
    for name in ("default-run", "headline"):
        assert readme_block(readme, name) == GENERATED[name](records), f"README.md ({name}) {stale}"


def test_readme_is_short_and_has_ci_commands():
    """The README stays a five-minute read, and its set-up and test commands are the ones CI runs."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text()
    for line in ('python -m pip install torch==2.14.1 torchvision==0.29.1', 'python -m pip install -e ".[dev]"'):
        assert line in readme and line.replace("pip install", "pip install -q") in ci
    assert "\npython -m pytest -q\n" in readme and ci.rstrip().endswith("\npython -m pytest -q")


def test_relative_links_in_readme_and_docs_resolve():
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken


def test_update_readme_rewrites_only_the_marked_block(tmp_path):
    from lightning_bpd.commands.results import BEGIN, END, readme_block, update_readme

    write_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{BEGIN}\n{END}\n\nafter\n")
    update_readme(readme, tmp_path / "results")
    update_readme(readme, tmp_path / "results")  # idempotent
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert readme_block(text) == markdown_tables(load(tmp_path / "results"))


def test_ablation_rows_from_records_filed_with_meta(tmp_path):
    from lightning_bpd.commands.results import add, parse_meta

    run = tmp_path / "decode_test.json"
    run.write_text(json.dumps({"stage": "test", "k": 8, "metrics": {
        "greedy/bleu": 33.0, "greedy/mean_accepted_block_size": 1.0, "greedy/head1_agreement": 1.0,
        "greedy/head2_agreement": 0.71, "greedy/head3_agreement": 0.55,
        "exact/bleu": 33.0, "exact/mean_accepted_block_size": 2.61, "exact/matches_greedy": 1.0}}))
    meta = parse_meta(["k=8", "head=chained", "targets=self-distilled", "base=frozen", "steps=1500", "minutes=12.5",
                       "device=cpu"])
    assert meta["steps"] == 1500 and meta["minutes"] == 12.5 and meta["head"] == "chained"
    add(run, tmp_path / "results/a.json", "k=8 chained", "python -m lightning_bpd test ...", meta)
    add(run, tmp_path / "results/b.json", "plain record", "python -m lightning_bpd test ...")  # no meta: no row
    table = markdown_tables(load(tmp_path / "results"))
    assert "| 8 | chained | self-distilled | frozen | 33.00 | 2.61 | 0.71 0.55 | 1500 | 12.5 cpu |" in table
    assert table.count("| 8 | chained |") == 1
    with pytest.raises(ValueError, match="--meta takes key=value"):
        parse_meta(["steps"])


def test_headline_cells_come_from_records_and_missing_ones_print_a_dash(tmp_path):
    from lightning_bpd.commands.results import default_run_printout, headline_tables

    results = tmp_path / "results"
    cell = {"label": "k=8 paper gold frozen", "command": "python -m lightning_bpd test ...", "stage": "test", "k": 8,
            "meta": {"k": 8, "head": "paper", "targets": "gold", "base": "frozen"},
            "metrics": {"greedy/bleu": 30.0, "greedy/mean_accepted_block_size": 1.0, "exact/bleu": 30.0,
                        "exact/mean_accepted_block_size": 1.5, "examples": 10.0}}
    (results / "multi30k/acceptance").mkdir(parents=True)
    (results / "multi30k/acceptance/a.json").write_text(json.dumps(cell))
    newer = {**cell, "meta": {**cell["meta"], "recipe": "multi30k-paper-k8-gold"},
             "metrics": {**cell["metrics"], "exact/mean_accepted_block_size": 1.7}}
    (results / "multi30k/acceptance/0_recipe.json").write_text(json.dumps(newer))  # sorts first, wins by its recipe
    records = load(results)
    text = headline_tables(records)
    assert "| `paper` | 8 | 1.70 (30.00) | - | - | - |" in text
    assert "| `chained_attn` | 8 | - | - | - | - |" in text
    assert "| 1.76 | 1.91 | 3.01 | 4.69 |" in text  # the paper's own values
    assert "(missing)" in text and "no record in `results/` yet" in text
    assert default_run_printout(records).startswith("(no record")


def test_peer_rows_from_peer_and_bench_records(tmp_path):
    from lightning_bpd.commands.results import HEADLINE_BENCH, headline_tables, peer_rows

    peer = {"label": "peer toy", "command": "python -m lightning_bpd.benchmarks.peer", "batch": 1, "tokens": 40,
            "lightning_bpd": {"ms_per_token_median": 2.0}, "transformers": {"ms_per_token_median": 3.0},
            "peer_over_ours": 1.5}
    bench = {"label": "bench toy", "command": "python -m lightning_bpd bench --peers ctranslate2", "k": 4,
             "batch_sizes": {"1": {"greedy": {"baseline": "greedy", "seconds_per_input_median": 0.1,
                                              "mean_accepted_block_size": 1.0, "speedup": 1.0, "efficiency": 1.0,
                                              "ms_per_output_token": 2.5}}},
             "peers": {"ctranslate2_version": "x", "batch_sizes": {"1": {
                 "ctranslate2_int8": {"ms_per_output_token": 0.5, "tokens_per_second": 2000.0}}}}}
    (tmp_path / "peer.json").write_text(json.dumps(peer))
    headline = tmp_path / HEADLINE_BENCH  # the bench record whose peers the README shows
    headline.parent.mkdir(parents=True)
    headline.write_text(json.dumps(bench))
    records = load(tmp_path)
    assert sorted(r.kind for r in records) == ["bench", "peer"]
    rows = {(r["label"], r["system"]): r for r in peer_rows(records)}
    assert rows[("peer toy", "transformers")]["x_ours"] == 1.5
    assert rows[("bench toy", "ctranslate2_int8")]["x_ours"] == 0.2
    assert rows[("bench toy", "lightning_bpd")]["ms_per_token"] == 2.5
    table = markdown_tables(records)
    assert "| peer toy | 1 | transformers | 3.000 | 1.50 |" in table
    assert "| bench toy | 1 | ctranslate2_int8 | 0.500 | 0.20 |" in table
    front = headline_tables(records)
    assert "| 1 | ctranslate2_int8 | 0.500 | 0.20 |" in front and f"[{Path(HEADLINE_BENCH).name}]" in front
    assert "| 1 | lightning_bpd greedy (float32) | 2.500 | 1.00 |" in front  # the record's precision (none: float32)
    assert "peer toy" not in front  # the README shows the headline bench's peers; docs/results.md shows all


def test_table2_rows_and_lines_come_from_the_cell_records(tmp_path):
    from lightning_bpd.commands.results import headline_tables, table2_rows

    write_results(tmp_path)
    rows = table2_rows(load(tmp_path))
    assert [(r["heads"], r["k"]) for r in rows] == [("chained, own pixel, self-distilled (H100 base)", 4)]
    assert rows[0]["cells"] == [(None, None), (None, None), (2.0, 20.0), (3.0, 19.9)]
    assert rows[0]["paper_both"] == 3.75
    text = headline_tables(load(tmp_path))
    assert "| chained, own pixel, self-distilled (H100 base) | 4 | - | - | 2.00 (20.00) | 3.00 (19.90) | 3.75 |" in text


def test_table2_readout_rows_read_the_frozen_cells_and_the_readout_stage(tmp_path):
    from lightning_bpd.commands.results import table2_rows

    write_results(tmp_path)
    for name, exact, eps2 in [("frozen", 1.3, 3.6), ("readout", 1.4, 3.8)]:
        cell = {"label": f"toy {name} cell", "command": "python -m lightning_bpd validate ...", "stage": "val", "k": 8,
                "metrics": {"exact/psnr": 21.0, "exact/mean_accepted_block_size": exact, "eps2/psnr": 20.9,
                            "eps2/mean_accepted_block_size": eps2, "examples": 64.0}}
        (tmp_path / f"superres/table2n_k8_{name}.json").write_text(json.dumps(cell))
    rows = {r["heads"]: r for r in table2_rows(load(tmp_path)) if r["k"] == 8}
    readout = rows["chained, own pixel + pixel neighbours, self-distilled (CPU base), readout fine-tuned"]
    assert readout["cells"] == [(1.3, 21.0), (3.6, 20.9), (1.4, 21.0), (3.8, 20.9)]
    whole = rows["chained, own pixel + pixel neighbours, self-distilled (CPU base)"]  # no finetune record: frozen only
    assert whole["cells"] == [(1.3, 21.0), (3.6, 20.9), (None, None), (None, None)]
