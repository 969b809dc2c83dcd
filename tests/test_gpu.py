"""On a CUDA machine: every implementation through the gate, and the runners capturable in a graph.

Marked ``gpu``: skipped without CUDA (and the FlashInfer ones without flashinfer)."""

import pytest
import torch

from swabench.core import gate, workloads
from swabench.inputs import axes
from swabench.impls import registry

pytestmark = pytest.mark.gpu

FLASHINFER = [i.name for i in registry.all_implementations() if i.library == "flashinfer"]
DECODE_FI = [n for n in FLASHINFER if n.startswith("decode-")]  # decode steps only: tested on their own below
SERVING_FI = [n for n in FLASHINFER if registry.get(n).wrapper in ("sink", "recipe") or "sinks" in n]  # below
CORRECT_FI = [n for n in FLASHINFER if registry.get(n).kind == "correct" and n not in DECODE_FI + SERVING_FI]
BUGS_FI = [n for n in FLASHINFER if registry.get(n).kind == "known-bug" and n not in DECODE_FI + SERVING_FI]


def workload(impl, window_left, prefix_len, qo_len, page_size=16, mode="verify", batch_size=4):
    storage = registry.get(impl).storages[0]
    c = axes.make_case(dict(mode=mode, qo_len=qo_len, prefix_len=prefix_len, window_left=window_left,
                                 num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16",
                                 batch_size=batch_size, page_size=page_size, storage=storage, accept="uniform"))
    return workloads.build(c, "cuda")


def gated(impl, w, backend):
    reason = registry.get(impl).skip_reason(w.case, backend, w.device)
    if reason:
        pytest.skip(reason)
    runner = registry.get(impl).make(w, backend)
    runner.plan()
    return runner, gate.check(runner, w)


SHAPES = [(4, 40, 8, 1), (127, 1000, 16, 16), (1023, 3000, 1, 16), (4095, 4200, 16, 64), (127, 2000, 256, 16)]


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("window_left,prefix,qo,page_size", SHAPES)
@pytest.mark.parametrize("impl", CORRECT_FI + ["torch-trim", "torch-mask", "torch-batch", "flex-window", "flex-contiguous",
                                  "flex-flat"])
def test_correct_implementations_pass_on_the_gpu(impl, window_left, prefix, qo, page_size, backend):
    if not registry.get(impl).backends and backend == "fa3":
        pytest.skip("no backend axis")
    w = workload(impl, window_left, prefix, qo, page_size)
    runner, result = gated(impl, w, backend if registry.get(impl).backends else "torch")
    assert result.passed, result.reason


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("window_left,prefix,qo,page_size", SHAPES)
@pytest.mark.parametrize("impl", BUGS_FI)
def test_known_bugs_are_caught_where_they_must_fail(impl, window_left, prefix, qo, page_size, backend):
    w = workload(impl, window_left, prefix, qo, page_size)
    must = registry.get(impl).must_fail(w.case, w.qo_lens, w.kv_lens, backend)
    runner, result = gated(impl, w, backend)
    if must:
        assert not result.passed, f"known bug not caught: {result}"
        assert result.probe_rel_l2 > 10 * gate.TOLERANCES["bfloat16"].row_rel_l2
    else:
        assert result.passed, result.reason


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("qo,heads", [(1, (8, 2)), (8, (8, 2)), (16, (8, 2)), (256, (8, 2)), (4, (128, 1)),
                                      (8, (64, 1))])
def test_a_window_given_only_at_run_is_wrong_on_exactly_the_rows_predicted(qo, heads, backend):
    """paged-plan-no-window: fa2 starts each query tile at its first query's window (one query a request, or a GQA
    group filling a tile, is exact), fa3 ignores the window: the gate's wrong rows are the predicted ones."""
    c = axes.make_case(dict(mode="verify" if qo > 1 else "decode", prefix_len=2000, window_left=127,
                            num_qo_heads=heads[0], num_kv_heads=heads[1], head_dim=128, dtype="bfloat16",
                            batch_size=3, page_size=16, **({"qo_len": qo} if qo > 1 else {})))
    w = workloads.build(c, "cuda")
    impl = registry.get("paged-plan-no-window")
    runner = impl.make(w, backend)
    runner.plan()
    predicted = torch.cat(impl.rows_wrong(c, w.qo_lens, w.kv_lens, backend))
    result = gate.check(runner, w, predicted=predicted)
    assert result.passed is not bool(predicted.any()), result.reason
    assert result.rows_as_predicted, f"{result.wrong_rows} rows wrong, {int(predicted.sum())} predicted"


@pytest.mark.parametrize("impl", CORRECT_FI + ["torch-trim"])
def test_runner_replays_in_a_cuda_graph(impl):
    w = workload(impl, 127, 1000, 16, mode="draft_extend")
    runner, result = gated(impl, w, "fa2" if registry.get(impl).backends else "torch")
    assert result.passed, result.reason
    assert_replays_in_a_graph(runner)


def test_auto_backend_is_resolved_and_recorded():
    w = workload("paged-window", 127, 1000, 16)
    runner, result = gated("paged-window", w, "auto")
    assert runner.resolved_backend in ("fa2", "fa3") and result.passed


@pytest.mark.parametrize("l2", ["cold", "warm"])
def test_graph_timer_measures_a_known_amount_of_work(l2):
    """A copy of 256 MiB: the graph time must sit near bytes / bandwidth, the noise must be small,
    and the eager time (launch overhead included) is never below it by more than noise."""
    from swabench.measure import timing
    src = torch.randn(32 << 20, device="cuda")
    dst = torch.empty_like(src)
    kernel, eager = timing.cuda_graph_time(lambda: dst.copy_(src), timing.GraphTimerOptions(l2=l2))
    tbps = 2 * src.numel() * 4 / (kernel.median_us * 1e-6) / 1e12
    assert 1.0 < tbps < 5.5, tbps  # an H200 copies ~4.3 TB/s
    assert kernel.noise < 0.05 and kernel.extra["replays"] >= 10 and kernel.extra["l2"] == l2
    assert eager.median_us > 0.9 * kernel.median_us


def test_the_measured_rates_stay_below_the_datasheet_ceiling():
    """What the node attains (copy, read stream, matmul) is under what the part's clocks and width allow."""
    from swabench.measure import peaks
    measured = peaks.measure(torch.device("cuda"))
    if "datasheet_tbps" not in measured or "datasheet_tflops" not in measured:
        pytest.skip(measured["ceiling"])
    assert max(measured["copy_tbps"], measured["read_tbps"]) < measured["datasheet_tbps"], measured
    assert measured["bf16_matmul_tflops"] < measured["datasheet_tflops"], measured


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_flex_decode_batch_compiles_and_passes(storage):
    """64 single-query requests with 4 query heads per KV head: Inductor's flex-decoding kernel needs
    a 256-row query block here; with the default 128 the H200 peers run failed (NoValidChoicesError)."""
    c = axes.make_case(dict(mode="decode", batch_size=64, prefix_len=2048, window_left=127, num_qo_heads=8,
                                 num_kv_heads=2, head_dim=128, dtype="bfloat16", page_size=16, storage=storage))
    runner, result = gated("flex-flat", workloads.build(c, "cuda"), "flex")
    assert result.passed, result.reason
    assert runner.block_mask.BLOCK_SIZE[0] == 256


@pytest.mark.parametrize("impl,heads,decoding", [("flex-window", (64, 8), True), ("flex-contiguous", (64, 8), True),
                                                 ("flex-window", (40, 8), False)])
def test_batched_flex_decode_runs_the_kernel_it_names(impl, heads, decoding):
    """Batch and heads static, so Inductor lowers a decode step with a power-of-two group to its
    flex-decoding kernel (which splits the keys: its source has SPLIT_KV; a profile names both kernels
    after the op), and a group of 5 to the general kernel; a second context compiles nothing new."""
    from torch._inductor.utils import run_and_get_code
    from swabench.impls import flex

    def case(prefix):
        return axes.make_case(dict(mode="decode", batch_size=48, prefix_len=prefix, window_left=127,
                                   num_qo_heads=heads[0], num_kv_heads=heads[1], head_dim=64, dtype="bfloat16",
                                   page_size=16))
    torch._dynamo.reset()
    flex._COMPILED = None  # compile here, so that the generated source can be read
    w = workloads.build(case(8192), "cuda")
    runner = registry.get(impl).make(w, "flex")
    _, sources = run_and_get_code(runner.plan)
    result = gate.check(runner, w)
    assert result.passed, result.reason
    assert any("SPLIT_KV" in code for code in sources) is decoding
    assert ("flex-decoding kernel" if decoding else "flex-attention kernel") in runner.layout
    again = registry.get(impl).make(workloads.build(case(20000), "cuda"), "flex")
    again.plan()
    assert again.compile_s < 5, f"a new context recompiled: {again.compile_s:.1f} s"


@pytest.mark.parametrize("impl", ["paged-window", "ragged-window"])
def test_gpt_oss_extend_fits_its_workspace(impl):
    """GPT-OSS extend (16 x 1024 new tokens after 4096, 64/8 heads, head_dim 64, window 128): fa2's
    CUDA-graph planner wants 260 MiB of float workspace here (flashinfer 0.7.2.post1), so a fixed
    256 MiB overflowed; the runner grows it and records the size it planned with."""
    c = axes.make_case(dict(mode="extend", extend_len=1024, prefix_len=4096, batch_size=16, num_qo_heads=64,
                                 num_kv_heads=8, head_dim=64, window_left=127, page_size=16,
                                 storage=registry.get(impl).storages[0], dtype="bfloat16"))
    runner, result = gated(impl, workloads.build(c, "cuda"), "fa2")
    assert result.passed, result.reason
    assert isinstance(runner.workspace_mib, int) and runner.workspace_mib > 256


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("head_dim,heads", [(64, (8, 8)), (128, (8, 2)), (128, (32, 4)), (256, (16, 8))])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("impl", DECODE_FI)
def test_decode_wrappers_on_the_gpu(impl, page_size, head_dim, heads, backend):
    """Every decode wrapper through the gate at GQA groups 1, 4 and 8 and head_dim 64/128/256: the
    correct ones pass; SGLang's recipe (decode-trim-nowindow) is caught exactly where a page reaches
    before the window, and passes at page size 1."""
    c = axes.make_case(dict(mode="decode", batch_size=8, prefix_len=4001, window_left=127, page_size=page_size,
                                 num_qo_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim, dtype="bfloat16"))
    w = workloads.build(c, "cuda")
    runner, result = gated(impl, w, backend)
    if registry.get(impl).must_fail(c, w.qo_lens, w.kv_lens, backend):
        assert not result.passed and result.probe_rel_l2 > 10 * gate.TOLERANCES["bfloat16"].row_rel_l2
    else:
        assert result.passed, result.reason
    assert_replays_in_a_graph(runner)


GPT_OSS = dict(num_qo_heads=64, num_kv_heads=8, head_dim=64, sliding_window=128)
GEMMA2 = dict(num_qo_heads=16, num_kv_heads=8, head_dim=256, sliding_window=4096)
VERIFY = dict(mode="verify", draft_tokens=8, batch_size=4)
SERVING = [  # (implementation, backends, shape): every serving path and each new axis, on the model's shape
    *[(impl, ("fa2", "fa3"), {**VERIFY, **GPT_OSS, "sinks": True, "prefix_len": p})
      for impl in ("sink-window", "paged-sinks-dropped") for p in (300, 4000)],
    *[("sink-decode", ("fa2", "fa3"), {**GPT_OSS, "mode": "decode", "batch_size": 8, "sinks": True, "prefix_len": p})
      for p in (300, 4000)],
    ("torch-trim", ("torch",), {**VERIFY, **GPT_OSS, "sinks": True, "prefix_len": 4000}),
    *[(impl, ("fa2", "fa3"), {**VERIFY, **GEMMA2, "logits_soft_cap": 50.0, "prefix_len": 5000, "storage": storage})
      for impl, storage in (("paged-window", "paged"), ("paged-trim", "paged"), ("ragged-window", "ragged"))],
    ("decode-tc-trim", ("fa2", "fa3"), {**GEMMA2, "mode": "decode", "batch_size": 8, "logits_soft_cap": 50.0,
                                        "prefix_len": 5000}),
    ("flex-window", ("flex",), {**VERIFY, **GEMMA2, "head_dim": 128, "logits_soft_cap": 50.0, "prefix_len": 5000}),
    *[(impl, ("fa2",), {**VERIFY, "num_qo_heads": 32, "num_kv_heads": 16, "head_dim": 128, "sliding_window": 4096,
                        "sm_scale": 144 ** -0.5, "prefix_len": 5000, "storage": registry.get(impl).storages[0]})
      for impl in ("paged-window", "ragged-window")],
    *[(impl, ("fa2", "fa3"), {**VERIFY, "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "sliding_window": 128,
                              "kv_dtype": "float8_e4m3", "prefix_len": 4000}) for impl in ("paged-window", "paged-trim")],
    ("decode-tc-trim", ("fa2",), {"mode": "decode", "batch_size": 8, "num_qo_heads": 32, "num_kv_heads": 8,
                                  "head_dim": 128, "sliding_window": 128, "kv_dtype": "float8_e4m3",
                                  "prefix_len": 4000}),
    *[(impl, ("fa2", "fa3"), {"mode": "extend", "extend_len": e, "batch_size": 2, "prefix_len": p,
                              "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "sliding_window": w,
                              "page_size": ps})
      for impl in ("sglang-extend", "sglang-extend-nomask", "sglang-extend-ragged-nowindow")
      for e, p, w, ps in ((300, 4000, 128, 16), (64, 4200, 4096, 1), (1, 40, 128, 16))],
    *[(impl, ("fa2", "fa3"), {**VERIFY, "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                              "sliding_window": 128, "prefix_len": p})
      for impl in ("eagle-verify-untrimmed",) for p in (100, 4000)],
]


@pytest.mark.parametrize("impl,backends,shape", SERVING, ids=lambda v: v if isinstance(v, str) else None)
def test_serving_paths_on_the_gpu(impl, backends, shape):
    """Each serving path gated on the GPU where docs/serving-paths.md puts it: the correct ones pass (and replay
    in a graph); each known bug is caught exactly where it must fail, by a wide margin."""
    c = axes.make_case({"page_size": 16, "dtype": "bfloat16", **shape})
    for backend in backends:
        w = workloads.build(c, "cuda")
        reason = registry.get(impl).skip_reason(c, backend, w.device)
        if reason:
            assert backend == "fa3", reason  # fa3: no custom mask (the recipes), no bf16 x fp8
            continue
        runner, result = gated(impl, w, backend)
        if registry.get(impl).must_fail(c, w.qo_lens, w.kv_lens, backend):
            assert not result.passed and result.probe_rel_l2 > 10 * gate.TOLERANCES["bfloat16"].row_rel_l2, \
                (backend, result)
        else:
            assert result.passed, (backend, result.reason)
            assert_replays_in_a_graph(runner)


def assert_replays_in_a_graph(runner):
    """run() allocates nothing and never syncs the host: the gated objects can be captured."""
    runner.run()
    eager = runner.out.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        runner.run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.run()
    runner.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(runner.out, eager, rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["paged-window", "paged-trim", "ragged-window"])
@pytest.mark.parametrize("qo,kv", [(300, 4096), (1024, 1024), (300, 400)])
def test_fa2_non_causal_windows_are_wrong_exactly_on_the_rows_its_schedule_predicts(impl, qo, kv):
    """flashinfer#4972: the rows fa2 gets wrong under plan(causal=False, window_left=333) are the ones
    impls/fa2_split predicts from the scheduler on this GPU (none where the chunks reach the last key);
    fa3 gets every row right."""
    from swabench.core import reference, semantics
    from swabench.impls import fa2_split, upstream

    c = axes.make_case(dict(mode="extend", extend_len=qo, seq_len=kv, window_left=333, num_qo_heads=8,
                            num_kv_heads=2, head_dim=128, dtype="bfloat16", batch_size=1, page_size=16,
                            storage=registry.get(impl).storages[0], causal=False))
    w = workloads.build(c, "cuda")
    ref = reference.attention(w)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kept = kv - semantics.trim_start(kv, qo, 333, 16) if impl == "paged-trim" else kv  # the lengths it plans
    predicted = fa2_split.wrong_rows([qo], [kept], 333, c.page_size or 1, 4, 2, 128, sms)[0]
    for backend in ("fa2", "fa3"):
        runner = registry.get(impl).make(w, backend)
        runner.plan()
        runner.run()
        torch.cuda.synchronize()
        err = (runner.out.double() - ref).norm(dim=-1).amax(dim=-1) / ref.norm(dim=-1).amax(dim=-1)
        wrong = set(torch.nonzero(err > 0.05).flatten().tolist())
        assert wrong == (set(predicted) if backend == "fa2" else set()), (backend, sorted(wrong)[:5], len(wrong))
    assert (upstream.hit(impl, c, "fa2") is not None) == bool(len(predicted))


CHUNK_SHAPES = [(16, 40, 6, 16), (64, 120, 40, 16), (64, 63, 1, 16), (8192, 8184, 16, 16), (32, 100, 30, 1)]


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("chunk,prefix,qo,page_size", CHUNK_SHAPES)
@pytest.mark.parametrize("impl", ["chunk-virtual", "chunk-trim", "chunk-as-window", "paged-mask"])
def test_chunked_attention_through_flashinfer(impl, chunk, prefix, qo, page_size, backend):
    """chunk-virtual and chunk-trim pass wherever they run; chunk-as-window fails exactly where some query
    is not its chunk's last position past the first chunk (Llama 4's 8192 among the shapes)."""
    c = axes.make_case(dict(mode="verify" if qo > 1 else "decode", prefix_len=prefix, attention_chunk=chunk,
                            num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", batch_size=3,
                            page_size=page_size, **({"qo_len": qo} if qo > 1 else {})))
    w = workloads.build(c, "cuda")
    runner, result = gated(impl, w, backend)
    must = registry.get(impl).must_fail(c, w.qo_lens, w.kv_lens, backend)
    assert result.passed is not must, (must, result.reason)


BLOCK_SHAPES = [(5, 40, 8, 4, 16), (127, 1000, 16, 16, 16), (127, 3000, 8, 8, 1), (2047, 5000, 16, 16, 16),
                (3, 200, 32, 8, 16)]  # (W, prefix, queries, block, page_size): DFlash's blocks of 8 and 16, and wider


@pytest.mark.parametrize("window_left,prefix,qo,block,page_size", BLOCK_SHAPES)
@pytest.mark.parametrize("impl", ["ranges-window", "paged-mask", "torch-trim"])
def test_bidirectional_blocks_pass_on_the_gpu(impl, window_left, prefix, qo, block, page_size):
    """Bidirectional blocks, each query's block seen both ways and the window causal before it: the ranges
    wrapper (fa2; skipped by name where the release lacks it) and the naive custom mask pass the gate."""
    c = axes.make_case(dict(mode="verify", qo_len=qo, prefix_len=prefix, window_left=window_left, block=block,
                            num_qo_heads=8, num_kv_heads=2, head_dim=128, dtype="bfloat16", batch_size=3,
                            page_size=page_size))
    w = workloads.build(c, "cuda")
    runner, result = gated(impl, w, "fa2" if registry.get(impl).backends else "torch")
    assert result.passed, result.reason


XQA_SHAPES = [(127, 1000, 1, 16), (127, 3000, 4, 64), (1023, 5000, 8, 16), (4095, 4200, 1, 32), (127, 60, 3, 128)]


@pytest.mark.parametrize("window_left,prefix,qo,page_size", XQA_SHAPES)
@pytest.mark.parametrize("impl", ["xqa-window", "xqa-window-off-by-one"])
@pytest.mark.parametrize("sinks", [False, True])
def test_xqa_passes_and_its_off_by_one_fails_where_it_must(impl, window_left, prefix, qo, page_size, sinks):
    """XQA on GPT-OSS's heads (64/8, head_dim 64), decode and chains: FlashInfer's call (W + 1 keys to the kernel)
    passes; W given as XQA's key count fails exactly where a window reaches its oldest key."""
    c = axes.make_case(dict(mode="verify" if qo > 1 else "decode", prefix_len=prefix, window_left=window_left,
                            num_qo_heads=64, num_kv_heads=8, head_dim=64, dtype="bfloat16", batch_size=3,
                            page_size=page_size, sinks=sinks, **({"qo_len": qo} if qo > 1 else {})))
    w = workloads.build(c, "cuda")
    runner, result = gated(impl, w, "xqa")
    must = registry.get(impl).must_fail(c, w.qo_lens, w.kv_lens, "xqa")
    assert result.passed is not must, (must, result.reason)


@pytest.mark.parametrize("window_left,prefix,qo,page_size", [(127, 1000, 16, 16), (1023, 3000, 256, 64),
                                                              (4095, 4200, 16, 32), (127, 0, 2048, 16)])
@pytest.mark.parametrize("sinks", [False, True])
def test_fmha_v2_window_passes(window_left, prefix, qo, page_size, sinks):
    c = axes.make_case(dict(mode="extend", extend_len=qo, prefix_len=prefix, window_left=window_left,
                            num_qo_heads=64, num_kv_heads=8, head_dim=64, dtype="bfloat16", batch_size=2,
                            page_size=page_size, sinks=sinks))
    runner, result = gated("fmha-v2-window", workloads.build(c, "cuda"), "fmha-v2")
    assert result.passed, result.reason


@pytest.mark.parametrize("chunk,prefix,qo", [(16, 40, 6), (8192, 8184, 16), (64, 120, 40)])
def test_fmha_v2_chunked_passes(chunk, prefix, qo):
    c = axes.make_case(dict(mode="verify", qo_len=qo, prefix_len=prefix, attention_chunk=chunk, num_qo_heads=8,
                            num_kv_heads=2, head_dim=128, dtype="bfloat16", batch_size=3, page_size=16))
    runner, result = gated("fmha-v2-chunked", workloads.build(c, "cuda"), "fmha-v2")
    assert result.passed, result.reason


@pytest.mark.parametrize("mode,prefix,qo,page_size", [("decode", 4000, 1, 1), ("decode", 4000, 1, 16),
                                                      ("verify", 4000, 8, 16), ("verify", 300, 8, 1)])
def test_batch_attention_on_a_trimmed_table_is_right_exactly_where_the_trim_is_the_window(mode, prefix, qo, page_size):
    c = axes.make_case(dict(mode=mode, prefix_len=prefix, window_left=1023, num_qo_heads=32, num_kv_heads=8,
                            head_dim=128, dtype="bfloat16", batch_size=4, page_size=page_size,
                            **({"qo_len": qo} if qo > 1 else {})))
    w = workloads.build(c, "cuda")
    runner, result = gated("batch-attention-trim", w, "fa2")
    must = registry.get("batch-attention-trim").must_fail(c, w.qo_lens, w.kv_lens, "fa2")
    assert result.passed is not must, (must, result.reason)


@pytest.mark.parametrize("impl", ["pod-window", "mixed-two-calls", "paged-trim", "paged-window"])
@pytest.mark.parametrize("extend,prefix,page_size", [(1984, 16384, 16), (512, 3000, 1), (8128, 16384, 64)])
def test_a_mixed_step_passes_each_way(impl, extend, prefix, page_size):
    """One prefill chunk batched with 64 decodes: POD's one launch, the two calls, and one prefill-wrapper call."""
    c = axes.make_case(dict(mode="mixed", extend_len=extend, prefills=1, batch_size=65, prefix_len=prefix,
                            window_left=1023, num_qo_heads=32, num_kv_heads=16, head_dim=128, dtype="bfloat16",
                            page_size=page_size))
    runner, result = gated(impl, workloads.build(c, "cuda"), "fa2")
    assert result.passed, result.reason


BACKEND_PATHS = {"cudnn-prefill": "cudnn", "cudnn-decode": "cudnn", "cudnn-graph": "cudnn",
                 "cudnn-graph-band-w": "cudnn", "fa4-window": "fa4", "fa4-window-count": "fa4",
                 "fa3-window": "vllm-fa3", "fa3-window-count": "vllm-fa3", "sglang-fa3": "sgl-fa3"}
BACKEND_SHAPES = [("decode", 127, 1000, 1, 16), ("verify", 127, 3000, 4, 64), ("verify", 1023, 5000, 8, 1),
                  ("extend", 4095, 4200, 512, 16), ("extend", 127, 0, 300, 128), ("draft_extend", 127, 60, 4, 16),
                  ("decode", -1, 2000, 1, 16)]


BACKEND_HEADS = {"gpt-oss": (64, 8, 64, True), "gpt-oss-no-sinks": (64, 8, 64, False),
                 "gemma-3": (32, 16, 128, False), "gemma-2": (16, 8, 256, False)}  # heads, head_dim, sinks


@pytest.mark.parametrize("mode,window_left,prefix,qo,page_size", BACKEND_SHAPES)
@pytest.mark.parametrize("impl", list(BACKEND_PATHS))
@pytest.mark.parametrize("heads", list(BACKEND_HEADS))
def test_cudnn_fa4_and_fa3_pass_and_their_mistakes_fail_where_they_must(impl, mode, window_left, prefix, qo,
                                                                          page_size, heads):
    """cuDNN (through FlashInfer and its own graph), FlashAttention-4 and FlashAttention-3 (vLLM's and SGLang's builds)
    on the served models' heads, every step: the correct calls pass; W handed to cuDNN uncounted, or the key count to
    FA4 or FA3, fail exactly where a window reaches its oldest key; then each replays in a CUDA graph."""
    queries = {"decode": {}, "extend": {"extend_len": qo}, "draft_extend": {"draft_tokens": qo, "accept": "uniform"},
               "verify": {"qo_len": qo}}[mode]
    qo_heads, kv_heads, head_dim, sinks = BACKEND_HEADS[heads]
    c = axes.make_case(dict(mode=mode, prefix_len=prefix, window_left=window_left, num_qo_heads=qo_heads,
                            num_kv_heads=kv_heads, head_dim=head_dim, dtype="bfloat16", batch_size=3,
                            page_size=page_size, sinks=sinks, **queries))
    w = workloads.build(c, "cuda")
    backend = BACKEND_PATHS[impl]
    runner, result = gated(impl, w, backend)
    must = registry.get(impl).must_fail(c, w.qo_lens, w.kv_lens, backend)
    assert result.passed is not must, (must, result.reason)
    assert_replays_in_a_graph(runner)  # FA4 returns its output: inside the graph, the graph's own tensor
