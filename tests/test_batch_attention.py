"""The persistent holistic kernel (BatchAttention, impls.batch_attention), held on the repro stand-in: its plan()
takes no window, so the table is trimmed to the window's first page and planned causal; that is exact on decode at
page size 1 and wrong elsewhere exactly where a query sees keys before its own window, which the gate is told."""

import pytest
from conftest import standin_calls

from swabench.core import semantics, workloads
from swabench.impls import registry
from swabench.inputs import axes


def case(**kw):
    base = dict(mode="verify", draft_tokens=4, prefix_len=(30, 13), window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="bfloat16", batch_size=2, page_size=4)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def test_the_plan_is_causal_on_the_trimmed_table():
    w = workloads.build(case())
    calls = standin_calls("batch-attention-trim", w, "fa2")
    (_, _, _, built), (_, _, (name, space), _), (_, _, planned, shape), (_, _, ran, ran_kw) = calls
    assert built == {"kv_layout": "NHD", "device": w.device}
    assert name == "float_workspace_buffer" and space.numel() == 256 << 20  # the shared workspace, as every wrapper's
    qo_indptr, indptr, indices, kept = planned[:4]
    starts = [semantics.trim_start(k, q, 5, 4) for q, k in zip(w.qo_lens, w.kv_lens)]
    assert kept.tolist() == [k - s for k, s in zip(w.kv_lens, starts)] and starts == [24, 8]
    assert indices.tolist() == w.kv_indices_host[6:9].tolist() + w.kv_indices_host[9 + 2:9 + 5].tolist()
    assert planned[4:9] == (8, 2, 64, 64, 4) and shape["causal"] and "window_left" not in shape
    assert ran[0] is w.q and ran_kw["out"].shape == w.q.shape


@pytest.mark.parametrize("fields, must", [
    (dict(mode="decode", draft_tokens=None, page_size=1), False),  # the trim is the window
    (dict(mode="decode", draft_tokens=None, page_size=16, prefix_len=(40, 30)), True),  # the page's earlier keys
    (dict(), True),  # a block of queries: the later ones see keys before their windows
    (dict(window_left=100), False),  # a window past every request: nothing trimmed, nothing extra
])
def test_it_must_fail_where_the_trim_is_not_the_window(fields, must):
    c = case(**fields)
    w = workloads.build(c)
    impl = registry.get("batch-attention-trim")
    assert impl.must_fail(c, w.qo_lens, w.kv_lens, "fa2") is must and impl.timed_where_exact


def test_it_models_a_sliding_window_layer():
    reason = registry.get("batch-attention-trim").skip_reason(case(window_left=-1), "fa2", None)
    assert reason and "sliding-window layer" in reason


def test_the_float_workspace_grows_once_where_the_planner_reserves_more_than_384_mib(monkeypatch):
    import sys
    import types

    import torch

    from swabench.impls.flashinfer_workspace import MIB

    plans = []

    class Holistic:  # reserves 622 MB of partial outputs, as at Gemma 3 27B's 16 KV heads on the H200
        def __init__(self, kv_layout, device):
            self.float_workspace_buffer = torch.empty(384 * MIB, dtype=torch.uint8, device="meta")

        def plan(self, *args, **kwargs):
            plans.append(self.float_workspace_buffer.numel())
            if self.float_workspace_buffer.numel() < 622854144:
                raise RuntimeError("Buffer overflow when allocating memory for holistic_partial_o with size 622854144 "
                                   "... Increase the workspace buffer size.")

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchAttention=Holistic))
    monkeypatch.setattr("swabench.impls.flashinfer_workspace._shared", {})
    monkeypatch.setattr("swabench.impls.flashinfer_workspace._allocate",
                        lambda device, n: torch.empty(n, dtype=torch.uint8, device="meta"))
    runner = registry.get("batch-attention-trim").make(workloads.build(case()), "fa2")
    runner.plan()
    assert runner.workspace_mib == 1024 and plans == [256 * MIB, 512 * MIB, 1024 * MIB]
    runner.plan()  # a timed re-plan keeps the size it found
    assert plans[3:] == [1024 * MIB]


def test_the_requests_past_2_to_the_32_elements_are_those_whose_trimmed_pages_end_there():
    """The holistic kernel's page offset is int32 x uint32 in 32 bits: a request is hit where a page of its trimmed
    table ends past 2^32 elements of the cache, counted here page by page from the case's own page table."""
    from swabench.impls import batch_attention

    def brute(c):
        qo, kv = workloads.request_lengths(c)
        indptr, indices, *_ = workloads.page_table(c, qo, kv)
        stride = c.page_size * c.num_kv_heads * c.head_dim
        hit = []
        for b, (q, k) in enumerate(zip(qo, kv)):
            first = semantics.trim_start(k, q, c.window_left, c.page_size) // c.page_size
            pages = indices[int(indptr[b]) + first:int(indptr[b + 1])].tolist()
            hit += [b] if any((p + 1) * stride > 2 ** 32 for p in pages) else []
        return hit

    gemma = dict(mode="decode", draft_tokens=None, num_qo_heads=32, num_kv_heads=16, head_dim=128, window_left=1023,
                 page_size=1)
    past = case(**gemma, batch_size=128, prefix_len=16384)  # 2,097,280 pages of 2048 elements: 128 past 2^32
    assert batch_attention.wrapped_requests(past) == brute(past) and 0 < len(brute(past)) < 128
    below = case(**gemma, batch_size=64, prefix_len=16384)  # half the pages: none reaches 2^32
    assert batch_attention.wrapped_requests(below) == brute(below) == []
    paged = case(**{**gemma, "page_size": 16}, batch_size=128, prefix_len=16384)  # the same bytes in pages of 16
    assert batch_attention.wrapped_requests(paged) == brute(paged) != []


def test_the_offset_bug_is_declared_where_the_trim_is_exact_and_left_to_the_known_bug_elsewhere():
    from swabench.impls import upstream
    from swabench.run.sweep import verdict

    exact = case(mode="decode", draft_tokens=None, num_qo_heads=32, num_kv_heads=16, head_dim=128, window_left=1023,
                 page_size=1, batch_size=128, prefix_len=16384)
    bug = upstream.hit("batch-attention-trim", exact, "fa2")
    assert bug and bug.ref == "holistic-offset" and upstream.hit("decode-tc-trim", exact, "fa2") is None
    assert upstream.speaks("batch-attention-trim", exact, "fa2", must_fail=False) is bug
    assert upstream.speaks("batch-attention-trim", exact, "fa2", must_fail=True) is None  # its own mistake first
    assert upstream.hit("batch-attention-trim", case(mode="decode", draft_tokens=None, page_size=1), "fa2") is None
    assert verdict(True, False, False, bug) == ("xfail", f"upstream bug holistic-offset: {bug.summary}")
    assert verdict(True, False, True, bug) == ("pass", "holistic-offset declared here, not shown")
    assert verdict(True, True, False, bug) == ("xfail", "known bug caught")  # its own mistake speaks first
    assert verdict(True, False, False) == ("fail", "failed where its known bug should not show")


def test_the_offset_script_makes_the_suites_calls_and_its_control_renumbers_the_same_pages():
    from string import Template

    from swabench.repro import bugs, holistic, make, script, verify

    text, parts = make.for_bug("holistic-offset")
    lines = text.splitlines()
    assert len(lines) <= 80 and max(map(len, lines)) <= 118
    said = " ".join(text.split('"""')[1].split())
    assert "Where: the request's 128 pages are the cache's last, from page 4194304" in said
    assert "Needs: 16.0 GiB of GPU memory" in said
    assert "FlashInfer bug: prefetch_offest in include/flashinfer/attention/persistent.cuh:66" in said
    assert "first = 2**32 // (8 * 128)" in text and "window" not in text.split('"""')[2]
    paragraph = make.issue_body("holistic-offset", text, "holistic-offset.py", []).split("\n\n")[1]
    assert "The script needs 16.0 GiB of GPU memory" in paragraph  # the memory a maintainer must have, said up front
    header = script.Header("t")
    original = holistic.MAIN
    for old, new in [("causal=True", "causal=False"), ("sm_scale=$scale", "sm_scale=1.0"),
                     ("(0, True)", "(1, True)"), ("logits_soft_cap=0.0", "logits_soft_cap=1.0")]:
        holistic.MAIN = Template(original.template.replace(old, new, 1))
        try:
            with pytest.raises(verify.Drift):
                holistic.check(parts, header)
        finally:
            holistic.MAIN = original
    holistic.check(parts, header)
    assert bugs.get("holistic-offset").impl == "batch-attention-trim"


def test_the_findings_credit_a_declared_bug_not_the_known_mistake_where_it_speaks():
    import pandas as pd

    from swabench.publish.sections import repros
    from swabench.publish.sections.base import Run

    table = pd.DataFrame({
        "impl": ["batch-attention-trim", "batch-attention-trim", "paged-trim"],
        "kind": ["known-bug", "known-bug", "correct"], "status": ["xfail", "xfail", "xfail"],
        "upstream": [None, "holistic-offset", "flashinfer#4972"], "mode": ["decode"] * 3,
        "median_us": [float("nan")] * 3})
    found = repros.caught([Run("run", table, {})])
    assert set(found) == {"batch-attention-trim", "holistic-offset", "flashinfer#4972"}
    assert repros.caught([Run("run", table.iloc[1:2], {})]) == {"holistic-offset": ["`run`"]}
