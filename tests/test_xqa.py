"""XQA through FlashInfer (impls.xqa), held on the repro stand-in: XQA counts its window in keys (``sliding_win_size
= N`` keeps N, the current one included), so FlashInfer's call hands it W + 1 and the direct call with W is the
off-by-one the gate must catch, exactly where a query's window reaches its oldest key; the chain mask is causal;
the cases XQA cannot run are skipped, saying why."""

import pytest
import torch
from conftest import standin_calls

from swabench.core import semantics, workloads
from swabench.impls import registry
from swabench.impls.xqa import CTA_TOKENS, SEMAPHORE_BYTES, chain_mask, tokens_read
from swabench.inputs import axes
from swabench.repro import standin


def case(**kw):
    base = dict(mode="verify", draft_tokens=3, prefix_len=(30, 13), window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="bfloat16", batch_size=2, page_size=16, backend="xqa")
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None and k != "backend"})


def calls_of(name, c):
    w = workloads.build(c)
    return w, [call[1:] for call in standin_calls(name, w, "xqa")]


def test_flashinfers_call_gets_the_window_and_the_tables():
    w, [(method, args, kwargs)] = calls_of("xqa-window", case())
    assert method == "decode.xqa_batch_decode_with_kv_cache"
    q, kv, workspace, tables, seq_lens, max_len = args
    assert q is w.q and kv == (w.k_store, w.v_store) and bool((workspace == 0).all())
    assert seq_lens.dtype == torch.uint32 and seq_lens.tolist() == w.kv_lens and max_len == max(w.kv_lens)
    for b in range(2):  # each request's pages, in order, zero-padded
        first, last = int(w.kv_indptr_host[b]), int(w.kv_indptr_host[b + 1])
        assert tables[b, :last - first].tolist() == w.kv_indices_host[first:last].tolist()
    assert kwargs["window_left"] == 5 and kwargs["q_len_per_req"] == 3 and kwargs["bmm1_scale"] == w.sm_scale
    assert torch.equal(kwargs["mask"], chain_mask(2, 3, "cpu"))
    assert kwargs["out"].shape == (2, 3, 8, 64)  # viewed as the queries are


def test_the_direct_call_passes_window_left_as_the_key_count():
    w, [(method, args, kwargs)] = calls_of("xqa-window-off-by-one", case())
    assert method == "xqa" and kwargs["sliding_win_size"] == 5 and kwargs["q_seq_len"] == 3
    assert args[0].shape == (2, 1, 3, 8, 64) and args[4].shape == (2, 1)
    assert args[7].numel() == SEMAPHORE_BYTES and bool((args[7] == 0).all())  # the semaphores, zeroed
    assert kwargs["q_scale"] == pytest.approx(w.sm_scale * 64 ** 0.5)


def test_the_chain_mask_is_causal_bit_by_bit():
    for q in (1, 3, 31, 32, 33, 70):
        words = chain_mask(2, q, "cpu").view(torch.int32)  # the uint32 words, viewed back
        assert words.shape == (2, q, -(-q // 32))
        for r in range(q):
            bits = [(int(words[1, r, j // 32]) >> (j % 32)) & 1 for j in range(q)]
            assert bits == [1] * (r + 1) + [0] * (q - r - 1), (q, r)


@pytest.mark.parametrize("window_left, prefix, must", [(5, (30, 13), True), (40, (30, 13), False),
                                                       (0, (30, 13), True), (-1, (30, 13), False)])
def test_the_off_by_one_must_fail_where_a_window_reaches_its_oldest_key(window_left, prefix, must):
    """W + 1 keys the truth; W the mistake: a query whose window holds W + 1 keys loses one.  With no window both
    see everything; with a window past every request, nothing is lost; W = 0 means no window at all to XQA."""
    c = case(window_left=window_left, prefix_len=prefix)
    impl = registry.get("xqa-window-off-by-one")
    w = workloads.build(c)
    assert impl.must_fail(c, w.qo_lens, w.kv_lens, "xqa") is must
    if window_left == 0:
        assert impl.computes(c, 30) == semantics.Visibility(semantics.NO_WINDOW)


@pytest.mark.parametrize("fields, says", [
    (dict(page_size=1), "XQA takes pages of 16, 32, 64, 128 tokens"),
    (dict(logits_soft_cap=30.0), "no soft-cap"),
    (dict(mode="draft_extend", accept="uniform", draft_tokens=4), "models decode and verify steps"),
    (dict(head_dim=72, num_qo_heads=8), "multiple of 16"),
    (dict(draft_tokens=(3, 4)), "one draft length for the batch"),
])
def test_xqa_says_where_it_cannot_run(fields, says):
    reason = registry.get("xqa-window").skip_reason(case(**fields), "xqa", None)
    assert reason and says in reason, reason


def test_xqa_takes_head_dims_the_prefill_wrappers_are_not_built_for():
    """Phi-3's 96: XQA's SM90 kernels take any multiple of 16 up to 256, where fa2 and fa3 skip it."""
    d96 = case(head_dim=96, num_qo_heads=32, num_kv_heads=32)
    assert registry.get("xqa-window").skip_reason(d96, "xqa", None) is None
    assert "not 96" in registry.get("paged-window").skip_reason(d96, "fa2", None)


def test_xqa_is_asked_for_by_name_and_takes_sinks():
    impl = registry.get("xqa-window")
    assert impl.runs_on(["fa2", "fa3"]) == [] and impl.runs_on(["fa2", "xqa"]) == ["xqa"]
    assert impl.skip_reason(case(sinks=True), "xqa", None) is None
    w, [(_, _, kwargs)] = calls_of("xqa-window", case(sinks=True))
    assert kwargs["sinks"] is w.sinks


def test_a_path_says_which_release_lacks_its_api(monkeypatch):
    """has_api walks a dotted name on the installed module: a function in a submodule, or a class at the top."""
    from swabench.impls import flashinfer_library

    monkeypatch.setattr(flashinfer_library, "_import_error", lambda: None)
    with standin.installed(lambda *call: None):
        assert flashinfer_library.has_api("decode.xqa_batch_decode_with_kv_cache")() is None
        assert flashinfer_library.has_api("BatchAttention")() is None
        said = flashinfer_library.has_api("decode.nothing_here")()
        assert said.startswith("flashinfer ") and said.endswith(" has no decode.nothing_here")


def test_the_warm_up_builds_one_xqa_module_per_page_size_head_group_and_draft_length():
    from swabench.core.cases import Point
    from swabench.run.sweep import module_signature, modules_needed, tiny_case

    points = [Point(case(page_size=ps, draft_tokens=d, num_kv_heads=kv), impl, "xqa")
              for ps in (16, 64) for d in (2, 8) for kv in (2, 4) for impl in ("xqa-window", "xqa-window-off-by-one")]
    signatures = {module_signature(p) for p in points}
    assert len(signatures) == 16 and len(modules_needed(points, None)) == 16
    assert "ps64 g2 q8" in module_signature(points[-1])
    for p in points:  # the tiny case the warm-up runs names the same module
        assert module_signature(Point(tiny_case(p.case), p.impl, p.backend)) == module_signature(p)


@pytest.mark.parametrize("kv_len,window_left", [(16257, 127), (16385, 127), (16511, 127), (16385, 1023), (100, 127),
                                                (128, 127), (129, 127), (385, 127), (5000, -1)])
def test_the_tile_rule_loads_whole_tiles_from_the_one_that_holds_the_window_s_first_key(kv_len, window_left):
    """mha.cu skips (kv_len - window) // 256 whole tiles and loads the rest: brute force over the tiles."""
    first = 0 if window_left < 0 else max(0, kv_len - window_left - 1)
    tiles = [t for t in range(0, kv_len, CTA_TOKENS) if t + CTA_TOKENS > first]
    assert tokens_read(kv_len, window_left) == kv_len - tiles[0]
    assert tokens_read(kv_len, window_left) >= min(kv_len, window_left + 1 if window_left >= 0 else kv_len)


def test_the_tile_rule_at_gpt_oss_s_window_reads_one_to_three_windows():
    assert [tokens_read(n, 127) for n in (16257, 16385, 16511)] == [129, 257, 383]
