"""llama.cpp built from the source that llama-cpp-python vendors (pinned :data:`LLAMA_CPP_PYTHON`): the binaries that
serve our DFlash drafter on a CPU (``build-llamacpp``) and where a build folder keeps them.

A build folder ``DIR`` holds the sdist (``pip download``), its extracted source (``DIR/src/...``: ``vendor/llama.cpp``
with its ``convert_hf_to_gguf.py``), the CMake build (``DIR/build``, binaries in ``DIR/build/bin``), the build's
output (``DIR/build.log``) and :data:`STAMP`, written last: what was built, from which source, with which flags. A
folder whose stamp names the same version and flags and whose binaries are there is built: :func:`build` does
nothing more (a target not yet built is added by an incremental build).

CMake: Release, static libraries, ``GGML_NATIVE`` (tuned to this CPU), CPU only, no network code (no OpenSSL; the
pinned source has no libcurl option any more), no tests, server or web UI; the targets :data:`TARGETS`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CMAKE_FLAGS", "LLAMA_CPP_PYTHON", "STAMP", "TARGETS", "BuildError", "binaries", "build", "built",
           "source_dir"]

LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python release whose vendored llama.cpp is built
TARGETS = ("llama-speculative-simple", "llama-tokenize", "llama-lookup", "llama-bench")  # the drafted and alone runs;
# the tokenization check; drafting from a retrieval datastore's lookup cache; a pass's cost
STAMP = "build_llamacpp.json"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF")
BUILD_HINT = "python -m lightning_bpd build-llamacpp --out DIR"


class BuildError(ValueError):
    """A build that cannot start or failed: one line saying what to fix."""


def read_stamp(folder: str | os.PathLike) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / STAMP).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def source_dir(folder: str | os.PathLike) -> Path:
    """The vendored ``llama.cpp`` source of a build folder (BuildError when there is none)."""
    stamp = read_stamp(folder)
    if stamp is None or not Path(stamp.get("source", "")).is_dir():
        raise BuildError(f"{folder}: no llama.cpp build here ({STAMP} missing or its source gone): {BUILD_HINT}")
    return Path(stamp["source"])


def binaries(folder: str | os.PathLike, names: Sequence[str] = TARGETS) -> dict[str, Path]:
    """name -> path of the binaries ``names`` of a build folder (``DIR`` of ``build-llamacpp``) or of a folder that
    holds them directly; BuildError (one line) naming what is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BuildError(f"{folder}: not a folder (a build-llamacpp folder is expected: {BUILD_HINT})")
    found = {}
    for name in names:
        for where in (folder / "build" / "bin", folder / "bin", folder):
            if (where / name).is_file() and os.access(where / name, os.X_OK):
                found[name] = where / name
                break
    missing = [name for name in names if name not in found]
    if missing:
        raise BuildError(f"{folder}: no {', '.join(missing)} (build them: {BUILD_HINT})")
    return found


def built(folder: str | os.PathLike, version: str = LLAMA_CPP_PYTHON, targets: Sequence[str] = TARGETS) -> bool:
    """Whether ``folder`` already holds ``targets`` built from ``version`` with :data:`CMAKE_FLAGS`."""
    stamp = read_stamp(folder)
    if stamp is None or stamp.get("version") != version or list(stamp.get("cmake_flags", [])) != list(CMAKE_FLAGS):
        return False
    try:
        binaries(folder, targets)
    except BuildError:
        return False
    return set(targets) <= set(stamp.get("targets", []))


def check_tools() -> dict[str, str]:
    """cmake and a C++ compiler on the PATH (their paths), else BuildError."""
    tools = {"cmake": shutil.which("cmake"), "c++": shutil.which(os.environ.get("CXX", "c++"))}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise BuildError(f"{' and '.join(missing)} not found on the PATH: install them (e.g. apt-get install cmake "
                         "g++) and run build-llamacpp again")
    return {name: str(path) for name, path in tools.items()}


def last_error(log: Path) -> str:
    """The last line of ``log`` that reports an error (CMake's with the message line under it), else its last line,
    trimmed."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    errors = [i for i, line in enumerate(lines) if re.search(r"\berror\b|Error|FAILED", line)]
    if not errors:
        return (lines or ["(empty log)"])[-1][:300]
    i = errors[-1]
    if lines[i].startswith("CMake Error") and i + 1 < len(lines):
        return f"{lines[i]} {lines[i + 1]}"[:300]
    return lines[i][:300]


def run_logged(cmd: Sequence[str], log: Path, what: str, cwd: Path | None = None) -> None:
    """Run ``cmd`` with its output appended to ``log``; BuildError with the log's last error when it fails."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, check=False)
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}): {last_error(log)} (full output: {log})")


def fetch_source(folder: Path, version: str, sdist: str | os.PathLike | None, log: Path) -> Path:
    """The extracted llama.cpp source of llama-cpp-python ``version`` (its sdist ``sdist``, else pip-downloaded into
    ``folder``)."""
    name = f"llama_cpp_python-{version}"
    source = folder / "src" / name / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    if sdist is None:
        archive = folder / f"{name}.tar.gz"
        if not archive.is_file():
            run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", str(folder)], log,
                       f"pip download of llama-cpp-python=={version}")
    else:
        archive = Path(sdist)
        if not archive.is_file():
            raise BuildError(f"--sdist {archive}: no such file (the llama-cpp-python {version} .tar.gz)")
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(folder / "src", filter="data")
    except (tarfile.TarError, OSError) as err:
        raise BuildError(f"{archive}: not a readable sdist ({err})") from None
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(f"{archive}: no {name}/vendor/llama.cpp inside (the llama-cpp-python {version} sdist is "
                         "expected)")
    return source


def build(out: str | os.PathLike, version: str = LLAMA_CPP_PYTHON, targets: Sequence[str] = TARGETS,
          jobs: int | None = None, sdist: str | os.PathLike | None = None,
          say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build ``targets`` of llama-cpp-python ``version``'s llama.cpp in ``out`` (nothing when already built); the
    stamp. ``say`` gets the progress lines. BuildError (one line) on bad input or a failed step."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise BuildError(f"--out {folder}: a file, not a folder")
    if jobs is not None and jobs < 1:
        raise BuildError(f"--jobs must be >= 1, got {jobs}")
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise BuildError(f"--version {version!r}: a llama-cpp-python release such as {LLAMA_CPP_PYTHON} is expected")
    if not targets:
        raise BuildError("no targets to build")
    if built(folder, version, targets):
        say(f"build-llamacpp: {folder} already holds {', '.join(targets)} of llama-cpp-python {version}: nothing to do")
        stamp = read_stamp(folder)
        assert stamp is not None
        return stamp
    tools = check_tools()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "build.log"
    (folder / STAMP).unlink(missing_ok=True)
    start = time.time()
    say(f"build-llamacpp: the source of llama-cpp-python {version} into {folder / 'src'}")
    source = fetch_source(folder, version, sdist, log)
    build_dir = folder / "build"
    jobs = jobs or os.cpu_count() or 1
    say(f"build-llamacpp: cmake configure and build of {', '.join(targets)} with {jobs} jobs (output: {log}; about "
        "10 minutes on 2 cores)")
    run_logged([tools["cmake"], "-S", str(source), "-B", str(build_dir), *CMAKE_FLAGS], log, "cmake configure")
    run_logged([tools["cmake"], "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target",
                *targets], log, "cmake --build")
    paths = binaries(folder, targets)
    stamp = {"version": version, "source": str(source.resolve()), "targets": list(targets),
             "cmake_flags": list(CMAKE_FLAGS), "binaries": {name: str(p.resolve()) for name, p in paths.items()},
             "jobs": jobs, "seconds": round(time.time() - start, 1), "cmake": tools["cmake"]}
    (folder / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    say(f"build-llamacpp: built {', '.join(targets)} in {stamp['seconds'] / 60:.1f} minutes: {build_dir / 'bin'}")
    return stamp
