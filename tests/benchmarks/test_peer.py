import json

import pytest

pytest.importorskip("transformers")

from lightning_bpd.benchmarks.peer import main


def test_both_decoders_reach_the_forced_length_and_are_timed(tmp_path, one_thread):
    out = tmp_path / "peer.json"
    result = main(["--tokens", "6", "--inputs", "2", "--warmup", "1", "--d-model", "32", "--layers", "1",
                   "--heads", "2", "--d-ff", "64", "--vocab", "50", "--json", str(out)])
    assert json.loads(out.read_text())["peer_over_ours"] == pytest.approx(result["peer_over_ours"])
    assert result["lightning_bpd"]["ms_per_token_median"] > 0 and result["transformers"]["ms_per_token_median"] > 0


def test_ctranslate2_rows_beside_transformers(one_thread):
    ctranslate2 = pytest.importorskip("ctranslate2")
    args = ["--tokens", "5", "--inputs", "2", "--warmup", "1", "--batch", "2", "--d-model", "32", "--layers", "1",
            "--heads", "2", "--d-ff", "64", "--vocab", "50", "--device", "cpu"]
    result = main(args)
    assert result["ctranslate2_version"] == ctranslate2.__version__
    for name in ("ctranslate2_float32", "ctranslate2_int8", "transformers"):
        assert result[name]["ms_per_token_median"] > 0 and result[name]["over_ours"] > 0
    assert "ctranslate2_int8" not in main([*args, "--no-ctranslate2"])
