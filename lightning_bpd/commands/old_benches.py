"""The two old benches, each a deprecated spelling of ``bench`` (:mod:`lightning_bpd.commands.bench`): one line on
stderr that names the command line in ``bench``'s spelling, then that bench.

* ``bench-generate`` (:func:`bench_generate`): ``bench --ckpt CKPT --peers generate,prompt-lookup[:N:T],...``; its
  ``--prompt-lookup-tokens`` / ``--max-matching-ngram``, ``--assistant``, ``--peers llamacpp --llamacpp-bin``,
  ``--peers ctranslate2 --ct2-quantizations`` and ``--inputs`` mapped onto ``--peers`` and ``--limit``
  (:func:`generate_argv`);
* ``bench-drafters`` (:func:`bench_drafters`): ``bench --run NAME=CKPT ...`` with its defaults (64 prompts, batch 1,
  the CPU) and prompt lookup's settings as ``--peers`` (:func:`drafters_argv`).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

from lightning_bpd.commands import bench
from lightning_bpd.commands.proposer_option import LOOKUP_NGRAM, LOOKUP_TOKENS

# bench-generate's options that bench spells otherwise (each takes one value; --peers and --ct2-quantizations several)
OLD_ONE = ("--prompt-lookup-tokens", "--max-matching-ngram", "--assistant", "--llamacpp-bin")
OLD_MANY = ("--peers", "--ct2-quantizations")


def generate_argv(argv: list[str]) -> list[str]:
    """``bench-generate``'s command line in ``bench``'s spelling: ``--peers generate,prompt-lookup[:N:T]`` (from
    ``--max-matching-ngram N --prompt-lookup-tokens T``) plus ``assisted:DRAFT`` (``--assistant``),
    ``llamacpp[:BIN]`` (``--peers llamacpp``, ``--llamacpp-bin``), ``ctranslate2[:QUANT]`` (``--peers ctranslate2``,
    one per ``--ct2-quantizations`` value), ``--limit`` for ``--inputs``; every other option as it is. ValueError
    (one line) for what the old command refused."""
    out: list[str] = []
    one: dict[str, str] = {}
    many: dict[str, list[str]] = {option: [] for option in OLD_MANY}
    i = 0
    while i < len(argv):
        arg = argv[i]
        option, eq, value = arg.partition("=")
        if option in OLD_ONE:
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{option}: expected one argument")
                i, value = i + 1, argv[i + 1]
            one[option] = value
        elif option in OLD_MANY:
            values = [value] if eq else []
            while not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                values.append(argv[i])
            many[option] += values
        else:
            out.append("--limit" + arg[len(option):] if option == "--inputs" else arg)
        i += 1
    unknown = sorted(set(many["--peers"]) - {"ctranslate2", "llamacpp"})
    if unknown:
        raise ValueError(f"--peers {' '.join(unknown)}: bench-generate's peers are ctranslate2 and llamacpp")
    if "--llamacpp-bin" in one and "llamacpp" not in many["--peers"]:
        raise ValueError("--llamacpp-bin names llama.cpp's binaries for --peers llamacpp: add --peers llamacpp")
    lookup = "prompt-lookup"
    if "--prompt-lookup-tokens" in one or "--max-matching-ngram" in one:
        lookup += f":{one.get('--max-matching-ngram', LOOKUP_NGRAM)}:{one.get('--prompt-lookup-tokens', LOOKUP_TOKENS)}"
    peers = ["generate", lookup]
    if "--assistant" in one:
        peers.append(f"assisted:{one['--assistant']}")
    if "llamacpp" in many["--peers"]:
        peers.append(f"llamacpp:{one['--llamacpp-bin']}" if "--llamacpp-bin" in one else "llamacpp")
    if "ctranslate2" in many["--peers"]:
        peers += [f"ctranslate2:{q}" for q in many["--ct2-quantizations"]] or ["ctranslate2"]
    return [*out, "--peers", ",".join(peers)]


def bench_generate(argv: list[str] | None = None) -> dict:
    """``bench-generate``, the old spelling of ``bench --ckpt CKPT --peers generate,...``: one line on stderr that
    names the new command line, then that bench (:func:`~lightning_bpd.commands.bench.main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = generate_argv(argv)
    except ValueError as err:
        sys.exit(f"bench-generate: {err}")
    print(f"bench-generate is deprecated: use bench {shlex.join(argv)}", file=sys.stderr)
    return bench.main(argv)


DEPRECATED = "bench-drafters is deprecated: use bench"  # + the command line in bench's spelling
DEFAULTS = (("--limit", "64"), ("--batch-sizes", "1"), ("--device", "cpu"))  # bench-drafters' own, where bench's differ


def drafters_argv(argv: list[str]) -> list[str]:
    """``bench-drafters``' command line in ``bench``'s spelling: ``--peers generate,prompt-lookup:N:T`` for
    ``--max-matching-ngram N --prompt-lookup-tokens T``, its defaults (64 prompts, batch 1, the CPU) given where
    unset, everything else as it is (``--run``, ``--k NAME=K``, ``--minutes``, ...)."""
    out: list[str] = []
    lookup: dict[str, str] = {}
    i = 0
    while i < len(argv):
        option, eq, value = argv[i].partition("=")
        if option in ("--prompt-lookup-tokens", "--max-matching-ngram"):
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{option}: expected one argument")
                i, value = i + 1, argv[i + 1]
            lookup[option] = value
        else:
            out.append("--limit" + argv[i][len(option):] if option == "--inputs" else argv[i])
        i += 1
    if lookup:
        ngram = lookup.get("--max-matching-ngram", str(LOOKUP_NGRAM))
        out += ["--peers", f"generate,prompt-lookup:{ngram}:{lookup.get('--prompt-lookup-tokens', LOOKUP_TOKENS)}"]
    given = {arg.partition("=")[0] for arg in out}
    for option, value in DEFAULTS:
        if option not in given and not (option == "--limit" and "--inputs" in given):
            out += [option, value]
    return out


def bench_drafters(argv: list[str] | None = None) -> dict[str, Any]:
    """``bench-drafters``, the old spelling of ``bench --run ...``: one deprecation line naming its command line in
    ``bench``'s spelling, then that bench."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = drafters_argv(argv)
    except ValueError as err:
        sys.exit(f"bench-drafters: {err}")
    print(f"{DEPRECATED} {shlex.join(argv)}", file=sys.stderr)
    return bench.main(argv)
