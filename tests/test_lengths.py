"""Heterogeneous batches: per-request lengths drawn from a distribution or given as a list, the
same way in every process, checked before any work, and carried through workload, gate and table."""

import pytest
import torch
from conftest import shipped

from swabench.core import gate, workloads
from swabench.inputs import axes
from swabench.core.cases import draw_lengths, length_bound, parse_length
from swabench.impls import registry


@pytest.mark.parametrize("value,lo,want", [(5, 0, 5), ([3, 4, 5], 0, (3, 4, 5)), ("uniform:2:9", 1, "uniform:2:9"),
                                           ("lognormal:100:0.5", 1, "lognormal:100:0.5")])
def test_length_forms(value, lo, want):
    assert parse_length(value, lo) == want


@pytest.mark.parametrize("value", [-1, "uniform:9:2", "uniform:0:5", "lognormal:0:1", "lognormal:10:4", [], [1, -2],
                                   "normal:1:2", True, 2.5])
def test_bad_length_forms_are_refused(value):
    with pytest.raises(ValueError, match="'uniform:LO:HI', 'lognormal:MEDIAN:SIGMA' or a list"):
        parse_length(value, 1)


def test_draws_are_deterministic_and_bounded():
    a = draw_lengths("uniform:10:20", 1000, seed=3, salt=1)
    assert a == draw_lengths("uniform:10:20", 1000, seed=3, salt=1) != draw_lengths("uniform:10:20", 1000, 4, 1)
    assert min(a) == 10 and max(a) == 20
    b = draw_lengths("lognormal:1000:1.0", 5000, seed=0, salt=2)
    assert 1 <= min(b) and max(b) <= length_bound("lognormal:1000:1.0")
    assert 900 < sorted(b)[2500] < 1100  # the median is the median
    assert draw_lengths((3, 4, 5), 3, 0, 1) == [3, 4, 5]


def case(**kw):
    return axes.make_case({**dict(mode="extend", window_left=4, num_qo_heads=4, num_kv_heads=4, head_dim=64,
                                       batch_size=3, page_size=16), **kw})


def test_a_per_request_batch_reaches_the_workload_and_the_table():
    c = case(extend_len=(6, 8, 12), prefix_len=0)
    w = workloads.build(c)
    assert w.qo_lens == [6, 8, 12] and w.kv_lens == [6, 8, 12]
    row = c.axes()
    assert row["length_dist"] == "qo_len=[6,8,12]" and row["qo_len"] is None and row["prefix_len"] == 0
    d = case(extend_len=2, prefix_len="uniform:3:40", seed=7)
    assert workloads.build(d).kv_lens == [p + 2 for p in d.drawn("prefix_len")]
    assert "p~uniform:3:40" in d.label and d.axes()["length_dist"] == "prefix_len=uniform:3:40"


def test_uniform_cases_keep_their_ids_and_lists_get_their_own():
    assert case(extend_len=2, prefix_len=3).case_id == "f7b8f8eabb96"  # its id before per-request lengths existed
    assert case(extend_len=2, prefix_len=(3, 3, 3)).case_id != case(extend_len=2, prefix_len=3).case_id


@pytest.mark.parametrize("name", ["torch-trim", "torch-mask", "planted-wide"])
@pytest.mark.parametrize("lengths", [dict(extend_len=(6, 8, 12), prefix_len=0), dict(extend_len=2, prefix_len=(3, 4, 5)),
                                     dict(extend_len="uniform:1:9", prefix_len="lognormal:20:0.5")])
def test_the_gate_works_request_by_request(name, lengths):
    w = workloads.build(case(**lengths))
    runner = registry.get(name).make(w, "torch")
    runner.plan()
    result = gate.check(runner, w)
    must = registry.get(name).must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    assert result.passed is not must, result.reason


def test_the_uniform_hint_goes_only_to_batches_of_one_query_count(monkeypatch):
    import sys
    import types
    planned = {}

    class Wrapper:
        def __init__(self, *args, **kwargs):
            pass

        def plan(self, *args, uniform_q_len=None, **kwargs):
            planned["hint"] = uniform_q_len

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=Wrapper))
    from swabench.impls import flashinfer_impls as fi
    from swabench.impls import flashinfer_workspace as ws
    monkeypatch.setattr(ws, "_allocate", lambda device, n: torch.empty(n, dtype=torch.uint8, device="meta"))
    monkeypatch.setattr(ws, "_shared", {})
    for lengths, hint in ((dict(extend_len=(6, 8, 12), prefix_len=0), None), (dict(extend_len=2, prefix_len=(3, 4, 5)), 2)):
        runner = fi.FlashInferRunner(workloads.build(case(**lengths)), "fa2", fi.Variant("paged"))
        runner.plan()
        assert planned["hint"] == hint


@pytest.mark.parametrize("shape,message", [
    (dict(extend_len=(6, 8), prefix_len=0), "extend_len: 2 per-request values for batch_size 3"),
    (dict(mode="verify", draft_tokens=4, seq_len=(9, 3, 9)), "draft_tokens: request 1 has 4 queries but seq_len 3"),
    (dict(mode="verify", draft_tokens=8, seq_len="uniform:2:20", batch_size=4), "queries but seq_len"),
    (dict(mode="draft_extend", draft_tokens="uniform:1:4", prefix_len=9), "draft block is one size"),
    (dict(mode="decode", qo_len="uniform:1:2", prefix_len=9), "decode has exactly one query"),
])
def test_per_request_mistakes_name_the_field(shape, message):
    with pytest.raises(axes.ScenarioError, match=message):
        case(**shape)


def test_sglang_regression_batches_are_in_edges():
    s = shipped("edges")
    labels = {c.label for c in s.cases}
    assert any("p0 q[6,8,12] W4" in label for label in labels) and any("p[3,4,5] q2 W4" in label for label in labels)


def test_the_memory_estimate_sums_a_drawn_mix_rather_than_its_bound():
    from swabench.core import footprint
    mix = case(mode="decode", prefix_len="lognormal:8192:1.0", batch_size=256)
    bound = case(mode="decode", prefix_len=mix.largest()[1] - 1, batch_size=256)
    assert footprint.footprint(mix, "cuda").kv_bytes < footprint.footprint(bound, "cuda").kv_bytes / 10


def test_a_long_per_request_list_shows_as_its_count_and_range():
    c = case(mode="decode", prefix_len=tuple(range(100, 132)), batch_size=32)
    assert f"p[32 of 100..131 sum {sum(range(100, 132))}]" in c.label and "p[3,4,5]" in case(extend_len=2, prefix_len=(3, 4, 5)).label
