"""Human evaluation of super-resolution: the rater folder written by ``export`` and the statistics of ``analyze``."""

from __future__ import annotations

import csv
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_bpd.commands import human_eval
from lightning_bpd.decoding import blockwise_decode, greedy_decode
from lightning_bpd.tasks.superres import SuperResolutionModule
from lightning_bpd.tasks.superres.pixels import image_to_tokens, tokens_to_image
from tests.task_modules import superres_module

SEED = 3
SHORT = 8 * 32 * 3  # tokens decoded in the export test: the top 8 pixel rows
METHODS = [("greedy", None, "greedy"), ("eps255_k2", 2, "eps255")]  # eps255 accepts every proposal


def tiny_module() -> SuperResolutionModule:
    torch.manual_seed(0)
    module = superres_module(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, window=16, k=2,
                             head_hidden=8).eval()
    with torch.no_grad():  # larger random weights, so that the heads disagree and the two methods differ
        for p in module.parameters():
            p.normal_(0.0, 1.0)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory, one_thread):
    """Export 2 pairs decoded to SHORT tokens (the rest of each image is black): (module, low inputs, folder)."""
    module = tiny_module()
    low = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = tmp_path_factory.mktemp("human_eval")
    assert human_eval.MAX_LEN == 32 * 32 * 3
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(human_eval, "MAX_LEN", SHORT)  # a quarter of the 3072 decoder calls, to keep the test fast
        human_eval.export([(name, module, k, c) for name, k, c in METHODS], low, out, seed=SEED)
    yield module, low, out


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_png(path: Path, scale: int) -> torch.Tensor:
    """A saved PNG downscaled back by ``scale`` (it was a nearest upscale, so every block is constant)."""
    big = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy())
    small = big[::scale, ::scale]
    assert torch.equal(small.repeat_interleave(scale, 0).repeat_interleave(scale, 1), big)
    return small


def test_folder_contents_and_sheet_without_method_names(exported):
    _, low, out = exported
    expected = {f"images/{i:04d}_{part}.png" for i in range(2) for part in ("input", "a", "b")}
    assert {str(p.relative_to(out)) for p in (out / "images").iterdir()} == expected
    assert {p.name for p in out.iterdir()} == {"images", "sheet.csv", "key.csv", "methods.json", "index.html"}
    for path in expected:
        assert Image.open(out / path).size == (128, 128)
    for i in range(2):
        assert torch.equal(load_png(out / f"images/{i:04d}_input.png", 16), low[i])
    sheet = read_rows(out / "sheet.csv")
    assert list(sheet[0]) == ["pair_id", "input_url", "left_url", "right_url"]
    assert sheet[1] == {"pair_id": "0001", "input_url": "images/0001_input.png", "left_url": "images/0001_a.png",
                        "right_url": "images/0001_b.png"}
    text = (out / "sheet.csv").read_text()
    assert not any(word in text for word in ("greedy", "eps", "method"))
    meta = json.loads((out / "methods.json").read_text())
    assert meta["method1"]["name"] == "greedy" and meta["method2"] == {
        "name": "eps255_k2", "criterion": "eps255", "k": 2, "model_class": "SuperResolutionModule"}
    assert meta["pairs"] == 2 and meta["seed"] == SEED


def test_key_matches_the_images_and_direct_decoding(exported):
    module, low, out = exported
    key = read_rows(out / "key.csv")
    assert [r["pair_id"] for r in key] == ["0000", "0001"]
    sides = human_eval.assign_sides(2, SEED)
    assert [r["left_method"] == "greedy" for r in key] == sides
    # each method decoded directly, without the human_eval code; the undecoded rest is padding (black)
    src = image_to_tokens(low)
    direct = {"greedy": greedy_decode(module.model, src, SHORT).tokens,
              "eps255": blockwise_decode(module.model, src, module.make_criterion("eps255"), SHORT, k=2).tokens}
    direct = {c: tokens_to_image(torch.cat([t, torch.zeros(2, 3072 - SHORT, dtype=t.dtype)], 1), 32, 32)
              for c, t in direct.items()}
    assert not torch.equal(direct["greedy"], direct["eps255"])  # the check below can tell the methods apart
    criterion = {name: c for name, _, c in METHODS}
    for i, row in enumerate(key):
        for part, column in (("a", "left_method"), ("b", "right_method")):
            image = load_png(out / f"images/{i:04d}_{part}.png", 4)
            assert torch.equal(image, direct[criterion[row[column]]][i])
        assert row["left_method"] != row["right_method"]


def test_index_html_is_self_contained(exported):
    _, _, out = exported
    html = (out / "index.html").read_text()
    for i in range(2):
        assert f'"{i:04d}"' in html
    for text in ("left is more realistic", "right is more realistic", "new Blob", "responses.csv", "pair_id,choice"):
        assert text in html
    assert "http://" not in html and "https://" not in html and "data:image/png;base64," in html


def test_export_then_analyze(exported, tmp_path):
    """Responses as index.html writes them, analyzed with the exported key (method 1 read from methods.json)."""
    _, _, out = exported
    responses = write(tmp_path / "responses.csv", "pair_id,choice\n0000,left\n0001,left\n")
    result = human_eval.analyze([responses], str(out / "key.csv"), bootstrap=100)
    assert result["method1"] == "greedy" and result["pairs_in_key"] == 2
    assert result["share_method1"] == sum(human_eval.assign_sides(2, SEED)) / 2


def test_sheet_goes_to_an_active_wandb_run(exported, monkeypatch):
    _, _, out = exported
    logged: dict = {}
    tables: list = []

    class Table:
        def __init__(self, columns):
            self.columns, self.rows = columns, []
            tables.append(self)

        def add_data(self, *row):
            self.rows.append(row)

    fake = types.SimpleNamespace(run=None, Table=Table, Image=lambda path: ("image", path), log=logged.update)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sheet = read_rows(out / "sheet.csv")
    assert not human_eval.log_to_wandb(out, sheet) and not logged
    fake.run = object()
    assert human_eval.log_to_wandb(out, sheet)
    assert logged["human_eval/sheet"] is tables[-1]
    assert tables[-1].columns == ["pair_id", "input", "left", "right"]
    assert tables[-1].rows[1] == ("0001", ("image", str(out / "images/0001_input.png")),
                                  ("image", str(out / "images/0001_a.png")), ("image", str(out / "images/0001_b.png")))


def test_side_assignment_is_seeded():
    a = human_eval.assign_sides(100, 0)
    assert a == human_eval.assign_sides(100, 0)
    assert a != human_eval.assign_sides(100, 1)
    assert 20 < sum(a) < 80


def test_parse_method():
    assert human_eval.parse_method("C:/runs/a.ckpt:8:EPS2") == ("C:/runs/a.ckpt", 8, "eps2")
    assert human_eval.parse_method("last.ckpt::greedy") == ("last.ckpt", None, "greedy")
    with pytest.raises(ValueError, match="K must be a positive integer"):
        human_eval.parse_method("last.ckpt:0:exact")
    with pytest.raises(ValueError, match="unknown criterion"):
        human_eval.parse_method("last.ckpt:2:nearest")


def test_export_command_line(tmp_path, monkeypatch):
    """The CLI wiring with a stub decoder (the decoding itself is tested above)."""
    import lightning_bpd.checkpoints

    module = tiny_module()
    monkeypatch.setattr(lightning_bpd.checkpoints, "load_model", lambda path, device: module)
    seen = []

    def fake_decode(m, spec, low, options=None):
        seen.append(options)
        return torch.full((low.shape[0], 32, 32, 3), spec[0] or 0, dtype=torch.uint8)

    monkeypatch.setattr(human_eval, "decode_method", fake_decode)
    human_eval.main(["export", "--method1", "a.ckpt::greedy", "--method2", "b.ckpt:2:top2", "--out", str(tmp_path),
                     "--n", "1", "--device", "cpu", "--precision", "fp32i"])
    assert [o.precision for o in seen] == ["float32-invariant"] * 2  # both methods decode in the asked precision
    meta = json.loads((tmp_path / "methods.json").read_text())
    assert meta["precision"] == "float32-invariant"
    assert meta["method1"]["name"] == "greedy" and meta["method1"]["checkpoint"] == "a.ckpt"
    assert meta["method2"]["name"] == "top2_k2" and meta["inputs"]["dataset"] == "synthetic_faces"
    assert len(read_rows(tmp_path / "key.csv")) == 1
    with pytest.raises(SystemExit, match="K must be"):
        human_eval.main(["export", "--method1", "a.ckpt:x:greedy", "--method2", "b.ckpt::exact", "--out", "o"])


# ---- analyze ----------------------------------------------------------------------------------------
KEY = "pair_id,left_method,right_method\n0000,A,B\n0001,B,A\n0002,A,B\n0003,B,A\n"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_analyze_share_and_interval(tmp_path, capsys):
    key = write(tmp_path / "key.csv", KEY)
    (tmp_path / "methods.json").write_text(json.dumps({"method1": {"name": "A"}, "method2": {"name": "B"}}))
    # A wins pairs 0, 1, 2 and loses pair 3; "3" is how a spreadsheet saves 0003
    r1 = write(tmp_path / "r1.csv", "pair_id,choice\n0000,left\n0001,right\n")
    r2 = write(tmp_path / "r2.csv", "pair_id,choice\n0002,Left\n3,left\n")
    out = tmp_path / "result.json"
    human_eval.main(["analyze", "--responses", r1, r2, "--key", key, "--bootstrap", "2000", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["method1"] == "A" and result["method2"] == "B"
    assert result["share_method1"] == 0.75 and result["responses"] == 4 and result["pairs"] == 4
    low, high = result["ci90"]
    assert 0.0 <= low <= 0.75 <= high <= 1.0 and low < high
    assert "0.750" in capsys.readouterr().out
    # --method1 overrides methods.json: the share of B
    assert human_eval.analyze([r1, r2], key, 500, method1="B")["share_method1"] == 0.25


def test_analyze_names_the_bad_rows(tmp_path):
    key = write(tmp_path / "key.csv", KEY)
    bad = write(tmp_path / "r.csv", "pair_id,choice\n0000,left\n9999,right\n0001,middle\n0002,right\n")
    with pytest.raises(SystemExit) as err:
        human_eval.main(["analyze", "--responses", bad, "--key", key, "--method1", "A"])
    message = str(err.value.code)
    assert message.startswith("human-eval analyze: 2 bad response row(s)")
    assert f"{bad} row 3: pair_id '9999' is not in the key" in message
    assert f"{bad} row 4: choice 'middle' is not left or right" in message
    assert "row 2" not in message and "row 5" not in message


def test_analyze_missing_files_and_columns(tmp_path):
    responses = write(tmp_path / "r.csv", "pair_id,choice\n0000,left\n")
    with pytest.raises(SystemExit, match=r"human-eval analyze: key file not found: .*nokey\.csv"):
        human_eval.main(["analyze", "--responses", responses, "--key", str(tmp_path / "nokey.csv")])
    key = write(tmp_path / "key.csv", KEY)
    with pytest.raises(SystemExit, match=r"responses file not found: .*missing\.csv"):
        human_eval.main(["analyze", "--responses", str(tmp_path / "missing.csv"), "--key", key, "--method1", "A"])
    with pytest.raises(SystemExit, match="cannot tell which method is method 1"):
        human_eval.main(["analyze", "--responses", responses, "--key", key])
    wrong = write(tmp_path / "w.csv", "id,vote\n0000,left\n")
    with pytest.raises(SystemExit, match="missing column"):
        human_eval.main(["analyze", "--responses", wrong, "--key", key, "--method1", "A"])


def test_analyze_json_refuses_its_inputs_and_a_folder(tmp_path):
    """--json the key, a responses file or a folder is one line, before anything is written; an earlier result is
    replaced."""
    key = write(tmp_path / "key.csv", KEY)
    responses = write(tmp_path / "r.csv", "pair_id,choice\n0000,left\n")
    base = ["analyze", "--responses", responses, "--key", key, "--method1", "A", "--bootstrap", "10"]
    for target, message in [(key, "is the --key file"), (responses, "is a --responses file"),
                            (str(tmp_path), "is a folder"), (str(tmp_path / "r.csv" / "out.json"), "lies under the file")]:
        with pytest.raises(SystemExit, match=f"human-eval analyze: --json .* {message}"):
            human_eval.main([*base, "--json", target])
    assert Path(key).read_text() == KEY and Path(responses).read_text() == "pair_id,choice\n0000,left\n"
    out = tmp_path / "result.json"
    human_eval.main([*base, "--json", str(out)])
    human_eval.main([*base, "--json", str(out)])  # an earlier result is replaced
    assert json.loads(out.read_text())["method1"] == "A"


def test_export_refuses_a_folder_holding_a_kit_and_a_file(tmp_path, monkeypatch):
    """export --out a folder that holds a rater kit (its key.csv) or a file is one line, before any decoding."""
    import lightning_bpd.checkpoints

    monkeypatch.setattr(lightning_bpd.checkpoints, "load_model", lambda path, device: pytest.fail("loaded"))
    kit = tmp_path / "he1"
    kit.mkdir()
    (kit / "key.csv").write_text(KEY)
    afile = tmp_path / "afile.txt"
    afile.write_text("keep\n")
    for out, message in [(kit, r"already holds a rater kit \(key.csv\), which export would rewrite: give a new --out"),
                         (afile, "is a file: give a new folder"), (afile / "kit", "lies under the file")]:
        with pytest.raises(SystemExit, match=f"human-eval export: --out .*{message}"):
            human_eval.main(["export", "--method1", "a.ckpt::greedy", "--method2", "b.ckpt:2:top2", "--out", str(out),
                             "--n", "1", "--device", "cpu"])
    assert (kit / "key.csv").read_text() == KEY and afile.read_text() == "keep\n"
