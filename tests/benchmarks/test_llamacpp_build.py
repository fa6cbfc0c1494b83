"""``build-llamacpp`` (lightning_bpd/benchmarks/llamacpp_build.py) without building: bad input and missing tools are
one line, a built folder is left as it is (nothing runs), a failing CMake step names its error and the log, the
binaries are found in a build folder or a plain one."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from lightning_bpd.benchmarks import llamacpp_build
from lightning_bpd.benchmarks.llamacpp_build import CMAKE_FLAGS, LLAMA_CPP_PYTHON, STAMP, TARGETS, BuildError, binaries
from lightning_bpd.commands.cli import main


def error_line(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        main(["build-llamacpp", *argv])
    message = str(err.value.code)
    assert message.startswith("build-llamacpp: ") and "\n" not in message and "Traceback" not in message
    return message


def fake_build(folder: Path, targets=TARGETS, version: str = LLAMA_CPP_PYTHON) -> Path:
    """A folder that looks built: executables in build/bin and the stamp."""
    bin_dir = folder / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in targets:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    (folder / STAMP).write_text(json.dumps({"version": version, "targets": list(targets), "source": str(folder),
                                            "cmake_flags": list(CMAKE_FLAGS)}))
    return folder


def test_bad_input_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    assert "a file, not a folder" in error_line(["--out", str(tmp_path / "file")])
    assert "--jobs must be >= 1" in error_line(["--out", str(tmp_path / "b"), "--jobs", "0"])
    assert "a llama-cpp-python release" in error_line(["--out", str(tmp_path / "b"), "--version", "latest"])
    assert "no such file" in error_line(["--out", str(tmp_path / "b"), "--sdist", str(tmp_path / "none.tar.gz")])


def test_missing_tools_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_build.shutil, "which", lambda name: None)
    message = error_line(["--out", str(tmp_path / "b")])
    assert "cmake and c++ not found on the PATH" in message and "apt-get install cmake g++" in message


def test_a_built_folder_is_left_as_it_is(tmp_path, monkeypatch, capsys):
    folder = fake_build(tmp_path / "b")

    def refuse(*args, **kwargs):
        raise AssertionError("nothing should run")

    monkeypatch.setattr(subprocess, "run", refuse)
    main(["build-llamacpp", "--out", str(folder)])
    assert "nothing to do" in capsys.readouterr().err
    assert llamacpp_build.built(folder) and not llamacpp_build.built(folder, "0.3.1")
    assert not llamacpp_build.built(folder, targets=["llama-server"])  # another target: built incrementally


def test_a_failing_cmake_step_names_its_error_and_the_log(tmp_path):
    pytest.importorskip("shutil").which("cmake") or pytest.skip("no cmake")
    sdist = tmp_path / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        data = b'cmake_minimum_required(VERSION 3.14)\nmessage(FATAL_ERROR "no compiler here")\n'
        info = tarfile.TarInfo(f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    message = error_line(["--out", str(tmp_path / "b"), "--sdist", str(sdist), "--jobs", "1"])
    assert "cmake configure failed" in message and "no compiler here" in message
    assert str(tmp_path / "b" / "build.log") in message and not (tmp_path / "b" / STAMP).exists()


def test_binaries_are_found_in_a_build_folder_or_a_plain_one(tmp_path):
    folder = fake_build(tmp_path / "b")
    assert binaries(folder) == {name: folder / "build" / "bin" / name for name in TARGETS}
    assert binaries(folder / "build" / "bin") == binaries(folder)
    with pytest.raises(BuildError, match="no llama-tokenize .*build-llamacpp --out DIR"):
        (folder / "build" / "bin" / "llama-tokenize").unlink()
        binaries(folder)
    with pytest.raises(BuildError, match="not a folder"):
        binaries(tmp_path / "nowhere")
