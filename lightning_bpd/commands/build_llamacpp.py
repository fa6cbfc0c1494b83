"""``python -m lightning_bpd build-llamacpp``: llama.cpp built for the CPU from the source llama-cpp-python vendors,
to serve our DFlash and EAGLE-3 drafters (``bench-generate --peers llamacpp --llamacpp-bin DIR``, ``export-heads
--format llamacpp``).

Downloads the pinned sdist (``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36``, or ``--sdist``
a copy of it) into ``--out``, extracts it and builds its ``vendor/llama.cpp`` with CMake (Release, static, native,
CPU only, no network code) for the targets ``llama-speculative-simple`` and ``llama-tokenize``
(:mod:`lightning_bpd.benchmarks.llamacpp_build`). About 10 minutes on 2 cores. Cached: a folder that already holds the
same build is left as it is (a second call does nothing); a failed step is one line naming what to fix and the log.

    nice -n 19 python -m lightning_bpd build-llamacpp --out ../llamacpp-build --jobs 2
"""

from __future__ import annotations

import argparse
import sys

from lightning_bpd.benchmarks.llamacpp_build import LLAMA_CPP_PYTHON, TARGETS, BuildError, build

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd build-llamacpp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the build folder (made if missing; kept as a cache)")
    p.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: the CPU count)")
    p.add_argument("--version", default=LLAMA_CPP_PYTHON,
                   help=f"the llama-cpp-python release whose llama.cpp is built (default: {LLAMA_CPP_PYTHON})")
    p.add_argument("--sdist", default=None, help="a local copy of that release's .tar.gz instead of pip download")
    p.add_argument("--targets", nargs="+", default=list(TARGETS),
                   help=f"CMake targets (default: {' '.join(TARGETS)})")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        build(args.out, args.version, args.targets, args.jobs, args.sdist,
              say=lambda line: print(line, file=sys.stderr, flush=True))
    except BuildError as err:
        sys.exit(f"build-llamacpp: {err}")


if __name__ == "__main__":
    main()
