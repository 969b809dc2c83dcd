"""What each FlashInfer implementation hands to plan(), checked on the CPU against a stand-in
wrapper (the kernels themselves run in tests/test_gpu.py on the H200)."""

import sys
import types

import pytest
import torch

from swabench import scenarios, semantics, workloads
from swabench.impls import flashinfer_impls as fi
from swabench.impls import registry


class FakeWrapper:
    def __init__(self, workspace, layout, backend="auto", **bufs):
        self.bufs, self._backend = bufs, backend

    def plan(self, *args, uniform_q_len=None, **kwargs):
        self.args, self.kwargs = args, {**kwargs, "uniform_q_len": uniform_q_len}


@pytest.fixture(autouse=True)
def fake_flashinfer(monkeypatch):
    module = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=FakeWrapper,
                                   BatchPrefillWithRaggedKVCacheWrapper=FakeWrapper)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    fi._workspace.cache_clear()
    monkeypatch.setattr(fi, "_workspace", lambda device: torch.empty(0))


def planned(impl, mode="verify", **kw):
    storage = registry.get(impl).storages[0]
    raw = {**dict(mode=mode, qo_len=4, prefix_len=100, window_left=31, page_size=16, num_qo_heads=4,
                  num_kv_heads=2, head_dim=64, dtype="bfloat16", batch_size=3, storage=storage,
                  accept="uniform"), **kw}
    c = scenarios.make_case({k: v for k, v in raw.items() if v is not None})
    w = workloads.build(c)
    runner = registry.get(impl).make(w, "fa2")
    runner.plan()
    return runner.wrapper, w


def test_window_at_plan_and_the_uniform_hint():
    wrapper, w = planned("paged-window")
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is True
    assert wrapper.kwargs["uniform_q_len"] == 4 and wrapper.bufs["use_cuda_graph"] is True
    wrapper, _ = planned("paged-window", mode="draft_extend", qo_len=None, draft_tokens=8, batch_size=16)
    assert wrapper.kwargs["uniform_q_len"] is None  # drawn acceptance lengths: not uniform


def test_trim_hands_over_the_trimmed_page_table():
    wrapper, w = planned("paged-trim")
    qo_indptr, indptr, indices, last = wrapper.args
    starts = [semantics.trim_start(k, q, 31, 16) for q, k in zip(w.qo_lens, w.kv_lens)]
    expect = workloads.trim_page_table(w.kv_indptr_host, w.kv_indices_host, w.kv_lens, starts, 16)
    assert torch.equal(indptr, expect[0].to(torch.int32)) and torch.equal(indices, expect[1].to(torch.int32))
    assert int(indptr[-1]) < int(w.kv_indptr_host[-1]) and wrapper.kwargs["window_left"] == 31


def test_known_bugs_plan_without_a_window():
    wrapper, _ = planned("paged-plan-no-window")
    assert wrapper.kwargs["window_left"] == -1
    wrapper, w = planned("paged-trim-causal")
    assert wrapper.kwargs["window_left"] == -1
    starts = [semantics.buggy_trim_start(k - q, 31, 16) for q, k in zip(w.qo_lens, w.kv_lens)]
    assert int(wrapper.args[1][-1]) == int(workloads.trim_page_table(
        w.kv_indptr_host, w.kv_indices_host, w.kv_lens, starts, 16)[0][-1])


@pytest.mark.parametrize("impl", ["paged-mask", "ragged-mask"])
def test_mask_paths_hand_over_the_exact_mask(impl):
    wrapper, w = planned(impl)
    mask = wrapper.kwargs["custom_mask"]
    assert "window_left" not in wrapper.kwargs and wrapper.kwargs["causal"] is False
    assert torch.equal(mask, semantics.custom_mask(w.qo_lens, w.kv_lens, semantics.Visibility(31)))
    assert wrapper.bufs["custom_mask_buf"].numel() == semantics.packed_mask_bytes(w.qo_lens, w.kv_lens)
