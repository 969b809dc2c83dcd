"""Bidirectional blocks (the `block` axis: DFlash's draft block, block diffusion): the step's queries fall in
blocks of B from the first on; a query sees every key of its own block both ways, and causally the keys before it
from p - W on.  The arithmetic, the reference and the probes agree with that definition written out by brute
force; the CPU paths that take the axis pass the gate; a path that stays causal, counts its blocks from key 0 or
makes them one key too long is caught; the paths that do not take blocks skip and say so; a block with a step it
cannot split is refused, naming the field."""

import dataclasses

import pytest
import torch
from conftest import invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from swabench.core import gate, probes, reference, semantics, workloads
from swabench.impls import registry
from swabench.impls.embedded import GatherRunner
from swabench.inputs import axes
from swabench.inputs.axes import ScenarioError

CPU_PATHS = ["torch-trim", "torch-mask", "torch-batch"]


def case(**kw):
    base = dict(mode="verify", draft_tokens=12, prefix_len=37, window_left=5, block=4, num_qo_heads=4,
                num_kv_heads=2, head_dim=64, dtype="float32", batch_size=3, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def brute_force_visible(i: int, j: int, prefix: int, window_left: int, block: int) -> bool:
    """Query i of the step (at position prefix + i) sees key j: its causal window, or its own block."""
    p, first = prefix + i, prefix + i // block * block
    return (j <= p and (window_left < 0 or j >= p - window_left)) or first <= j < first + block


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 30), st.integers(0, 40), st.integers(-1, 20), st.integers(1, 24))
def test_the_block_visibility_is_the_definition(qo, prefix, window_left, block):
    kv = prefix + qo
    mask = semantics.Visibility(window_left, block=block).mask(qo, kv)
    truth = torch.tensor([[brute_force_visible(i, j, prefix, window_left, block) for j in range(kv)]
                          for i in range(qo)])
    assert torch.equal(mask, truth)
    assert semantics.useful_pairs(qo, kv, window_left, block=block) == int(truth.sum())
    first_seen = int(truth.any(dim=0).int().argmax())
    assert semantics.trim_start(kv, qo, window_left) <= first_seen  # a trimmed table still holds every key seen


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 20), st.integers(0, 40), st.integers(-1, 12), st.integers(1, 9),
       st.sampled_from(["paged", "ragged"]))
def test_the_reference_masks_by_the_definition(qo, prefix, window_left, block, storage):
    w = workloads.build(case(draft_tokens=qo, prefix_len=prefix, window_left=window_left, block=block,
                             storage=storage))
    got, row = reference.attention(w), 0
    for b, (q_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
        keys = w.keys(b, 0, kv_len).double().repeat_interleave(2, dim=1)
        values = w.values(b, 0, kv_len).double().repeat_interleave(2, dim=1)
        visible = torch.tensor([[brute_force_visible(i, j, kv_len - q_len, window_left, block) for j in range(kv_len)]
                                for i in range(q_len)])
        scores = torch.einsum("qhd,khd->hqk", w.queries(b).double(), keys) * w.sm_scale
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        torch.testing.assert_close(got[row:row + q_len], torch.einsum("hqk,khd->qhd", probs, values))
        row += q_len


def test_the_probes_tune_rows_to_their_blocks_ends():
    names = [name for _, name, _ in probes.edges(5, block=4)]
    assert names[-3:] == ["block end", "after block", "block start"] and len(names) == 7
    w = workloads.build(case(num_qo_heads=8))
    edge = probes.fill(w, 0, seed=0)
    q, keys = w.q.double(), w.keys(0, 0, w.kv_lens[0]).double()
    found = probes.edges(5, block=4)
    for t in range(w.qo_lens[0]):
        for h in range(8):
            distance, name, _ = found[int(edge[t, h])]
            if not name.startswith(("block", "after")):
                continue
            first = w.prefix_lens[0] + t // 4 * 4
            want = first - distance if name == "block start" else first + 3 - distance
            logits = (q[t, h] * keys[:, h // 4]).sum(dim=-1)
            if want < w.kv_lens[0]:
                assert int(logits.argmax()) == want, (t, h, name)


@pytest.mark.parametrize("name", CPU_PATHS)
@pytest.mark.parametrize("window_left, block", [(5, 4), (2, 8), (-1, 3), (100, 12)])
def test_each_cpu_path_that_takes_blocks_passes_the_gate(name, window_left, block):
    w = workloads.build(case(window_left=window_left, block=block))
    impl = registry.get(name)
    assert impl.skip_reason(w.case, impl.library, torch.device("cpu")) is None
    runner = impl.make(w, impl.library)
    runner.plan()
    result = gate.check(runner, w)
    assert result.passed, result.reason


@pytest.mark.parametrize("mistake, edge", [
    (lambda c: semantics.Visibility(c.window_left), "block end"),  # causal: the block's later keys lost
    (lambda c: semantics.Visibility(c.window_left, block=c.block + 1), "outside window"),  # a key past its window
])
def test_a_path_with_the_wrong_blocks_is_caught(mistake, edge):
    w = workloads.build(case(window_left=2, block=4, prefix_len=38))
    runner = GatherRunner(w, lambda c, prefix: mistake(c), trim=False)
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed and f"probe ({edge})" in result.reason, result.reason


def test_blocks_counted_from_key_0_not_the_first_query_are_caught():
    """A path that aligns its blocks to absolute positions (p // B) instead of the step's first query."""
    w = workloads.build(case(window_left=2, block=4, prefix_len=38))  # 38 is no multiple of 4

    def seen(c, qo_lens, kv_lens):
        return [torch.tensor([[(j <= p and j >= p - c.window_left) or (p // c.block * c.block <= j
                                                                         < (p // c.block + 1) * c.block)
                               for j in range(k)] for p in range(k - q, k)]) for q, k in zip(qo_lens, kv_lens)]

    runner = GatherRunner(w, lambda c, prefix: semantics.of_case(c), trim=False,
                          seen=seen(w.case, w.qo_lens, w.kv_lens))
    runner.plan()
    assert not gate.check(runner, w).passed


def test_the_paths_without_blocks_skip_and_say_so():
    c = case()
    for name in ("planted-wide", "flex-window", "paged-window", "paged-trim"):
        assert registry.get(name).skip_reason(c, "fa2", None) == "takes no bidirectional blocks (block)", name
    assert registry.get("paged-mask").skip_reason(case(dtype="bfloat16"), "fa2", None) is None  # any mask
    assert "block4" in c.label and c.features == frozenset({"block"})
    plain = case(block=None)
    assert plain.block == 0 and dataclasses.replace(plain, block=0).case_id == plain.case_id


@pytest.mark.parametrize("fields, says", [
    (dict(mode="decode", draft_tokens=None, seq_len=64, prefix_len=None), "a decode step has one query"),
    (dict(causal=False), "leave out causal = false"),
    (dict(window_left=None, attention_chunk=16), "leave out causal = false, attention_chunk and tree"),
    (dict(tree="eagle:2:3", draft_tokens=6), "leave out causal = false, attention_chunk and tree"),
    (dict(block=-1), "must be an integer >= 0"),
])
def test_a_block_the_step_cannot_take_is_refused_naming_the_field(fields, says):
    with pytest.raises((ScenarioError, ValueError)) as e:
        axes.AXES["block"](fields["block"]) if "block" in fields else case(**fields)
    assert says in str(e.value)
    if "block" not in fields:
        assert e.value.field.endswith(".block")


def test_a_block_scenario_runs_end_to_end_on_the_cpu(tmp_path):
    from swabench.analysis import derived

    (tmp_path / "blocks.toml").write_text(
        'name = "blocks"\nimplementations = ["torch-trim", "torch-mask", "planted-wide"]\n'
        '[fixed]\nmode = "verify"\nprefix_len = 37\nnum_qo_heads = 4\nnum_kv_heads = 2\nhead_dim = 64\n'
        'dtype = "float32"\nbatch_size = 2\nwindow_left = 5\ndraft_tokens = 8\n'
        '[[sweep]]\ngroup = "blocks"\nblock = [4, 8]\n')
    r = invoke("run", tmp_path / "blocks.toml", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table, _ = derived.load(tmp_path / "run")
    assert set(table["block"]) == {4, 8}
    assert set(table.loc[table["status"] == "pass", "impl"]) == {"torch-trim", "torch-mask"}
    assert set(table.loc[table["impl"] == "planted-wide", "status"]) == {"skip"}


@pytest.mark.parametrize("name", ["torch-trim", "paged-mask"])
def test_a_block_case_has_a_script_that_makes_the_suites_calls(name, tmp_path):
    """The script's mask and reference take the blocks too: the custom mask is the suite's, value for value, and
    the PyTorch path's script gives the suite's output and exits 0 on its own."""
    import subprocess
    import sys

    from swabench.repro import script, verify

    c = case(window_left=2, block=4, prefix_len=38, dtype="bfloat16", head_dim=64)
    parts = [script.Part(c, name, registry.get(name).library if name.startswith("torch") else "fa2")]
    text = script.render(parts, script.Header(name))
    verify.check(parts, text)
    assert "block" in text.split("CASE = dict(")[1].split(")\n")[0]
    if name.startswith("torch"):
        path = tmp_path / "block.py"
        path.write_text(text)
        ran = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0 and ran.stdout.startswith("NOT REPRODUCED: right"), ran.stdout + ran.stderr


def test_a_block_step_is_not_exported_as_a_causal_definition():
    from swabench.inputs import fib

    assert fib._not_exportable(case(storage="paged")) == "bidirectional blocks of 4 (the definitions are causal)"


def test_the_ranges_wrapper_gets_each_querys_block_and_the_window_on_the_causal_part():
    """ranges-window's calls, on the repro stand-in: built for the case's dtypes and head_dim, planned on the whole
    table with neither causal nor window_left (its variant owns the mask), run with each row's block as its span,
    causal_window_left = W and unclamped spans; its script writes the spans as block_ranges(CASE)."""
    from conftest import standin_calls

    from swabench.repro import script, verify

    c = case(window_left=5, block=4, prefix_len=13, draft_tokens=8, dtype="bfloat16", page_size=4, batch_size=2)
    w = workloads.build(c)
    (_, _, _, built), (_, _, planned_args, planned), (_, _, ran_args, ran) = \
        [call for call in standin_calls("ranges-window", w, "fa2") if call[1] in ("__init__", "plan", "run")]
    assert built["head_dim_qk"] == 64 and built["q_data_type"] == torch.bfloat16 and built["use_cuda_graph"]
    assert "causal" not in planned and "window_left" not in planned and planned["page_size"] == 4
    assert torch.equal(planned_args[2], w.kv_indices_host.to(torch.int32))  # the whole table
    spans = ran_args[2]
    assert spans.dtype == torch.int32 and spans.is_contiguous() and spans.shape == (16, 2)
    assert spans[:8].tolist() == [[13, 16]] * 4 + [[17, 20]] * 4  # request 0: prefix 13, blocks of 4
    assert ran["causal_window_left"] == 5 and ran["range_window_left"] == 0
    parts = [script.Part(c, "ranges-window", "fa2")]
    text = script.render(parts, script.Header("ranges-window"))
    verify.check(parts, text)
    assert "block_ranges(CASE)" in text and "def block_ranges(case):" in text


def test_the_ranges_wrapper_says_where_it_cannot_run():
    impl = registry.get("ranges-window")
    assert impl.skip_reason(case(dtype="bfloat16", block=0), "fa2", None) == "runs only cases with block"
    assert "soft-cap" in impl.skip_reason(case(dtype="bfloat16", logits_soft_cap=30.0), "fa2", None)
    assert "no sink term" in impl.skip_reason(case(dtype="bfloat16", sinks=True), "fa2", None)
    assert impl.skip_reason(case(dtype="bfloat16"), "fa3", None) == "has kernels on fa2 only, not fa3"
