import pytest
import torch
from conftest import shipped

from swabench.core import footprint, workloads
from swabench.inputs import axes


def case(**kw):
    base = dict(mode="verify", draft_tokens=4, prefix_len=37, window_left=8, num_qo_heads=4,
                num_kv_heads=2, head_dim=16, dtype="float32", batch_size=5)
    merged = {**base, **kw}
    return axes.make_case({k: v for k, v in merged.items() if v is not None})


def absurd(**kw):
    """A Case past the limits, made without make_case (which refuses it, as a scenario file should)."""
    import dataclasses
    qo = kw.pop("extend_len", None) or kw.pop("draft_tokens", None)
    kw.pop("draft_tokens", None)
    return dataclasses.replace(case(), **kw, **({"qo_len": qo} if qo else {}))


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
    other = workloads.request_lengths(axes.make_case({**_raw(c), "seed": 1}))
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


# ---------------------------------------------------------------- memory footprint, before allocation

def _held_bytes(w) -> int:
    """Bytes of every storage the workload holds, each once (ragged shares an indptr; paged K and V are one)."""
    import dataclasses
    seen = {}
    for f in dataclasses.fields(w):
        t = getattr(w, f.name)
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


FOOTPRINT_CASES = {
    "paged-scattered-ps16": case(),
    "paged-contiguous-ps1": case(page_size=1, page_layout="contiguous"),
    "ragged-extend": case(mode="extend", extend_len=8, draft_tokens=None, storage="ragged"),
    "paged-extend-ps1-gqa": case(mode="extend", extend_len=6, draft_tokens=None, page_size=1,
                                 num_qo_heads=8, num_kv_heads=1),
    "draft-extend": case(mode="draft_extend", draft_tokens=8, batch_size=16),
    "draft-extend-seq": case(mode="draft_extend", draft_tokens=8, seq_len=60, prefix_len=None, accept="full"),
    "decode": case(mode="decode", draft_tokens=None, window_left=-1),
    "decode-ragged-mha": case(mode="decode", draft_tokens=None, storage="ragged", num_kv_heads=4),
}


@pytest.mark.parametrize("name", FOOTPRINT_CASES)
def test_footprint_bounds_what_build_allocates(name):
    c = FOOTPRINT_CASES[name]
    w = workloads.build(c)
    held = _held_bytes(w) + w.q.nbytes  # the workload, plus one runner's output buffer
    qo, kv = w.qo_lens, w.kv_lens
    chunk = 8 * c.num_qo_heads * max(kv) * (2 * max(qo) + 2 * c.head_dim)  # the reference's largest chunk
    f = footprint.footprint(c)
    assert held <= f.device_bytes <= 3 * held + chunk, (held, f.device_bytes, chunk)
    assert f.kv_bytes == w.k_store.nbytes + w.v_store.nbytes
    from swabench.core import semantics
    dense = sum(q * k for q, k in zip(qo, kv)) + semantics.packed_mask_bytes(qo, kv)
    assert f.mask_bytes == dense if c.mode != "draft_extend" or c.accept == "full" else f.mask_bytes >= dense
    assert f.host_bytes >= 8 * (len(w.slots) + len(w.key_request) + len(w.key_position))
    assert footprint.footprint(c, "cuda").device_bytes < f.device_bytes  # float32 reference on a GPU
    assert footprint.impossible(c) is None


@pytest.mark.parametrize("axes,field", [
    (dict(batch_size=10**9), "batch_size 1000000000"),
    (dict(batch_size=1, prefix_len=10**12), "prefix_len 1000000000000"),
    (dict(batch_size=1, mode="extend", extend_len=3 * 10**9, draft_tokens=None), "extend_len 3000000000"),
    (dict(batch_size=1, seq_len=2**31, prefix_len=None), "seq_len 2147483648"),
])
def test_absurd_cases_are_refused_in_milliseconds(axes, field):
    import time
    c = absurd(**axes)
    started = time.perf_counter()
    f, reason = footprint.footprint(c), footprint.impossible(c)
    assert time.perf_counter() - started < 0.05
    assert f.device_bytes > 500 << 30  # no tensor made, yet the size is right
    assert field in reason and "int32" in reason, reason


def test_batch_of_a_billion_names_its_keys():
    reason = footprint.impossible(absurd(batch_size=10**9, prefix_len=40, draft_tokens=4))
    assert reason == ("batch_size 1000000000 x 44 keys (prefix_len 40 + draft_tokens 4) = 44000000000 keys: "
                      "more than the 2147483647 a FlashInfer page table can index (int32)")


def test_footprint_above_the_ceiling_is_impossible_within_int32():
    c = absurd(batch_size=8, prefix_len=200_000_000, num_qo_heads=64, num_kv_heads=64, head_dim=1024)
    reason = footprint.impossible(c)
    assert c.batch_size * (c.prefix_len + c.qo_len) < footprint.LIMITS.int32_index
    assert "ceiling" in reason and "head_dim 1024" in reason and "prefix_len 200000000" in reason, reason


def test_human_bytes_and_describe():
    assert footprint.human_bytes(512) == "512 B"
    assert footprint.human_bytes(1536 << 20) == "1.5 GiB"
    f = footprint.Footprint(device_bytes=int(1.2 * 2**30), host_bytes=0, mask_bytes=0, kv_bytes=2**30)
    assert f.describe() == "1.2 GiB on the device (K/V 1.0 GiB)"


@pytest.mark.parametrize("name", ["cpu", "quick", "edges", "default", "peers", "workspace", "serving"])
def test_shipped_cases_are_possible(name):
    for c in shipped(name).cases:
        assert footprint.impossible(c) is None, (c.label, footprint.impossible(c))


def test_make_case_refuses_what_can_never_run():
    with pytest.raises(axes.ScenarioError, match="batch_size 1000000000 x 41 keys"):
        case(batch_size=10**9)
