"""Retrieval (REST with the row's own history) by hand: the datastore's longest matching order and its
continuations, the history's matches, the trie's best nodes and the row trees they make."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding.proposers.retrieval import (
    Datastore,
    Retrieval,
    best_nodes,
    history_continuations,
    ngram_keys,
    row_trees,
    tail_key,
)


def test_keys_of_equal_ngrams_are_equal_and_of_others_differ():
    tokens = torch.tensor([3, 4, 5, 3, 4, 6, 3, 4, 5])
    keys = ngram_keys(tokens, 3)
    assert keys.shape == (7,)
    assert keys[0] == keys[6] and len(set(keys.tolist())) == 6  # "3 4 5" twice, the rest once each
    big = torch.tensor([49151, 40000, 3, 49000] * 5)  # wraps past 64 bits: the host key does as the tensor's
    assert [tail_key(big.tolist()[: 4 + i], 4 + (i % 13)) for i in range(4)] == [
        int(ngram_keys(big[: 4 + i], 4 + (i % 13))[-1]) for i in range(4)]


def test_the_longest_order_that_matches_gives_what_followed_each_occurrence():
    #                       0  1  2  3  4  5  6  7  8  9 10 11
    store = Datastore.of(torch.tensor([1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3, 5]), orders=(1, 2, 3))
    n, found = store.continuations([6, 1, 2, 3], depth=2, cap=10)
    assert n == 3 and found.tolist() == [[9, 1], [8, 7]]  # "1 2 3" at 0 and 4, in the stream's order
    n, found = store.continuations([0, 2, 3], depth=3, cap=10)
    assert n == 2 and found.tolist() == [[9, 1, 2], [8, 7, 2], [5, -1, -1]]  # -1 past the stream's end
    n, found = store.continuations([0, 2, 3], depth=1, cap=2)
    assert n == 2 and len(found) == 2  # at most cap, spread over the matches
    n, found = store.continuations([42], depth=2, cap=10)
    assert n == 0 and found.shape == (0, 2)


def test_a_datastore_refuses_bad_orders_and_an_empty_stream():
    with pytest.raises(ValueError, match="orders"):
        Datastore.of(torch.tensor([1, 2]), orders=(0, 2))
    with pytest.raises(ValueError, match="at least one token"):
        Datastore.of(torch.tensor([], dtype=torch.long))


def test_history_matches_take_the_largest_n_and_its_last_occurrences():
    history = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert history_continuations(history, 3, 8, 3) == (2, [[7, 1, 5], [8, 2, 5]])
    assert history_continuations(history, 3, 1, 3) == (2, [[8, 2, 5]])
    assert history_continuations([1, 2, 3], 3, 8, 3) == (0, [])


def test_best_nodes_score_the_weight_through_each_prefix_in_depth_order():
    weighted = [([1, 2, 3], 1.0), ([1, 2, 4], 1.0), ([5, 6, -1], 1.5)]
    assert best_nodes(weighted, 3, 3) == [(1,), (5,), (1, 2)]  # 2.0, 1.5, 2.0: then (5, 6) at 1.5 is cut
    assert best_nodes(weighted, 10, 2) == [(1,), (5,), (1, 2), (5, 6)]  # depth 2: nothing deeper
    assert best_nodes([], 4, 4) == []


def test_row_trees_pad_smaller_trees_with_copies_of_the_root():
    trees = row_trees([[(7,), (7, 8)], []], torch.tensor([3, 4]))
    assert trees.tokens.tolist() == [[3, 7, 8], [4, 4, 4]]
    assert trees.depths.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert trees.parents.tolist() == [[0, 0, 1], [0, 0, 0]]
    assert trees.paths[0, 2].tolist() == [0, 1, 2]


def test_a_retrieval_proposer_refuses_bad_options():
    store = Datastore.of(torch.arange(10))
    with pytest.raises(ValueError, match="nodes"):
        Retrieval(store, nodes=0)
    with pytest.raises(ValueError, match="history_weight"):
        Retrieval(store, history_weight=-1.0)
    assert Retrieval(store, nodes=8, depth=6).width == 7 and Retrieval(store, nodes=8, depth=6).extra_slots == 2
    assert Retrieval(store, nodes=3, depth=6).width == 4 and Retrieval(store, nodes=3, depth=6).extra_slots == 0


def test_the_greedy_datastore_is_searched_on_its_own_with_its_own_weight():
    text = Datastore.of(torch.tensor([1, 2, 3, 9, 8] * 20), orders=(1, 2, 3))  # many occurrences: 9 follows "1 2 3"
    greedy = Datastore.of(torch.tensor([5, 1, 2, 3, 7, 6]), orders=(1, 2, 3))  # once: the model writes 7 after it
    history = [4, 1, 2, 3]
    assert Retrieval(text, nodes=2, depth=2, history_weight=0.0).trie(history) == [(9,), (9, 8)]
    both = Retrieval(text, nodes=3, depth=2, history_weight=0.0, greedy=greedy, greedy_weight=0.5)
    assert both.trie(history) == [(9,), (7,), (9, 8)]  # 7 weighs half the text's 20 occurrences together
    assert Retrieval(text, nodes=1, depth=2, history_weight=0.0, greedy=greedy, greedy_weight=2.0).trie(history) == [(7,)]


def test_a_cap_on_the_pass_inputs_shrinks_each_row_s_tree_with_the_batch():
    store = Datastore.of(torch.arange(50) % 7)
    capped = Retrieval(store, nodes=8, inputs=16)
    assert [capped.nodes_for(b) for b in (1, 2, 3, 8, 9, 16)] == [8, 7, 4, 1, 0, 0]
    assert Retrieval(store, nodes=8).nodes_for(64) == 8  # no cap
    history = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    small, full = capped.trie(history, 3), capped.trie(history)
    assert len(small) == 3 and set(small) <= set(full)  # the best three of the eight
    assert all(p[:-1] in small or len(p) == 1 for p in small)  # a tree: every node's parent is in it
    with pytest.raises(ValueError, match="inputs must be >= 0"):
        Retrieval(store, inputs=-1)
