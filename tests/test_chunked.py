"""Chunked local attention (the `attention_chunk` axis, Llama 4's ``attention_chunk_size``): a query at
position p sees, causally, the keys of its own chunk, floor(p / C) * C through p.  The arithmetic, the
reference and the probes agree with that definition written out by brute force; every CPU path that takes
the axis passes the gate at every chunk edge; the natural mistake (the chunk planned as a window of C - 1
keys) and a chunk one key too long are caught exactly where they change what some query sees, at small and
large chunks; the paths that do not take chunks skip and say so."""

import pytest
from conftest import shipped
from hypothesis import given, settings
from hypothesis import strategies as st

from swabench.core import gate, probes, reference, semantics, workloads
from swabench.impls import registry
from swabench.inputs import axes
from swabench.inputs.axes import ScenarioError

CPU_PATHS = ["torch-trim", "torch-mask", "torch-batch", "flex-window", "flex-contiguous", "flex-flat"]
MISTAKES = ["planted-chunk-window", "planted-chunk-long"]


def case(**kw):
    base = dict(mode="verify", qo_len=6, prefix_len=40, attention_chunk=16, num_qo_heads=4, num_kv_heads=2,
                head_dim=64, dtype="float32", batch_size=3, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def gated(name, w):
    impl = registry.get(name)
    runner = impl.make(w, impl.library)
    runner.plan()
    return gate.check(runner, w)


def brute_force_visible(p: int, j: int, chunk: int) -> bool:
    return (p // chunk) * chunk <= j <= p


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 90), st.integers(1, 24))
def test_the_chunk_visibility_is_the_definition(qo, kv, chunk):
    qo = min(qo, kv)
    mask = semantics.Visibility(semantics.NO_WINDOW, chunk=chunk).mask(qo, kv)
    for i in range(qo):
        p = kv - qo + i
        assert [bool(x) for x in mask[i]] == [brute_force_visible(p, j, chunk) for j in range(kv)]
    pairs = sum(brute_force_visible(kv - qo + i, j, chunk) for i in range(qo) for j in range(kv))
    assert semantics.useful_pairs(qo, kv, semantics.NO_WINDOW, chunk=chunk) == pairs
    first_seen = min(j for i in range(qo) for j in range(kv) if brute_force_visible(kv - qo + i, j, chunk))
    assert semantics.window_keys(qo, kv, semantics.NO_WINDOW, chunk) == kv - first_seen
    assert semantics.trim_start(kv, qo, semantics.NO_WINDOW, chunk=chunk) == first_seen


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 30), st.integers(0, 50), st.integers(2, 20), st.sampled_from(["paged", "ragged"]))
def test_the_reference_masks_by_the_definition(qo, prefix, chunk, storage):
    import torch
    w = workloads.build(case(qo_len=qo, prefix_len=prefix, attention_chunk=chunk, storage=storage))
    got = reference.attention(w)
    row = 0
    for b, (q_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
        keys = w.keys(b, 0, kv_len).double().repeat_interleave(2, dim=1)
        values = w.values(b, 0, kv_len).double().repeat_interleave(2, dim=1)
        visible = torch.tensor([[brute_force_visible(kv_len - q_len + i, j, chunk) for j in range(kv_len)]
                                for i in range(q_len)])
        scores = torch.einsum("qhd,khd->hqk", w.queries(b).double(), keys) * w.sm_scale
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        torch.testing.assert_close(got[row:row + q_len], torch.einsum("hqk,khd->qhd", probs, values))
        row += q_len


def test_the_probes_sit_on_each_rows_own_chunk_start():
    names = [name for _, name, _ in probes.edges(semantics.NO_WINDOW, chunk=16)]
    assert names == ["before chunk", "chunk start", "future key", "diagonal"]
    w = workloads.build(case(qo_len=20, prefix_len=10, num_qo_heads=4))
    edge = probes.fill(w, 0, seed=0)
    # each row's logits peak where it is tuned: its chunk start, or the key just before it
    q = w.q.double()
    keys = w.keys(0, 0, w.kv_lens[0]).double()
    for t in range(w.qo_lens[0]):
        p = int(w.query_position[t])
        for h in range(4):
            name = probes.edge_name(semantics.NO_WINDOW, int(edge[t, h]), chunk=16)
            want = {"chunk start": p - p % 16, "before chunk": p - p % 16 - 1, "diagonal": p, "future key": p + 1}[name]
            if 0 <= want < w.kv_lens[0]:
                assert int((keys[:, h // 2] @ q[t, h]).argmax()) == want, (t, h, name)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 40), st.integers(0, 60), st.integers(1, 24), st.sampled_from(["paged", "ragged"]),
       st.sampled_from(CPU_PATHS))
@pytest.mark.slow
def test_every_cpu_path_passes_chunked_attention_on_random_shapes(qo, prefix, chunk, storage, name):
    result = gated(name, workloads.build(case(qo_len=qo, prefix_len=prefix, attention_chunk=chunk, storage=storage)))
    assert result.passed, result.reason


CHUNK_EDGES = [c for c in shipped("edges").cases if c.attention_chunk]


def test_edges_holds_chunk_edges_for_every_step():
    firsts = {(c.attention_chunk, c.prefix_len if c.prefix_len is not None else c.seq_len - 1) for c in CHUNK_EDGES}
    for chunk in (4, 16):
        assert {(chunk, chunk - 1), (chunk, chunk), (chunk, chunk + 1)} <= firsts
    assert {c.mode for c in CHUNK_EDGES} == {"verify", "extend", "decode"}
    crossing = [c for c in CHUNK_EDGES if c.prefix_len is not None
                and (c.prefix_len + c.qo_len - 1) // c.attention_chunk - c.prefix_len // c.attention_chunk >= 2]
    assert crossing  # a prefill that crosses two chunk starts


@pytest.mark.parametrize("c", CHUNK_EDGES[::6], ids=lambda c: c.label)
@pytest.mark.parametrize("name", ["torch-trim", "torch-mask", *MISTAKES])
def test_chunk_edges_pass_and_the_mistakes_are_caught_exactly_where_they_show(name, c):
    w = workloads.build(c)
    must = registry.get(name).must_fail(c, w.qo_lens, w.kv_lens, "fa2")
    result = gated(name, w)
    assert result.passed is not must, (must, result.reason)


@pytest.mark.parametrize("chunk,prefix,qo", [(8, 30, 5), (1024, 1020, 9), (8192, 8190, 4)])
@pytest.mark.parametrize("name", MISTAKES)
def test_the_mistakes_are_caught_at_small_and_large_chunks(name, chunk, prefix, qo):
    w = workloads.build(case(attention_chunk=chunk, prefix_len=prefix, qo_len=qo, batch_size=1, dtype="bfloat16",
                             head_dim=64))
    assert registry.get(name).must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
    result = gated(name, w)
    assert not result.passed and "probe (" in result.reason, result.reason


def test_a_chunk_as_a_window_is_right_only_where_every_query_ends_its_chunk():
    """Past the first chunk, a window of C - 1 keys is the chunk only for the query at its chunk's last position."""
    as_window = registry.get("planted-chunk-window")
    last = case(mode="decode", qo_len=None, prefix_len=31, batch_size=1)  # the query at 31 ends chunk 16..31
    assert not as_window.must_fail(last, [1], [32], "fa2")
    assert as_window.must_fail(case(mode="decode", qo_len=None, prefix_len=32, batch_size=1), [1], [33], "fa2")


def test_paths_without_chunks_skip_and_say_so():
    c = case()
    for impl in registry.all_implementations():
        if impl.models(c.storage, c.mode, c.features) and not impl.chunked:
            assert impl.skip_reason(c, (impl.backends or ("x",))[0], workloads.build(c).device) \
                == "takes no chunked attention (attention_chunk)", impl.name
    for name in ("planted-chunk-window", "planted-chunk-long", "chunk-virtual", "chunk-trim", "chunk-as-window"):
        impl = registry.get(name)  # no point of a chunk-only path on a case without chunks
        assert not impl.models("paged", "verify", frozenset()) and impl.models("paged", "verify", frozenset({"chunk"}))


def test_the_axis_is_exclusive_with_a_window_and_causal_and_keeps_every_other_case_id():
    with pytest.raises(ScenarioError, match="attention_chunk: 16 with window_left 15: a layer is chunked or sliding"):
        case(window_left=15)
    with pytest.raises(ScenarioError, match="causal: chunked attention is causal"):
        case(causal=False, sliding_window=-1)
    assert case(sliding_window=-1).case_id == case().case_id
    plain = axes.make_case(dict(mode="extend", extend_len=512, prefix_len=8192, window_left=127, batch_size=32,
                                num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", page_size=16))
    assert plain.case_id == "e0513591dc82"  # its id in the published runs, from before the axis
    assert case().label.startswith("verify b3 p40 q6 C16 ")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(0, 70), st.sampled_from([16, 32, 48]), st.sampled_from([1, 16]))
def test_the_virtual_batches_hold_each_querys_chunk_and_nothing_else(qo, prefix, chunk, page_size):
    """chunk-virtual's tables, read back as FlashInfer's causal kernel reads them (bottom-right aligned, no
    window), give every query exactly its chunk's keys, and the queries stay in place."""
    import torch
    from swabench.impls.chunked import VirtualBatch
    w = workloads.build(case(qo_len=qo, prefix_len=prefix, attention_chunk=chunk, page_size=page_size))
    v = VirtualBatch(w)
    assert sum(v.qo_lens) == sum(w.qo_lens) and v.q is w.q
    position_of_slot = {int(s): int(p) for s, p in zip(w.slots, w.key_position)}
    request_of_slot = {int(s): int(r) for s, r in zip(w.slots, w.key_request)}
    row = 0
    for i, (q_len, kv_len) in enumerate(zip(v.qo_lens, v.kv_lens)):
        pages = v.kv_indices_host[int(v.kv_indptr_host[i]):int(v.kv_indptr_host[i + 1])]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:kv_len]
        assert len(pages) == -(-kv_len // page_size) == len(set(pages.tolist()))
        assert int(v.kv_last_page_len[i]) == kv_len - (len(pages) - 1) * page_size
        for t in range(q_len):
            seen = slots[:kv_len - q_len + t + 1]  # causal, bottom-right aligned
            b, p = int(w.query_request[row + t]), int(w.query_position[row + t])
            assert {request_of_slot[int(s)] for s in seen} == {b}
            assert sorted(position_of_slot[int(s)] for s in seen) == list(range(p - p % chunk, p + 1))
        row += q_len


def test_chunk_trim_and_virtual_say_where_they_cannot_run():
    trim, virtual = registry.get("chunk-trim"), registry.get("chunk-virtual")
    inside = case(prefix_len=40, qo_len=6, dtype="bfloat16")  # queries 40..45: all in the chunk 32..47
    across = case(prefix_len=45, qo_len=6, dtype="bfloat16")  # 45..50: across 48
    assert trim.unsupported(inside, "fa2") is None
    assert "crosses a chunk start" in trim.unsupported(across, "fa2")
    assert virtual.unsupported(across, "fa2") is None
    for impl in (virtual, trim):  # a table cut at a chunk start must start on a page
        assert "must be a multiple of page_size 16" in impl.unsupported(case(attention_chunk=24, dtype="bfloat16"), "fa2")
    as_window = registry.get("chunk-as-window")
    assert as_window.must_fail(across, [6] * 3, [51] * 3, "fa2") and as_window.kind == "known-bug"


SAWTOOTH = """
name = "saw"
description = "chunked decode and verify beside a window of the same keys, on the CPU"
implementations = ["torch-trim", "planted-chunk-window"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
dtype = "float32"
[[sweep]]
group = "chunked"
mode = ["decode", "verify"]
qo_len = 1
attention_chunk = 32
seq_len = [8, 31, 32, 33, 63, 64, 65]
[[sweep]]
group = "window"
implementations = ["torch-trim"]
mode = ["decode", "verify"]
qo_len = 1
window_left = 31
seq_len = [8, 31, 32, 33, 63, 64, 65]
"""


@pytest.mark.slow
def test_a_chunked_run_draws_its_sawtooth_beside_the_window_and_the_known_mistake_is_caught(tmp_path):
    from conftest import invoke
    from swabench.analysis import derived
    from swabench.publish import marks, plots

    (tmp_path / "saw.toml").write_text(SAWTOOTH)
    r = invoke("run", tmp_path / "saw.toml", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table, meta = derived.load(tmp_path / "run")
    mistake = table[table["impl"] == "planted-chunk-window"]
    # a window of 31 keys is the chunk of 32 in the first chunk (nothing before it) and at a chunk's last position
    assert set(mistake[mistake["status"] == "pass"]["seq_len"]) == {8, 31, 32, 64}
    assert set(mistake["status"]) == {"pass", "xfail"}
    fig = plots.sawtooth(table, meta)
    assert len(fig.axes) == 2  # one chunk size, two steps
    labels = set(fig.axes[0].get_legend_handles_labels()[1]) - {marks.NOISY}  # a CPU run's points may be noisy
    assert labels == {"torch-trim [torch]", "torch-trim [torch] (window)"}
    window_decode = table[(table["mode"] == "decode") & (table["attention_chunk"] == 0)]
    assert len(window_decode) and window_decode["prefix_len"].isna().all()  # cases by seq_len: no one context
    assert plots.decode(table, meta) is None  # the sawtooth above draws these steps, the chunked beside the window
    assert plots.sawtooth(table[table["attention_chunk"] == 0], meta) is None


def test_the_warm_up_case_of_a_chunked_point_is_chunked_and_cut_into_virtual_requests():
    """The GPU warm-up builds each module on a tiny case: a chunked point's is chunked, with a chunk its
    page size divides, so chunk-virtual cuts it into a few virtual requests (and chunk-as-window plans a window)."""
    from swabench.impls.chunked import VirtualBatch
    from swabench.run import sweep
    for page_size in (1, 16, 64):
        tiny = sweep.tiny_case(case(page_size=page_size, dtype="bfloat16"))
        assert tiny.attention_chunk == 2 * page_size and tiny.window_left == -1
        assert registry.get("chunk-virtual").unsupported(tiny, "fa2") is None
        assert VirtualBatch(workloads.build(tiny)).batch_size <= 3 * (-(-68 // tiny.attention_chunk))
    assert sweep.tiny_case(case(attention_chunk=0, window_left=15)).attention_chunk == 0
    assert registry.get("chunk-as-window").computes(sweep.tiny_case(case()), 0).window_left == 31


def test_evicted_layouts_are_refused_with_a_chunk():
    with pytest.raises(ScenarioError, match="page_layout: evicted-null evicts the pages before a window"):
        case(page_layout="evicted-null")


def test_chunked_rows_stay_out_of_the_window_figures_and_a_sparse_sawtooth_draws():
    import pandas as pd
    from swabench.analysis import versus
    from swabench.publish import plots
    row = dict(impl="chunk-virtual", backend="fa2", kind="correct", status="pass", mode="decode", storage="paged",
               median_us=10.0, iqr_us=1.0, case_id="a", case="x", sinks=False, logits_soft_cap=0.0, dtype="bfloat16",
               kv_dtype="bfloat16", window_left=-1, sliding_window=-1, attention_chunk=64, prefix_len=70.0,
               seq_len=71.0, qo_len=1, page_size=16, batch_size=2)
    rows = [row, dict(row, case_id="b", prefix_len=None, seq_len=None),  # lengths drawn per request: no context
            dict(row, case_id="c", mode="verify", status="skip", median_us=None),  # no timed verify
            dict(row, case_id="d", impl="paged-window", attention_chunk=0, window_left=63, sliding_window=64)]
    table = pd.DataFrame(rows)
    assert list(versus.plain(table)["case_id"]) == ["d"] and len(versus.plain(table, chunked=True)) == 4
    fig = plots.sawtooth(table, {})
    assert fig is not None and len(fig.axes) == 1
