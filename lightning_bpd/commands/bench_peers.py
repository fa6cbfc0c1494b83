"""``bench``'s vocabulary of peers and blocks: ``--peers generate,prompt-lookup[:NGRAM:TOKENS],assisted:DRAFT,
llamacpp[:BIN],ctranslate2[:QUANT]`` (:func:`peer_choice`) and ``--k K|NAME=K`` (:func:`k_value`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from lightning_bpd.commands.proposer_option import LOOKUP_NGRAM, LOOKUP_TOKENS

PEERS = ("generate", "prompt-lookup", "assisted", "llamacpp", "ctranslate2")
GENERATE_PEERS = ("generate", "prompt-lookup", "assisted", "llamacpp")  # they run a Hugging Face base's generate


def k_value(text: str) -> int | str:
    """``--k``'s argparse type: an integer, or ``NAME=K`` (a ``--run``'s block, kept as text: the table checks K)."""
    name, eq, _ = text.partition("=")
    try:
        return text if eq and name else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k {text}: give an integer K or NAME=K") from None


def peer_list(text: str) -> str:
    """``--peers``' argparse type: comma-separated peers (see :data:`PEERS`), each checked; :func:`peer_choice`
    reads them."""
    try:
        for name in text.split(","):
            if name.strip():
                peer_item(name.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


PEERS_SPELLED = "generate, prompt-lookup[:NGRAM:TOKENS], assisted:DRAFT, llamacpp[:BIN] or ctranslate2[:QUANT]"


def peer_item(text: str) -> tuple[str, str]:
    """One peer as ``(name, its argument)`` (``""``: none); ValueError (one line) for a peer or argument it is not."""
    head, _, rest = text.partition(":")
    if head not in PEERS:
        raise ValueError(f"--peers {text}: write {PEERS_SPELLED}")
    if head == "generate" and rest:
        raise ValueError(f"--peers {text}: generate takes no argument")
    if head == "assisted" and not rest:
        raise ValueError("--peers assisted:DRAFT: name the draft model (a causal LM folder with the base's tokenizer, "
                         "or an LM run's .ckpt)")
    if head == "prompt-lookup" and rest:
        numbers = rest.split(":")
        if len(numbers) != 2 or not all(n.isdigit() and int(n) > 0 for n in numbers):
            raise ValueError(f"--peers {text}: prompt lookup is prompt-lookup or prompt-lookup:NGRAM:TOKENS "
                             "(integers >= 1)")
    return head, rest


@dataclass(frozen=True)
class PeerChoice:
    """What ``--peers`` asked for: the peers named (in order, once each), prompt lookup's n-gram size and token count,
    the draft model of assisted generation, llama.cpp (and its build folder), CTranslate2's conversions (empty: the
    defaults)."""

    names: tuple[str, ...] = ()
    ngram: int = LOOKUP_NGRAM
    tokens: int = LOOKUP_TOKENS
    assistant: str | None = None
    llamacpp_bin: str | None = None
    quantizations: tuple[str, ...] = ()

    @property
    def generate(self) -> bool:
        """Whether a peer runs the base's own ``generate`` (then it is the reference of every row)."""
        return any(name in GENERATE_PEERS for name in self.names)


def peer_choice(given: list[str] | None) -> PeerChoice:
    """``--peers``' values (each comma-separated) as one :class:`PeerChoice`; ValueError (one line) for a peer given
    twice with different arguments."""
    names: list[str] = []
    seen: dict[str, str] = {}
    quantizations: list[str] = []
    for text in peers_of(given):
        head, rest = peer_item(text)
        if head == "ctranslate2":
            if rest and rest not in quantizations:
                quantizations.append(rest)
        elif head in seen and seen[head] != rest:
            raise ValueError(f"--peers {head}: given twice ({head}:{seen[head]} and {text}): give it once")
        seen.setdefault(head, rest)
        if head not in names:
            names.append(head)
    ngram, tokens = map(int, seen["prompt-lookup"].split(":")) if seen.get("prompt-lookup") else (LOOKUP_NGRAM,
                                                                                                    LOOKUP_TOKENS)
    return PeerChoice(tuple(names), ngram, tokens, seen.get("assisted"), seen.get("llamacpp") or None,
                      tuple(quantizations))


def peers_of(given: list[str] | None) -> list[str]:
    """The peers named by ``--peers`` (each value comma-separated), in order."""
    return [t.strip() for text in given or [] for t in text.split(",") if t.strip()]
