"""On a CUDA machine: draft trees through FlashInfer and SGLang's FA3 build.  The depth paths and the per-node branches
pass the gate on trees and chains, below and past the window; the slot rule, SGLang's verify recipe and the sink
wrapper under a tree mask are wrong exactly on the rows their semantics predict (and right on every row they do
not); the tree paths replay in a CUDA graph.  SGLang's FA3 backend, one row a draft token (``sglang-fa3-tree``),
passes on trees and chains, with and without GPT-OSS's sinks, and replays in a CUDA graph.

Marked ``gpu``: skipped without CUDA (and the FlashInfer ones without flashinfer, SGLang's without its FA3 build)."""

import pytest
import torch

from swabench.core import gate, workloads
from swabench.impls import registry
from swabench.inputs import axes
from tests.test_gpu import assert_replays_in_a_graph

pytestmark = pytest.mark.gpu

# (tree, draft tokens, window, prefix): SGLang's EAGLE-3 launch past and under the window, a wide tree, vLLM's test tree
TREES = [("eagle:4:3", 16, 127, 1000), ("eagle:4:3", 16, 127, 64), ("eagle:8:5", 64, 1023, 3000),
         ("[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]", 7, 127, 500)]
CORRECT = ["tree-mask-depth", "tree-trim-depth", "tree-branches", "torch-trim"]
MISTAKES = ["tree-window-slot", "sglang-verify-tree"]


def workload(tree, n, window_left, prefix, page_size=16, sinks=False, head_dim=128):
    c = axes.make_case(dict(mode="verify", tree=tree, draft_tokens=n, prefix_len=prefix, window_left=window_left,
                            num_qo_heads=64 if sinks else 8, num_kv_heads=8 if sinks else 2, head_dim=head_dim,
                            dtype="bfloat16", batch_size=4, page_size=page_size, sinks=sinks))
    return workloads.build(c, "cuda")


def gated(impl, w, backend="fa2"):
    spec = registry.get(impl)
    backend = backend if spec.backends else spec.library
    reason = spec.skip_reason(w.case, backend, w.device)
    if reason:
        pytest.skip(reason)
    runner = spec.make(w, backend)
    runner.plan()
    predicted = torch.cat(spec.rows_wrong(w.case, w.qo_lens, w.kv_lens, backend)) if spec.expected_to_fail else None
    return runner, gate.check(runner, w, predicted=predicted)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("tree,n,window_left,prefix", TREES)
@pytest.mark.parametrize("impl", CORRECT)
def test_the_depth_paths_pass_on_trees_and_chains(impl, tree, n, window_left, prefix, chain, page_size):
    w = workload("chain" if chain else tree, n, window_left, prefix, page_size)
    runner, result = gated(impl, w)
    assert result.passed, result.reason


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("tree,n,window_left,prefix", TREES)
@pytest.mark.parametrize("impl", MISTAKES)
def test_the_slot_rule_and_sglangs_recipe_are_wrong_exactly_where_predicted(impl, tree, n, window_left, prefix, chain):
    w = workload("chain" if chain else tree, n, window_left, prefix, page_size=1)
    runner, result = gated(impl, w)
    must = registry.get(impl).must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    assert result.passed != must, result.reason
    assert result.rows_as_predicted, f"{result.wrong_rows} rows wrong; {result.reason}"
    if impl == "tree-window-slot" and chain:
        assert result.passed  # slot = depth on a chain


def test_the_branches_run_on_fa3_which_takes_no_custom_mask():
    w = workload("eagle:4:3", 16, 127, 1000, page_size=1)
    assert gated("tree-branches", w, "fa3")[1].passed
    reason = registry.get("tree-mask-depth").skip_reason(w.case, "fa3", w.device)
    assert reason and "custom-mask" in reason


@pytest.mark.parametrize("chain", [False, True])
def test_on_a_sink_layer_the_branches_pass_and_the_sink_wrapper_drops_the_tree_mask(chain):
    w = workload("chain" if chain else "eagle:4:3", 16, 127, 1000, page_size=1, sinks=True, head_dim=64)
    assert gated("tree-branches-sink", w)[1].passed
    runner, result = gated("tree-sink-mask", w)
    assert not result.passed


@pytest.mark.parametrize("impl", ["tree-mask-depth", "tree-trim-depth", "tree-branches"])
def test_tree_runners_replay_in_a_cuda_graph(impl):
    w = workload("eagle:4:3", 16, 127, 1000, page_size=1)
    runner, result = gated(impl, w)
    assert result.passed, result.reason
    assert_replays_in_a_graph(runner)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("tree,n,window_left,prefix", TREES)
def test_sglangs_fa3_backend_runs_a_tree_as_one_row_a_draft_token_and_passes(tree, n, window_left, prefix, chain,
                                                                              sinks):
    w = workload("chain" if chain else tree, n, window_left, prefix, page_size=1, sinks=sinks,
                 head_dim=64 if sinks else 128)
    runner, result = gated("sglang-fa3-tree", w, "sgl-fa3")
    assert result.passed, result.reason
    assert_replays_in_a_graph(runner)
