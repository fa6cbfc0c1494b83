"""notebooks/results.ipynb runs top to bottom on result files the test writes, and draws its plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from lightning_bpd.results import load, markdown_tables

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
    (folder / "notes.json").write_text(json.dumps({"something": "else"}))  # not a record: skipped
    from torchvision.utils import save_image

    save_image(torch.rand(6, 3, 32, 32), str(folder / "samples_val.png"), nrow=3)


def test_tables_come_from_the_records(tmp_path):
    write_results(tmp_path)
    records = load(tmp_path)
    assert sorted(r.kind for r in records) == ["bench", "decode", "decode"]
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
    assert len(images) == 4  # BLEU plot, speedup plot, PSNR plot, one sample grid
    text = "".join(o.get("text", "") for o in outputs)
    assert "3 records" in text and "1 sample grid(s)" in text
    assert any("toy bench" in o.get("data", {}).get("text/markdown", "") for o in outputs)


def test_readme_tables_are_generated_from_the_repository_results():
    from lightning_bpd.results import readme_block

    root = NOTEBOOK.parents[1]
    block = readme_block((root / "README.md").read_text())
    assert block == markdown_tables(load(root / "results")), \
        "README out of date: run `python -m lightning_bpd.results readme`"


def test_update_readme_rewrites_only_the_marked_block(tmp_path):
    from lightning_bpd.results import BEGIN, END, readme_block, update_readme

    write_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nintro\n\n{BEGIN}\n{END}\n\nafter\n")
    update_readme(readme, tmp_path / "results")
    update_readme(readme, tmp_path / "results")  # idempotent
    text = readme.read_text()
    assert text.startswith("# Title\n\nintro\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert readme_block(text) == markdown_tables(load(tmp_path / "results"))


def test_ablation_rows_from_records_filed_with_meta(tmp_path):
    from lightning_bpd.results import add, parse_meta

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
