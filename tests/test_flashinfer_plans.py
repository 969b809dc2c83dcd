"""What each FlashInfer implementation hands to plan(), checked on the CPU against a stand-in
wrapper (the kernels themselves run in tests/test_gpu.py on the H200)."""

import sys
import types

import pytest
import torch

from swabench.inputs import axes
from swabench.core import semantics, workloads
from swabench.impls import flashinfer_impls as fi
from swabench.impls import flashinfer_workspace as ws
from swabench.impls import registry


MIB = 1 << 20


def overflow_message(nbytes, available):
    """FlashInfer 0.7.2.post1's message, as tvm-ffi raises it (RuntimeError) from AlignedAllocator."""
    return (f"Error in function 'aligned_alloc' at /tmp/site/flashinfer/data/include/flashinfer/allocator.h:71: "
            f"Buffer overflow when allocating memory for batch_prefill_tmp_v with size {nbytes} and "
            f"alignment 16, but only {available} bytes available in AlignedAllocator. "
            f"Increase the workspace buffer size.")


class FakeWrapper:
    """Plans anything whose float workspace holds ``need`` bytes; ``count`` is what its
    ``workspace_size`` answers (None: a FlashInfer without the count)."""
    need = 0
    count = None
    built = []  # workspace size of every wrapper constructed, in MiB

    def __init__(self, workspace, layout, backend="auto", **bufs):
        self.bufs, self._backend, self.workspace = bufs, backend, workspace
        FakeWrapper.built.append(workspace.numel() // MIB)

    def __getattr__(self, name):
        if name == "workspace_size" and FakeWrapper.count is not None:
            return lambda *args, **kwargs: (FakeWrapper.count, 8 << 10)
        raise AttributeError(name)

    def plan(self, *args, uniform_q_len=None, **kwargs):
        if self.workspace.numel() < FakeWrapper.need:
            raise RuntimeError(overflow_message(FakeWrapper.need, self.workspace.numel()))
        self.args, self.kwargs = args, {**kwargs, "uniform_q_len": uniform_q_len}


@pytest.fixture(autouse=True)
def fake_flashinfer(monkeypatch):
    module = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=FakeWrapper,
                                   BatchPrefillWithRaggedKVCacheWrapper=FakeWrapper,
                                   BatchDecodeWithPagedKVCacheWrapper=FakeWrapper,
                                   BatchAttentionWithAttentionSinkWrapper=FakeWrapper,
                                   BatchDecodeWithAttentionSinkWrapper=FakeWrapper,
                                   merge_state_in_place=lambda *args: None)
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(ws, "_shared", {})
    # meta tensors have a size and no memory: a 4 GiB workspace costs nothing here
    monkeypatch.setattr(ws, "_allocate", lambda device, nbytes: torch.empty(nbytes, dtype=torch.uint8,
                                                                             device="meta"))
    monkeypatch.setattr(FakeWrapper, "need", 0)
    monkeypatch.setattr(FakeWrapper, "count", None)
    monkeypatch.setattr(FakeWrapper, "built", [])


def planned(impl, mode="verify", **kw):
    storage = registry.get(impl).storages[0]
    raw = {**dict(mode=mode, qo_len=4, prefix_len=100, window_left=31, page_size=16, num_qo_heads=4,
                  num_kv_heads=2, head_dim=64, dtype="bfloat16", batch_size=3, storage=storage,
                  accept="uniform"), **kw}
    c = axes.make_case({k: v for k, v in raw.items() if v is not None})
    w = workloads.build(c)
    runner = registry.get(impl).make(w, "fa2")
    runner.plan()
    return runner.wrapper, w


def extend_runner(impl="paged-window"):
    c = axes.make_case(dict(mode="extend", extend_len=64, prefix_len=256, batch_size=2, num_qo_heads=8,
                                 num_kv_heads=2, head_dim=64, window_left=127, page_size=16,
                                 storage=registry.get(impl).storages[0], dtype="bfloat16"))
    return registry.get(impl).make(workloads.build(c), "fa2")


def test_window_at_plan_and_the_uniform_hint():
    wrapper, w = planned("paged-window")
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is True
    assert wrapper.kwargs["uniform_q_len"] == 4 and wrapper.bufs["use_cuda_graph"] is True
    wrapper, _ = planned("paged-window", mode="draft_extend", qo_len=None, draft_tokens=8, batch_size=16)
    assert wrapper.kwargs["uniform_q_len"] is None  # drawn acceptance lengths: not uniform


@pytest.mark.parametrize("impl", ["paged-window", "paged-trim", "ragged-window"])
def test_a_non_causal_window_is_planned_causal_false_with_its_window(impl):
    wrapper, _ = planned(impl, causal=False)
    assert wrapper.kwargs["causal"] is False and wrapper.kwargs["window_left"] == 31


def test_the_naive_mask_of_a_non_causal_window_holds_the_future_keys():
    from swabench.core.semantics import Visibility
    wrapper, w = planned("paged-mask", causal=False)
    expect = semantics.custom_mask(w.qo_lens, w.kv_lens, Visibility(31, causal=False))
    assert wrapper.kwargs["causal"] is False and torch.equal(wrapper.kwargs["custom_mask"].cpu(), expect)
    assert not torch.equal(expect, semantics.custom_mask(w.qo_lens, w.kv_lens, Visibility(31)))


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


def test_the_deprecated_forward_gets_the_scale_and_soft_cap_plan_took(monkeypatch):
    """forward() resets the scale and the soft-cap that plan() set (None: 1/sqrt(head_dim), no cap): a model
    with its own scale (Gemma 3's query_pre_attn_scalar) would fail everywhere, not where the bug shows."""
    calls = []
    monkeypatch.setattr(FakeWrapper, "forward", lambda self, q, kv, **kw: calls.append(kw) or torch.zeros_like(q),
                        raising=False)
    c = axes.make_case(dict(mode="verify", qo_len=4, prefix_len=100, window_left=31, page_size=16, num_qo_heads=4,
                            num_kv_heads=2, head_dim=64, dtype="bfloat16", batch_size=3, sm_scale=0.07,
                            logits_soft_cap=30.0))
    w = workloads.build(c)
    runner = registry.get("paged-plan-no-window").make(w, "fa2")
    runner.plan()
    runner.run()
    assert calls == [dict(causal=True, window_left=31, sm_scale=w.sm_scale, logits_soft_cap=30.0)]
    assert w.sm_scale == pytest.approx(0.07) and runner.wrapper.kwargs["sm_scale"] == w.sm_scale


@pytest.mark.parametrize("heads,why", [((40, 8), True), ((48, 8), False), ((32, 2), False), ((10, 2), True)])
def test_the_cuda_core_decode_skips_a_group_it_has_no_kernel_for(heads, why):
    """Llama 4's 40/8 heads: FlashInfer's CUDA-core decode dispatches groups 1-4, 6, 8 and 16 and raises
    "Unsupported group_size: 5" at run; said before any GPU work, and the tensor-core decode takes it."""
    c = axes.make_case(dict(mode="decode", prefix_len=100, window_left=31, num_qo_heads=heads[0],
                            num_kv_heads=heads[1], head_dim=128, dtype="bfloat16"))
    for impl in ("decode-window", "decode-trim", "decode-trim-nowindow"):
        reason = registry.get(impl).unsupported(c, "fa2")
        assert (reason is not None and f"no GQA group of {heads[0] // heads[1]}" in reason) is why, reason
    assert registry.get("decode-tc-window").unsupported(c, "fa2") is None


@pytest.mark.parametrize("impl", ["paged-mask", "ragged-mask"])
def test_mask_paths_hand_over_the_exact_mask(impl):
    wrapper, w = planned(impl)
    mask = wrapper.kwargs["custom_mask"]
    assert "window_left" not in wrapper.kwargs and wrapper.kwargs["causal"] is False
    assert torch.equal(mask, semantics.custom_mask(w.qo_lens, w.kv_lens, semantics.Visibility(31)))
    assert wrapper.bufs["custom_mask_buf"].numel() == semantics.packed_mask_bytes(w.qo_lens, w.kv_lens)


@pytest.mark.parametrize("impl", ["paged-window", "ragged-window"])
def test_a_workload_that_fits_keeps_the_default_workspace(impl):
    runner = extend_runner(impl)
    runner.plan()
    assert runner.workspace_mib == 256 and FakeWrapper.built == [256]
    runner.plan()  # later plans (timed) plan again on the same wrapper
    assert FakeWrapper.built == [256]


def test_overflow_doubles_the_workspace_on_a_new_wrapper():
    FakeWrapper.need = 700 * MIB
    runner = extend_runner("ragged-window")
    runner.plan()
    assert runner.workspace_mib == 1024 and FakeWrapper.built == [256, 512, 1024]
    assert runner.wrapper.workspace.numel() == 1024 * MIB and runner.wrapper.kwargs["window_left"] == 127


def test_the_library_count_sizes_the_workspace_before_planning():
    FakeWrapper.need = FakeWrapper.count = 260 * MIB + 5
    runner = extend_runner("paged-window")
    runner.plan()
    assert runner.workspace_mib == 261 and FakeWrapper.built == [256, 261]


def test_runners_share_the_largest_workspace_and_see_their_own_size():
    FakeWrapper.need = 600 * MIB
    big = extend_runner()
    big.plan()
    FakeWrapper.need = 0
    small = extend_runner()
    small.plan()
    assert (big.workspace_mib, small.workspace_mib) == (1024, 256)
    assert small.wrapper.workspace.numel() == 256 * MIB  # a view of the shared 1 GiB buffer
    assert ws._shared["cpu"].numel() == 1024 * MIB


def test_beyond_the_cap_is_a_resource_error_with_the_library_message(monkeypatch):
    monkeypatch.setattr(ws, "WORKSPACE_CAP", 1024 * MIB)
    FakeWrapper.need = 3000 * MIB
    runner = extend_runner()
    with pytest.raises(registry.ResourceError) as e:
        runner.plan()
    assert "Buffer overflow when allocating memory for batch_prefill_tmp_v" in str(e.value)
    assert str(e.value).endswith("at 1024 MiB") and FakeWrapper.built == [256, 512, 1024]
    assert runner.workspace_mib is None


def test_a_failed_build_is_a_resource_error_and_a_crash_is_not(monkeypatch):
    log = "\n".join(["Ninja build failed. Ninja output:", "[1/3] /usr/local/cuda/bin/nvcc -O3 ... -c x.cu",
                     'cute/arch/mma_sm90.hpp(1790): error: static assertion failed with "No eligible GMMA '
                     'operator for request configuration."', "ninja: build stopped: subcommand failed."] * 50)

    def fail(message):
        def plan(self, *args, **kwargs):
            raise RuntimeError(message)
        return plan

    monkeypatch.setattr(FakeWrapper, "plan", fail(log))
    with pytest.raises(registry.ResourceError) as e:
        extend_runner().plan()
    assert str(e.value) == ('Ninja build failed. Ninja output: ... cute/arch/mma_sm90.hpp(1790): error: static '
                            'assertion failed with "No eligible GMMA operator for request configuration."')
    monkeypatch.setattr(FakeWrapper, "plan", fail("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError) as e:
        extend_runner().plan()
    assert not isinstance(e.value, registry.ResourceError)


def test_a_module_whose_sources_the_install_lacks_is_a_build_failure_and_other_errors_are_not():
    """A release unpacked without data/csrc fails on a kernel's first call (XQA, fmha v2): a skip, not a failure.  A
    built module that will not load, or a file outside the package's data, is the path's own failure."""
    missing = FileNotFoundError(2, "No such file or directory",
                                "/tmp/site/flashinfer/data/csrc/fmha_v2/templates/kernel_hopper_ws.jinja")
    assert ws.build_failure(missing).endswith("kernel_hopper_ws.jinja'")
    stale = OSError("/root/.cache/flashinfer/0.7.4/90a/cached_ops/xqa/xqa.so: undefined symbol: _Z3mhav")
    assert ws.build_failure(stale) is None
    assert ws.build_failure(FileNotFoundError(2, "No such file", "/root/.cache/flashinfer/x/x.so")) is None
    assert ws.build_failure(FileNotFoundError(2, "No such file", "/data/traces/x.jsonl")) is None
    assert ws.build_failure(RuntimeError("CUDA error: an illegal memory access was encountered")) is None
    assert registry.build_failure(missing, "flashinfer") == ws.build_failure(missing)  # as the sweep asks it
    assert registry.build_failure(missing, "torch") is None


def test_out_of_memory_while_making_is_a_resource_error(monkeypatch):
    def oom(device, nbytes):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB.\nmore detail")

    monkeypatch.setattr(ws, "_allocate", oom)
    with pytest.raises(registry.ResourceError, match=r"^CUDA out of memory. Tried to allocate 256.00 MiB.$"):
        extend_runner()


def test_fa3_with_an_fp8_cache_under_bf16_queries_is_unsupported():
    c = axes.make_case(dict(mode="verify", draft_tokens=4, prefix_len=100, window_left=31, head_dim=64,
                                 kv_dtype="float8_e4m3"))
    impl = registry.get("paged-window")
    assert "fp8 queries" in impl.unsupported(c, "fa3")
    assert impl.unsupported(c, "fa2") is None


def decode_case(page_size=16, prefix_len=100, window_left=31, batch_size=3):
    return axes.make_case(dict(mode="decode", prefix_len=prefix_len, window_left=window_left, page_size=page_size,
                                    num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype="bfloat16",
                                    batch_size=batch_size))


@pytest.mark.parametrize("impl,cores,trimmed,window", [
    ("decode-window", False, False, 31), ("decode-trim", False, True, 31), ("decode-trim-nowindow", False, True, -1),
    ("decode-tc-window", True, False, 31), ("decode-tc-trim", True, True, 31)])
def test_decode_wrappers_hand_over_their_table_and_window(impl, cores, trimmed, window):
    w = workloads.build(decode_case())
    runner = registry.get(impl).make(w, "fa2")
    runner.plan()
    wrapper = runner.wrapper
    indptr, indices, last = wrapper.args  # no query indptr: one query per request
    starts = [semantics.trim_start(k, 1, 31, 16) if trimmed else 0 for k in w.kv_lens]
    expect = workloads.trim_page_table(w.kv_indptr_host, w.kv_indices_host, w.kv_lens, starts, 16)
    assert torch.equal(indptr, expect[0].to(torch.int32)) and torch.equal(indices, expect[1].to(torch.int32))
    assert torch.equal(last, w.kv_last_page_len.cpu())
    assert wrapper.kwargs["window_left"] == window and wrapper.kwargs["head_dim"] == 64
    assert "causal" not in wrapper.kwargs and wrapper.kwargs["uniform_q_len"] is None
    assert wrapper.bufs["use_tensor_cores"] is cores and wrapper.bufs["use_cuda_graph"] is True
    assert wrapper.bufs["paged_kv_indices_buffer"].numel() == len(w.kv_indices_host)


def test_decode_wrappers_model_decode_only_and_the_cuda_core_kernel_has_no_fa3():
    """Declared at registration, so a scenario makes no such point; a point made by hand skips, saying why."""
    verify = axes.make_case(dict(mode="verify", draft_tokens=4, prefix_len=100, window_left=31, head_dim=64))
    cpu = torch.device("cpu")
    assert "models decode steps, not verify" in registry.get("decode-window").skip_reason(verify, "fa2", cpu)
    assert not registry.get("decode-window").models("paged", "verify", frozenset())
    assert registry.get("decode-trim").runs_on(["fa2", "fa3"]) == ["fa2"]
    assert "fa2 and auto and cudnn only, not fa3" in registry.get("decode-trim").skip_reason(decode_case(), "fa3", cpu)
    assert registry.get("decode-tc-trim").runs_on(["fa2", "fa3"]) == ["fa2", "fa3"]
    assert registry.get("decode-tc-trim").unsupported(decode_case(), "fa3") is None


@pytest.mark.parametrize("page_size,prefix_len,must", [(1, 100, False), (16, 100, True), (16, 111, False),
                                                      (16, 20, False)])
def test_sglang_decode_recipe_must_fail_only_where_a_page_reaches_before_the_window(page_size, prefix_len, must):
    """kv_len 101, W 31: the window starts at key 70, inside the page [64, 80) with 16-token pages;
    kv_len 112 starts it at 80, a page boundary; kv_len 21 has no key before the window."""
    c = decode_case(page_size=page_size, prefix_len=prefix_len)
    w = workloads.build(c)
    impl = registry.get("decode-trim-nowindow")
    assert impl.must_fail(c, w.qo_lens, w.kv_lens, "fa2") is must and impl.timed_where_exact


def test_serving_axes_reach_plan():
    wrapper, w = planned("paged-window", logits_soft_cap=50.0, sm_scale=144 ** -0.5, kv_dtype="float8_e4m3")
    assert wrapper.kwargs["logits_soft_cap"] == 50.0 and wrapper.kwargs["sm_scale"] == 144 ** -0.5
    assert wrapper.kwargs["kv_data_type"] == torch.float8_e4m3fn and wrapper.kwargs["q_data_type"] == torch.bfloat16
    wrapper, _ = planned("paged-window")
    assert "logits_soft_cap" not in wrapper.kwargs and wrapper.kwargs["sm_scale"] == 64 ** -0.5


def test_sink_wrapper_is_built_for_the_window_and_the_dropped_sinks_are_handed_over():
    wrapper, w = planned("sink-window", sinks=True)
    assert wrapper.bufs["window_left"] == 31 and wrapper.bufs["head_dim_qk"] == 64
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is True
    calls = []
    runner = registry.get("paged-sinks-dropped").make(w, "fa2")
    runner.plan()
    runner.wrapper.run = lambda *args, **kwargs: calls.append(kwargs)
    runner.run()
    assert calls[0]["sinks"] is w.sinks


@pytest.mark.parametrize("impl,reason", [("paged-window", "no sink term"), ("decode-tc-trim", "no sink term"),
                                         ("sglang-extend", "no sink term"), ("flex-window", "no sink term")])
def test_paths_without_a_sink_term_skip_cases_with_sinks(impl, reason):
    c = axes.make_case(dict(mode="decode" if "decode" in impl else "extend", extend_len=8, prefix_len=100,
                                 window_left=31, head_dim=64, sinks=True))
    assert reason in registry.get(impl).unsupported(c, "fa2")
    plain = axes.make_case(dict(mode="extend", extend_len=8, prefix_len=100, window_left=31, head_dim=64))
    sink_wrapper = registry.get("sink-window")
    assert "only cases with sinks" in sink_wrapper.skip_reason(plain, "fa2", torch.device("cpu"))
    assert not sink_wrapper.models("paged", "extend", plain.features)
    assert sink_wrapper.models("paged", "extend", c.features)


def extend_recipe(impl, extend_len=8, prefix_len=100, window_left=31, page_size=16):
    c = axes.make_case(dict(mode="extend", extend_len=extend_len, prefix_len=prefix_len, window_left=window_left,
                                 page_size=page_size, num_qo_heads=4, num_kv_heads=2, head_dim=64, batch_size=3))
    w = workloads.build(c)
    runner = registry.get(impl).make(w, "fa2")
    runner.plan()
    return runner, w


@pytest.mark.parametrize("impl,mask,ragged_window", [("sglang-extend", True, 31), ("sglang-extend-nomask", False, 31),
                                                     ("sglang-extend-ragged-nowindow", True, -1)])
def test_sglang_extend_plans_the_new_tokens_ragged_and_the_trimmed_prefix_paged(impl, mask, ragged_window):
    runner, w = extend_recipe(impl)
    ragged, paged = runner.wrappers["ragged"], runner.wrappers["paged"]
    assert ragged.kwargs["window_left"] == ragged_window and ragged.kwargs["causal"] is True
    assert torch.equal(ragged.args[0], ragged.args[1])  # new tokens against new tokens
    assert paged.kwargs["causal"] is False and "window_left" not in paged.kwargs
    # prefix 100, W 31: SGLang starts at key 69; 16-token pages start the table at 64 and end it at key 100
    _, indptr, indices, last = paged.args
    assert indptr.tolist() == [0, 3, 6, 9] and last.tolist() == [4, 4, 4]
    assert torch.equal(indices[:3], w.kv_indices_host[4:7].to(torch.int32))
    if not mask:
        assert "custom_mask" not in paged.kwargs
        return
    rows = paged.kwargs["custom_mask"][:8 * 36].view(8, 36)  # request 0: 8 queries x keys 64..99
    keys, queries = torch.arange(64, 100), torch.arange(100, 108)
    assert torch.equal(rows, keys[None, :] >= queries[:, None] - 31)
    # the new tokens' K/V are gathered from the cache for the ragged part
    assert torch.equal(runner.new_slots[:8], w.request_slots(0, 100))


def test_eagle_verify_untrimmed_keeps_the_requests_first_keys():
    wrapper, w = planned("eagle-verify-untrimmed")  # prefix 100, 4 draft tokens, W 31
    _, indptr, indices, last = wrapper.args
    assert wrapper.kwargs["window_left"] == -1
    # min(100, 31) + 4 = 35 keys from key 0: three 16-token pages, the last holding 3
    assert indptr.tolist() == [0, 3, 6, 9] and last.tolist() == [3, 3, 3]
    assert torch.equal(indices[:3], w.kv_indices_host[:3].to(torch.int32))


def test_the_sink_wrapper_runs_with_the_sinks_and_the_scale_as_its_variant_declares_them():
    wrapper, w = planned("sink-window", sinks=True, sm_scale=0.1)
    calls = []
    wrapper.run = lambda *args, **kwargs: calls.append((args, kwargs))
    runner = registry.get("sink-window").make(w, "fa2")
    runner.plan()
    runner.wrapper.run = wrapper.run
    runner.run()
    (q, kv, sinks, scale), kwargs = calls[0]
    assert q is w.q and kv == (w.k_store, w.v_store) and sinks is w.sinks and scale == 0.1
    assert kwargs["out"] is runner.out


def test_the_recipe_as_sglang_writes_it_hands_the_ragged_part_its_window_at_run():
    runner, _ = extend_recipe("sglang-extend-ragged-nowindow")
    assert runner.wrappers["ragged"].kwargs["window_left"] == -1 and runner.wrappers["ragged"]._window_left == 31
    runner, _ = extend_recipe("sglang-extend")
    assert not hasattr(runner.wrappers["ragged"], "_window_left")


@pytest.mark.parametrize("impl,shape,reason", [
    ("eagle-verify-untrimmed", dict(mode="verify", draft_tokens=4, window_left=-1), "window_left >= 0"),
    ("sglang-extend", dict(mode="extend", extend_len=4, window_left=0), "window_left >= 1"),
])
def test_the_recipes_refuse_cases_without_a_window_to_cut_to(impl, shape, reason):
    c = axes.make_case(dict(prefix_len=100, head_dim=64, **shape))
    assert reason in registry.get(impl).unsupported(c, "fa2")


def chunked(impl, **kw):
    return planned(impl, window_left=None, attention_chunk=32, **kw)


def test_chunk_virtual_plans_one_request_per_chunk_without_a_window():
    wrapper, w = chunked("chunk-virtual", prefix_len=60, qo_len=8)  # queries 60..67: chunks 32..63 and 64..95
    qo_indptr, indptr, indices, last = wrapper.args
    assert wrapper.kwargs["window_left"] == -1 and wrapper.kwargs["causal"] is True
    assert qo_indptr.tolist() == [0, 4, 8, 12, 16, 20, 24]  # each request's queries split 4 + 4, in place
    assert wrapper.bufs["qo_indptr_buf"].numel() == 7  # the wrapper is sized for 6 virtual requests
    for b in range(3):
        pages = w.kv_indices_host[int(w.kv_indptr_host[b]):int(w.kv_indptr_host[b + 1])]
        first, second = indices[indptr[2 * b]:indptr[2 * b + 1]], indices[indptr[2 * b + 1]:indptr[2 * b + 2]]
        assert first.tolist() == pages[2:4].tolist() and second.tolist() == pages[4:5].tolist()  # keys 32..63, 64..67
    assert last.tolist() == [16, 4] * 3


def test_chunk_trim_starts_the_table_at_the_chunk_and_chunk_as_window_plans_c_minus_one():
    wrapper, w = chunked("chunk-trim", prefix_len=70, qo_len=8)  # queries 70..77 in the chunk 64..95
    qo_indptr, indptr, indices, last = wrapper.args
    assert wrapper.kwargs["window_left"] == -1 and int(indptr[1]) == 1  # keys 64..77: one page
    wrapper, _ = chunked("chunk-as-window")
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["causal"] is True


def test_the_backend_recorded_is_the_one_the_wrapper_resolved():
    """A decode wrapper reports what backend="auto" resolved to (0.7.4 can pick cuDNN or XQA)."""
    FakeWrapper.resolved_backend = "cudnn"
    try:
        c = axes.make_case(dict(mode="decode", prefix_len=100, window_left=31, page_size=16, num_qo_heads=4,
                                num_kv_heads=2, head_dim=64, dtype="bfloat16", batch_size=2))
        runner = registry.get("decode-tc-window").make(workloads.build(c), "auto")
        runner.plan()
        assert runner.resolved_backend == "cudnn"
    finally:
        del FakeWrapper.resolved_backend
    runner.plan()
    assert runner.resolved_backend == "auto"  # a wrapper without it: the backend it holds


def test_the_cudnn_decode_backend_names_the_package_it_needs_and_what_its_graph_leaves_out(monkeypatch):
    """The decode wrapper's cudnn backend runs cuDNN's paged decode graph: without the cuDNN frontend package a
    point skips naming it; with it, soft-cap and fp8 caches skip, and the rest is handed to the wrapper as is."""
    import importlib.util
    c = decode_case()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cudnn" else real(name, *a))
    assert "nvidia-cudnn-frontend" in registry.get("decode-window").unsupported(c, "cudnn")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cudnn" else real(name, *a))
    assert registry.get("decode-window").unsupported(c, "cudnn") is None
    capped = axes.make_case(dict(mode="decode", prefix_len=100, window_left=31, head_dim=64, logits_soft_cap=30.0))
    assert "no soft-cap" in registry.get("decode-trim").unsupported(capped, "cudnn")
    group5 = axes.make_case(dict(mode="decode", prefix_len=100, window_left=31, num_qo_heads=40, num_kv_heads=8,
                                 head_dim=128))
    assert registry.get("decode-window").unsupported(group5, "cudnn") is None  # cuDNN takes any group
    assert "no GQA group of 5" in registry.get("decode-window").unsupported(group5, "auto")
    runner = registry.get("decode-window").make(workloads.build(c), "cudnn")
    runner.plan()
    assert runner.wrapper._backend == "cudnn" and runner.wrapper.kwargs["window_left"] == 31
    assert runner.resolved_backend == "cudnn" and runner.wrapper.bufs["use_tensor_cores"] is False
    assert registry.get("decode-tc-window").skip_reason(c, "cudnn", torch.device("cpu")).startswith("has kernels on")


def test_the_opt_in_backends_are_asked_for_by_name_and_a_replay_runs_every_served_one():
    """A scenario names cudnn or fa4 to run them; a replay or price that names no backend runs every backend an
    engine serves a step with, each once: fa2, fa3, the shelf's cuDNN, XQA and fmha v2, FlashAttention-4 and the
    engines' FlashAttention-3 builds."""
    from swabench.run import replay
    assert {"cudnn", "fa4"} <= set(registry.backends())
    assert axes.AXES["backend"]("cudnn") == "cudnn"
    assert replay._checked_backends(()) == ["fa2", "fa3", "cudnn", "xqa", "fmha-v2", "fa4", "vllm-fa3", "sgl-fa3"]
    assert replay._checked_backends(("fa2",)) == ["fa2"]


@pytest.mark.parametrize("command", ["replay", "price"])
def test_the_backend_help_names_the_backends_a_default_replay_runs(command):
    """--backend's help says what a replay or price that names no backend runs: the same backends, in the same
    order, as the selection the code makes, and `--help` shows that text."""
    import re

    from conftest import invoke
    from swabench.cli import sweep as commands
    from swabench.run import replay

    said = next(p.help for p in getattr(commands, command).params if p.name == "backends")
    named = re.search(r"default: (.+?), every backend a library serves steps with", said)
    assert named and re.split(r", | and ", named.group(1)) == replay.default_backends()
    shown = invoke(command, "--help")
    assert shown.exit_code == 0 and "".join(said.split()) in "".join(shown.output.split())


@pytest.mark.parametrize("impl,mode", [("paged-window", "verify"), ("ragged-window", "verify"), ("paged-mask", "verify"),
                                       ("decode-tc-trim", "decode"), ("sink-window", "verify"),
                                       ("chunk-virtual", "verify")])
def test_a_plain_wrapper_is_built_without_the_graph_buffers_and_plans_the_same(impl, mode):
    shape = dict(mode=mode, qo_len=1 if mode == "decode" else 4, sinks=True if impl == "sink-window" else None)
    if impl == "chunk-virtual":
        shape.update(window_left=None, attention_chunk=32)
    graph, _ = planned(impl, **shape)
    plain, _ = planned(impl, wrapper_mode="plain", **shape)
    assert graph.bufs["use_cuda_graph"] is True and not any(k.endswith(("buf", "buffer")) for k in plain.bufs)
    assert "use_cuda_graph" not in plain.bufs
    same = lambda a, b: torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b  # noqa: E731
    assert plain.kwargs.keys() == graph.kwargs.keys() and all(same(v, graph.kwargs[k]) for k, v in plain.kwargs.items())
    assert all(same(a, b) for a, b in zip(plain.args, graph.args))


def test_the_recipe_builds_both_wrappers_plain_in_plain_mode():
    c = axes.make_case(dict(mode="extend", extend_len=8, prefix_len=100, batch_size=3, num_qo_heads=4, num_kv_heads=2,
                            head_dim=64, window_left=31, page_size=16, wrapper_mode="plain"))
    runner = registry.get("sglang-extend").make(workloads.build(c), "fa2")
    runner.plan()
    assert all("use_cuda_graph" not in w.bufs for w in runner.wrappers.values()) and runner.layout.startswith("plain:")
    assert "custom_mask" in runner.wrappers["paged"].kwargs


@pytest.mark.parametrize("impl", ["torch-trim", "flex-window", "torch-batch"])
def test_a_path_without_a_wrapper_has_no_plain_mode(impl):
    c = axes.make_case(dict(mode="decode", prefix_len=100, window_left=31, head_dim=64, wrapper_mode="plain"))
    assert "has no wrapper to build plain" in registry.get(impl).skip_reason(c, registry.get(impl).runs_on(["fa2"])[0], None)
    assert not registry.get(impl).models("paged", "decode", frozenset(), "plain")
    assert registry.get("paged-window").models("paged", "decode", frozenset(), "plain")


def test_the_decode_sink_wrapper_is_built_for_the_window_and_runs_with_the_sinks_and_the_scale():
    wrapper, w = planned("sink-decode", mode="decode", qo_len=1, sinks=True, sm_scale=0.1)
    assert wrapper.bufs["window_left"] == 31 and wrapper.bufs["head_dim_qk"] == 64 and "use_tensor_cores" not in wrapper.bufs
    assert wrapper.kwargs["window_left"] == 31 and wrapper.kwargs["head_dim"] == 64 and len(wrapper.args) == 3
    calls = []
    runner = registry.get("sink-decode").make(w, "fa2")
    runner.plan()
    runner.wrapper.run = lambda *args, **kwargs: calls.append((args, kwargs))
    runner.run()
    (q, kv, sinks, scale), _ = calls[0]
    assert sinks is w.sinks and scale == 0.1
    impl = registry.get("sink-decode")
    assert impl.modes == ("decode",) and impl.requires == frozenset({"sinks"}) and impl.family == "sink"


def run_window_case(qo_len, heads=(8, 2), prefix_len=100, window_left=31, **kw):
    mode = dict(mode="decode") if qo_len == 1 else dict(mode="verify", qo_len=qo_len)
    return axes.make_case(dict(mode, prefix_len=prefix_len, window_left=window_left, num_qo_heads=heads[0],
                               num_kv_heads=heads[1], head_dim=128, dtype="bfloat16", batch_size=2, page_size=16,
                               **kw))


def test_a_window_given_only_at_run_starts_each_fa2_query_tile_at_its_first_query_s_window():
    """paged-plan-no-window on fa2: 8 queries of a group of 4 pack 32 rows, one 64-row tile, so query 0 is exact and
    query i sees i keys before its window; fa3 takes no window at run, so every query past key W sees too much."""
    impl, c = registry.get("paged-plan-no-window"), run_window_case(8)
    qo, kv = workloads.request_lengths(c)
    fa2 = impl.rows_wrong(c, qo, kv, "fa2")[0]
    assert fa2.tolist() == [False] + [True] * 7
    seen = impl.seen_masks(c, qo, kv, "fa2")[0]
    exact = semantics.of_case(c).mask(qo[0], kv[0])
    assert ((seen & ~exact).sum(dim=1) == torch.arange(8)).all() and not (exact & ~seen).any()
    assert impl.rows_wrong(c, qo, kv, "fa3")[0].all()
    assert impl.keys_lost(c, qo, kv, "fa2") == (0, 0.0)


@pytest.mark.parametrize("qo_len,heads,must_fa2", [(1, (8, 2), False), (8, (8, 2), True), (4, (128, 1), False),
                                                   (8, (64, 1), True)])
def test_a_window_given_only_at_run_is_exact_where_each_query_starts_its_own_tile(qo_len, heads, must_fa2):
    """One query a request (decode, or the single-token verify the published runs held as xpass), or a GQA group as
    large as the tile (128 heads on one KV head: a 128-row tile a query), is exact on fa2; fa3 is wrong wherever a
    key lies before the window."""
    impl, c = registry.get("paged-plan-no-window"), run_window_case(qo_len, heads)
    qo, kv = workloads.request_lengths(c)
    assert impl.must_fail(c, qo, kv, "fa2") is must_fa2
    assert impl.must_fail(c, qo, kv, "fa3")
    assert not impl.must_fail(run_window_case(qo_len, heads, prefix_len=20), qo, [20 + qo_len] * 2, "fa3")


@pytest.mark.slow
def test_the_published_runs_hold_the_run_window_rule_point_by_point():
    """Every point of a path planned without a window and handed W at run that the H200 gated, in every committed
    run (frozen under tests/fixtures/published/run-window): the gate's outcome (right or wrong) is what the rule predicts, on fa2 and fa3 (823 fa2 points, 213 of them
    right at one query a request, which the runs once printed as xpass), and where the run counted the rows the
    gate found wrong, as many as predicted (the tile rule, and the rows a split request merges out of step)."""
    import pandas as pd
    from pathlib import Path
    from swabench.inputs import scenarios

    frozen = Path(__file__).resolve().parent / "fixtures" / "published" / "run-window"  # make_published.py
    checked = 0
    for run, rows in pd.read_csv(frozen / "rows.csv.gz", low_memory=False).groupby("run"):
        cases = {c.case_id: c for c in scenarios.load(frozen / f"{run}.toml").cases}
        for row in rows.itertuples():
            impl, case = registry.get(row.impl), cases[row.case_id]
            qo, kv = workloads.request_lengths(case)
            wrong = row.status in ("xfail", "fail")
            assert impl.must_fail(case, qo, kv, row.backend) is wrong, (run, row.case, row.backend)
            assert row.status != "xpass", (run, row.case)
            if pd.notna(row.wrong_rows):
                predicted = int(torch.cat(impl.rows_wrong(case, qo, kv, row.backend)).sum())
                assert predicted == row.wrong_rows, (run, row.case, row.backend)
            checked += 1
    assert checked > 1000


def test_restatus_recomputes_only_the_rows_whose_prediction_moved(tmp_path):
    """scripts/restatus.py on a copy of a committed H200 folder holding a one-query xpass of paged-plan-no-window:
    that row becomes a pass, meta.json says what was done and why, and every other byte of the table stays."""
    import importlib.util
    import json
    import shutil
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "restatus.py"
    spec = importlib.util.spec_from_file_location("restatus", script)
    restatus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(restatus)
    run = shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "h200-run", tmp_path / "run")
    before = (run / "results.csv").read_text().splitlines()
    assert restatus.main([str(run), "--write", "--why", "the fa2 tile rule"]) == 0
    after = (run / "results.csv").read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 1
    assert ",xpass," in changed[0][0] and ",pass,case does not exercise the bug" in changed[0][1]
    meta = json.loads((run / "meta.json").read_text())
    assert "xpass" not in meta["status_counts"]
    assert meta["statuses_recomputed"][-1]["changes"] == {"xpass -> pass": 1}
    assert meta["statuses_recomputed"][-1]["why"] == "the fa2 tile rule"
    assert restatus.main([str(run), "--write", "--why", "again"]) == 0  # nothing left to move: nothing recorded
    assert len(json.loads((run / "meta.json").read_text())["statuses_recomputed"]) == 1



def test_a_split_request_of_several_queries_merges_its_rows_out_of_step():
    """fa2 planned without a window splits a 2008-key request into more KV chunks than W + tile keys need; the
    kernel lays each row's partials out for the fewer chunks, the merge reads them for the planned ones: every row
    of a request of several queries is wrong, a request of one query reads its chunks where they were written."""
    from swabench.impls import fa2_split

    args = dict(window_left=127, page_size=16, num_kv_heads=2, head_dim=128, num_sms=132)
    assert fa2_split.run_window_mixed([8] * 3, [2008] * 3, group=4, **args) == [True] * 3
    assert fa2_split.run_window_mixed([1] * 3, [2001] * 3, group=4, **args) == [False] * 3
    assert fa2_split.run_window_mixed([8] * 3, [108] * 3, group=4, **args) == [False] * 3  # one chunk: nothing mixed
    impl, c = registry.get("paged-plan-no-window"), run_window_case(4, (128, 1), prefix_len=2000)
    qo, kv = workloads.request_lengths(c)
    assert all(rows.all() for rows in impl.rows_wrong(c, qo, kv, "fa2"))  # a tile a query, yet every row wrong
