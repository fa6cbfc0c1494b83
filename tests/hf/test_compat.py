"""The tested ``transformers`` range: one in ``pyproject.toml`` and ``lightning_bpd.hf.compat``, the installed version
inside it, one warning line outside it, and no deprecation warning from our calls into transformers."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import lightning_bpd.hf
from lightning_bpd.benchmarks.verify_cost import build, hf_own_step
from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.hf import compat
from lightning_bpd.hf.compat import TESTED, UntestedTransformersWarning, check_version, untested

pytestmark = pytest.mark.usefixtures("one_thread")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_pins_the_tested_range_and_the_installed_version_lies_in_it():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    pins = {req for extra in ("hf", "dev", "peers") for req in extras[extra] if req.startswith("transformers")}
    assert pins == {"transformers" + ",".join(TESTED)}
    assert compat.installed() == transformers.__version__
    assert untested(transformers.__version__) is None  # the HF tests run here: this version is a tested one


@pytest.mark.parametrize("version", ["5.40.0", "6.1.0", "5.23.1", "4.57.0"])
def test_a_version_outside_the_range_is_one_line_naming_the_range_and_the_way_out(version):
    message = untested(version)
    assert message is not None and "\n" not in message
    assert f"transformers{','.join(TESTED)}, not {version}" in message
    assert "pip install 'transformers" in message and "-W ignore::lightning_bpd.hf.compat.Untested" in message


def test_importing_lightning_bpd_hf_warns_once_outside_the_range(monkeypatch):
    monkeypatch.setattr(compat, "installed", lambda: "5.40.0")
    with pytest.warns(UntestedTransformersWarning, match="not 5.40.0") as record:
        importlib.reload(lightning_bpd.hf)
    assert len(record) == 1
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_version()  # the installed version: silent
        importlib.reload(lightning_bpd.hf)


def test_our_calls_into_transformers_raise_no_deprecation_warning():
    """The base's own cached step (``cache=``, not the deprecated ``past_key_values=``), our cached and uncached
    decoding through the HF layers, and the training forward, with every deprecation warning an error."""
    model = build("tiny", k=3)
    src = torch.randint(3, 1000, (2, 6))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*deprecat.*")
        warnings.filterwarnings("error", category=DeprecationWarning)
        warnings.filterwarnings("error", category=FutureWarning)
        one, block = hf_own_step(model, 3, prefix=4, src_len=5)
        one(), block()
        with torch.no_grad():
            greedy = greedy_decode(model, src, 6)
            assert blockwise_decode(model, src, Exact(), 6).sequences() == greedy.sequences()
            model(src, torch.full((2, 3), model.bos_id))
