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
