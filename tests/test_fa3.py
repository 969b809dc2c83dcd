"""FlashAttention-3 (impls.fa3), held on stand-ins: every call bound to the signature its build released (vLLM
0.26.0's flash_attn_interface.py, sglang-kernel 0.4.5's flash_attn.py), argument by argument, and what each path
hands it: the window, the whole table, every key of each request, the sinks as bfloat16."""

from __future__ import annotations

import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch

from swabench.core import semantics, workloads
from swabench.impls import fa3, registry
from swabench.inputs import axes

from conftest import bound, table_rows

ROOT = Path(__file__).resolve().parents[1]


def case(**kw):
    base = dict(mode="verify", draft_tokens=3, prefix_len=(30, 13), window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="bfloat16", batch_size=2, page_size=16)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


# the released signatures (bodies never run: a call that binds to them is a call the build takes)
def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                           q_v=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=None, softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
                           return_softmax_lse=False, out=None, scheduler_metadata=None, q_descale=None,
                           k_descale=None, v_descale=None, num_splits=0, output_scale=None, fa_version=2, s_aux=None,
                           cp_world_size=1, cp_rank=0, cp_tot_seqused_k=None, mask_mod=None, aux_tensors=None,
                           dynamic_causal=None): ...


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=None, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, only_qv=False, sm_margin=0,
                            return_softmax_lse=False, sinks=None, score_mod=None, aux_tensors=None, ver=3,
                            out=None): ...


@pytest.fixture(autouse=True)
def no_device_to_wait_for(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the first call, made at plan


def calls_of(impl: str, c, monkeypatch):
    """The calls the path makes at plan and run, each bound to its build's released signature."""
    calls = []
    backend = registry.get(impl).backends[0]
    if backend == fa3.VLLM:
        interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
        interface.flash_attn_varlen_func = lambda *a, **k: calls.append(bound(flash_attn_varlen_func, a, k))
        names = ("vllm", "vllm.vllm_flash_attn", "vllm.vllm_flash_attn.flash_attn_interface")
    else:
        interface = types.ModuleType("sgl_kernel.flash_attn")
        interface.flash_attn_with_kvcache = lambda *a, **k: calls.append(bound(flash_attn_with_kvcache, a, k))
        names = ("sgl_kernel", "sgl_kernel.flash_attn")
    for name in names[:-1]:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, names[-1], interface)
    w = workloads.build(c)
    runner = registry.get(impl).make(w, backend)
    runner.plan()
    runner.run()
    return w, runner, calls


def test_vllms_call_gets_the_window_as_w_and_0_the_whole_table_and_version_3(monkeypatch):
    w, runner, calls = calls_of("fa3-window", case(sinks=True, logits_soft_cap=30.0), monkeypatch)
    call = calls[-1]
    assert len(calls) == 2  # the first call at plan (compile_s), then the run
    assert call["fa_version"] == 3 and call["causal"] is True and call["window_size"] == [5, 0]
    assert call["q"] is w.q and call["k"] is w.k_store and call["v"] is w.v_store and call["out"] is runner.out
    assert call["cu_seqlens_q"].tolist() == w.qo_indptr_host and call["max_seqlen_q"] == max(w.qo_lens)
    assert call["seqused_k"].tolist() == w.kv_lens and call["cu_seqlens_k"] is None  # exactly one of the two
    assert call["max_seqlen_k"] == max(w.kv_lens) and call["block_table"].dtype == torch.int32
    table_rows(w, call["block_table"])
    assert call["s_aux"].dtype == torch.bfloat16 and torch.equal(call["s_aux"], w.sinks.to(torch.bfloat16))
    assert call["softcap"] == 30.0 and call["softmax_scale"] == w.sm_scale and call["num_splits"] == 0
    w.write_sinks(0.0)  # as a probe does, after plan: the tensor the call holds follows
    assert call["s_aux"].abs().sum() == 0


def test_vllms_call_takes_ragged_keys_through_cu_seqlens_and_no_window_as_minus_one(monkeypatch):
    w, _, calls = calls_of("fa3-window", case(window_left=-1, storage="ragged", page_size=None), monkeypatch)
    call = calls[-1]
    assert call["window_size"] == [-1, -1] and call["block_table"] is None and call["seqused_k"] is None
    assert call["cu_seqlens_k"].tolist() == w.kv_indptr.tolist() and call["s_aux"] is None and call["softcap"] == 0.0


def test_the_window_given_as_a_count_sees_one_key_more(monkeypatch):
    _, _, calls = calls_of("fa3-window-count", case(), monkeypatch)
    assert calls[-1]["window_size"] == [6, 0]
    assert registry.get("fa3-window-count").computes(case(), 30) == semantics.Visibility(6)


@pytest.mark.parametrize("mode, new_keys", [("verify", True), ("extend", True), ("decode", False)])
def test_sglangs_call_is_its_backends_over_the_whole_table(mode, new_keys, monkeypatch):
    """SGLang's extend and verify hand cu_seqlens_k_new (which FA3 ignores without new keys), its decode does not;
    each hands the request's key count as cache_seqlens and the window as (sliding_window - 1, 0) = (W, 0)."""
    c = case(mode=mode, draft_tokens=3 if mode == "verify" else None, extend_len=7 if mode == "extend" else None,
             sinks=True)
    w, runner, calls = calls_of("sglang-fa3", c, monkeypatch)
    call = calls[-1]
    assert call["window_size"] == (5, 0) and call["causal"] is True and call["out"] is runner.out
    assert call["cache_seqlens"].tolist() == w.kv_lens and call["max_seqlen_q"] == max(w.qo_lens)
    assert (call["cu_seqlens_k_new"] is not None) is new_keys and call["k"] is None and call["v"] is None
    table_rows(w, call["page_table"])
    assert call["sinks"].dtype == torch.bfloat16 and call["return_softmax_lse"] is False


@pytest.mark.parametrize("impl, fields, says", [
    ("fa3-window", dict(head_dim=72), "head_dim 64, 96, 128, 192, 256"),
    ("fa3-window", dict(kv_dtype="float8_e4m3"), "FP8 path is not built here"),
    ("fa3-window", dict(tree="eagle:2:2", draft_tokens=5), "no tree mask"),
    ("sglang-fa3", dict(dtype="float16", sinks=True), "sinks with bfloat16"),
])
def test_each_build_says_where_it_cannot_run(impl, fields, says):
    assert says in registry.get(impl).skip_reason(case(**fields), registry.get(impl).backends[0], None)


def test_sglangs_path_is_paged_only_and_each_path_runs_on_its_build_alone():
    assert registry.get("sglang-fa3").storages == ("paged",) and registry.get("fa3-window").runs_on(["fa2"]) == []
    assert registry.get("fa3-window").runs_on([fa3.VLLM, fa3.SGL]) == [fa3.VLLM]
    assert fa3.window(-1) == (-1, -1) and fa3.window(127) == (127, 0) and fa3.window(127, 1) == (128, 0)


def test_without_a_build_each_path_says_what_to_install(monkeypatch):
    fa3.import_error.cache_clear()
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "sgl_kernel", None)
    try:
        assert "FA3=1's bundle" in registry.get("fa3-window").available()
        assert "SGL_FA3=1's bundle" in registry.get("sglang-fa3").available()
    finally:
        fa3.import_error.cache_clear()


def test_a_subset_wheel_keeps_the_files_asked_for_and_says_what_it_is(tmp_path):
    """scripts/subset-wheel.py: the kept files as the source holds them, empty package files, the build's line
    beside them, and a RECORD that gpu-join.sh's check accepts; a path the source lacks is refused (exit 2)."""
    source = tmp_path / "engine-1.2.3-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(source, "w") as z:
        z.writestr("engine/__init__.py", "import engine.everything\n")
        z.writestr("engine/attn/lib.so", b"\x7fELF...")
        z.writestr("engine/attn/interface.py", "from . import lib\n")
    script = [sys.executable, str(ROOT / "scripts/subset-wheel.py"), str(source), str(tmp_path / "out"),
              "--name", "swabench-engine-attn", "--keep", "engine/attn/lib.so", "--keep", "engine/attn/interface.py",
              "--empty", "engine/__init__.py", "--build", "built for torch 2.11.0"]
    made = Path(subprocess.run(script, capture_output=True, text=True, check=True).stdout.strip())
    assert made.name == "swabench_engine_attn-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(made) as z:
        z.extractall(tmp_path / "files")
        assert z.read("engine/attn/lib.so") == b"\x7fELF..." and z.read("engine/__init__.py") == b""
        assert z.read("engine/attn/SWABENCH_BUILD") == b"built for torch 2.11.0\n"
    checked = subprocess.run(["bash", str(ROOT / "scripts/gpu-join.sh"), "--check-record", str(tmp_path / "files"),
                              made.name], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    refused = subprocess.run(script[:-2] + ["--keep", "engine/nope.so", "--build", "x"], capture_output=True, text=True)
    assert refused.returncode == 2 and "engine/nope.so" in refused.stderr


def test_fa3_is_drawn_and_named_as_a_backend_beyond_flashinfers():
    """Every engine the backends section names has a colour of its own, and FA3's paths share a hue of their own,
    apart from cuDNN's and FA4's: an engine figure's bars tell the five engines apart."""
    from matplotlib.colors import to_rgb

    from swabench.publish import style
    from swabench.publish.sections.backends import BEYOND

    assert set(BEYOND.values()) <= set(style.ENGINE_COLOUR)
    assert {style.family(n) for n in ("fa3-window", "fa3-window-count", "sglang-fa3", "sglang-fa3-tree")} == {"fa3"}
    assert style.family("fa4-window") == style.family("cudnn-prefill") == "beyond"
    colours = [to_rgb(c) for c in style.ENGINE_COLOUR.values()]
    assert min(sum(abs(a - b) for a, b in zip(x, y)) for i, x in enumerate(colours) for y in colours[i + 1:]) > 0.25
