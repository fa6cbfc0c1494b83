"""Where the slow tests find llama.cpp built by ``build-llamacpp``: ``$LIGHTNING_BPD_LLAMACPP_BUILD``, else
``.cache/llamacpp-build`` in the repository; they skip, saying how to build it, when it is not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_bpd.benchmarks.llamacpp_build import BuildError, binaries, source_dir

ENV = "LIGHTNING_BPD_LLAMACPP_BUILD"
DEFAULT = Path(__file__).resolve().parents[1] / ".cache" / "llamacpp-build"


def build_folder() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT)


def skip_reason() -> str:
    return (f"no llama.cpp build in {build_folder()}: run 'nice -n 19 python -m lightning_bpd build-llamacpp --out "
            f"{build_folder()} --jobs 2' (about 10 minutes) or point ${ENV} at a build folder")


def llamacpp_source() -> Path:
    """The vendored llama.cpp source of the build folder, or skip."""
    try:
        return source_dir(build_folder())
    except BuildError:
        pytest.skip(skip_reason())


def llamacpp_binaries() -> Path:
    """The build folder, skipped unless its binaries are there."""
    try:
        binaries(build_folder())
    except BuildError:
        pytest.skip(skip_reason())
    return build_folder()
