"""The slow references (torch only): each decoder's uncached, one-row-at-a-time oracle, written for obviousness,
not speed, that the tests hold the fast decoders to: :mod:`~.greedy`, :mod:`~.beam`, :mod:`~.blockwise` (blockwise
parallel decoding under every acceptance rule), :mod:`~.tree` (static trees, exact and sampled) and
:mod:`~.dynamic` (EAGLE-2 style dynamic trees). Nothing outside the tests and the benchmarks' parity checks should
need them."""
