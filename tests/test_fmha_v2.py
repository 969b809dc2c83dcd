"""TRT-LLM's fmha v2 through FlashInfer (impls.fmha_v2), held on the repro stand-in: the paged cache as separate K
and V halves of one allocation with block tables [batch, 2, pages] (V's rows offset by the pool's page count), each
request's lengths as cumulative sums, the window as FlashInfer's window_left and the chunk by its size; the cases it
cannot run are skipped, saying why."""

import pytest
import torch
from conftest import standin_calls

from swabench.core import workloads
from swabench.impls import registry
from swabench.inputs import axes


def case(**kw):
    base = dict(mode="verify", draft_tokens=4, prefix_len=(30, 13), window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="bfloat16", batch_size=2, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def call_of(name, c):
    w = workloads.build(c)
    [(_, method, args, kwargs)] = standin_calls(name, w, "fmha-v2")
    assert method == "trtllm_fmha_v2_prefill"
    return w, args, kwargs


def test_the_window_call_reads_k_and_v_through_one_pool():
    w, args, kwargs = call_of("fmha-v2-window", case())
    (q, (k, v)), layout, workspace, seq_lens, max_q, max_kv, scale, v_scale, batch, cum_q, cum_kv = args
    assert q is w.q and k is w.k_store and v is w.v_store and layout == "Q_PAGED_KV_NHD"
    assert (max_q, max_kv, scale, v_scale, batch) == (4, 34, w.sm_scale, 1.0, 2)
    assert cum_q.tolist() == [0, 4, 8] and cum_kv.tolist() == [0, 34, 51] and seq_lens.tolist() == [34, 17]
    tables, pool = kwargs["block_tables"], w.k_store.shape[0]
    assert tables.shape == (2, 2, 3) and tables.dtype == torch.int32
    for b in range(2):
        first, last = int(w.kv_indptr_host[b]), int(w.kv_indptr_host[b + 1])
        pages = w.kv_indices_host[first:last].tolist()
        assert tables[b, 0, :len(pages)].tolist() == pages
        assert tables[b, 1, :len(pages)].tolist() == [p + pool for p in pages]  # V is the allocation's second half
        assert not tables[b, :, len(pages):].any()  # the padding past a request's pages
    assert w.v_store.data_ptr() - w.k_store.data_ptr() == w.k_store.numel() * w.k_store.element_size()
    assert kwargs["mask_mode"] == "sliding_window" and kwargs["window_left"] == 5 and kwargs["out"] is not q


def test_the_chunked_call_gives_the_chunk():
    _, _, kwargs = call_of("fmha-v2-chunked", case(window_left=None, attention_chunk=16))
    assert kwargs["mask_mode"] == "chunked" and kwargs["chunked_attention_size"] == 16 and "window_left" not in kwargs


def test_sinks_go_through():
    w, _, kwargs = call_of("fmha-v2-window", case(sinks=True))
    assert kwargs["sinks"] is w.sinks and w.sinks.dtype == torch.float32


@pytest.mark.parametrize("name, fields, says", [
    ("fmha-v2-window", dict(page_size=12), "power-of-two size"),
    ("fmha-v2-window", dict(logits_soft_cap=30.0), "no soft-cap"),
    ("fmha-v2-window", dict(causal=False), "takes causal windows only"),
    ("fmha-v2-window", dict(window_left=None, attention_chunk=16), "takes no chunked attention"),
    ("fmha-v2-chunked", dict(window_left=None, attention_chunk=24), "power-of-two chunk"),
    ("fmha-v2-window", dict(mode="decode", draft_tokens=None), "models extend and verify and draft_extend steps"),
])
def test_fmha_v2_says_where_it_cannot_run(name, fields, says):
    reason = registry.get(name).skip_reason(case(**fields), "fmha-v2", None)
    assert reason and says in reason, reason


@pytest.mark.parametrize("head_dim, runs", [(96, True), (104, True), (72, False)])
def test_fmha_v2_takes_the_head_dims_its_sm90_kernels_are_built_for(head_dim, runs):
    reason = registry.get("fmha-v2-window").skip_reason(case(head_dim=head_dim), "fmha-v2", None)
    assert (reason is None) is runs, reason


def test_fmha_v2_is_asked_for_by_name():
    assert registry.get("fmha-v2-window").runs_on(["fa2", "fa3", "auto"]) == []
    assert registry.get("fmha-v2-window").runs_on(["fa2", "fmha-v2"]) == ["fmha-v2"]
