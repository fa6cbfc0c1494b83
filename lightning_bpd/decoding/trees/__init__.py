"""Trees of candidates, the shape a tree decoder verifies (torch only): :mod:`~.tree` (a static tree, Medusa's greedy
tree of a node budget, paths and ancestor masks), :mod:`~.rows` (one tree per row: a dynamic tree's), :mod:`~.cost`
(what a tree pass costs on this machine and the budget of most expected accepted tokens per unit of cost) and
:mod:`~.budget` (``--tree-nodes N`` / ``auto``: the heads' stored top-r agreement table, measured, kept and turned
into a tree). The decoders that use them live one folder up."""
