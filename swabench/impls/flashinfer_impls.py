"""FlashInfer implementations (docs/serving-paths.md): every single-wrapper FlashInfer row, correct and
known-bug (the engines' multi-wrapper recipes are in ``recipes``).  One runner covers them all; a Variant says
what differs: paged or ragged storage, whether ``window_left`` reaches ``plan()`` or a custom mask does, where
the page table starts and ends, the deprecated ``forward``, the decode wrapper (CUDA-core or tensor-core
kernel), the sink wrappers or sinks handed to a wrapper that drops them.  The case's ``wrapper_mode`` builds
the wrapper for CUDA-graph capture (fixed buffers, a schedule padded for any batch of the size) or plain;
either way the object that passed the gate is captured and timed (a plain ``run()`` may be, unplanned again).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from swabench.core import semantics, workloads
from swabench.core.cases import WRAPPER_MODES
from .fa2_run_window import merged_out_of_step, window_at_run
from .flashinfer_library import (BACKENDS, CUDA_CORE_BACKENDS, CUDA_CORE_DECODE_GROUPS, CUDNN, DTYPES, HEAD_DIMS,
                                 LIBRARY, SINK_HEAD_DIMS, SINK_WRAPPERS, _import_error, _sink_module, accepts)
from .flashinfer_workspace import WORKSPACE_BYTES, plan_sized, resource_errors, workspace
from .registry import Implementation, Unsupported, register

@dataclass(frozen=True)
class Variant:
    storage: str  # "paged" | "ragged"
    window_at_plan: bool = True  # plan(..., window_left=W); False plans without a window
    mask: bool = False  # window and causality (and a draft tree) as a custom mask over the table, no window at plan
    mask_window: bool = False  # with the mask: the window to plan() as window_left, the mask the rest (the tree)
    start: Callable[..., int] | None = None  # (case, qo, kv, page) -> first key kept
    end: Callable[..., int] | None = None  # (case, qo, kv, page) -> the key the table ends before
    plan_window: Callable[..., int] | None = None  # case -> the window_left plan() gets, where not the case's
    deprecated_forward: bool = False  # run through forward(..., window_left=W)
    decode: str | None = None  # "cuda-core" | "tensor-core": BatchDecodeWithPagedKVCacheWrapper, decode steps only
    modes: tuple[str, ...] = ()  # the steps it models, where not every mode (): all
    sinks: str | None = None  # "apply": BatchAttentionWithAttentionSinkWrapper; "drop": run(..., sinks=s) on the
    # prefill wrapper, which takes them and leaves them out

    def spans(self, case, qo_lens, kv_lens, page_size: int) -> list[tuple[int, int]]:
        """Each request's keys ``[start, end)`` that its table holds."""
        return [(self.start(case, q, k, page_size) if self.start else 0, self.end(case, q, k, page_size) if self.end
                 else k) for q, k in zip(qo_lens, kv_lens)]


def _needs(variant: Variant) -> list[tuple[str, str, str | None]]:
    """The FlashInfer API a variant calls: (class, method, keyword it passes, or None)."""
    paged, ragged = "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"
    cls = "BatchDecodeWithPagedKVCacheWrapper" if variant.decode else paged if variant.storage == "paged" else ragged
    needs = [(cls, "__init__", "backend")]
    if not variant.decode and not variant.mask:
        needs.append((cls, "plan", "window_left"))
    if variant.sinks == "apply":
        needs = [(SINK_WRAPPERS[bool(variant.decode)], "__init__", "window_left")]
    if variant.sinks == "drop":
        needs.append((paged, "run", "sinks"))
    if variant.deprecated_forward:
        needs.append((cls, "forward", "window_left"))
    return needs


def missing_api(needs) -> Callable[[], str | None]:
    """``available`` of a path: why the installed FlashInfer cannot run it (not importable, or a release
    without the class, method or keyword it calls, named with the release), or None."""
    @lru_cache(maxsize=1)
    def check() -> str | None:
        error = _import_error()
        if error:
            return error
        import flashinfer

        release = f"flashinfer {LIBRARY.version()}"
        for cls_name, method, keyword in needs:
            cls = getattr(flashinfer, cls_name, None)
            if cls is None:
                return f"{release} has no {cls_name}"
            fn = getattr(cls, method, None)
            if fn is None:
                return f"{release} has no {cls_name}.{method}"
            params = inspect.signature(fn).parameters
            if keyword and keyword not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                return f"{release}'s {cls_name}.{method} takes no {keyword}"
        return None
    return check


def graph_buffers(w: workloads.Workload, paged: bool, mask_bytes: int | None = None) -> dict:
    """A prefill wrapper's CUDA-graph mode: its fixed index buffers (and a custom mask's), sized for ``w``."""
    b, dev, i32 = w.batch_size, w.device, torch.int32
    bufs = dict(use_cuda_graph=True, qo_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
    if paged:
        bufs.update(paged_kv_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev),
                    paged_kv_indices_buf=torch.empty(len(w.kv_indices_host), dtype=i32, device=dev),
                    paged_kv_last_page_len_buf=torch.empty(b, dtype=i32, device=dev))
    else:
        bufs.update(kv_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
    if mask_bytes is not None:
        bufs.update(custom_mask_buf=torch.empty(mask_bytes, dtype=torch.uint8, device=dev),
                    mask_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
    return bufs


class FlashInferRunner:
    """One wrapper, planned for one workload.  ``graph_wrapper``: built in CUDA-graph mode, as a server capturing
    verify/decode builds it (its planner allows any batch of this size).  ``uniform_hint``: where every request
    has the same query count, the planner is told (``uniform_q_len``, where the installed FlashInfer takes it), so
    fa2 sizes its query tile for it rather than for the ragged worst case."""

    def __init__(self, w: workloads.Workload, backend: str, variant: Variant, graph_wrapper: bool = True,
                 uniform_hint: bool = True):
        import flashinfer

        self.w, self.variant, self.backend = w, variant, backend
        self.graph_wrapper = graph_wrapper
        self.resolved_backend = backend
        self.out = torch.empty_like(w.q)
        b, dev, i32 = w.batch_size, w.device, torch.int32
        paged = variant.storage == "paged"
        bufs = {}
        if variant.decode:  # the decode wrapper names its buffers its own way
            bufs = dict(use_tensor_cores=variant.decode == "tensor-core")
            if graph_wrapper:
                bufs.update(use_cuda_graph=True,
                            paged_kv_indptr_buffer=torch.empty(b + 1, dtype=i32, device=dev),
                            paged_kv_indices_buffer=torch.empty(len(w.kv_indices_host), dtype=i32, device=dev),
                            paged_kv_last_page_len_buffer=torch.empty(b, dtype=i32, device=dev))
        elif graph_wrapper:
            kept = [e - s for s, e in variant.spans(w.case, w.qo_lens, w.kv_lens, w.page_size)]
            bufs = graph_buffers(w, paged, semantics.packed_mask_bytes(w.qo_lens, kept) if variant.mask else None)
        cls = flashinfer.BatchDecodeWithPagedKVCacheWrapper if variant.decode else \
            flashinfer.BatchPrefillWithPagedKVCacheWrapper if paged else flashinfer.BatchPrefillWithRaggedKVCacheWrapper
        if variant.sinks == "apply":  # its JIT module is chosen at construction: the dtypes and the window
            SINK_HEAD_DIMS.setdefault(_sink_module(w.case, backend), set()).add(w.case.head_dim)
            cls = getattr(flashinfer, SINK_WRAPPERS[bool(variant.decode)])
            bufs.pop("use_tensor_cores", None)  # the decode sink wrapper always runs the tensor-core kernel
            bufs.update(q_data_type=w.dtype, kv_data_type=w.kv_dtype, head_dim_qk=w.case.head_dim,
                        head_dim_vo=w.case.head_dim, window_left=w.case.window_left)
        self._new_wrapper = lambda workspace: cls(workspace, "NHD", backend=backend, **bufs)
        self._workspace_bytes = WORKSPACE_BYTES
        self.wrapper = self._new_wrapper(workspace(dev, WORKSPACE_BYTES))
        self.workspace_mib: int | None = None  # set by the first successful plan()
        self.hint = uniform_hint and not variant.decode and len(set(w.qo_lens)) == 1 \
            and accepts(self.wrapper.plan, "uniform_q_len")

    def plan(self) -> None:
        """Host work of one serving step: trimmed page tables or the custom mask, then plan()."""
        w, v, c = self.w, self.variant, self.w.case
        i32 = torch.int32
        qo_indptr = torch.tensor(w.qo_indptr_host, dtype=i32)
        window_left = (v.plan_window(c) if v.plan_window else c.window_left) if v.window_at_plan else semantics.NO_WINDOW
        ps = w.page_size
        starts, ends = zip(*v.spans(c, w.qo_lens, w.kv_lens, ps))
        if v.decode:  # one query per request: no query indptr, no causal flag
            window = dict(head_dim=c.head_dim, window_left=window_left)
        elif v.mask:  # over the keys the table holds; the kernel ANDs it with plan()'s window, by row
            rule = semantics.of_case(c)
            if v.mask_window:
                rule = dataclasses.replace(rule, window_left=semantics.NO_WINDOW)
            window = dict(custom_mask=semantics.custom_mask(w.qo_lens, w.kv_lens, rule, w.device, w.trees, starts),
                          causal=False, head_dim_qk=c.head_dim, **({"window_left": c.window_left} if v.mask_window
                                                                     else {}))
        else:
            window = dict(causal=c.causal, window_left=window_left, head_dim_qk=c.head_dim)
        shape = dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, q_data_type=w.dtype,
                     kv_data_type=w.kv_dtype, sm_scale=w.sm_scale, **window)
        if c.logits_soft_cap:
            shape["logits_soft_cap"] = c.logits_soft_cap
        if self.hint:
            shape["uniform_q_len"] = w.qo_lens[0]
        if v.storage == "ragged":
            args = (qo_indptr, w.kv_indptr_host.to(i32))
        else:
            indptr, indices, last = w.kv_indptr_host, w.kv_indices_host, w.kv_last_page_len.cpu()
            if v.start is not None or v.end is not None:
                indptr, indices, last = workloads.slice_page_table(indptr, indices, starts, ends, ps)
            args = (qo_indptr,) * (not v.decode) + (indptr.to(i32), indices.to(i32), last)
            shape["page_size"] = ps
        self._plan(args, shape)
        # the decode wrapper says what backend="auto" resolved to (cuDNN, XQA, a tensor-core pick)
        self.resolved_backend = getattr(self.wrapper, "resolved_backend", None) or getattr(self.wrapper, "_backend",
                                                                                           self.backend)
        self.layout = ("cuda-graph" if self.graph_wrapper else "plain") + \
            (f", uniform_q_len={shape['uniform_q_len']}" if "uniform_q_len" in shape else "")

    def _plan(self, args, shape: dict) -> None:
        plan_sized(self, args, shape)

    def run(self) -> None:
        w = self.w
        kv = (w.k_store, w.v_store)
        if self.variant.deprecated_forward:
            # forward() resets the scale and soft-cap that plan() took: hand them over again
            self.out.copy_(self.wrapper.forward(w.q, kv, causal=True, window_left=w.case.window_left,
                                                sm_scale=w.sm_scale, logits_soft_cap=w.case.logits_soft_cap or None))
        elif self.variant.sinks == "apply":  # the variant's extra tensor and scalar, positionally
            self.wrapper.run(w.q, kv, w.sinks, w.sm_scale, out=self.out)
        elif self.variant.sinks == "drop":
            self.wrapper.run(w.q, kv, out=self.out, sinks=w.sinks)
        elif self.variant.storage == "paged":
            self.wrapper.run(w.q, kv, out=self.out)
        else:
            self.wrapper.run(w.q, *kv, out=self.out)


def unsupported(variant: Variant, head_dims: tuple[int, ...] | None = HEAD_DIMS):
    """The variant's check: why FlashInfer cannot run a case on a backend this way, or None; ``head_dims``: those
    its kernels are built for (None: a family that checks its own, as TRT-LLM's XQA and fmha v2 do)."""
    def check(case, backend: str) -> str | None:
        if case.sinks and not variant.sinks:
            return ("this wrapper has no sink term: only BatchAttentionWithAttentionSinkWrapper applies sinks "
                    "(never run without them)")
        if variant.sinks == "apply" and case.logits_soft_cap:
            return "the sink wrapper's AttentionSink variant applies no soft-cap"
        if variant.end is not None and case.window_left < 0:
            return "cuts the table to the window: it models a sliding-window layer (window_left >= 0)"
        if case.dtype not in DTYPES:
            return f"FlashInfer attention takes {' or '.join(DTYPES)}, not {case.dtype}"
        if head_dims and case.head_dim not in head_dims:
            return (f"FlashInfer is built for head_dim {'/'.join(map(str, head_dims))}, not {case.head_dim} (fa3 "
                    f"asserts it; fa2 prefill JIT-builds any head_dim but only multiples of 64 run right: "
                    f"flashinfer issue 4299)")
        if variant.mask and backend == "fa3":
            return "fa3 has no custom-mask support"
        if backend == CUDNN:
            return _cudnn_unsupported(case)
        if variant.decode == "cuda-core" and case.gqa_group not in CUDA_CORE_DECODE_GROUPS:
            return (f"FlashInfer's CUDA-core decode kernel has no GQA group of {case.gqa_group} (DISPATCH_GQA_GROUP_SIZE "
                    f"takes {', '.join(map(str, CUDA_CORE_DECODE_GROUPS))}; \"Unsupported group_size\" at run); "
                    f"the tensor-core decode runs it")
        if backend == "fa3" and "fp8_kv" in case.features:
            return ("fa3 reads an fp8 KV cache only with fp8 queries (flashinfer 0.7.2 "
                    "utils.is_fa3_backend_supported; bf16 x fp8 has no Hopper GMMA, so the module does not build)")
        return None
    return check


def _cudnn_unsupported(case) -> str | None:
    """Why the decode wrapper's cudnn backend cannot run a case: the package it needs, or what its graph
    leaves out (soft-cap, an fp8 cache)."""
    import importlib.util

    if importlib.util.find_spec("cudnn") is None:
        return ("the cudnn decode backend needs the cuDNN frontend package (nvidia-cudnn-frontend, `import cudnn`), "
                "not installed here")
    if case.logits_soft_cap:
        return "the cudnn decode backend applies no soft-cap"
    if "fp8_kv" in case.features:
        return "the cudnn decode backend takes one dtype for queries and cache (no fp8 cache under bf16 queries)"
    return None


VARIANTS: dict[str, Variant] = {}  # every registered path's call


def planned_kv_lens(impl: str, case, qo_lens, kv_lens) -> list[int]:
    """The keys each request's table holds as ``impl`` plans it: from the first key it keeps (a trimming path's
    first page) to the key its table ends before."""
    return [e - s for s, e in VARIANTS[impl].spans(case, qo_lens, kv_lens, case.page_size or 1)]


def register_variant(name, summary, variant: Variant, kind="correct", visibility=None, wrapper=None,
                     module: str = __name__, runner=None, also: Callable[..., str | None] | None = None, **roles):
    """Register a FlashInfer path for ``module``; ``roles`` are Implementation's role fields (baseline,
    reference, timed_where_exact, ignores, noncausal, chunked, chunk_visibility, requires).  ``runner(w, backend,
    variant)`` builds its runner where that is not a FlashInferRunner; ``also(case, backend)`` says why
    it cannot run a case beyond what the variant says."""
    build = runner or FlashInferRunner

    # the CUDA-core decode kernel is one kernel, whatever the backend; use_tensor_cores=True runs the prefill kernels
    backends = CUDA_CORE_BACKENDS if variant.decode == "cuda-core" else BACKENDS

    def make(w, backend):
        if backend not in backends:
            raise Unsupported(f"{name} takes the FlashInfer backends {', '.join(backends)}, not {backend!r}")
        with resource_errors():
            return build(w, backend, variant, graph_wrapper=w.case.wrapper_mode == "cuda-graph")

    def check(case, backend: str) -> str | None:
        return (also(case, backend) if also else None) or unsupported(variant)(case, backend)

    extra = {"visibility": visibility} if visibility else {}
    wrapper = wrapper or ("decode" if variant.decode else "sink" if variant.sinks == "apply" else "prefill")
    modes = ("decode",) if variant.decode else variant.modes  # the decode wrapper takes one query per request
    requires = roles.pop("requires", frozenset({"sinks"} if variant.sinks else ()))
    VARIANTS[name] = variant
    register(Implementation(name, LIBRARY.name, (variant.storage,), summary, make, kind=kind, wrapper=wrapper,
                            backends=backends, modes=modes, requires=requires, wrapper_modes=WRAPPER_MODES,
                            needs_cuda=True, unsupported=check, available=missing_api(_needs(variant)),
                            **extra, **roles), module)


def trim(case, qo_len, kv_len, page_size):
    """The table from the page holding the first key some query of the block sees (its window's, or its
    chunk's)."""
    return semantics.trim_start(kv_len, qo_len, case.window_left, page_size, case.attention_chunk)


def _request_trim(case, qo_len, kv_len, page_size):
    return semantics.buggy_trim_start(kv_len - qo_len, case.window_left, page_size)


register_variant("paged-window", "paged wrapper, plan(causal=True, window_left=W)", Variant("paged"),
                 reference="fa2", noncausal=True)
register_variant("paged-trim", "page table starts at the window (kv_start_idx trimming), planned with window_left=W",
                 Variant("paged", start=trim), noncausal=True)
register_variant("ragged-window", "ragged wrapper, plan(causal=True, window_left=W)", Variant("ragged"),
                 reference="fa2", noncausal=True)
register_variant("paged-mask", "full KV, window and causality as a custom mask (naive)", Variant("paged", mask=True),
                 baseline=True, noncausal=True, chunked=True, block=True)
register_variant("ragged-mask", "ragged wrapper, window and causality as a custom mask (naive)",
                 Variant("ragged", mask=True), baseline=True, noncausal=True, chunked=True, block=True)
register_variant("paged-plan-no-window", "plan() without window_left, then the deprecated forward(window_left=W): "
                 "plan() builds the kernel without the window mask, yet run() hands it W; fa2 starts each query "
                 "tile's keys at its first query's window start, so later queries of a tile see keys before their "
                 "window (one query a request is exact), and where plan() split a request of several queries into "
                 "more KV chunks than W needs, the merge reads its rows' partials out of step; fa3 ignores W and "
                 "reads every key",
                 Variant("paged", window_at_plan=False, deprecated_forward=True), kind="known-bug",
                 visibility=lambda w, prefix, ps: semantics.Visibility(semantics.NO_WINDOW), seen=window_at_run,
                 garbled=merged_out_of_step)
register_variant("paged-trim-causal", "table trimmed at the page holding key prefix - W, planned causal without "
                 "a window: query j sees every key from that page's start, j more than the first query does",
                 Variant("paged", window_at_plan=False, start=_request_trim), kind="known-bug",
                 visibility=lambda w, prefix, ps: semantics.Visibility(
                     semantics.NO_WINDOW, first_key=semantics.buggy_trim_start(prefix, w, ps)))


def _decode_trim_window(window_left, prefix_len, page_size):
    """What SGLang's decode recipe sees: the table trimmed to the page holding key kv_len-1-W and no
    window at plan, so the first page brings up to page_size - 1 keys from before the window."""
    return semantics.Visibility(semantics.NO_WINDOW, first_key=semantics.trim_start(prefix_len + 1, 1, window_left,
                                                                                     page_size))


register_variant("decode-window", "decode wrapper, CUDA-core kernel, full page table, plan(window_left=W)",
                 Variant("paged", decode="cuda-core"))
register_variant("decode-trim", "decode wrapper, CUDA-core kernel, table from the page holding key kv_len-1-W, "
                 "window_left=W", Variant("paged", decode="cuda-core", start=trim))
register_variant("decode-trim-nowindow", "SGLang's decode recipe: trimmed table (kv_start_idx), window_left=-1 at "
                 "plan: exact only when pages hold one token",
                 Variant("paged", decode="cuda-core", start=trim, window_at_plan=False), kind="known-bug",
                 visibility=_decode_trim_window, timed_where_exact=True)
register_variant("decode-tc-window", "decode wrapper with use_tensor_cores=True (a prefill kernel, qo_len 1), full "
                 "table, window_left=W", Variant("paged", decode="tensor-core"))
register_variant("decode-tc-trim", "decode wrapper with use_tensor_cores=True, table from the page holding key "
                 "kv_len-1-W, window_left=W", Variant("paged", decode="tensor-core", start=trim))
register_variant("sink-window", "BatchAttentionWithAttentionSinkWrapper (GPT-OSS), plan(causal=True, window_left=W), "
                 "run(q, kv, sinks, sm_scale)", Variant("paged", sinks="apply"))
register_variant("paged-sinks-dropped", "paged prefill wrapper, run(..., sinks=s): fa2 and fa3 take the sinks and "
                 "leave them out", Variant("paged", sinks="drop"), kind="known-bug", ignores=frozenset({"sinks"}))
