"""Progress lines of a fit whose output goes to a file (ProgressLines): one every N seconds and one at the end where no
progress bar shows on a terminal, with the step, steps/s, the training loss and the time left by max_steps or
max_time, whichever ends the run first; nothing under a progress bar on a terminal."""

from __future__ import annotations

import io
import re

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_bpd.callbacks.progress_lines import ProgressLines, progress_line, time_left

pytestmark = pytest.mark.usefixtures("one_thread")


class Tiny(pl.LightningModule):
    """One linear layer, a constant loss of its output's square."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)  # the same loss every step


def fit(callback: ProgressLines, **trainer: object) -> Tiny:
    module = Tiny()
    data = DataLoader(TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=2)
    options = {"accelerator": "cpu", "max_steps": 3, "logger": False, "enable_checkpointing": False,
               "enable_model_summary": False, "enable_progress_bar": False, "callbacks": [callback], **trainer}
    pl.Trainer(**options).fit(module, data)
    return module


def test_the_time_left_is_what_ends_the_run_first_and_the_line_says_which():
    assert time_left(20, 100, 2.0, None) == (40.0, "max_steps")
    assert time_left(20, 100, 2.0, 30.0) == (30.0, "max_time")
    assert time_left(20, None, 2.0, None) is None and time_left(20, 100, 0.0, None) is None
    line = progress_line(120, 5000, 0.5, 3.21449, (9370.0, "max_steps"))
    assert line == "train: step 120/5000, 0.5 steps/s, loss 3.2145, ETA 2:36:10 (max_steps)"
    assert progress_line(4, None, 2.0, None, None, elapsed=65.0) == "train: step 4, 2 steps/s, done in 0:01:05"
    with pytest.raises(ValueError, match="every must be >= 0"):
        ProgressLines(every=-1)


def test_a_fit_without_a_terminal_prints_a_line_per_interval_and_one_at_the_end(capsys):
    module = fit(ProgressLines(every=0))  # pytest's captured stdout is no TTY
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: ")]
    assert [line.split(",")[0] for line in lines] == ["train: step 1/3", "train: step 2/3", "train: step 3/3",
                                                      "train: step 3/3"]
    with torch.no_grad():  # the learning rate is 0: step 3's loss is its batch's (rows 4 and 5)
        loss = float(module.layer(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))[4:6]).pow(2).mean())
    assert f"loss {loss:.4f}," in lines[2]  # the mean over the interval's batches: step 3's alone
    assert re.search(r"steps/s, loss [0-9.]+, ETA 0:00:\d\d \(max_steps\)$", lines[0])
    assert re.search(r"^train: step 3/3, [0-9.e+]+ steps/s, done in 0:00:\d\d$", lines[-1])  # no batch since
    fit(ProgressLines())  # a line a minute: the end's alone
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: ")]
    assert len(lines) == 1 and re.search(r"^train: step 3/3, .* steps/s, loss [0-9.]+, done in", lines[0])


def test_max_time_ends_the_eta_when_it_comes_first(capsys):
    fit(ProgressLines(every=0), max_steps=10**6, max_epochs=1, max_time="00:00:10:00")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: step ")]
    assert lines[0].startswith("train: step 1/1000000,") and lines[0].endswith("(max_time)")
    assert re.search(r"ETA 0:(09:5\d|10:00) \(max_time\)$", lines[0])


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_printed_under_a_progress_bar_on_a_terminal(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    fit(ProgressLines(every=0), enable_progress_bar=True)
    assert "train: step" not in terminal.getvalue()
    monkeypatch.setattr("sys.stdout", terminal := Terminal())
    fit(ProgressLines(every=0))  # a terminal but no bar: the lines
    assert "train: step 3/3" in terminal.getvalue()
