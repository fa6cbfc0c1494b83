"""Proposers of the one decoding loop (:mod:`~lightning_bpd.decoding.loop`), one file each. Torch only.

- :class:`Heads`: the model's own heads (the paper's block, chained heads, Medusa heads);
- :class:`HeadTree`: a static tree of the heads' candidates (Medusa trees);
- :class:`DynamicHeadTree`: a tree grown per row from the heads' confidence (EAGLE-2);
- :class:`DraftModel`: a separate draft model;
- :class:`PromptLookup`: tokens copied from the row's own prompt and output;
- :class:`Retrieval`: a tree per row of continuations from a datastore of the target's text and greedy output and from
  the row's own history (REST);
- :class:`DFlash`: a DFlash block drafter, a whole block per pass from the target's features;
- :class:`Eagle3`: an EAGLE-3 drafter, a chain of drafts from the target's features and its own states;
- :class:`Eagle3Tree`: an EAGLE-3 drafter growing a dynamic tree per row (EAGLE-2's expand and rerank);
  :class:`Eagle3StaticTree`: one filling a static tree (paths of ranks).

A new proposer subclasses :class:`Proposer` (:mod:`~lightning_bpd.decoding.proposers.base`); docs/design.md shows one.
"""

from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.draft import DraftModel
from lightning_bpd.decoding.proposers.dynamic_tree import DynamicHeadTree
from lightning_bpd.decoding.proposers.heads import Heads
from lightning_bpd.decoding.proposers.prompt_lookup import PromptLookup
from lightning_bpd.decoding.proposers.retrieval import Datastore, Retrieval
from lightning_bpd.decoding.proposers.tree import HeadTree

__all__ = ["Datastore", "DraftModel", "DynamicHeadTree", "HeadTree", "Heads", "PromptLookup", "Proposer", "Retrieval"]
