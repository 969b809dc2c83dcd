"""cuDNN and FlashAttention-4 (impls.cudnn, impls.fa4), held on stand-ins: every call bound to the signature its
released source declares (FlashInfer 0.7.4's ``flashinfer/cudnn/prefill.py`` and ``decode.py``, flash-attn-4
4.0.0b36's ``flash_attn/cute/interface.py``), argument by argument; each library's window convention against
FlashInfer's (cuDNN counts keys, FA4 takes window_left as it is); the known mistakes must fail exactly where a window
reaches its oldest key; what each cannot run is a skip that says why."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Optional

import pytest
import torch
from conftest import wheel_of

from swabench.core import semantics, workloads
from swabench.core.cases import Point
from swabench.impls import cudnn, fa4, registry
from swabench.inputs import axes
from swabench.repro import standin

from conftest import bound, table_rows


def case(**kw):
    base = dict(mode="verify", draft_tokens=3, prefix_len=(30, 13), window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="bfloat16", batch_size=2, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


# the released signatures (bodies never run: a call that binds to them is a call the library takes)
def cudnn_batch_prefill_with_kv_cache(q, k_cache, v_cache, scale, workspace_buffer, *, max_token_per_sequence,
                                      max_sequence_kv, actual_seq_lens_q=None, actual_seq_lens_kv=None,
                                      block_tables=None, causal, return_lse, q_scale=None, k_scale=None, v_scale=None,
                                      batch_offsets_q=None, batch_offsets_o=None, batch_offsets_k=None,
                                      batch_offsets_v=None, batch_offsets_stats=None, batch_offsets_units="elements",
                                      out=None, lse=None, is_cuda_graph_compatible=False, backend=None,
                                      o_data_type=None, lse_base="log2", window_left: Optional[int] = None,
                                      sinks=None): ...


def cudnn_batch_decode_with_kv_cache(q, k_cache, v_cache, scale, workspace_buffer, *, max_sequence_kv,
                                     actual_seq_lens_kv=None, block_tables=None, is_cuda_graph_compatible=False,
                                     batch_offsets_q=None, batch_offsets_o=None, batch_offsets_k=None,
                                     batch_offsets_v=None, out=None, return_lse=False, lse=None, q_len_per_req=1,
                                     window_left=-1, sinks=None): ...


def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                           gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                           window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                           deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                           block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                           scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                           gather_bwd_recompute_p=False, gather_bwd_token_chunk=None): ...


RELEASED = {"prefill.cudnn_batch_prefill_with_kv_cache": cudnn_batch_prefill_with_kv_cache,
            "decode.cudnn_batch_decode_with_kv_cache": cudnn_batch_decode_with_kv_cache}


@pytest.fixture(autouse=True)
def no_device_to_wait_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the first call, made at plan


def flashinfer_calls(impl: str, c):
    w = workloads.build(c)
    calls = []
    with standin.installed(lambda obj, cls, method, args, kwargs: calls.append(bound(RELEASED[method], args, kwargs))):
        runner = registry.get(impl).make(w, "cudnn")
        runner.plan()
        runner.run()
    return w, runner, calls


def test_cudnn_through_flashinfer_prefill_gets_the_window_the_pages_and_the_offsets():
    w, runner, calls = flashinfer_calls("cudnn-prefill", case(sinks=True))
    assert len(calls) == 2 and calls[0].keys() == calls[1].keys()  # the first call (the graph built) at plan, then run
    call = calls[-1]
    assert call["q"] is w.q and call["window_left"] == 5 and call["sinks"] is w.sinks and call["out"] is runner.out
    assert call["k_cache"].shape == (w.k_store.shape[0], 2, 16, 64)  # [pages, heads, page_size, dim]: a view
    assert call["k_cache"].data_ptr() == w.k_store.data_ptr() and call["causal"] is True
    table_rows(w, call["block_tables"])
    lens = call["actual_seq_lens_kv"]
    assert lens.shape == (2, 1, 1, 1) and lens.flatten().tolist() == w.kv_lens
    assert call["batch_offsets_q"].tolist() == [x * 8 * 64 for x in w.qo_indptr_host]
    assert call["max_token_per_sequence"] == 3 and call["max_sequence_kv"] == max(w.kv_lens)
    assert call["scale"] == w.sm_scale and runner.compile_s is not None


def test_cudnn_prefill_takes_no_window_as_none_and_ragged_keys_through_offsets():
    w, _, calls = flashinfer_calls("cudnn-prefill", case(window_left=-1, storage="ragged", page_size=None))
    call = calls[-1]
    assert call["window_left"] is None and call["block_tables"] is None and call["k_cache"] is w.k_store
    assert call["batch_offsets_k"].tolist() == [x * 2 * 64 for x in w.kv_indptr.tolist()]


def test_cudnn_through_flashinfer_decode_runs_a_chain_and_a_table_as_wide_as_its_longest_request():
    w, runner, calls = flashinfer_calls("cudnn-decode", case())
    call = calls[-1]
    assert call["q_len_per_req"] == 3 and call["window_left"] == 5 and call["out"] is runner.out
    pages = call["block_tables"].shape[1]
    assert pages == -(-max(w.kv_lens) // 16) and call["max_sequence_kv"] == pages * 16  # cuDNN's rule
    table_rows(w, call["block_tables"])


class Tensor:
    """A graph tensor: what it was declared as, its ragged offset; hashable, as the variant pack's keys are."""

    def __init__(self, like=None, **declared):
        self.like, self.declared, self.ragged = like, declared, None

    def set_ragged_offset(self, offset):
        self.ragged = offset

    def set_output(self, *args):
        return self

    def set_dim(self, dim):
        self.declared["dim"] = dim
        return self

    def set_stride(self, stride):
        self.declared["stride"] = stride
        return self

    set_data_type = set_output


class Graph:
    """The cuDNN frontend's pygraph, recording the tensors it declares, its sdpa and its executes."""

    refuse = None  # what build() raises, where cuDNN declines the graph

    def __init__(self, calls, **kwargs):
        self.calls = calls
        calls.append(("pygraph", kwargs))

    def tensor_like(self, x):
        return Tensor(x)

    def tensor(self, **kwargs):
        return Tensor(**kwargs)

    def sdpa(self, **kwargs):
        self.calls.append(("sdpa", kwargs))
        self.o = Tensor()
        return self.o, None

    def build(self, modes):
        self.calls.append(("build", modes))
        if self.refuse:
            raise self.refuse

    def get_workspace_size(self):
        return 0

    def execute(self, pack, workspace, handle=None):
        self.calls.append(("execute", pack))


@pytest.fixture
def frontend(monkeypatch):
    calls = []
    fake = types.ModuleType("cudnn")
    def pygraph(**kwargs):
        graph = Graph(calls, **kwargs)
        calls.append(("graph", graph))
        return graph

    fake.pygraph = pygraph
    fake.data_type = types.SimpleNamespace(FLOAT="float")
    fake.datatypes = types.SimpleNamespace(_torch_to_cudnn_data_type=str)
    fake.diagonal_alignment = types.SimpleNamespace(BOTTOM_RIGHT="bottom-right")
    fake.heur_mode = types.SimpleNamespace(A="A", FALLBACK="fallback")
    fake.create_handle = lambda: "handle"
    fake.set_stream = lambda handle, stream: None
    fake.backend_version = lambda: 91900
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0))
    cudnn._handle.cache_clear()
    return calls


@pytest.mark.parametrize("impl, bound_", [("cudnn-graph", 6), ("cudnn-graph-band-w", 5)])
def test_the_frontend_graph_counts_the_window_in_keys(frontend, impl, bound_):
    """W + 1 keys ending at the diagonal, bottom-right, causal; the mistake hands cuDNN W."""
    w = workloads.build(case())
    runner = registry.get(impl).make(w, "cudnn")
    runner.plan()
    runner.plan()
    runner.run()
    sdpa = [kw for name, kw in frontend if name == "sdpa"]
    assert len(sdpa) == 1 and len([c for c in frontend if c[0] == "build"]) == 1  # one graph for the shape
    kw = sdpa[0]
    assert kw["diagonal_band_left_bound"] == bound_ and kw["diagonal_band_right_bound"] == 0
    assert kw["diagonal_alignment"] == "bottom-right" and kw["use_padding_mask"] is True and "sink_token" not in kw
    assert kw["attn_scale"] == w.sm_scale and kw["paged_attention_max_seq_len_kv"] % 16 == 0
    assert kw["q"].declared["dim"] == [2, 8, 3, 64] and kw["q"].declared["stride"] == [8 * 64, 64, 8 * 64, 1]
    table_rows(w, kw["paged_attention_k_table"].like.view(2, -1))
    assert kw["seq_len_kv"].like.flatten().tolist() == w.kv_lens
    o = next(c for c in frontend if c[0] == "graph")[1].o
    assert o.declared == {"dim": [2, 8, 3, 64], "stride": [3 * 8 * 64, 64, 8 * 64, 1]}  # packed as the queries are
    assert o.ragged.like.flatten().tolist() == kw["q"].ragged.like.flatten().tolist() == \
        [x * 8 * 64 for x in w.qo_indptr_host]
    packs = [pack for name, pack in frontend if name == "execute"]
    assert len(packs) == 2  # the first call at the first plan (none at the second), then run
    assert any(x is runner.out for x in packs[-1].values()) and any(x is w.q for x in packs[-1].values())


def test_the_frontend_graph_takes_sinks_as_the_sink_token_and_no_window_as_no_band(frontend):
    w = workloads.build(case(sinks=True, window_left=-1))
    registry.get("cudnn-graph").make(w, "cudnn").plan()
    kw = next(kw for name, kw in frontend if name == "sdpa")
    assert "diagonal_band_left_bound" not in kw and kw["sink_token"].like.shape == (1, 8, 1, 1)


def test_cudnn_counts_its_band_where_flashinfer_counts_the_keys_before_the_query():
    assert cudnn.band(5) == 6 and cudnn.band(5, counted=False) == 5 and cudnn.band(-1) is None


def fa4_call(impl: str, c, monkeypatch):
    calls = []

    def varlen(*args, **kwargs):
        calls.append(bound(flash_attn_varlen_func, args, kwargs))
        calls[-1]["returned"] = torch.zeros_like(args[0])
        return calls[-1]["returned"], None

    pkg, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func, pkg.cute = varlen, cute
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    w = workloads.build(c)
    runner = registry.get(impl).make(w, "fa4")
    runner.plan()
    runner.run()
    return w, runner, calls


def test_fa4_gets_window_left_as_it_is_the_pages_and_every_key_of_each_request(monkeypatch):
    w, runner, calls = fa4_call("fa4-window", case(sinks=True, logits_soft_cap=30.0), monkeypatch)
    call = calls[-1]
    assert len(calls) == 2 and call["window_size"] == (5, None) and call["causal"] is True
    assert call["k"] is w.k_store and call["q"] is w.q and call["cu_seqlens_q"].tolist() == w.qo_indptr_host
    assert call["seqused_k"].tolist() == w.kv_lens and call["cu_seqlens_k"] is None  # every key, the new ones too
    table_rows(w, call["page_table"])
    assert call["page_table"].dtype == torch.int32 and call["num_splits"] == 1
    assert call["learnable_sink"] is w.sinks and call["softcap"] == 30.0 and call["softmax_scale"] == w.sm_scale
    assert runner.out is call["returned"] and runner.compile_s is not None  # the output it returned


def test_fa4_takes_no_window_as_none_and_ragged_keys_through_cu_seqlens(monkeypatch):
    w, _, calls = fa4_call("fa4-window", case(window_left=-1, storage="ragged", page_size=None), monkeypatch)
    call = calls[-1]
    assert call["window_size"] == (None, None) and call["page_table"] is None  # never -1: (-1, None) keeps no key
    assert call["cu_seqlens_k"].tolist() == w.kv_indptr.tolist() and call["max_seqlen_k"] == max(w.kv_lens)


def test_fa4_given_a_count_of_keys_sees_one_key_before_its_window(monkeypatch):
    _, _, calls = fa4_call("fa4-window-count", case(), monkeypatch)
    assert calls[-1]["window_size"] == (6, None)


@pytest.mark.parametrize("impl", ["fa4-window-count", "cudnn-graph-band-w"])
@pytest.mark.parametrize("window_left, prefix, must", [(5, (30, 13), True), (40, (30, 13), False),
                                                       (-1, (30, 13), False)])
def test_each_mistake_must_fail_where_a_window_reaches_its_oldest_key(impl, window_left, prefix, must):
    """One key more (FA4 given a count) or one key fewer (cuDNN given W): only a window that begins after key 0
    shows it; with no window, or a window past every request, both see what the truth sees."""
    c = case(window_left=window_left, prefix_len=prefix)
    w = workloads.build(c)
    impl_ = registry.get(impl)
    assert impl_.must_fail(c, w.qo_lens, w.kv_lens, impl_.backends[0]) is must


def test_the_warm_up_builds_a_paged_and_a_ragged_fa4_kernel_apart():
    """FA4's compile key holds cu_seqlens_k, seqused_k and page_table (interface.py): a paged and a ragged point of
    one dtype, head_dim and window run two kernels, so they are two signatures, and each one's tiny case is its own."""
    from swabench.run.sweep import module_signature, modules_needed, tiny_case

    points = [Point(case(storage=storage, page_size=page_size), "fa4-window", "fa4")
              for storage, page_size in (("paged", 16), ("ragged", None))]
    paged, ragged = (module_signature(p) for p in points)
    assert paged != ragged and paged.endswith(" paged") and ragged.endswith(" ragged")
    assert list(modules_needed(points, None)) == [paged, ragged]
    for p in points:
        assert module_signature(Point(tiny_case(p.case), p.impl, p.backend)) == module_signature(p)


def test_the_warm_up_builds_every_fa4_signature_one_after_another():
    """The CuTe DSL keeps each compile's state on one shared object and FA4's compile cache is an unlocked dict: all
    of FA4's builds (both paths, every head_dim, paged and ragged) are one group, built in one thread in turn; every
    other library's signature keeps a group of its own."""
    from swabench.inputs import scenarios
    from swabench.run.sweep import build_groups, module_signature

    ragged = [Point(case(storage="ragged", page_size=None, head_dim=d), impl, "fa4")
              for d in (64, 128) for impl in ("fa4-window", "fa4-window-count")]
    points = scenarios.load(scenarios.find("backends")).points + ragged
    todo = {module_signature(p): p for p in points if registry.get(p.impl).needs_cuda}
    fa4_signatures = {label for label, p in todo.items() if p.impl.startswith("fa4")}
    groups = build_groups(todo)
    together = [g for g in groups if any(p.impl.startswith("fa4") for _, p in g)]
    assert len(together) == 1 and {label for label, _ in together[0]} == fa4_signatures
    assert len(fa4_signatures) > 4 and {p.case.storage for _, p in together[0]} == {"paged", "ragged"}
    assert all(len(g) == 1 for g in groups if g is not together[0]) and sum(map(len, groups)) == len(todo)


def test_the_mistakes_see_one_key_more_and_one_key_fewer():
    c = case()
    assert registry.get("fa4-window-count").computes(c, 30) == semantics.Visibility(6)
    assert registry.get("cudnn-graph-band-w").computes(c, 30) == semantics.Visibility(4)


@pytest.mark.parametrize("impl, fields, says", [
    ("cudnn-decode", dict(mode="decode", sinks=True), "no sink on a graph declared with one query"),
    ("cudnn-prefill", dict(draft_tokens=1, sinks=True), "no sink on a graph declared with one query"),
    ("cudnn-graph", dict(mode="decode", sinks=True), "no sink on a graph declared with one query"),
    ("cudnn-graph", dict(logits_soft_cap=30.0), "no soft-cap"),
    ("cudnn-decode", dict(draft_tokens=(3, 4)), "one draft length for the batch"),
    ("cudnn-graph-band-w", dict(window_left=0), "left bound of 1 or more"),
    ("cudnn-prefill", dict(kv_dtype="float8_e4m3"), "caches of one dtype"),
    ("fa4-window", dict(kv_dtype="float8_e4m3"), "FP8 is SM100's only"),
    ("fa4-window", dict(head_dim=264, num_qo_heads=8), "a multiple of 8 from 8 to 256"),
    ("fa4-window", dict(head_dim=72, page_size=16), "multiple of 16"),
    ("fa4-window", dict(tree="eagle:2:2", draft_tokens=5), "a mask_mod drops causal and the window"),
])
def test_each_backend_says_where_it_cannot_run(impl, fields, says):
    backend = registry.get(impl).backends[0]
    reason = registry.get(impl).skip_reason(case(**fields), backend, None)
    assert reason and says in reason, reason


def test_what_each_backend_runs():
    assert registry.get("cudnn-graph").skip_reason(case(mode="verify", sinks=True), "cudnn", None) is None
    assert registry.get("fa4-window").skip_reason(case(head_dim=72, page_size=128), "fa4", None) is None  # by TMA
    assert registry.get("fa4-window").skip_reason(case(logits_soft_cap=30.0, sinks=True), "fa4", None) is None
    assert registry.get("fa4-window").runs_on(["fa2", "fa3"]) == [] and fa4.window(-1) == (None, None)
    assert registry.get("cudnn-decode").skip_reason(case(mode="draft_extend", accept="uniform", draft_tokens=4),
                                                   "cudnn", None).startswith("models decode and verify")


def test_without_either_package_each_path_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "cudnn", None)
    fa4._import_error.cache_clear()
    cudnn._frontend_error.cache_clear()
    try:
        assert "install flash-attn-4" in registry.get("fa4-window").available()
        assert "install nvidia-cudnn-frontend" in registry.get("cudnn-graph").available()
    finally:
        fa4._import_error.cache_clear()
        cudnn._frontend_error.cache_clear()


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_setup_installs_a_wheel_in_parts_beside_the_wheels_that_share_its_folder(tmp_path):
    """The CuTe DSL's CUDA-13 libraries come in parts and live in the folder its other wheels install into: setup.sh
    must copy them in after pip (whose --upgrade replaces that folder), put the DSL's packages on PYTHONPATH (a .pth
    file is not read there), and say which backends import."""
    import shutil
    import subprocess

    if not all(shutil.which(tool) for tool in ("xz", "split", "sha256sum", "tar")):
        pytest.skip("needs xz, split, sha256sum and tar")
    kit = tmp_path / "kit"
    (kit / "whl-fa4").mkdir(parents=True)  # FA4=1's wheels, in a folder of their own
    for script, name in (("gpu-setup.sh", "setup.sh"), ("gpu-join.sh", "join.sh")):
        shutil.copy(SCRIPTS / script, kit / name)
    wheel_of(kit / "whl-fa4" / "dsl-1.0-py3-none-any.whl", {"dsl/__init__.py": b"", "dsl/dsl_packages/cutlass.py": b""})
    libs = wheel_of(tmp_path / "dsllibs-1.0-py3-none-any.whl", {"dsl/cu13/lib.so": b"\x7fELF" + bytes(1000)})
    subprocess.run(["bash", SCRIPTS / "gpu-split.sh", libs, kit / "parts"], check=True)
    site, stage = tmp_path / "site", tmp_path / "stage"
    shell = (f"source {kit / 'setup.sh'} && echo \"PYTHONPATH=$PYTHONPATH\"")
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True,
                       env={**os.environ, "SWABENCH_SITE": str(site), "SWABENCH_STAGE": str(stage)})
    assert (site / "dsl" / "cu13" / "lib.so").is_file() and (site / "dsl" / "__init__.py").is_file(), r.stderr
    assert "swabench: dsllibs-1.0-py3-none-any.whl joined from 1 parts" in r.stderr
    assert "swabench: flash_attn.cute does not import" in r.stderr  # said, not fatal
    (site / "nvidia_cutlass_dsl" / "dsl_packages").mkdir(parents=True)
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True,
                       env={**os.environ, "SWABENCH_SITE": str(site), "SWABENCH_STAGE": str(stage)})
    assert f"PYTHONPATH={site}/nvidia_cutlass_dsl/dsl_packages:{site}" in r.stdout


def backends_run(rows):
    import pandas as pd

    from swabench.publish.sections.base import Run

    t = pd.DataFrame(rows, columns=["case_id", "impl", "backend", "library", "kind", "mode", "status", "median_us",
                                    "pct_of_floor"])
    t = t.assign(model="gemma-3-27b", reason=["cuDNN takes no soft-cap" if s == "skip" else "" for s in t["status"]],
                 attention_chunk=0, block=0, causal=True, storage="paged")
    return Run("backends-run", t, {"scenario": "backends", "gpu": "NVIDIA H200", "libraries": {"flashinfer": "0.7.4"}})


BACKENDS_RUN = [
    ("c1", "paged-trim", "fa3", "flashinfer", "correct", "verify", "pass", 10.0, 40.0),
    ("c1", "paged-trim", "fa2", "flashinfer", "correct", "verify", "pass", 12.0, 35.0),
    ("c1", "fa4-window", "fa4", "fa4", "correct", "verify", "pass", 8.0, 50.0),
    ("c1", "fa4-window-count", "fa4", "fa4", "known-bug", "verify", "xfail", None, None),
    ("c1", "cudnn-graph", "cudnn", "cudnn", "correct", "verify", "pass", 30.0, 13.0),
    ("c1", "cudnn-graph-band-w", "cudnn", "cudnn", "known-bug", "verify", "xfail", None, None),
    ("c1", "torch-trim", "torch", "torch", "correct", "verify", "pass", 900.0, 1.0),
    ("c2", "paged-trim", "fa3", "flashinfer", "correct", "verify", "pass", 20.0, 40.0),
    ("c2", "fa4-window", "fa4", "fa4", "correct", "verify", "pass", 24.0, 33.0),
    ("c2", "cudnn-graph", "cudnn", "cudnn", "correct", "verify", "skip", None, None),
    ("c2", "cudnn-graph-band-w", "cudnn", "cudnn", "known-bug", "verify", "pass", 50.0, 8.0),
]


def test_the_findings_hold_each_backend_to_flashinfers_best_on_the_same_cases():
    from swabench.publish.sections import backends

    t = backends.backends_table(backends_run(BACKENDS_RUN)).set_index("backend")
    assert list(t.index) == ["FlashInfer", "cuDNN", "FlashAttention-4"]  # the suite's own PyTorch paths are no backend
    assert t.loc["FlashAttention-4", "fastest correct path"] == "`fa4-window [fa4]`"
    assert t.loc["FlashAttention-4", backends.VS_FLASHINFER] == "1.00"  # the median of 8 / 10 and 24 / 20
    assert t.loc["FlashAttention-4", "statuses"] == "pass 2, xfail 1" and t.loc["FlashAttention-4", "cases"] == 2
    assert t.loc["cuDNN", backends.VS_FLASHINFER] == "3.00" and t.loc["cuDNN", "cases"] == 1
    assert t.loc["FlashInfer", "fastest correct path"] == "`paged-trim [fa3]`"
    said = backends.caught_said(backends_run(BACKENDS_RUN))[0]
    assert "`fa4-window-count`, verify: caught on its one point" in said
    assert "`cudnn-graph-band-w`, verify: caught on 1 of 2 points, right on 1 where its semantics make it exact" in said
    assert backends.caught_said(backends_run(BACKENDS_RUN))[-1].startswith(
        "- Every correct cuDNN and FlashAttention-4 path passed the gate wherever it ran (3 points)")
    failing = [r[:6] + ("fail",) + r[7:] if r[1] == "fa4-window" and r[0] == "c2" else r for r in BACKENDS_RUN]
    assert backends.caught_said(backends_run(failing))[-1].startswith(
        "- `fa4-window [fa4]` failed the gate on 1 of 2 points: a library bug until shown otherwise")


def test_the_answer_counts_the_steps_each_backend_is_fastest_on():
    from swabench.publish.sections import backends

    decode = [("d1", "decode-tc-trim", "fa2", "flashinfer", "correct", "decode", "pass", 10.0, 60.0),
              ("d1", "fa4-window", "fa4", "fa4", "correct", "decode", "pass", 13.0, 45.0),
              ("d1", "cudnn-graph", "cudnn", "cudnn", "correct", "decode", "pass", 11.0, 55.0)]
    faster = [(c, i, b, lib, k, m, s, us / 2 if i == "fa4-window" else us, f)
              for c, i, b, lib, k, m, s, us, f in BACKENDS_RUN]  # FA4 at half its time: fastest on verify
    said, = backends.answer([backends_run(faster + decode)])
    assert said == ("- Of 2 steps of 1 model, the fastest correct path is FlashInfer's on 1 (decode 1), cuDNN's on 0 "
                    "(1.10-3.00x FlashInfer's best on the 2 it ran), FlashAttention-4's on 1 (verify 1; 0.50-1.30x "
                    "FlashInfer's best on the 2 it ran) (`backends-run`).")


def test_a_replay_picks_cudnn_through_flashinfer_as_cudnn():
    import pandas as pd

    from swabench.analysis import replay

    rows = pd.DataFrame({"library": ["flashinfer", "flashinfer", "fa4", "torch"],
                         "backend": ["cudnn", "fa2", "fa4", "torch"]})
    assert list(replay.engine_of(rows)) == ["cudnn", "flashinfer", "fa4", "torch"]


def test_a_priced_models_global_layers_are_named_in_the_backends_table():
    from swabench.publish.sections import backends

    run = backends_run(BACKENDS_RUN)
    run.table.loc[run.table["case_id"] == "c2", "model"] = None  # a global layer's step names no model
    run.meta["price"] = {"model": "gemma-3-27b", "layers": {"c1": "window", "c2": "global"}}
    assert set(backends.backends_table(run)["model"]) == {"gemma-3-27b", "gemma-3-27b (global layers)"}


def test_the_findings_say_nothing_of_a_run_where_no_new_backend_timed_a_point():
    from swabench.publish.sections import backends

    only_skips = [r for r in BACKENDS_RUN if r[2] not in ("cudnn", "fa4")] + [
        ("c1", "cudnn-decode", "cudnn", "flashinfer", "correct", "verify", "skip", None, None)]
    assert backends.backends_table(backends_run(only_skips)).empty


def test_a_graph_cudnn_declines_and_a_draw_of_one_query_with_sinks_are_skips(frontend):
    """What cuDNN refuses at build is a skip in its own words; an acceptance draw of one token a request with sinks
    is found at plan (the case says four), before cuDNN is asked."""
    declined = type("cudnnGraphNotSupportedError", (Exception,), {})
    Graph.refuse = declined("No valid engine configs for SDPA\nmore detail")
    try:
        runner = registry.get("cudnn-graph").make(workloads.build(case()), "cudnn")
        with pytest.raises(registry.Unsupported, match="cuDNN declines the graph: No valid engine configs for SDPA$"):
            runner.plan()
    finally:
        Graph.refuse = None
    drawn = case(mode="draft_extend", draft_tokens=4, accept="fixed:1", sinks=True)
    assert registry.get("cudnn-graph").skip_reason(drawn, "cudnn", None) is None  # the case alone cannot say
    with pytest.raises(registry.Unsupported, match="no sink on a graph declared with one query"):
        registry.get("cudnn-graph").make(workloads.build(drawn), "cudnn").plan()


def test_a_run_records_the_cudnn_library_beside_the_frontends_release(frontend, monkeypatch):
    from importlib import metadata

    monkeypatch.setattr(metadata, "version", lambda name: "1.32.0" if name == "nvidia-cudnn-frontend" else
                        (_ for _ in ()).throw(metadata.PackageNotFoundError(name)))
    sys.modules["cudnn"].__version__ = "1.32.0"
    assert cudnn.LIBRARY.version() == "1.32.0 (9.19.0)"
    cudnn._frontend_error.cache_clear()
    try:
        assert cudnn._frontend_error() is None
        sys.modules["cudnn"].backend_version = lambda: 91200
        cudnn._frontend_error.cache_clear()
        assert cudnn._frontend_error().startswith("cuDNN 9.12.0 is loaded; these paths need 9.13 or later")
    finally:
        cudnn._frontend_error.cache_clear()


def test_only_ragged_keys_are_held_to_cudnns_int32_offsets(frontend, monkeypatch):
    """Pages are reached through the table, so a pool past int32 elements is no limit; ragged keys are offsets."""
    monkeypatch.setattr(cudnn, "INT32_MAX", 4_000)
    paged = workloads.build(case())
    assert paged.k_store.numel() > 4_000 > paged.q.numel()
    registry.get("cudnn-graph").make(paged, "cudnn").plan()
    ragged = workloads.build(case(storage="ragged", page_size=None))
    with pytest.raises(registry.Unsupported, match="int32 elements"):
        registry.get("cudnn-prefill").make(ragged, "cudnn").plan()



def test_the_which_backend_figure_is_drawn_where_a_new_backend_timed_a_point():
    from swabench.publish import backend_plots, plots

    run = backends_run(BACKENDS_RUN)
    fig = backend_plots.which_backend(run.table, run.meta)
    assert fig is not None and [ax.get_title() for ax in fig.axes if ax.get_title()] == ["verify"]
    bars = [p for ax in fig.axes for p in ax.patches]
    assert sorted(round(b.get_y() + b.get_height(), 2) for b in bars) == [1.0, 1.0, 3.0]  # FlashInfer, FA4, cuDNN
    assert plots.FIGURES["which_backend"] is backend_plots.which_backend  # `swabench plot` draws it
    only_skips = [r for r in BACKENDS_RUN if r[2] not in ("cudnn", "fa4")]
    assert backend_plots.which_backend(backends_run(only_skips).table, {}) is None


def test_a_path_with_more_shapes_than_a_panel_labels_is_drawn_against_fa2():
    import pandas as pd

    from swabench.publish import backend_plots

    shapes = backend_plots.MOST_BARS + 6
    rows = [{"kind": "correct", "case_id": f"c{i}", "case": f"decode b{i}", "impl": "paged-trim", "backend": b,
             "status": "pass", "median_us": 10.0 + i + (5 if b == "fa3" else 0)}
            for i in range(shapes) for b in ("fa2", "fa3")]
    fig = backend_plots.backends(pd.DataFrame(rows), {})
    ax = next(ax for ax in fig.axes if ax.get_title())
    assert ax.get_title() == f"paged-trim: {shapes} shapes, each against fa2 (below the line: faster)"
    points = ax.collections[0].get_offsets()
    assert len(points) == shapes and all(y > x for x, y in points)  # fa3 5 us slower on each: above the line
