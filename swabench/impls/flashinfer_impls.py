"""FlashInfer implementations (DESIGN section 2): every FlashInfer row, correct and known-bug.

One runner covers them all; a Variant says what differs: paged or ragged storage, whether
``window_left`` reaches ``plan()``, whether the window is a custom mask instead, where the page
table starts (trimming), and whether ``run`` goes through the deprecated ``forward``.  Wrappers are
built in CUDA-graph mode (fixed buffers sized for the workload) so the very objects that pass the
gate can be captured and timed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch

from .. import semantics, workloads
from .registry import Implementation, Unsupported, register

BACKENDS = ("fa2", "fa3", "auto")
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
WORKSPACE_BYTES = 256 << 20  # FlashInfer recommends 128 MiB; split-kv on 64 x 32k batches wants more


@lru_cache(maxsize=1)
def _import_error() -> str | None:
    try:
        import flashinfer  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA setup inside flashinfer's import
        return f"flashinfer is not importable ({type(e).__name__}: {e}); install swabench[gpu]"
    return None


def jit_modules() -> dict[str, float]:
    """FlashInfer's compiled JIT modules on disk, name -> modification time ({} without flashinfer).
    Taken before and after a warm-up, the difference is what the warm-up built."""
    if _import_error():
        return {}
    from flashinfer.jit import env
    return {so.parent.name: so.stat().st_mtime for so in env.FLASHINFER_JIT_DIR.glob("*/*.so")}


def jit_cache_dir() -> str | None:
    if _import_error():
        return None
    from flashinfer.jit import env
    return str(env.FLASHINFER_JIT_DIR)


@lru_cache(maxsize=None)
def _workspace(device: torch.device) -> torch.Tensor:
    """One float workspace per device, shared by every wrapper (as serving engines do)."""
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


@dataclass(frozen=True)
class Variant:
    storage: str  # "paged" | "ragged"
    window_at_plan: bool = True  # plan(..., window_left=W); False plans without a window
    mask: bool = False  # window and causality as a custom mask, full KV, no window at plan
    start: Callable[[int, int, int, int], int] | None = None  # (W, qo, kv, page) -> first key kept
    deprecated_forward: bool = False  # run through forward(..., window_left=W)


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


class FlashInferRunner:
    """One wrapper, planned for one workload.

    ``graph_wrapper``: build the wrapper in CUDA-graph mode (what a server capturing verify/decode
    steps uses; its planner must allow any batch of this size).  ``uniform_hint``: when every
    request has the same query count, tell the planner (``uniform_q_len``, where the installed
    FlashInfer has it) so fa2 sizes its query tile for it rather than for the ragged worst case.
    """

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
        if graph_wrapper:  # fixed buffers sized for this workload, as CUDA-graph mode requires
            bufs = dict(use_cuda_graph=True, qo_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
            if paged:
                bufs.update(paged_kv_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev),
                            paged_kv_indices_buf=torch.empty(len(w.kv_indices_host), dtype=i32, device=dev),
                            paged_kv_last_page_len_buf=torch.empty(b, dtype=i32, device=dev))
            else:
                bufs.update(kv_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
            if variant.mask:
                bufs.update(custom_mask_buf=torch.empty(semantics.packed_mask_bytes(w.qo_lens, w.kv_lens),
                                                        dtype=torch.uint8, device=dev),
                            mask_indptr_buf=torch.empty(b + 1, dtype=i32, device=dev))
        cls = flashinfer.BatchPrefillWithPagedKVCacheWrapper if paged else flashinfer.BatchPrefillWithRaggedKVCacheWrapper
        self.wrapper = cls(_workspace(dev), "NHD", backend=backend, **bufs)
        self.hint = uniform_hint and len(set(w.qo_lens)) == 1 and _accepts(self.wrapper.plan, "uniform_q_len")

    def plan(self) -> None:
        """Host work of one serving step: trimmed page tables or the custom mask, then plan()."""
        w, v, c = self.w, self.variant, self.w.case
        i32 = torch.int32
        qo_indptr = torch.tensor(w.qo_indptr_host, dtype=i32)
        if v.mask:
            window = dict(custom_mask=semantics.custom_mask(w.qo_lens, w.kv_lens, semantics.Visibility(c.window_left),
                                                            device=w.device), causal=False)
        else:
            window = dict(causal=True, window_left=c.window_left if v.window_at_plan else semantics.NO_WINDOW)
        shape = dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                     q_data_type=w.dtype, kv_data_type=w.dtype, **window)
        if self.hint:
            shape["uniform_q_len"] = w.qo_lens[0]
        if v.storage == "ragged":
            self.wrapper.plan(qo_indptr, w.kv_indptr_host.to(i32), **shape)
        else:
            indptr, indices, ps = w.kv_indptr_host, w.kv_indices_host, w.page_size
            if v.start is not None:
                starts = [v.start(c.window_left, q, k, ps) for q, k in zip(w.qo_lens, w.kv_lens)]
                indptr, indices, _ = workloads.trim_page_table(indptr, indices, w.kv_lens, starts, ps)
            self.wrapper.plan(qo_indptr, indptr.to(i32), indices.to(i32), w.kv_last_page_len.cpu(),
                              page_size=ps, **shape)
        self.resolved_backend = getattr(self.wrapper, "_backend", self.backend)
        self.wrapper_mode = ("cuda-graph" if self.graph_wrapper else "plain") + \
            (f", uniform_q_len={shape['uniform_q_len']}" if "uniform_q_len" in shape else "")

    def run(self) -> None:
        w = self.w
        kv = (w.k_store, w.v_store)
        if self.variant.deprecated_forward:
            self.out.copy_(self.wrapper.forward(w.q, kv, causal=True, window_left=w.case.window_left))
        elif self.variant.storage == "paged":
            self.wrapper.run(w.q, kv, out=self.out)
        else:
            self.wrapper.run(w.q, *kv, out=self.out)


def _unsupported(mask: bool):
    def check(case, backend: str) -> str | None:
        if case.dtype not in DTYPES:
            return f"FlashInfer attention takes {' or '.join(DTYPES)}, not {case.dtype}"
        if case.head_dim not in HEAD_DIMS:
            return f"FlashInfer prefill is built for head_dim {'/'.join(map(str, HEAD_DIMS))}, not {case.head_dim}"
        if mask and backend == "fa3":
            return "fa3 has no custom-mask support"
        return None
    return check


def _register(name, summary, variant: Variant, kind="correct", visibility=None):
    def make(w, backend):
        if backend not in BACKENDS:
            raise Unsupported(f"unknown FlashInfer backend {backend!r}")
        return FlashInferRunner(w, backend, variant)

    extra = {"visibility": visibility} if visibility else {}
    register(Implementation(name, "flashinfer", (variant.storage,), summary, make, kind=kind, backends=BACKENDS,
                            needs_cuda=True, unsupported=_unsupported(variant.mask), available=_import_error,
                            **extra))


def _trim(window_left, qo_len, kv_len, page_size):
    return semantics.trim_start(kv_len, qo_len, window_left, page_size)


def _request_trim(window_left, qo_len, kv_len, page_size):
    return semantics.buggy_trim_start(kv_len - qo_len, window_left, page_size)


_register("paged-window", "paged wrapper, plan(causal=True, window_left=W)", Variant("paged"))
_register("paged-trim", "page table starts at the window (kv_start_idx trimming), planned with window_left=W",
          Variant("paged", start=_trim))
_register("ragged-window", "ragged wrapper, plan(causal=True, window_left=W)", Variant("ragged"))
_register("paged-mask", "full KV, window and causality as a custom mask (naive)", Variant("paged", mask=True))
_register("ragged-mask", "ragged wrapper, window and causality as a custom mask (naive)", Variant("ragged", mask=True))
_register("paged-plan-no-window", "plan() without window_left, then deprecated forward(window_left=W): "
          "the kernel without the window mask is chosen at plan time",
          Variant("paged", window_at_plan=False, deprecated_forward=True), kind="known-bug",
          visibility=lambda w, prefix, ps: semantics.Visibility(semantics.NO_WINDOW))
_register("paged-trim-causal", "trim at prefix - W per request, causal, no window at plan: "
          "query j of the block sees j keys too many",
          Variant("paged", window_at_plan=False, start=_request_trim), kind="known-bug",
          visibility=lambda w, prefix, ps: semantics.Visibility(
              semantics.NO_WINDOW, first_key=semantics.buggy_trim_start(prefix, w, ps)))
