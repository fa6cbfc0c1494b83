"""Fixtures of the LM task's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random Llama checkpoint directory with its tokenizer (:func:`tests.tasks.lm.tiny_lm.write_checkpoint`)."""
    pytest.importorskip("transformers")
    from tests.tasks.lm.tiny_lm import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("lm") / "llama")
