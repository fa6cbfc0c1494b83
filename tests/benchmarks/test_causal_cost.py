import json

import pytest

pytest.importorskip("transformers")

from lightning_bpd.benchmarks.causal_cost import main


def test_generate_each_runtime_lean_and_not_and_the_base_itself_are_timed(tmp_path):
    out = tmp_path / "cost.json"
    report = main(["--shape", "tiny", "--k", "4", "--prompt", "6", "--precisions", "float32", "--repeats", "2",
                   "--generate-tokens", "2", "--decode-inputs", "1", "--decode-tokens", "3", "--note", "a test", "--json", str(out)])
    assert set(report["runtimes"]) == {"float32 lean", "float32 modules", "hf_own"}
    assert all(r["step_ms"] > 0 and r["verify_ms"] > 0 for r in report["runtimes"].values())
    saved = json.loads(out.read_text())
    assert saved["vocab"] == 300 and saved["threads"] == 1 and saved["note"] == "a test"
    assert saved["generate_ms_per_token"] > 0 and set(saved["decodes"]) == {"float32"}


def test_an_unknown_precision_is_one_line():
    with pytest.raises(SystemExit, match="causal_cost: unknown precision 'fp16'"):
        main(["--shape", "tiny", "--precisions", "fp16"])


def test_the_decodes_are_timed_by_part(tmp_path):
    report = main(["--shape", "tiny", "--k", "4", "--prompt", "6", "--precisions", "float32", "--repeats", "1",
                   "--generate-tokens", "1", "--decode-inputs", "2", "--decode-tokens", "3"])
    parts = report["decodes"]["float32"]
    assert parts["greedy"]["steps"] == 6 and parts["exact@k4"]["calls"]["decode_step"] >= 2
    assert set(parts["exact@k4"]["ceilings"]) >= {"measured", "and_one_token_pass"}
