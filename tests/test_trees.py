"""Draft trees (the ``tree`` axis: a speculative-decoding verify block laid out as a draft tree, docs/trees.md).

Node i of a tree verified after ``prefix`` cached keys has depth d and sits at position prefix + d; its own key
is in column prefix + i (its slot).  It must see exactly what it would see in the linear sequence of its own
branch: the cached keys at positions >= prefix + d - W and those of its ancestors (and itself) whose position
prefix + d_a is >= prefix + d - W.  The slot rule (FlashInfer's kernel window under a tree mask, vLLM's Triton
kernel) measures the node's position as prefix + i and a draft key's as its column.

Asserted here, each against an independent definition (a brute force that walks the parents, or the engines'
own documented examples):

- the flattening: vLLM's choice lists (test_tree_attention.py's masks, its (len, path) re-sort), SGLang's DFlash
  tree and SGLang's EAGLE-2 dynamic tree (test_build_eagle_tree.py's scores, parents and positions);
- the semantics (masks, by depth and by slot, missed keys, pair counts, differing rows) and the repro kit's
  ``visible`` against the brute force on random trees;
- the reference against per-node attention over each node's own branch, with sinks and a soft-cap;
- the probes: a slot-rule runner is wrong exactly on the rows whose slot is past their depth, at the window
  edge, and a runner without the tree mask is caught by the non-ancestor edge;
- the axis (what it refuses, how it canonicalises and labels, case ids kept), the registry (skips, must_fail,
  keys_lost, rows_losing, SGLang's out-of-step mask read), the CPU paths through the gate, what the FlashInfer
  tree paths hand to plan() (against a stand-in wrapper), and a CPU ``swabench run`` of a tiny tree scenario.
"""

import random
import re
import sys
import types

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swabench.core import gate, probes, reference, semantics, trees, workloads
from swabench.core.semantics import Visibility
from swabench.core.trees import Tree
from swabench.impls import flashinfer_workspace as ws
from swabench.impls import implementation, registry
from swabench.impls.embedded import GatherRunner
from swabench.inputs import axes
from swabench.inputs.axes import ScenarioError
from swabench.repro import kit
from tests.test_flashinfer_plans import FakeWrapper

TOL = gate.TOLERANCES["float32"]
VLLM_TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]"


# ---------------------------------------------------------------- brute force, from the definition

def branch(parents, i) -> list[int]:
    """Node i's ancestors and itself, root first, by walking up its parents."""
    line = [i]
    while parents[line[-1]] >= 0:
        line.append(parents[line[-1]])
    return line[::-1]


def depth(parents, i) -> int:
    return len(branch(parents, i)) - 1


def brute_mask(parents, prefix: int, window_left: int, by_slot: bool = False) -> torch.Tensor:
    """Bool [n, prefix + n]: by depth (the exact rule), or by slot (the slot rule)."""
    n = len(parents)
    out = torch.zeros(n, prefix + n, dtype=torch.bool)
    for i in range(n):
        me = prefix + (i if by_slot else depth(parents, i))
        for j in range(prefix):
            out[i, j] = window_left < 0 or j >= me - window_left
        for s in branch(parents, i):
            key = prefix + (s if by_slot else depth(parents, s))
            out[i, prefix + s] = window_left < 0 or key >= me - window_left
    return out


def plain_mask(qo: int, kv: int, window_left: int) -> torch.Tensor:
    """The interval mask of a chain: query i at p = kv - qo + i sees keys [p - W, p]."""
    return torch.tensor([[j <= p and (window_left < 0 or j >= p - window_left) for j in range(kv)]
                         for p in range(kv - qo, kv)])


def chain_parents(n: int) -> tuple:
    return (-1, *range(n - 1))


def random_parents():
    """A tree of 1 to 9 nodes: the root first, every parent before its child."""
    return st.integers(1, 9).flatmap(
        lambda n: st.tuples(st.just(-1), *[st.integers(0, i - 1) for i in range(1, n)]))


def case(**kw):
    base = dict(mode="verify", tree="eagle:2:3", draft_tokens=8, prefix_len=40, window_left=12, num_qo_heads=4,
                num_kv_heads=2, head_dim=64, dtype="float32", batch_size=2, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def gated(name, w, predicted=None):
    impl = registry.get(name)
    runner = impl.make(w, impl.library)
    runner.plan()
    return gate.check(runner, w, predicted=predicted)


def slot_rule_runner(w):
    return GatherRunner(w, lambda c, prefix: implementation.computed(
        c, prefix, lambda W, p, ps: Visibility(W, by_slot=True)), trim=False)


# ---------------------------------------------------------------- 1. the engines' documented flattenings

def test_vllm_choice_lists_flatten_to_its_tree_attention_tests_masks():
    """vLLM tests/v1/attention/test_tree_attention.py: the expected masks, root row and column included."""
    chain = trees.from_choices(trees.parse_choices("[(0,), (0, 0), (0, 0, 0)]"))
    assert chain.ancestors().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert chain.is_chain and chain.depths == (0, 1, 2, 3)
    binary = trees.from_choices(trees.parse_choices(VLLM_TREE))
    assert binary.ancestors().int().tolist() == [[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0],
                                                 [1, 0, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0],
                                                 [1, 1, 0, 0, 1, 0, 0], [1, 0, 1, 0, 0, 1, 0],
                                                 [1, 0, 1, 0, 0, 0, 1]]
    assert not binary.is_chain and binary.depth == 2


def test_vllm_resorts_a_user_tree_by_length_then_path():
    """sorted(tree_choices, key=lambda t: (len(t), t)): [(0,),(0,0),(1,),(0,1)] lays out as
    [(0,), (1,), (0, 0), (0, 1)] behind the root."""
    t = trees.from_choices([(0,), (0, 0), (1,), (0, 1)])
    assert t.parents == (-1, 0, 0, 1, 1)  # (0,) and (1,) under the root, (0, 0) and (0, 1) under (0,)
    assert t.depths == (0, 1, 1, 2, 2)


def test_sglangs_dflash_tree_has_its_positions_and_draft_mask():
    """SGLang's DFlash tree test: parents [-1, 0, 1, 0, 3] at seq_len 5 give positions [5, 6, 7, 6, 7]."""
    t = Tree((-1, 0, 1, 0, 3))
    assert [5 + d for d in t.depths] == [5, 6, 7, 6, 7]
    assert t.ancestors().int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0],
                                            [1, 0, 0, 1, 1]]


# SGLang test/srt/test_build_eagle_tree.py (topk 4, 4 steps, 8 draft tokens): score_list per step [b, beams, topk]
SGLANG_SCORES = [
    [[[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]], [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]]],
    [[[6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03], [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
      [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08], [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05]],
     [[8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02], [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
      [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05], [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08]]],
    [[[6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06], [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
      [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05], [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05]],
     [[2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03], [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
      [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04], [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04]]],
    [[[6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06], [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
      [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05], [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05]],
     [[5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04], [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
      [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03], [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04]]],
]
SGLANG_EXPECTED = [  # (seq_len, positions, parent flat index per node)
    (5, [5, 6, 6, 7, 7, 8, 8, 9], [-1, 0, 0, 1, 2, 3, 4, 5]),
    (10, [10, 11, 12, 12, 12, 12, 13, 14], [-1, 0, 1, 1, 1, 1, 3, 6]),
]


def sglang_child_probabilities(score_list, b: int, topk: int) -> list[list[float]]:
    """The child probabilities trees.eagle asks for, one list per expansion in its order (the root, then each
    step's frontier best first), from SGLang's cumulative scores: in SGLang step s >= 1's beam j is the j-th best
    candidate of step s - 1 (torch.topk, best first), so its children's probabilities are their cumulative
    scores over that candidate's."""
    calls = [list(score_list[0][b][0])]
    for s in range(1, len(score_list)):
        beams = sorted((x for row in score_list[s - 1][b] for x in row), reverse=True)[:topk]
        calls += [[c / beams[j] for c in score_list[s][b][j]] for j in range(topk)]
    return calls


@pytest.mark.parametrize("b", [0, 1])
def test_the_eagle_tree_is_sglangs_build_eagle_tree_on_its_test_scores(monkeypatch, b):
    """trees.eagle cannot be handed scores (it draws them), so its one source of probabilities is fed SGLang's
    test scores, in the order it expands nodes; the tree must be the one SGLang's kernel test expects."""
    calls = iter(sglang_child_probabilities(SGLANG_SCORES, b, 4))
    monkeypatch.setattr(trees, "_child_probabilities", lambda topk, rng: next(calls))
    t = trees.eagle(4, 4, 8, random.Random(0))
    seq_len, positions, parents = SGLANG_EXPECTED[b]
    assert list(t.parents) == parents
    assert [seq_len + d for d in t.depths] == positions
    assert next(calls, None) is None  # one expansion per frontier node per step, no more


def test_eagle_trees_are_seeded_per_request_and_fit_their_capacity():
    built = trees.build("eagle:3:3", 13, 4, 5)
    assert built == trees.build("eagle:3:3", 13, 4, 5) and len(set(built)) > 1  # each request draws its own
    assert all(t.size == 13 and t.depth <= 3 for t in built)
    assert trees.eagle_capacity(3, 3) == 1 + 3 + 2 * 9
    full = trees.eagle(3, 3, trees.eagle_capacity(3, 3), random.Random(1))
    # every candidate kept: the root's 3 children, then 3 beams of 3 at each later step
    assert sorted(full.depths) == [0] + [1] * 3 + [2] * 9 + [3] * 9


# ---------------------------------------------------------------- 2. the semantics against the brute force

@settings(max_examples=60, deadline=None)
@given(random_parents(), st.integers(0, 40), st.integers(-1, 12))
def test_tree_visibility_is_the_branch_definition(parents, prefix, window_left):
    t, n = Tree(parents), len(parents)
    kv = prefix + n
    exact, slot = brute_mask(parents, prefix, window_left), brute_mask(parents, prefix, window_left, by_slot=True)
    assert torch.equal(Visibility(window_left).mask(n, kv, tree=t), exact)
    assert torch.equal(Visibility(window_left, by_slot=True).mask(n, kv, tree=t), slot)
    offset = max(0, prefix - window_left) if window_left >= 0 else 0  # a trimmed table's columns
    assert torch.equal(Visibility(window_left).mask(n, kv, key_offset=offset, tree=t), exact[:, offset:])
    assert not (slot & ~exact).any()  # an ancestor in the slot window is in the depth window too
    missed = semantics.keys_missed(Visibility(window_left, by_slot=True), Visibility(window_left), n, kv, t)
    assert missed.tolist() == (exact & ~slot).sum(dim=1).tolist()
    assert semantics.keys_missed(Visibility(window_left), Visibility(window_left), n, kv, t).tolist() == [0] * n
    differ = semantics.rows_differ(Visibility(window_left, by_slot=True), Visibility(window_left), n, kv, t)
    assert differ.tolist() == (exact != slot).any(dim=1).tolist()
    assert semantics.differs(Visibility(window_left, by_slot=True), Visibility(window_left), n, kv, t) \
        == bool((exact != slot).any())
    assert semantics.useful_pairs(n, kv, window_left, tree=t) == int(exact.sum())
    if prefix >= window_left >= n - 1:  # every slot inside the window of the cache: a node misses slot - depth
        assert missed.tolist() == [i - depth(parents, i) for i in range(n)]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(0, 40), st.integers(-1, 12))
def test_on_a_chain_both_rules_are_the_interval(n, prefix, window_left):
    t, kv = Tree(chain_parents(n)), prefix + n
    plain = Visibility(window_left).mask(n, kv)
    assert torch.equal(plain, plain_mask(n, kv, window_left))
    assert torch.equal(Visibility(window_left).mask(n, kv, tree=t), plain)
    assert torch.equal(Visibility(window_left, by_slot=True).mask(n, kv, tree=t), plain)
    assert semantics.useful_pairs(n, kv, window_left, tree=t) == semantics.useful_pairs(n, kv, window_left)


@settings(max_examples=40, deadline=None)
@given(random_parents(), st.integers(0, 40), st.integers(-1, 12), st.booleans())
def test_the_repro_kit_sees_what_the_suite_sees(parents, prefix, window_left, by_slot):
    n = len(parents)
    got = kit.visible(n, prefix + n, window_left, parents=list(parents), by_slot=by_slot)
    assert torch.equal(got, Visibility(window_left, by_slot=by_slot).mask(n, prefix + n, tree=Tree(parents)))
    assert torch.equal(got, brute_mask(parents, prefix, window_left, by_slot))


def test_a_tree_of_the_wrong_size_and_a_parent_after_its_child_are_refused():
    with pytest.raises(ValueError, match="3 nodes verified as 4 queries"):
        Visibility(5).mask(4, 20, tree=Tree((-1, 0, 0)))
    for bad in ((0, -1), (-1, 1), (-1, 0, 3), ()):
        with pytest.raises(ValueError, match="root first"):
            Tree(bad)


# ---------------------------------------------------------------- 3. the reference

def branch_attention(w) -> torch.Tensor:
    """Each node's attention over its own branch written out linearly: the cached keys, then its ancestors root
    first (itself last), a causal sliding window over those positions, float64."""
    c = w.case
    out, row = [], 0
    for b, (qo, kv) in enumerate(zip(w.qo_lens, w.kv_lens)):
        prefix, parents = kv - qo, w.trees[b].parents
        keys, values = w.keys(b).double(), w.values(b).double()
        for i in range(qo):
            columns = list(range(prefix)) + [prefix + s for s in branch(parents, i)]
            k = keys[columns].repeat_interleave(c.gqa_group, dim=1)
            v = values[columns].repeat_interleave(c.gqa_group, dim=1)
            me = len(columns) - 1
            seen = torch.tensor([c.window_left < 0 or j >= me - c.window_left for j in range(len(columns))])
            s = torch.einsum("hd,khd->hk", w.q[row + i].double(), k) * w.sm_scale
            if c.logits_soft_cap:
                s = c.logits_soft_cap * torch.tanh(s / c.logits_soft_cap)
            s = s.masked_fill(~seen, float("-inf"))
            if w.sinks is not None:
                s = torch.cat([s, w.sinks.double()[:, None]], dim=1)
            p = torch.softmax(s, dim=1)[:, :len(columns)]
            out.append(torch.einsum("hk,khd->hd", p, v))
        row += qo
    return torch.stack(out)


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([("eagle:2:3", 8), ("eagle:3:2", 9), (VLLM_TREE, None), ("[(0,), (0, 0), (1,), (0, 1)]", None)]),
       st.integers(0, 30), st.integers(-1, 12), st.sampled_from(["paged", "ragged"]))
def test_the_reference_is_attention_over_each_nodes_branch(tree, prefix, window_left, storage):
    spec, n = tree
    w = workloads.build(case(tree=spec, draft_tokens=n, prefix_len=prefix, window_left=window_left, storage=storage,
                             page_size=4))
    torch.testing.assert_close(reference.attention(w), branch_attention(w))


@pytest.mark.parametrize("extra", [dict(sinks=True), dict(logits_soft_cap=30.0)])
def test_the_reference_over_branches_applies_sinks_and_the_soft_cap(extra):
    w = workloads.build(case(prefix_len=25, window_left=9, **extra))
    assert w.sinks is not None or w.case.logits_soft_cap
    torch.testing.assert_close(reference.attention(w), branch_attention(w))


# ---------------------------------------------------------------- 4. the probes

def slots_past_depth(w) -> torch.Tensor:
    return torch.tensor([i > d for t in w.trees for i, d in enumerate(t.depths)])


def has_cousin(w) -> torch.Tensor:
    """Rows with a draft key before them that is not their ancestor."""
    return torch.tensor([any(s not in branch(t.parents, i) for s in range(i)) for t in w.trees for i in range(t.size)])


def probe_errors(runner, w):
    """Per probe pass: (the edge name of every (row, head), the row rel-L2 error of every (row, head))."""
    c = w.case
    runner.plan()
    found = []
    for s in range(probes.passes(c.num_qo_heads, c.window_left, tree=True)):
        edge = probes.fill(w, s, c.seed)
        err = gate.run_checked(runner, w).row_rel_l2
        names = [[probes.edge_name(c.window_left, int(e), tree=True) for e in row] for row in edge]
        found.append((names, err))
    return found


def past_the_window():
    c = case(tree="eagle:2:3", draft_tokens=8, prefix_len=40, window_left=12)
    w = workloads.build(c)
    assert all(p > c.window_left + t.size for p, t in zip(w.prefix_lens, w.trees))  # past the window, and
    assert c.qo_len <= c.window_left + 1  # every node's slot window still inside the cache
    return w


def edge_target(w, t: int, name: str) -> int:
    """The key column a row tuned to ``name`` must peak at, from its branch: the window edges at the positions
    prefix + depth - W (- 1) of its own branch (a cached key, or the ancestor at that depth), the near edges at its
    own column (and the next), the non-ancestor at the last draft key before it that is not its ancestor."""
    b = int(w.query_request[t])
    i, prefix, W = t - w.qo_indptr_host[b], w.prefix_lens[b], w.case.window_left
    parents = w.trees[b].parents
    line = list(range(prefix)) + [prefix + s for s in branch(parents, i)]  # the branch, column by position
    if name in ("outside window", "window edge"):
        return line[len(line) - 1 - W - (name == "outside window")]
    others = [s for s in range(i) if s not in branch(parents, i)]
    return prefix + {"diagonal": i, "future key": i + 1, "non-ancestor": others[-1] if others else i + 1}[name]


@pytest.mark.parametrize("window_left", [12, 1])  # W 1: the window edges of the deeper nodes are ancestors
def test_every_row_meets_every_edge_and_peaks_where_its_branch_puts_it(window_left):
    w = workloads.build(case(window_left=window_left))
    c = w.case
    names = [set() for _ in range(sum(w.qo_lens))]
    for s in range(probes.passes(c.num_qo_heads, c.window_left, tree=True)):
        edge = probes.fill(w, s, 0)
        for t in range(len(names)):
            b = int(w.query_request[t])
            for h in range(c.num_qo_heads):
                name = probes.edge_name(c.window_left, int(edge[t, h]), tree=True)
                names[t].add(name)
                want = edge_target(w, t, name)
                if want < w.kv_lens[b]:
                    logits = w.keys(b).double()[:, h // c.gqa_group] @ w.q[t, h].double()
                    assert int(logits.argmax()) == want, (t, h, name)
    assert all(n == {"outside window", "window edge", "future key", "diagonal", "non-ancestor"} for n in names)


def test_the_slot_rule_is_wrong_exactly_on_the_rows_past_their_depth_and_at_their_window_edge():
    w = past_the_window()
    past = slots_past_depth(w)
    assert past.any() and not past.all()
    wrong_anywhere = torch.zeros(len(past), dtype=torch.bool)
    for names, err in probe_errors(slot_rule_runner(w), w):
        for t in range(len(past)):
            for h, name in enumerate(names[t]):
                wrong = bool(err[t, h] > TOL.row_rel_l2)
                assert not wrong or past[t], (t, h, name, float(err[t, h]))  # a node at its depth is right
                if name == "window edge":  # the key that rules the row is the one the slot rule drops
                    assert wrong == bool(past[t]), (t, h, float(err[t, h]))
                    assert not wrong or err[t, h] > 100 * TOL.row_rel_l2  # O(1), not a rounding
                wrong_anywhere[t] |= wrong
    assert torch.equal(wrong_anywhere, past)


def test_a_runner_without_the_tree_mask_is_caught_by_the_non_ancestor_edge():
    w = past_the_window()
    c = w.case
    chained = []
    for q, k, t in zip(w.qo_lens, w.kv_lens, w.trees):
        mask = brute_mask(t.parents, k - q, c.window_left)
        mask[:, k - q:] |= torch.ones(q, q, dtype=torch.bool).tril()  # every draft key up to its own slot
        chained.append(mask)
    cousin = has_cousin(w)
    assert cousin.any() and not cousin.all()

    def without_tree():  # GatherRunner wants a Visibility even where ``seen`` decides (it trims nothing here)
        return GatherRunner(w, lambda case, prefix: Visibility(case.window_left), trim=False, seen=chained)

    for names, err in probe_errors(without_tree(), w):
        for t in range(len(cousin)):
            for h, name in enumerate(names[t]):
                wrong = bool(err[t, h] > TOL.row_rel_l2)
                assert not wrong or cousin[t], (t, h, name)  # a row with only ancestors before it is right
                if name == "non-ancestor":  # the key that rules the row leaks in
                    assert wrong == bool(cousin[t]) and (not wrong or err[t, h] > 100 * TOL.row_rel_l2), (t, h)
    runner = without_tree()
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed and "probe (non-ancestor)" in result.reason
    assert result.wrong_rows == int(cousin.sum())


def test_the_gate_says_the_slot_rule_is_wrong_on_the_predicted_rows_and_the_depth_path_passes():
    w = past_the_window()
    predicted = torch.cat(registry.get("vllm-tree-window").rows_wrong(w.case, w.qo_lens, w.kv_lens, "fa2"))
    assert torch.equal(predicted, slots_past_depth(w))
    runner = slot_rule_runner(w)
    runner.plan()
    result = gate.check(runner, w, predicted=predicted)
    assert not result.passed and result.rows_as_predicted is True and result.wrong_rows == int(predicted.sum())
    named = re.findall(r"slot (\d+), depth (\d+)", result.reason)
    assert "probe (" in result.reason and named and all(int(i) > int(d) for i, d in named)
    assert gate.check(runner, w, predicted=~predicted).rows_as_predicted is False
    assert gate.check(runner, w, predicted=torch.ones_like(predicted)).rows_as_predicted is False  # too many
    exact = gated("torch-trim", w, predicted=predicted)
    assert exact.passed and exact.wrong_rows == 0 and exact.rows_as_predicted is False  # it is right on them
    assert gated("torch-trim", w, predicted=torch.zeros_like(predicted)).rows_as_predicted is True


# ---------------------------------------------------------------- 5. the axis

@pytest.mark.parametrize("mode,length", [("extend", dict(extend_len=5)), ("decode", {}),
                                         ("draft_extend", dict(draft_tokens=5))])
def test_a_tree_is_verified_only(mode, length):
    with pytest.raises(ScenarioError, match=r"sweep\.tree: a draft tree is verified in one call: mode must be "
                                            rf"'verify', not '{mode}'"):
        axes.make_case(dict(mode=mode, tree="eagle:2:2", prefix_len=40, window_left=12, head_dim=64, **length))


def test_an_eagle_tree_holds_at_most_its_capacity():
    most = 1 + 4 + 2 * 4 * 4  # the root, topk from the first step, topk^2 from each later one
    assert case(tree="eagle:4:3", draft_tokens=most).qo_len == most
    with pytest.raises(ScenarioError, match=rf"sweep\.draft_tokens: eagle:4:3 makes 2 to {most} draft tokens.*"
                                            rf"not {most + 1}"):
        case(tree="eagle:4:3", draft_tokens=most + 1)
    with pytest.raises(ScenarioError, match=r"sweep\.draft_tokens: .*not 1"):
        case(tree="eagle:4:3", draft_tokens=1)


@pytest.mark.parametrize("value,message", [
    ("[(0,), (1, 0)]", r"choice \(1, 0\) has no parent \(1,\) in the list"),
    ("[(0,), (0,)]", r"choice \(0,\) is listed twice"),
    ([[0], [0, 0], [1, 1]], r"choice \(1, 1\) has no parent \(1,\)"),
    ("eagle:0:3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagle:4", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagles:4:3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagle_v2:4:3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagle:\u00b2:3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("[(0,), (-1,)]", "a choice list is tuples of child indices"),
    ("[(0,) (1,)]", "a choice list is tuples of child indices"),
    ("[(0,)(1,)]", "a choice list is tuples of child indices"),
    ("[(0,),,(1,)]", "a choice list is tuples of child indices"),
    ("[,(0,)]", "a choice list is tuples of child indices"),
    ("eagle:17:3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagle:1000:1000", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16 and DEPTH from 1 to 16"),
    ("eagle:" + "9" * 5000 + ":3", "'eagle:TOPK:DEPTH' takes TOPK from 1 to 16"),
    ("[(" + "9" * 5000 + ",)]", "a choice list is tuples of child indices"),
    ([], "a choice list names at least one node besides the root"),
    ("binary", "must be 'chain', 'eagle:TOPK:DEPTH'"),
])
def test_a_bad_tree_value_is_refused_naming_the_field_and_the_forms(value, message):
    with pytest.raises(ScenarioError, match=r"tiny\.toml: sweep\.tree: " + message):
        axes.check_axes({"tree": [value] if isinstance(value, list) else value}, "tiny.toml", "sweep")


def test_the_axis_canonicalises_what_it_takes():
    assert trees.parse("eagle:04:3") == "eagle:4:3"
    assert trees.parse(" [ ( 0 , ) ,(1,),  (0,0 ), ] ") == "[(0,), (1,), (0, 0)]"
    assert trees.parse([[0], [1], [0, 0]]) == "[(0,), (1,), (0, 0)]"  # a TOML array of arrays
    assert trees.parse("chain") == "chain"
    assert axes.check_axes({"tree": ["eagle:04:3", "[(0,),(1,)]"]}, "x", "sweep")["tree"] == \
        ["eagle:4:3", "[(0,), (1,)]"]


def test_a_choice_list_must_agree_with_draft_tokens_and_else_gives_it():
    with pytest.raises(ScenarioError, match=r"sweep\.tree: the choice list has 6 nodes and the root: 7 draft tokens, "
                                            r"not 8"):
        case(tree=VLLM_TREE, draft_tokens=8)
    assert case(tree=VLLM_TREE, draft_tokens=None).qo_len == 7 == case(tree=VLLM_TREE, draft_tokens=7).qo_len


@pytest.mark.parametrize("extra,field,message", [
    (dict(window_left=None, attention_chunk=16), "tree", "leave out attention_chunk and causal = false"),
    (dict(causal=False), "tree", "leave out attention_chunk and causal = false"),
    (dict(draft_tokens=(8, 8)), "draft_tokens", "a draft tree has one size for the batch"),
])
def test_a_tree_is_refused_where_it_has_no_meaning(extra, field, message):
    with pytest.raises(ScenarioError, match=rf"sweep\.{field}: .*{message}"):
        case(**extra)


def test_a_case_without_a_tree_keeps_its_id_and_label():
    plain = axes.make_case(dict(mode="extend", extend_len=512, prefix_len=8192, window_left=127, batch_size=32,
                                num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", page_size=16))
    assert plain.tree is None and plain.case_id == "e0513591dc82"  # its id in the published runs
    assert "tree" not in plain.label and "tree" not in plain.features
    tree = case()
    chain = case(tree="chain")
    untreed = case(tree=None)
    assert len({tree.case_id, chain.case_id, untreed.case_id}) == 3  # a chain is a declared tree, not a plain verify
    assert tree.features == chain.features == untreed.features | {"tree"}


def test_the_label_shows_the_tree():
    assert " q16 tree eagle:4:3 W12 " in case(tree=trees.parse("eagle:04:3"), draft_tokens=16).label
    assert case(tree=VLLM_TREE, draft_tokens=None).label.startswith("verify b2 p40 q7 tree [6 choices, depth 2] W12")
    assert trees.label("chain") == "chain"


# ---------------------------------------------------------------- 6. the registry

def test_chain_only_paths_skip_a_tree_and_run_a_chain():
    cpu = torch.device("cpu")
    for name, backend, dtype in [("paged-trim", "fa2", "bfloat16"), ("planted-wide", "torch", "float32")]:
        impl = registry.get(name)
        reason = impl.skip_reason(case(dtype=dtype), backend, None)
        assert reason and "tree" in reason, (name, reason)
        assert impl.skip_reason(case(tree="chain", dtype=dtype), backend, None) is None, name
    assert registry.get("planted-wide").skip_reason(case(tree="chain"), "torch", cpu) is None
    assert registry.get("torch-trim").skip_reason(case(), "torch", cpu) is None


def brute_missed(c, qo_lens, kv_lens):
    """Per row, keys of the exact rule the slot rule leaves out (the brute force)."""
    return torch.cat([(brute_mask(t.parents, k - q, c.window_left) & ~brute_mask(t.parents, k - q, c.window_left,
                                                                                  by_slot=True)).sum(dim=1)
                      for t, q, k in zip(trees.of_case(c), qo_lens, kv_lens)])


@pytest.mark.parametrize("tree,n,prefix,window_left", [
    ("chain", 8, 40, 12), ("chain", 9, 3, 4), ("chain", 5, 100, 0),
    ("eagle:2:3", 8, 0, 8), ("eagle:2:3", 8, 1, 8),  # every key in every window: nothing lost
    ("eagle:2:3", 8, 2, 8), ("eagle:2:3", 8, 40, 12), ("eagle:3:2", 10, 30, 4), (VLLM_TREE, 7, 50, 3),
    (VLLM_TREE, 7, 20, 1),
])
@pytest.mark.parametrize("name", ["tree-window-slot", "vllm-tree-window"])
def test_the_slot_rules_losses_are_the_brute_forces(name, tree, n, prefix, window_left):
    c = case(tree=tree, draft_tokens=n, prefix_len=prefix, window_left=window_left, dtype="bfloat16")
    impl = registry.get(name)
    qo, kv = [n] * c.batch_size, [prefix + n] * c.batch_size
    missed = brute_missed(c, qo, kv)
    assert impl.must_fail(c, qo, kv, "fa2") is bool(missed.any())
    assert impl.keys_lost(c, qo, kv, "fa2") == (int(missed.max()), pytest.approx(float((missed > 0).float().mean())))
    assert torch.equal(torch.cat(impl.rows_wrong(c, qo, kv, "fa2")), missed > 0)
    if tree == "chain" or prefix + n <= window_left + 1:
        assert not impl.must_fail(c, qo, kv, "fa2")
    if prefix > window_left + n and n <= window_left + 1:  # past the window, each slot window inside the cache
        depths = [(i, d) for t in trees.of_case(c) for i, d in enumerate(t.depths)]
        assert impl.keys_lost(c, qo, kv, "fa2")[0] == max(i - d for i, d in depths)
        assert impl.keys_lost(c, qo, kv, "fa2")[1] == pytest.approx(sum(i > d for i, d in depths) / len(depths))
        assert impl.must_fail(c, qo, kv, "fa2") is (tree != "chain")


def sglang_emulated(c, qo_lens, kv_lens):
    """SGLang's EAGLE verify on an SWA layer as FlashInfer reads it (one query tile a request): the table holds
    K_b = min(prefix, W) + n keys from the first; request b's mask bits are read from the sum of n * K over the
    requests before it, K bits a row, from the concatenated full-prefix masks (every cached key, then the
    node's ancestors and itself)."""
    full = []
    for t, q, k in zip(trees.of_case(c), qo_lens, kv_lens):
        prefix = k - q
        rows = [[True] * prefix + [s in branch(t.parents, i) for s in range(q)] for i in range(q)]
        full += [bit for row in rows for bit in row]
    out, offset = [], 0
    for q, k in zip(qo_lens, kv_lens):
        kept = min(k - q, c.window_left) + q
        seen = torch.zeros(q, k, dtype=torch.bool)
        for r in range(q):
            for col in range(kept):
                at = offset + r * kept + col
                seen[r, col] = at < len(full) and full[at]
        out.append(seen)
        offset += q * kept
    return out


def test_sglangs_verify_recipe_reads_its_mask_out_of_step_as_emulated():
    from swabench.impls import fa2_split, tree_verify
    c = case(tree="eagle:2:2", draft_tokens=5, prefix_len=(30, 50), window_left=20, dtype="bfloat16")
    qo, kv = [5, 5], [35, 55]
    assert 5 * c.gqa_group <= fa2_split.cta_tile_q(5 * c.gqa_group, c.head_dim)  # one query tile a request
    got = tree_verify._sglang_seen(c, qo, kv, "fa2")
    want = sglang_emulated(c, qo, kv)
    assert all(torch.equal(g, e) for g, e in zip(got, want))
    impl = registry.get("sglang-verify-tree")
    rows = impl.rows_wrong(c, qo, kv, "fa2")
    exact = [brute_mask(t.parents, k - q, 20) for t, q, k in zip(trees.of_case(c), qo, kv)]
    assert [r.tolist() for r in rows] == [(e != s).any(dim=1).tolist() for e, s in zip(exact, want)]
    assert impl.must_fail(c, qo, kv, "fa2")


@pytest.mark.parametrize("tree,n", [("eagle:2:3", 8), (VLLM_TREE, 7), ("chain", 6)])
def test_sglangs_verify_recipe_is_exact_inside_the_window_and_wrong_past_it(tree, n):
    impl = registry.get("sglang-verify-tree")
    inside = case(tree=tree, draft_tokens=n, prefix_len=(10, 17), window_left=30, dtype="bfloat16")
    qo, kv = [n, n], [10 + n, 17 + n]
    assert all(k <= 30 for k in kv)
    assert not any(r.any() for r in impl.rows_wrong(inside, qo, kv, "fa2")) and not impl.must_fail(inside, qo, kv, "fa2")
    assert impl.keys_lost(inside, qo, kv, "fa2") == (0, 0.0)
    past = case(tree=tree, draft_tokens=n, prefix_len=(60, 90), window_left=30, dtype="bfloat16")
    assert impl.must_fail(past, [n, n], [60 + n, 90 + n], "fa2")


@pytest.mark.parametrize("tree,n,prefix", [("eagle:2:3", 8, 40), ("eagle:2:3", 8, 2), ("chain", 2, 40),
                                           ("chain", 6, 3), (VLLM_TREE, 7, 100)])
def test_the_sink_wrapper_under_a_tree_mask_must_fail_on_every_tree_and_chain(tree, n, prefix):
    c = case(tree=tree, draft_tokens=n, prefix_len=prefix, dtype="bfloat16", sinks=True)
    impl = registry.get("tree-sink-mask")
    qo, kv = [n, n], [prefix + n] * 2
    assert impl.must_fail(c, qo, kv, "fa2")
    # the tree and causality dropped: a node sees every key from its slot's window on, future ones too
    dropped = [torch.tensor([[j >= prefix + i - c.window_left for j in range(prefix + n)] for i in range(n)])] * 2
    exact = [brute_mask(t.parents, prefix, c.window_left) for t in trees.of_case(c)]
    rows = impl.rows_wrong(c, qo, kv, "fa2")
    assert [r.tolist() for r in rows] == [(d != e).any(dim=1).tolist() for d, e in zip(dropped, exact)]
    assert all(r[:-1].all() for r in rows)  # every row but the last sees a future draft key


# ---------------------------------------------------------------- 7. the CPU paths through the gate

CPU_TREE_CASES = {"eagle": dict(tree="eagle:3:3", draft_tokens=12, prefix_len=(45, 60), window_left=11),
                  "vllm": dict(tree=VLLM_TREE, draft_tokens=None, prefix_len=(40, 33), window_left=9)}


@pytest.mark.parametrize("storage", ["paged", "ragged"])
@pytest.mark.parametrize("shape", CPU_TREE_CASES)
@pytest.mark.parametrize("name", ["torch-trim", "torch-mask", "torch-batch"])
def test_the_cpu_paths_pass_on_trees_past_the_window(name, shape, storage):
    w = workloads.build(case(storage=storage, **CPU_TREE_CASES[shape]))
    assert all(p > w.case.window_left + t.size for p, t in zip(w.prefix_lens, w.trees))
    result = gated(name, w)
    assert result.passed, result.reason
    assert result.wrong_rows == 0


@pytest.mark.parametrize("name,shape,storage", [("flex-window", "eagle", "paged"),
                                                ("flex-contiguous", "vllm", "ragged")])
def test_flex_passes_on_trees_past_the_window(name, shape, storage):
    result = gated(name, workloads.build(case(storage=storage, **CPU_TREE_CASES[shape])))
    assert result.passed, result.reason


@pytest.mark.parametrize("storage", ["paged", "ragged"])
@pytest.mark.parametrize("shape", CPU_TREE_CASES)
def test_vllms_rule_fails_where_predicted_and_passes_on_a_chain(shape, storage):
    impl = registry.get("vllm-tree-window")
    w = workloads.build(case(storage=storage, **CPU_TREE_CASES[shape]))
    predicted = torch.cat(impl.rows_wrong(w.case, w.qo_lens, w.kv_lens, "fa2"))
    assert predicted.any() and impl.must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    result = gated("vllm-tree-window", w, predicted)
    assert not result.passed and result.rows_as_predicted is True
    shape = {**CPU_TREE_CASES[shape], "tree": "chain", "draft_tokens": w.qo_lens[0]}
    chain = workloads.build(case(storage=storage, **shape))
    assert not impl.must_fail(chain.case, chain.qo_lens, chain.kv_lens, "fa2")
    result = gated("vllm-tree-window", chain, torch.zeros(sum(chain.qo_lens), dtype=torch.bool))
    assert result.passed and result.rows_as_predicted is True, result.reason


# ---------------------------------------------------------------- 8. what the FlashInfer tree paths hand to plan()

@pytest.fixture
def fake_flashinfer(monkeypatch):
    """The FlashInfer stand-in of tests/test_flashinfer_plans.py: it records what plan() is handed."""
    module = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=FakeWrapper,
                                   BatchPrefillWithRaggedKVCacheWrapper=FakeWrapper,
                                   BatchDecodeWithPagedKVCacheWrapper=FakeWrapper,
                                   BatchAttentionWithAttentionSinkWrapper=FakeWrapper,
                                   BatchDecodeWithAttentionSinkWrapper=FakeWrapper)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(ws, "_shared", {})
    monkeypatch.setattr(ws, "_allocate", lambda device, nbytes: torch.empty(nbytes, dtype=torch.uint8, device="meta"))
    monkeypatch.setattr(FakeWrapper, "need", 0)
    monkeypatch.setattr(FakeWrapper, "count", None)
    monkeypatch.setattr(FakeWrapper, "built", [])


def planned(name, **kw):
    c = case(**{**dict(dtype="bfloat16", prefix_len=(100, 77), window_left=31, draft_tokens=8), **kw})
    w = workloads.build(c)
    runner = registry.get(name).make(w, "fa2")
    runner.plan()
    return runner.wrapper, w


def pages_of(w, b) -> list[int]:
    return w.kv_indices_host[int(w.kv_indptr_host[b]):int(w.kv_indptr_host[b + 1])].tolist()


def test_tree_mask_depth_hands_the_exact_tree_mask_over_the_full_table(fake_flashinfer):
    wrapper, w = planned("tree-mask-depth")
    mask = wrapper.kwargs["custom_mask"].cpu()
    assert torch.equal(mask, semantics.custom_mask(w.qo_lens, w.kv_lens, Visibility(31), trees=w.trees))
    assert torch.equal(mask, torch.cat([brute_mask(t.parents, p, 31).reshape(-1)
                                        for t, p in zip(w.trees, w.prefix_lens)]))
    assert "window_left" not in wrapper.kwargs and wrapper.kwargs["causal"] is False
    _, indptr, indices, _ = wrapper.args
    assert indices.tolist() == w.kv_indices_host.tolist() and indptr.tolist() == w.kv_indptr_host.tolist()


def test_tree_trim_depth_starts_at_the_page_holding_prefix_minus_w(fake_flashinfer):
    wrapper, w = planned("tree-trim-depth")
    _, indptr, indices, last = wrapper.args
    starts = [(p - 31) // 16 * 16 for p in w.prefix_lens]  # the page holding key prefix - W
    table = [pages_of(w, b)[s // 16:] for b, s in enumerate(starts)]
    assert indices.tolist() == table[0] + table[1] and indptr.tolist() == [0, len(table[0]), len(table[0] + table[1])]
    mask = wrapper.kwargs["custom_mask"].cpu()
    assert len(mask) == sum(q * (k - s) for q, k, s in zip(w.qo_lens, w.kv_lens, starts))
    assert torch.equal(mask, torch.cat([brute_mask(t.parents, p, 31)[:, s:].reshape(-1)
                                        for t, p, s in zip(w.trees, w.prefix_lens, starts)]))
    assert "window_left" not in wrapper.kwargs and wrapper.kwargs["causal"] is False


def test_tree_window_slot_hands_the_window_and_the_bare_tree(fake_flashinfer):
    wrapper, w = planned("tree-window-slot")
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is False
    assert torch.equal(wrapper.kwargs["custom_mask"].cpu(), torch.cat(
        [brute_mask(t.parents, p, -1).reshape(-1) for t, p in zip(w.trees, w.prefix_lens)]))


def test_sglangs_verify_recipe_hands_the_cut_table_the_full_prefix_mask_and_w_at_run(fake_flashinfer):
    wrapper, w = planned("sglang-verify-tree")
    _, indptr, indices, last = wrapper.args
    kept = [min(p, 31) + 8 for p in w.prefix_lens]  # 39 keys from each request's first
    pages = [-(-k // 16) for k in kept]
    assert indices.tolist() == pages_of(w, 0)[:pages[0]] + pages_of(w, 1)[:pages[1]]
    assert indptr.tolist() == [0, pages[0], pages[0] + pages[1]]
    assert last.tolist() == [k - (p - 1) * 16 for k, p in zip(kept, pages)]
    mask = wrapper.kwargs["custom_mask"].cpu()
    assert len(mask) == sum(8 * (p + 8) for p in w.prefix_lens)
    assert torch.equal(mask, torch.cat([brute_mask(t.parents, p, -1).reshape(-1)
                                        for t, p in zip(w.trees, w.prefix_lens)]))
    assert wrapper.kwargs["causal"] is False and "window_left" not in wrapper.kwargs
    assert wrapper._window_left == 31


def test_tree_branches_plan_one_request_per_node_over_its_branch(fake_flashinfer):
    wrapper, w = planned("tree-branches", page_size=1)
    qo_indptr, indptr, indices, last = wrapper.args
    nodes = sum(w.qo_lens)
    assert qo_indptr.tolist() == list(range(nodes + 1)) and last.tolist() == [1] * nodes
    want = []
    for b, t in enumerate(w.trees):
        pages, prefix = pages_of(w, b), w.prefix_lens[b]
        for i, d in enumerate(t.depths):
            want.append(pages[max(0, prefix + d - 31):prefix] + [pages[prefix + s] for s in branch(t.parents, i)])
    assert indptr.tolist() == [0, *torch.tensor([len(x) for x in want]).cumsum(0).tolist()]
    assert indices.tolist() == [p for x in want for p in x]
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is True
    assert "page_size 1" in registry.get("tree-branches").unsupported(case(dtype="bfloat16"), "fa2")


# ---------------------------------------------------------------- 9. the repro kit

@pytest.mark.parametrize("extra", [dict(), dict(tree=VLLM_TREE, draft_tokens=None, storage="ragged", sinks=True)])
def test_the_repro_kits_reference_is_the_suites_on_a_tree(extra):
    from swabench.repro.script import case_literals
    c = case(prefix_len=(30, 52), window_left=10, **extra)
    literals = case_literals(c)
    assert literals["parents"] == [list(t.parents) for t in trees.of_case(c)]
    x = kit.make_inputs(literals, "cpu")
    w = workloads.build(c)
    assert torch.equal(x["q"], w.q)
    torch.testing.assert_close(kit.reference(literals, x), reference.attention(w).float(), rtol=1e-5, atol=1e-5)
    bare = kit.window_mask(literals, [0, 0], literals["kv_lens"], window_left=-1)  # the tree alone
    assert torch.equal(bare, torch.cat([brute_mask(t.parents, p, -1).reshape(-1)
                                        for t, p in zip(trees.of_case(c), w.prefix_lens)]))


# ---------------------------------------------------------------- 10. a CPU run

TREE_RUN = """
name = "tiny-tree"
description = "a draft tree and its chain, past the window"
implementations = ["torch-trim", "vllm-tree-window"]
[fixed]
mode = "verify"
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
dtype = "float32"
batch_size = 2
prefix_len = 30
window_left = 8
storage = "ragged"
[[sweep]]
tree = ["eagle:2:2", "chain"]
draft_tokens = 5
"""


def test_a_cpu_run_records_the_tree_and_what_the_slot_rule_loses(tmp_path):
    from tests.conftest import invoke
    from swabench.store import run_folder

    (tmp_path / "tree.toml").write_text(TREE_RUN)
    r = invoke("run", tmp_path / "tree.toml", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table = pd.read_csv(tmp_path / "run" / run_folder.TABLE)
    for column in ("tree", "keys_lost", "rows_losing", "wrong_rows", "rows_as_predicted"):
        assert column in table.columns, column
    assert set(table["tree"]) == {"eagle:2:2", "chain"} and len(table) == 4
    rows = {(row.impl, row.tree): row for row in table.itertuples()}
    slot_tree, slot_chain = rows["vllm-tree-window", "eagle:2:2"], rows["vllm-tree-window", "chain"]
    c = case(tree="eagle:2:2", draft_tokens=5, prefix_len=30, window_left=8, storage="ragged")
    missed = brute_missed(c, [5, 5], [35, 35])
    assert slot_tree.status == "xfail" and bool(slot_tree.rows_as_predicted) is True
    assert slot_tree.keys_lost == int(missed.max()) > 0
    assert slot_tree.rows_losing == pytest.approx(float((missed > 0).float().mean()))
    assert slot_tree.wrong_rows == int((missed > 0).sum())
    assert slot_chain.status == "pass" and slot_chain.keys_lost == 0 and slot_chain.wrong_rows == 0
    assert bool(slot_chain.rows_as_predicted) is True
    for tree in ("eagle:2:2", "chain"):
        correct = rows["torch-trim", tree]
        assert correct.status == "pass" and correct.keys_lost == 0 and correct.wrong_rows == 0


# ---------------------------------------------------------------- after a second reading

def test_one_tree_written_in_two_orders_is_one_case_and_a_tree_that_never_branches_is_a_chain():
    assert trees.parse("[(1,), (0, 0), (0,)]") == trees.parse("[(0,), (1,), (0, 0)]") == "[(0,), (1,), (0, 0)]"
    assert trees.is_chain("chain", 5) and trees.is_chain("eagle:1:6", 5) and trees.is_chain("[(0,), (0, 0)]", 3)
    assert not trees.is_chain("eagle:4:3", 16) and not trees.is_chain(VLLM_TREE, 7) and not trees.is_chain(None, 4)


def test_an_eagle_tree_expands_no_deeper_than_its_nodes_can_reach():
    """A kept node's ancestors are kept too, so steps past n - 1 change nothing: DEPTH 16 at 4 nodes is DEPTH 3."""
    assert trees.eagle(4, 16, 4, random.Random(5)) == trees.eagle(4, 3, 4, random.Random(5))
    assert trees.eagle(4, 16, 4, random.Random(5)).depth <= 3


def test_a_future_key_is_seen_on_a_chain_as_without_a_tree():
    """A path that lets in the next key lets it in whether or not its verify block is declared a chain."""
    chain = dict(tree="chain", draft_tokens=6, prefix_len=40, window_left=7, batch_size=2)
    impl = registry.get("planted-future")
    for c in (case(**chain), case(**{**chain, "tree": None})):
        qo, kv = workloads.request_lengths(c)
        assert impl.must_fail(c, qo, kv, "fa2")
    future = Visibility(7, future=1)
    mask = future.mask(6, 46, tree=trees.chain(6))
    assert torch.equal(mask, future.mask(6, 46))
    assert torch.equal(kit.visible(6, 46, 7, future=1, parents=list(trees.chain(6).parents)), mask)


def test_sglangs_recipe_on_a_layer_without_a_window_skips_and_records_no_loss():
    c = case(tree="eagle:2:2", draft_tokens=5, prefix_len=40, window_left=-1, page_size=1)
    impl = registry.get("sglang-verify-tree")
    qo, kv = workloads.request_lengths(c)
    assert impl.skip_reason(c, "fa2", None) and "window" in impl.skip_reason(c, "fa2", None)
    assert not impl.must_fail(c, qo, kv, "fa2") and impl.keys_lost(c, qo, kv, "fa2") == (0, 0.0)


def test_a_release_set_is_keyed_by_the_cases_its_command_picked():
    from swabench.publish.sections.releases import picked_cases
    from swabench.run import environment

    assert picked_cases("swabench run release --case tree --out x") == ("tree",)
    assert picked_cases("swabench run release --out x") == ()
    unquoted = "swabench run tree --count --case p8192 q16 tree chain W1023 --case p64 ps1 --impl a"
    assert picked_cases(unquoted) == ("p64 ps1", "p8192 q16 tree chain W1023")
    assert picked_cases("swabench run tree --case 'verify b8' --case=x") == ("verify b8", "x")
    argv = ["swabench", "run", "tree", "--case", "verify b8 q16", "--out", "o"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        assert picked_cases(environment.collect_command()) == ("verify b8 q16",)


@pytest.mark.parametrize("impl", ["sglang-verify-tree", "eagle-verify-untrimmed"])
@pytest.mark.parametrize("model, says", [("gpt-oss-20b", "does not serve GPT-OSS through its FlashInfer backend"),
                                         ("mistral-7b-v0.1", "runs Mistral's layers as full attention"),
                                         ("gemma-3-27b", None)])
def test_sglangs_recipes_skip_the_models_sglang_never_runs_them_on(impl, model, says):
    """SGLang's EAGLE verify on an SWA layer is its FlashInfer backend's: never GPT-OSS's (refused that backend) or
    Mistral's (no window in SGLang); Gemma's it runs."""
    tree = {"tree": "eagle:2:2", "draft_tokens": 5} if impl == "sglang-verify-tree" else {"qo_len": 4}
    c = axes.make_case(dict(mode="verify", prefix_len=5000, model=model, batch_size=2, page_size=1, **tree))
    reason = registry.get(impl).skip_reason(c, "fa2", None)
    assert (reason is None) if says is None else (says in reason and "sglang 0.5.23" in reason), reason
