"""Config files that build on other config files: a top-level ``_base_`` key.

``_base_: ../common/translation.yaml`` (or a list of files) names files, relative to the one that names them,
whose values are applied first; the file's own values then override them, and a later base overrides an
earlier one. Bases may have bases; a file reached twice is applied once, where it is first reached. So a recipe
holds only what differs from its base, e.g. the fine-tuned stage 2 is the frozen one with four other values::

    _base_: multi30k_k8_frozen.yaml
    model:
      init_args:
        freeze_base: false
        ...

The ``--config`` option of the CLI (:class:`ActionConfigWithBases`) applies the chain, so a file with bases is used
like any other. The ``config.yaml`` saved in a run folder is fully resolved and has no ``_base_``.
"""

from __future__ import annotations

from argparse import SUPPRESS
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace

BASE_KEY = "_base_"


def named_bases(path: Path) -> list[Path]:
    """The files ``path`` names in its ``_base_`` key (none without one), relative to its folder."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return []  # not ours to report: the config parser says what is wrong with the file
    names = data.get(BASE_KEY) if isinstance(data, dict) else None
    if names is None:
        return []
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{path}: {BASE_KEY} must be a file name or a list of file names, got {data[BASE_KEY]!r}")
    return [path.parent / name for name in names]


def base_files(path: str | Path, _chain: tuple[Path, ...] = ()) -> list[Path]:
    """Every file that ``path`` builds on, in the order they are applied (a base's bases before it), not ``path``.

    Raises:
        FileNotFoundError: a base that does not exist (the message names it and the file that names it).
        ValueError: a ``_base_`` that is not a file name or a list of them, or a cycle.
    """
    path = Path(path)
    chain = (*_chain, path.resolve())
    order: list[Path] = []
    for base in named_bases(path):
        if not base.is_file():
            raise FileNotFoundError(f"{path}: {BASE_KEY} {base} does not exist")
        if base.resolve() in chain:
            cycle = " -> ".join(str(p) for p in (*chain, base.resolve()))
            raise ValueError(f"{path}: {BASE_KEY} cycle {cycle}")
        for found in [*base_files(base, chain), base]:
            if all(found.resolve() != seen.resolve() for seen in order):
                order.append(found)
    return order


class ActionConfigWithBases(ActionConfigFile):
    """``--config FILE``: FILE's bases (:func:`base_files`), then FILE itself, each applied over the previous."""

    def __call__(self, parser: ArgumentParser, cfg: Namespace, values: Any, option_string: str | None = None) -> None:
        if isinstance(values, (str, Path)) and Path(values).is_file():  # not a YAML string given inline
            for base in base_files(values):
                self.apply_config(parser, cfg, self.dest, str(base))
        super().__call__(parser, cfg, values, option_string)


def add_config_arguments(parser: ArgumentParser) -> None:
    """``-c/--config`` with bases, and the ``_base_`` key as a hidden option (read by the action, never saved)."""
    parser.add_argument("-c", "--config", action=ActionConfigWithBases,
                        help="Path to a configuration file in json or yaml format (its _base_ files first).")
    parser.add_argument(f"--{BASE_KEY}", type=str | list[str] | None, default=None, help=SUPPRESS)
