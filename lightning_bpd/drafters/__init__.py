"""Drafter kinds, one folder each (``dflash/``, ``eagle3/``, ...): its network, its training module, its proposer(s)
and its exports; what they share sits in ``common/``. :mod:`~lightning_bpd.drafters.registry` maps a kind's name to
those parts, and every command asks it. Nothing is imported here: a kind loads when it is asked for."""
