"""``--proposer``: what proposes the candidates a decoding step verifies, as one option.

* ``heads`` (default): the model's own heads, one block;
* ``tree:N``: the heads verify the tree of N nodes built from their rank agreement table (0 = the single path);
  ``tree:auto`` (``tree:auto:M``): the budget up to 64 (M) that pays on this machine, timed on the input;
  ``tree:PATHS``: a tree given as paths of head ranks in Medusa's format (``tree:0;1;0,0;0,1``) or ``tree:path:D``;
* ``dynamic:N[:D[:W]]``: EAGLE-2's dynamic tree of N nodes, D heads deep (default k - 1), W wide (default 4);
* ``draft:CKPT``: a draft model (same vocabulary) proposes; the criterion becomes ``draft:<criterion>``;
* ``prompt-lookup[:NGRAM:TOKENS]``: n-grams of the prompt propose (up to NGRAM long, TOKENS tokens; default 2 and
  10, transformers' own and the benches');
* ``retrieval:FILE[:NODES[:DEPTH[:INPUTS]]]``: a tree of continuations (NODES nodes, DEPTH deep; default 8 and 6;
  INPUTS > 0 caps a verify pass's inputs over the batch) found in
  the datastore FILE (``python -m lightning_bpd datastore``) and in the row's own history (REST with prompt lookup);
  exact acceptance, any run of the base (its heads or drafter unused);
* ``NAME`` / ``NAME:CKPT``, NAME a registered drafter kind (``dflash``, ``eagle3``, ...,
  :mod:`lightning_bpd.drafters.registry`): its drafter proposes from the target's features (exact and the other
  deterministic rules): the checkpoint's own (a drafter's run, where it is the default), or the one of CKPT on a
  causal LM checkpoint of the same target shapes.

:func:`proposer_arg` is the argparse type (one line naming what to write on anything else);
:func:`add_proposer_arg` adds the option and the old ``--tree``, ``--tree-nodes`` and ``--draft`` as deprecated
spellings of it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.drafters.registry import REGISTERED

# prompt lookup's one default, everywhere (decode, the benches' rows of ours and of generate): transformers' own
# (max_matching_ngram_size 2, prompt_lookup_num_tokens 10)
LOOKUP_NGRAM, LOOKUP_TOKENS = 2, 10
RETRIEVAL_NODES, RETRIEVAL_DEPTH = 8, 6  # retrieval's default tree: 9 inputs a verify pass at most
RETRIEVAL_MAX = (1024, 256)  # the largest NODES and DEPTH retrieval takes (Sequoia's GPU trees reach 768 nodes)
BASE_ONLY = ("prompt-lookup", "retrieval")  # proposers that read only the base: any run of it takes them

PROPOSER_HELP = ("what proposes the candidates: heads (default), tree:N (the tree of N nodes from the heads' rank "
                 "agreement table; 0 = the single path), tree:auto[:M] (the budget up to 64 (M) that pays here, timed), "
                 "tree:PATHS (Medusa-format paths such as '0;1;0,0;0,1', or path:D), dynamic:N[:D[:W]] (EAGLE-2's "
                 "dynamic tree of N nodes, D deep (default k-1), W wide (default 4); exact), draft:CKPT (a draft model "
                 "of the same vocabulary; the criterion becomes draft:<criterion>), prompt-lookup[:NGRAM:TOKENS] "
                 "(n-grams of the prompt; default 2:10, as transformers'), retrieval:FILE[:NODES[:DEPTH[:INPUTS]]] (a tree of continuations "
                 "from the datastore FILE and the row's history; default 8 nodes, 6 deep; exact), or a drafter kind's name, NAME[:CKPT] (dflash, eagle3, ...: the "
                 "checkpoint's own drafter, the default on a drafter's checkpoint, or CKPT's on a causal LM of the same "
                 "target; deterministic rules)")
KINDS = ("heads, tree:N, tree:auto[:M], tree:PATHS, dynamic:N[:D[:W]], draft:CKPT, prompt-lookup[:NGRAM:TOKENS], "
         "retrieval:FILE[:NODES[:DEPTH[:INPUTS]]] or a drafter kind's NAME[:CKPT] (" + ", ".join(REGISTERED) + ")")


@dataclass(frozen=True)
class ProposerChoice:
    """A parsed ``--proposer``: ``kind`` (heads, tree, draft, prompt-lookup or a registered drafter kind's name) and
    what that kind reads."""

    text: str
    kind: str = "heads"
    nodes: int | None = None  # tree:N
    auto: str | None = None  # tree:auto / tree:auto:M, in tree_budget's spelling ("auto", "auto:M")
    paths: str | None = None  # tree:PATHS, in parse_tree's spelling
    dynamic: tuple[int, ...] = ()  # dynamic:N[:D[:W]]
    ckpt: str | None = None  # draft:CKPT, NAME:CKPT (a drafter kind)
    ngram: int = LOOKUP_NGRAM  # prompt-lookup
    tokens: int = LOOKUP_TOKENS
    tree_size: tuple[int, int, int] = (RETRIEVAL_NODES, RETRIEVAL_DEPTH, 0)  # retrieval's NODES, DEPTH, INPUTS

    @property
    def on_base(self) -> bool:
        """Whether it reads only the base (prompt lookup, retrieval): any run of the base takes it."""
        return self.kind in BASE_ONLY

    def criterion(self, spec: str) -> str:
        """The criterion ``make_method`` reads: a draft proposer's rule is ``draft:<rule>``."""
        if self.kind == "draft" and not spec.strip().startswith("draft:"):
            return f"draft:{spec.strip()}"
        return spec

    def tree(self, table: Any, k: int) -> Any:
        """The tree of a ``tree:N``, ``tree:PATHS`` or ``dynamic:...`` proposer for ``k`` heads with rank agreement
        ``table`` (None for the others and for ``tree:0``); ``tree:auto`` is timed on the input by the command."""
        from lightning_bpd.decoding import parse_tree
        from lightning_bpd.decoding.trees.budget import budget_tree

        if self.nodes is not None:
            return budget_tree(self.nodes, table, k, option="--proposer tree:N")
        if self.paths is not None:
            try:
                return parse_tree(self.paths)
            except ValueError as err:  # parse_tree's line names --tree: name this option
                raise ValueError(f"--proposer {self.text}: {str(err).split(': ', 1)[-1]}") from None
        if self.dynamic:
            nodes, depth, *width = self.dynamic
            return parse_tree(":".join(map(str, ("dynamic", nodes, depth if depth else k - 1, *width))))
        return None

    def method_kwargs(self, tokenizer: Any = None) -> dict[str, Any]:
        """The keywords of ``make_method`` this proposer adds beside ``tree`` and ``draft``: ``proposer=`` for prompt
        lookup and retrieval (:mod:`lightning_bpd.decoding.proposers`; a datastore made by another tokenizer than
        ``tokenizer``, the checkpoint's, is refused in one line), none for the others."""
        if self.kind == "retrieval":
            from lightning_bpd.decoding.proposers.retrieval import Retrieval
            from lightning_bpd.tasks.lm.datastore import load_datastores

            (text, greedy), (nodes, depth, inputs) = load_datastores(self.ckpt, tokenizer), self.tree_size
            return {"proposer": Retrieval(text, nodes=nodes, depth=depth, greedy=greedy, inputs=inputs)}
        if self.kind != "prompt-lookup":
            return {}
        from lightning_bpd.decoding.proposers import PromptLookup  # the decoding loop's proposers

        return {"proposer": PromptLookup(max_ngram=self.ngram, num_tokens=self.tokens)}


def base_only_kind(spelling: str | None) -> str | None:
    """The kind of a ``--proposer`` spelling that reads only the base (``prompt-lookup``, ``retrieval``), else None."""
    head = (spelling or "").partition(":")[0].strip()
    return head if head in BASE_ONLY else None


def positive(text: str, what: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{what} must be >= 1")
    return value


def proposer_arg(text: str) -> ProposerChoice:
    """``--proposer``'s argparse type (see the module)."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    try:
        if text == "heads":
            return ProposerChoice(text)
        if kind == "tree" and rest:
            if rest == "auto" or rest.startswith("auto:"):
                from lightning_bpd.decoding.trees.budget import tree_nodes_arg

                return ProposerChoice(text, "tree", auto=tree_nodes_arg(rest))
            if rest.lstrip("-").isdigit():
                nodes = int(rest)
                if nodes < 0:
                    raise ValueError("a node budget must be >= 0 (0 = the single path)")
                return ProposerChoice(text, "tree", nodes=nodes)
            return ProposerChoice(text, "tree", paths=rest)  # read by parse_tree when the tree is built: its error line
        if kind == "dynamic" and rest:
            numbers = [positive(v, "a dynamic tree's N, D and W") for v in rest.split(":")]
            if len(numbers) > 3:
                raise ValueError("a dynamic tree is dynamic:N, dynamic:N:D or dynamic:N:D:W")
            return ProposerChoice(text, "tree", dynamic=(numbers[0], *(numbers[1:] or [0])))
        if kind == "draft" and rest:
            return ProposerChoice(text, "draft", ckpt=rest)
        if kind in REGISTERED:  # a drafter kind (lightning_bpd.drafters.registry): NAME or NAME:CKPT
            return ProposerChoice(text, kind, ckpt=rest or None)
        if kind == "retrieval" and rest:
            return retrieval_choice(text, rest)
        if kind == "prompt-lookup":
            if not rest:
                return ProposerChoice(text, "prompt-lookup")
            numbers = rest.split(":")
            if len(numbers) != 2:
                raise ValueError("prompt lookup is prompt-lookup or prompt-lookup:NGRAM:TOKENS")
            return ProposerChoice(text, "prompt-lookup", ngram=positive(numbers[0], "NGRAM"),
                            tokens=positive(numbers[1], "TOKENS"))
    except (ValueError, argparse.ArgumentTypeError) as err:
        raise argparse.ArgumentTypeError(f"--proposer {text!r}: {err}") from None
    raise argparse.ArgumentTypeError(f"--proposer {text!r}: write {KINDS}")


def retrieval_choice(text: str, rest: str) -> ProposerChoice:
    """``retrieval:FILE[:NODES[:DEPTH[:INPUTS]]]`` (``rest``: what follows ``retrieval:``): trailing integers are the
    tree's size and the cap on a verify pass's inputs over the batch (0: none), the rest the datastore's path."""
    parts = rest.split(":")
    numbers: list[int] = []
    while len(parts) > 1 and len(numbers) < 3 and is_integer(parts[-1]):
        numbers.insert(0, int(parts.pop()))
    if len(parts) > 1 and is_integer(parts[-1]):
        raise ValueError(f"{text}: retrieval takes at most three numbers after its file (NODES:DEPTH:INPUTS)")
    if any(n < 1 for n in numbers[:2]) or any(n < 0 for n in numbers[2:]):
        raise ValueError("retrieval's NODES and DEPTH must be >= 1, INPUTS >= 0")
    nodes = numbers[0] if numbers else RETRIEVAL_NODES
    depth = numbers[1] if len(numbers) > 1 else RETRIEVAL_DEPTH
    inputs = numbers[2] if len(numbers) > 2 else 0
    if nodes > RETRIEVAL_MAX[0] or depth > RETRIEVAL_MAX[1]:
        raise ValueError(f"retrieval's NODES {nodes} and DEPTH {depth}: at most {RETRIEVAL_MAX[0]} and "
                         f"{RETRIEVAL_MAX[1]} (a verify pass takes NODES + 1 inputs a row)")
    return ProposerChoice(text, "retrieval", ckpt=":".join(parts), tree_size=(nodes, depth, inputs))


def is_integer(text: str) -> bool:
    """Whether ``text`` is an integer, signed or not (a spelling's number, not a path)."""
    return text.strip().lstrip("-").isdigit()


def old_tree(text: str) -> str:
    """``--tree``'s value as a ``--proposer``."""
    return text if text.strip().startswith("dynamic:") else f"tree:{text}"


def add_proposer_arg(p: argparse.ArgumentParser) -> None:
    """``--proposer`` (default heads), and the old ``--tree``, ``--tree-nodes`` and ``--draft`` mapped onto it."""
    p.add_argument("--proposer", type=proposer_arg, default=ProposerChoice("heads"), help=PROPOSER_HELP)
    deprecated_alias(p, "--tree", "--proposer", convert=old_tree, note="--proposer tree:PATHS or dynamic:N:D")
    deprecated_alias(p, "--tree-nodes", "--proposer", convert=lambda v: f"tree:{v}", note="--proposer tree:N")
    deprecated_alias(p, "--draft", "--proposer", convert=lambda v: f"draft:{v}", note="--proposer draft:CKPT")
