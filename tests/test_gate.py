"""The gate must pass the right implementations and fail planted off-by-one mistakes, at small
windows and at W = 4095, in bf16 tolerance: that is what lets the suite trust its own numbers."""

import pytest
import torch

from swabench.core import gate, probes, workloads
from swabench.inputs import axes
from swabench.impls import implementation, registry


def workload(window_left, prefix_len, qo_len, dtype="bfloat16", num_qo_heads=4, num_kv_heads=2, **kw):
    c = axes.make_case(dict(mode="verify", draft_tokens=qo_len, prefix_len=prefix_len,
                                 window_left=window_left, num_qo_heads=num_qo_heads,
                                 num_kv_heads=num_kv_heads, head_dim=64, dtype=dtype, batch_size=2, **kw))
    return workloads.build(c)


def gated(name, w):
    runner = registry.get(name).make(w, "torch")
    runner.plan()
    return gate.check(runner, w)


SHAPES = [(4, 40, 8), (4095, 4100, 16)]  # (W, prefix, draft tokens): small window, and W = 4095


@pytest.mark.parametrize("window_left,prefix,qo", SHAPES)
@pytest.mark.parametrize("name", ["torch-trim", "torch-mask", "flex-window"])
def test_correct_implementations_pass(name, window_left, prefix, qo):
    result = gated(name, workload(window_left, prefix, qo))
    assert result.passed, result.reason
    assert result.rel_l2 < 5e-3 and result.probe_rel_l2 < 1e-2  # well inside the bf16 tolerance


@pytest.mark.parametrize("window_left,prefix,qo", SHAPES)
@pytest.mark.parametrize("name", ["planted-wide", "planted-narrow", "planted-future"])
def test_planted_mistakes_fail_through_the_probe(name, window_left, prefix, qo):
    w = workload(window_left, prefix, qo)
    assert registry.get(name).must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    result = gated(name, w)
    assert not result.passed
    tol = gate.TOLERANCES["bfloat16"].row_rel_l2
    assert result.probe_rel_l2 > 10 * tol, "the probe pass alone must catch it, by a wide margin"


def test_random_inputs_alone_are_nearly_blind_at_large_windows():
    """Why the probe exists: one extra key at W = 4095 barely moves the whole output."""
    result = gated("planted-wide", workload(4095, 4100, 16))
    assert result.rel_l2 < 0.05 < result.probe_rel_l2


@pytest.mark.parametrize("heads", [(1, 1), (2, 1), (3, 3), (8, 2)])
def test_probe_covers_every_edge_for_any_head_count(heads):
    w = workload(16, 30, 4, num_qo_heads=heads[0], num_kv_heads=heads[1])
    for name in ("planted-wide", "planted-narrow", "planted-future"):
        assert gated(name, w).probe_rel_l2 > 0.5, name


@pytest.mark.parametrize("n_freq", range(1, 13))
def test_probe_profile_peaks_by_at_least_two_units(n_freq):
    x = torch.arange(-(2 ** n_freq) + 1, 2 ** n_freq)
    g = probes.profile(x, n_freq)
    assert torch.isclose(g[x == 0], torch.tensor(float(n_freq), dtype=torch.float64)).all()
    assert (g[x != 0] <= n_freq - 2 + 1e-9).all()


def test_probe_logits_realise_the_profile():
    f = probes.features(torch.arange(200), 9, 32)
    logits = f[150] @ f.T  # query at 150 tuned to distance 0
    torch.testing.assert_close(logits, probes.profile(150 - torch.arange(200), 9))


class LazyRunner:
    """Leaves the last row unwritten: the NaN poison must catch it."""

    def __init__(self, inner):
        self.inner, self.out, self.resolved_backend = inner, inner.out, "lazy"

    def plan(self):
        self.inner.plan()

    def run(self):
        keep = self.out[-1].clone()
        self.inner.run()
        self.out[-1] = keep


def test_unwritten_rows_fail():
    w = workload(4, 40, 8, dtype="float32")
    runner = LazyRunner(registry.get("torch-trim").make(w, "torch"))
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed and result.unwritten_rows > 0 and "never written" in result.reason


def test_gate_leaves_random_data_for_timing():
    w = workload(4, 40, 8)
    runner = registry.get("torch-trim").make(w, "torch")
    runner.plan()
    gate.check(runner, w)
    fresh = workload(4, 40, 8)
    assert torch.equal(w.q, fresh.q) and torch.equal(w.k_store, fresh.k_store)


@pytest.mark.parametrize("name,qo,kv,must", [
    ("planted-wide", 1, 6, True), ("planted-wide", 1, 5, False),   # W = 4: the 6th key is the first outside
    ("planted-narrow", 1, 5, True), ("planted-narrow", 1, 4, False),
    ("planted-future", 2, 9, True), ("planted-future", 1, 9, False),  # decode has no future key
    ("torch-trim", 4, 50, False),
])
def test_must_fail_is_where_the_visible_set_changes(name, qo, kv, must):
    c = axes.make_case(dict(mode="verify", qo_len=qo, seq_len=kv, window_left=4))
    assert registry.get(name).must_fail(c, [qo], [kv], "fa2") == must


@pytest.mark.parametrize("queries,group,block", [(64, 4, 256), (16, 4, 128), (32, 4, 128), (100, 4, 512),
                                                  (127, 1, 128), (128, 4, 128), (8192, 4, 128),
                                                  (32, 5, 128), (64, 6, 128)])
def test_flex_query_block_holds_what_the_decoding_kernel_packs(queries, group, block):
    from swabench.impls.flex import q_block_size
    assert q_block_size(queries, group) == block


@pytest.mark.slow
def test_flex_runs_a_decode_batch_with_a_grown_query_block():
    c = axes.make_case(dict(mode="decode", batch_size=40, prefix_len=30, window_left=7, num_qo_heads=8,
                                 num_kv_heads=2, head_dim=64, dtype="float32", page_size=4))
    runner = registry.get("flex-flat").make(workloads.build(c), "flex")
    runner.plan()
    assert runner.block_mask.BLOCK_SIZE == (256, 128)
    assert gate.check(runner, runner.w).passed


def _point(name, w):
    from swabench.core.cases import Point
    return Point(w.case, name, "torch")


def test_an_xpass_says_the_library_changed_where_the_gate_fails_the_predicted_output(monkeypatch):
    """A known mistake whose output comes out exact: the gate fails what its mistake predicts, so the path no longer
    computes it (the library changed)."""
    import dataclasses
    from swabench.run import sweep

    w = workload(4, 40, 8)
    fixed = dataclasses.replace(registry.get("planted-wide"), make=registry.get("torch-trim").make)
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: fixed if name == "planted-wide" else real(name))
    row = sweep.measure_point(_point("planted-wide", w), w, sweep.SweepOptions(torch.device("cpu"), timed=False), None)
    assert row["status"] == "xpass" and row["must_fail"]
    assert row["reason"].startswith("KNOWN BUG NOT CAUGHT: the library changed"), row["reason"]


def test_an_xpass_says_the_gate_is_blind_where_it_passes_the_predicted_output_too(monkeypatch):
    import dataclasses
    from swabench.impls import embedded
    from swabench.run import sweep

    w = workload(4, 40, 8)
    fixed = dataclasses.replace(registry.get("planted-wide"), make=registry.get("torch-trim").make)
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: fixed if name == "planted-wide" else real(name))

    def exact(impl, w, backend):  # a prediction the gate cannot tell from the exact output
        runner = fixed.make(w, "torch")
        runner.plan()
        return runner

    monkeypatch.setattr(embedded, "as_predicted", exact)
    row = sweep.measure_point(_point("planted-wide", w), w, sweep.SweepOptions(torch.device("cpu"), timed=False), None)
    assert row["status"] == "xpass"
    assert row["reason"].startswith("KNOWN BUG NOT CAUGHT: the gate is blind here"), row["reason"]


def test_an_xpass_of_rows_predicted_out_of_step_says_the_library_changed(monkeypatch):
    """A path predicted to write rows out of step (``garbled``) whose output came out right: nothing it could see
    gives that output, so the library changed."""
    import dataclasses
    from swabench.run import sweep

    w = workload(4, 40, 8)
    out_of_step = dataclasses.replace(registry.get("planted-wide"), make=registry.get("torch-trim").make,
                                      visibility=implementation.exact,
                                      garbled=lambda c, qo, kv, b: [torch.ones(q, dtype=torch.bool) for q in qo])
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: out_of_step if name == "planted-wide" else real(name))
    row = sweep.measure_point(_point("planted-wide", w), w, sweep.SweepOptions(torch.device("cpu"), timed=False), None)
    assert row["must_fail"] and row["status"] == "xpass"
    assert "the library changed (predicted to write rows out of step" in row["reason"], row["reason"]


def test_the_output_predicted_for_a_path_that_drops_sinks_is_the_output_without_them():
    """paged-sinks-dropped's predicted output is attention without the sink term: the gate fails it on a case with
    sinks (so an xpass there is the library's change, not a blind gate)."""
    from swabench.impls.embedded import as_predicted

    w = workload(4, 40, 8, sinks=True)
    impl = registry.get("paged-sinks-dropped")
    assert not gate.check(as_predicted(impl, w, "fa2"), w).passed
    assert gate.check(as_predicted(registry.get("torch-trim"), w, "torch"), w).passed
