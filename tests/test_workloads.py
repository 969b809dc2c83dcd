import pytest
import torch

from swabench import scenarios, workloads


def case(**kw):
    base = dict(mode="verify", draft_tokens=4, prefix_len=37, window_left=8, num_qo_heads=4,
                num_kv_heads=2, head_dim=16, dtype="float32", batch_size=5)
    merged = {**base, **kw}
    return scenarios.make_case({k: v for k, v in merged.items() if v is not None})


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("layout", ["scattered", "contiguous"])
def test_paged_gather_round_trips(page_size, layout):
    w = workloads.build(case(page_size=page_size, page_layout=layout))
    # write position-coded keys through the page table, read them back per request
    coded = torch.arange(max(w.kv_lens), dtype=torch.float32)[:, None, None].expand(-1, 1, 16)
    values = torch.randn(sum(w.kv_lens), 2, 16)
    w.write_kv(coded, values)
    row = 0
    for b, kv in enumerate(w.kv_lens):
        assert torch.equal(w.keys(b)[:, 0, 0], torch.arange(kv, dtype=torch.float32))
        assert torch.equal(w.values(b), values[row:row + kv])
        row += kv
    # the page table itself: every page used once, last pages partly filled
    pages = w.kv_indices_host.tolist()
    assert sorted(pages) == list(range(w.k_store.shape[0]))
    assert (pages == sorted(pages)) == (layout == "contiguous" or len(pages) == 1)
    last = w.kv_last_page_len.tolist()
    for b, kv in enumerate(w.kv_lens):
        n = int(w.kv_indptr_host[b + 1] - w.kv_indptr_host[b])
        assert (n - 1) * page_size + last[b] == kv and 1 <= last[b] <= page_size


def test_ragged_store_is_request_major():
    w = workloads.build(case(storage="ragged"))
    assert w.kv_indices is None and w.k_store.shape[0] == sum(w.kv_lens)
    assert torch.equal(w.keys(1), w.k_store[w.kv_lens[0]:w.kv_lens[0] + w.kv_lens[1]])


def test_draft_extend_lengths_are_drawn_per_request_and_reproducible():
    c = case(mode="draft_extend", draft_tokens=8, accept="uniform", batch_size=64, seq_len=100, prefix_len=None)
    qo, kv = workloads.request_lengths(c)
    assert all(1 <= q <= 8 for q in qo) and len(set(qo)) > 1
    assert kv == [100] * 64  # prefix = seq_len - accepted
    assert (qo, kv) == workloads.request_lengths(c)
    other = workloads.request_lengths(scenarios.make_case({**_raw(c), "seed": 1}))
    assert other[0] != qo


def _raw(c):
    return dict(mode=c.mode, draft_tokens=c.qo_len, accept=c.accept, batch_size=c.batch_size,
                seq_len=c.seq_len, window_left=c.window_left, num_qo_heads=4, num_kv_heads=2,
                head_dim=16, dtype="float32")


@pytest.mark.parametrize("spec,check", [
    ("full", lambda qo: qo == [6] * 200),
    ("fixed:2", lambda qo: qo == [2] * 200),
    ("geometric:0.5", lambda qo: min(qo) == 1 and max(qo) <= 6 and 1.6 < sum(qo) / len(qo) < 2.4),
])
def test_accept_distributions(spec, check):
    assert check(workloads.draw_accept_lengths(spec, 6, 200, seed=3))


def test_fill_random_is_deterministic_and_not_zero():
    w = workloads.build(case())
    q0 = w.q.clone()
    w.fill_random(0)
    assert torch.equal(q0, w.q) and w.q.abs().sum() > 0 and w.k_store.std() > 0.5
