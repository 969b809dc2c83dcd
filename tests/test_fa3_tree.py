"""SGLang's FA3 backend on a sliding-window layer in EAGLE verify at topk > 1 (``sglang-fa3-tree``), held on stand-ins:
its one call bound to sglang-kernel 0.4.5's released ``flash_attn_with_kvcache`` argument by argument, its page table
against SGLang 0.5.17's construction transcribed line by line, and what the call computes, through a pure-torch FA3
that keeps the keys ``hopper/mask.h`` keeps, held to the depth-anchored window of the reference."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from swabench.core import gate, semantics, workloads
from swabench.impls import registry
from swabench.impls.tree_verify import full_prefix_mask
from swabench.inputs import axes

from conftest import bound
from test_fa3 import flash_attn_with_kvcache

TREE = "sglang-fa3-tree"


def case(**kw):
    base = dict(mode="verify", tree="eagle:3:3", draft_tokens=7, prefix_len=(30, 13), window_left=5, num_qo_heads=8,
                num_kv_heads=2, head_dim=64, dtype="bfloat16", batch_size=2, page_size=1)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


@pytest.fixture(autouse=True)
def no_device_to_wait_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the first call, made at plan


def install(monkeypatch, call) -> None:
    """``call`` as sgl_kernel.flash_attn.flash_attn_with_kvcache."""
    interface = types.ModuleType("sgl_kernel.flash_attn")
    interface.flash_attn_with_kvcache = call
    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_attn", interface)


def planned(c, monkeypatch, call):
    install(monkeypatch, call)
    w = workloads.build(c)
    runner = registry.get(TREE).make(w, "sgl-fa3")
    runner.plan()
    return w, runner


def sglang_swa_table(w):
    """SGLang 0.5.17's rows, transcribed: init_forward_metadata's target verify at topk > 1 (the prefix metadata and
    the expand table cut from the tree mask, flashattention_backend.py l.826-911), then
    _init_sliding_window_attn_spec_metadata (l.3226-3272) and prepare_swa_spec_page_table_triton's concatenation
    (kernels/ops/attention/metadata.py l.63-123)."""
    n, bs = w.qo_lens[0], w.batch_size
    req_to_token = workloads.block_tables(w.kv_indptr_host, w.kv_indices_host)
    seq_lens = torch.tensor(w.prefix_lens)
    custom_mask = full_prefix_mask(w.qo_lens, w.kv_lens, w.trees)  # spec_info.custom_mask (FULL_MASK)
    page_table = req_to_token[:, :int(seq_lens.max())]
    offsets = torch.arange(n).unsqueeze(0)
    cols = offsets.expand(bs, -1) + seq_lens.unsqueeze(1)
    cum_len = torch.nn.functional.pad(torch.cumsum((seq_lens + n).repeat_interleave(n), dim=0), (1, 0))[:-1]
    mask = custom_mask[(cols.repeat_interleave(n, dim=0) + cum_len[:, None]).view(1, -1)].view(-1, n)
    col_indices = offsets.expand(mask.shape[0], n)
    _, sort_order = torch.sort(torch.where(mask, col_indices, col_indices + n), dim=1)
    expand_table = req_to_token.gather(1, cols).repeat_interleave(n, dim=0).gather(1, sort_order)
    expand_lens = mask.sum(dim=1)
    table = torch.zeros(bs * n, page_table.shape[1] + expand_table.shape[1], dtype=torch.int32)
    for m in range(bs * n):
        a, b = int(seq_lens[m // n]), int(expand_lens[m])
        table[m, :a], table[m, a:a + b] = page_table[m // n, :a], expand_table[m, :b]
    return table, (seq_lens.repeat_interleave(n) + expand_lens).to(torch.int32)


def fa3(seen: list):
    """flash_attn_with_kvcache in pure torch: batch row r's queries over the first ``cache_seqlens[r]`` keys of its
    page table, query i at ``p = seqlen_k - seqlen_q + i`` keeping keys ``p - left .. p + right`` (-1: no bound;
    causal: right 0), as hopper/mask.h:118-133 does; soft-cap and sinks as the reference takes them.  Appends each
    row's visible K/V rows to ``seen``."""
    def call(q, k_cache, v_cache, page_table=None, cache_seqlens=None, cu_seqlens_q=None, softmax_scale=None,
             causal=False, window_size=(-1, -1), softcap=0.0, sinks=None, out=None, **rest):
        page_size, kv_heads, dim = k_cache.shape[1:]
        keys, values = k_cache.reshape(-1, kv_heads, dim).float(), v_cache.reshape(-1, kv_heads, dim).float()
        left, right = window_size[0], 0 if causal else window_size[1]
        group = q.shape[1] // kv_heads
        for r in range(len(cache_seqlens)):
            first, end, kv_len = int(cu_seqlens_q[r]), int(cu_seqlens_q[r + 1]), int(cache_seqlens[r])
            j = torch.arange(kv_len)
            rows = page_table[r, j // page_size].long() * page_size + j % page_size
            p = kv_len - (end - first) + torch.arange(end - first)
            keep = torch.ones(end - first, kv_len, dtype=torch.bool)
            if right >= 0:
                keep &= j[None, :] <= p[:, None] + right
            if left >= 0:
                keep &= j[None, :] >= p[:, None] - left
            seen.append([set(rows[k].tolist()) for k in keep])
            scores = torch.einsum("qhd,khd->hqk", q[first:end].float(),
                                  keys[rows].repeat_interleave(group, dim=1)) * softmax_scale
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            scores.masked_fill_(~keep, float("-inf"))
            if sinks is not None:
                scores = torch.cat([scores, sinks.float()[:, None, None].expand(-1, end - first, 1)], dim=-1)
            probs = torch.softmax(scores, dim=-1)[..., :kv_len]
            out[first:end] = torch.einsum("hqk,khd->qhd", probs,
                                          values[rows].repeat_interleave(group, dim=1)).to(out.dtype)
        return out
    return call


def test_the_tree_call_is_sglangs_one_call_a_draft_token(monkeypatch):
    """One row a draft token, max_seqlen_q 1, causal, (W, 0), no LSE (no cascade on a sliding-window layer), the
    row's key count prefix + depth + 1 and cu_seqlens_k_new their prefix sums, the table as SGLang builds it."""
    calls = []
    c = case(sinks=True, logits_soft_cap=30.0)
    w, runner = planned(c, monkeypatch, lambda *a, **k: calls.append(bound(flash_attn_with_kvcache, a, k)))
    runner.run()
    assert len(calls) == 2 and all(set(x) == set(calls[0]) for x in calls)  # the first call at plan, then the run
    call, rows = calls[-1], sum(w.qo_lens)
    assert call["q"] is w.q and call["k_cache"] is w.k_store and call["v_cache"] is w.v_store
    assert call["k"] is None and call["v"] is None and call["out"] is runner.out
    assert call["causal"] is True and call["window_size"] == (5, 0) and call["return_softmax_lse"] is False
    assert call["max_seqlen_q"] == 1 and call["cu_seqlens_q"].tolist() == list(range(rows + 1))
    depths = [d for t in w.trees for d in t.depths]
    prefixes = [p for p, q in zip(w.prefix_lens, w.qo_lens) for _ in range(q)]
    assert call["cache_seqlens"].tolist() == [p + d + 1 for p, d in zip(prefixes, depths)]
    assert call["cu_seqlens_k_new"].tolist() == [0, *torch.cumsum(call["cache_seqlens"], 0).tolist()]
    table, lens = sglang_swa_table(w)
    assert torch.equal(call["page_table"], table) and torch.equal(call["cache_seqlens"], lens)
    assert call["page_table"].dtype == call["cache_seqlens"].dtype == torch.int32
    assert call["softcap"] == 30.0 and call["softmax_scale"] == w.sm_scale and call["num_splits"] == 0
    assert call["ver"] == 3 and call["sinks"].dtype == torch.bfloat16


def test_each_row_is_its_requests_whole_prefix_then_its_ancestors_root_first(monkeypatch):
    w, runner = planned(case(), monkeypatch, lambda *a, **k: None)
    n = w.qo_lens[0]
    for b, tree in enumerate(w.trees):
        pages = w.kv_indices_host[int(w.kv_indptr_host[b]):int(w.kv_indptr_host[b + 1])]
        prefix = w.prefix_lens[b]
        for i in range(n):
            line = [s for s in range(n) if tree.ancestors()[i, s]]
            expected = [*pages[:prefix].tolist(), *pages[prefix:][line].tolist()]
            row = runner.page_table[b * n + i]
            assert row[:len(expected)].tolist() == expected and not row[len(expected):].any()


@pytest.mark.parametrize("fields", [dict(), dict(tree="chain"), dict(sinks=True), dict(window_left=2),
                                    dict(tree="[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]", window_left=1),
                                    dict(prefix_len=(3, 40), window_left=4)])
def test_what_fa3_keeps_in_each_row_is_the_window_by_depth_over_its_branch(fields, monkeypatch):
    """A window smaller than the prefix: each draft token sees exactly the keys of the reference's tree view (cached
    keys from prefix + depth - W on, its ancestors at depth >= depth - W, itself), and the output passes the gate."""
    seen = []
    c = case(**fields)
    w, runner = planned(c, monkeypatch, fa3(seen))
    seen.clear()
    runner.run()
    rows = [row for call_rows in seen for row in call_rows]
    for b, tree in enumerate(w.trees):
        q, k = w.qo_lens[b], w.kv_lens[b]
        truth = semantics.Visibility(c.window_left).mask(q, k, tree=tree)
        slots = w.request_slots(b)
        for i in range(q):
            assert rows[w.qo_indptr_host[b] + i] == set(slots[truth[i]].tolist()), (b, i)
    result = gate.check(runner, w)
    assert result.passed, result.reason


def test_the_trees_here_tell_the_depth_window_from_the_slot_window():
    """The control for the test above: on these trees a window measured from the slot sees other keys."""
    for fields in (dict(), dict(window_left=2)):
        c = case(**fields)
        w = workloads.build(c)
        assert any(semantics.differs(semantics.Visibility(c.window_left),
                                     semantics.Visibility(c.window_left, by_slot=True), q, k, t)
                   for q, k, t in zip(w.qo_lens, w.kv_lens, w.trees))


@pytest.mark.parametrize("fields, says", [
    (dict(page_size=16), "asserts page size 1"),
    (dict(window_left=-1), "cascade"),
    (dict(model="mistral-7b-v0.1"), "full attention"),
    (dict(head_dim=72), "head_dim 64, 96, 128, 192, 256"),
    (dict(dtype="float16", sinks=True), "sinks with bfloat16"),
    (dict(tree=None, draft_tokens=None, qo_len=4), "runs only cases with tree"),
    (dict(mode="extend", tree=None, draft_tokens=None, extend_len=8), "models verify steps"),
])
def test_where_sglang_does_not_run_a_tree_this_way_the_path_says_why(fields, says):
    assert says in registry.get(TREE).skip_reason(case(**fields), "sgl-fa3", None)


def test_the_tree_path_runs_on_sglangs_build_alone_and_the_one_call_paths_point_to_it():
    spec = registry.get(TREE)
    assert spec.storages == ("paged",) and spec.kind == "correct" and spec.modes == ("verify",)
    assert spec.runs_on(["fa2", "vllm-fa3", "sgl-fa3"]) == ["sgl-fa3"]
    assert spec.skip_reason(case(), "sgl-fa3", None) is None and spec.skip_reason(case(tree="chain"), "sgl-fa3", None) \
        is None
    assert TREE in registry.get("sglang-fa3").skip_reason(case(), "sgl-fa3", None)
