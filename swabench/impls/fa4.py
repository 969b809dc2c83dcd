"""FlashAttention-4 (``flash-attn-4``, the CuTe DSL FlashAttention, ``flash_attn.cute``): its varlen forward on the
suite's own buffers, paged through ``page_table`` or ragged through ``cu_seqlens_k``, every step an engine runs.

FA4 aligns a request's queries to the end of its keys (query ``i`` of ``q_len`` sits at ``p = kv_len - q_len + i``)
and with ``causal=True, window_size=(W, None)`` keeps the keys ``p - W .. p`` (``mask.py``, ``apply_mask``'s local
branch; ``testing.construct_local_mask``): the W + 1 keys of FlashInfer's ``window_left = W``, no shift.  Two traps
sit beside it: ``-1`` is no "no window" (only both sides negative are; ``(-1, None)`` keeps no key at all, so a
global layer is ``(None, None)``), and a window given as a count of keys (a model config's ``sliding_window``, cuDNN's
bound, XQA's ``sliding_win_size``: W + 1) shows each query one key before its window (``fa4-window-count``).

- ``fa4-window``: ``flash_attn_varlen_func(q, k, v, cu_seqlens_q, seqused_k, page_table, causal=True,
  window_size=(W, None), learnable_sink=sinks, softcap=cap, num_splits=1)``: SM90 has no split-KV.
- ``fa4-window-count``: the same call with ``window_size=(W + 1, None)`` (a known mistake).

GPT-OSS's sinks are ``learnable_sink`` (one logit per query head, in the scaled logits' units, as FlashInfer's),
Gemma 2's soft-cap is ``softcap`` (``cap * tanh(scale * qk / cap)``; each value compiles its own kernel).  FA4
compiles each kernel variant on its first call (seconds, CuTe DSL): a point's first plan makes its first call, recorded
as ``compile_s`` and never timed.  Its compile key (``interface.py``, ``_flash_attn_fwd``) holds the storage (paged:
``page_table`` and ``seqused_k``; ragged: ``cu_seqlens_k``), so the storage is in the module signature and the warm-up
builds both; it also holds two facts of the shape a tiny case cannot share with a long step (whether the longest
request's queries, times the head group under pack_gqa, fit one M tile, and a batch over 256), so an extend or prefill
point's plan may still compile its own kernel.  Two FA4 builds never run at once (``shared_module``): the compile
cache is a dict checked and filled without a lock, and the CuTe DSL keeps each compile's state (its options, its
kernels) on one shared object and swaps the process's ``sys.stdout`` and ``sys.stderr`` while it compiles.  The
public forward returns its output rather than writing a given one, so ``run()`` takes the tensor it returns as ``out``
(inside a captured graph, the graph's own).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from swabench.core import semantics, trees, workloads
from .implementation import first_call
from .library import Library, not_importable
from .registry import Implementation, register, register_library

BACKEND = "fa4"
DTYPES = ("bfloat16", "float16")  # SM90's forward (flash_fwd.py); FP8 is SM100's only
HEAD_DIM_MAX = 256  # interface.py's _validate_head_dims: 8..256, a multiple of 8 on SM90

# no module: flash_attn.cute's own __version__ is a placeholder (0.0.0 in 4.0.0b36), the distribution names the release
LIBRARY = register_library(Library(BACKEND, distributions=("flash-attn-4",),
                                   backends=(BACKEND,), opt_in=(BACKEND,), served=(BACKEND,),
                                   shared_module=lambda impl, case, backend: BACKEND))


@lru_cache(maxsize=1)
def _import_error() -> str | None:
    return not_importable("flash_attn.cute", "flash-attn-4[cu13]")


def module_key(case) -> str:
    """What else names the kernel a case runs: its storage (FA4 compiles a paged and a ragged call apart)."""
    return case.storage


def kv_tile(case) -> int:
    """SM90's key tile for the case (interface.py, ``_tile_size_fwd_sm90``; K and V of one head_dim, causal): 128 keys
    up to head_dim 128; above it 112, or 96 with a window (FA4 calls a windowed causal call local); above 192, 80, or
    64 with a window.  A page of exactly this many keys is loaded by TMA; any other page by cp.async rows, which takes
    head_dim a multiple of 16 (``paged_kv_non_tma``)."""
    local = case.window_left >= 0
    if case.head_dim <= 128:
        return 128
    if case.head_dim <= 192:
        return 96 if local else 112
    return 64 if local else 80


def loads_pages_by_tma(case) -> bool:
    return case.storage == "paged" and case.page_size == kv_tile(case)


def last_page_partly_used(case) -> bool:
    """Whether some request's last page holds fewer keys than the page (rows past seqused_k in it)."""
    return case.storage == "paged" and any(k % case.page_size for k in workloads.request_lengths(case)[1])


def window(window_left: int) -> tuple[int | None, None]:
    """FA4's ``window_size`` for FlashInfer's ``window_left``: the same W, and None (not -1) for no window."""
    return (window_left if window_left >= 0 else None), None


class Fa4Runner:
    """One varlen forward a step: the lengths and page table built at plan, the call at run."""

    def __init__(self, w, extra_keys: int):
        self.w, self.extra_keys = w, extra_keys
        self.out = torch.empty_like(w.q)
        self.resolved_backend = BACKEND
        self.compile_s = None

    def plan(self) -> None:
        w = self.w
        self.cu_seqlens_q = w.qo_indptr.to(torch.int32)
        self.max_seqlen_q = max(w.qo_lens)
        if w.case.storage == "paged":
            self.kv = dict(page_table=workloads.block_tables(w.kv_indptr_host, w.kv_indices_host).to(w.device),
                           seqused_k=torch.tensor(w.kv_lens, dtype=torch.int32, device=w.device))
        else:
            self.kv = dict(cu_seqlens_k=w.kv_indptr.to(torch.int32), max_seqlen_k=max(w.kv_lens))
        left, right = window(w.case.window_left)
        self.window_size = (left + self.extra_keys if left is not None else None, right)
        self.compile_s = first_call(self, self.compile_s)  # the first call compiles its kernel

    def run(self) -> None:
        from flash_attn.cute import flash_attn_varlen_func

        w = self.w
        self.out, _ = flash_attn_varlen_func(
            w.q, w.k_store, w.v_store, cu_seqlens_q=self.cu_seqlens_q, max_seqlen_q=self.max_seqlen_q, **self.kv,
            softmax_scale=w.sm_scale, causal=True, window_size=self.window_size, learnable_sink=w.sinks,
            softcap=w.case.logits_soft_cap, num_splits=1)


def unsupported(case, backend: str) -> str | None:
    """Why FA4's SM90 forward cannot run a case, from its own checks (``interface.py``)."""
    if case.tree not in (None, trees.CHAIN):
        return ("FA4 takes a draft tree only as a mask_mod, and a mask_mod drops causal and the window "
                "(interface.py, _resolve_causal_local_window): every tile is loaded; not built here")
    if case.dtype not in DTYPES or case.kv_dtype not in (None, case.dtype):
        return f"FA4 on SM90 takes {' and '.join(DTYPES)} queries and caches of one dtype (FP8 is SM100's only)"
    if not 8 <= case.head_dim <= HEAD_DIM_MAX or case.head_dim % 8:
        return f"FA4 on SM90 takes head_dim a multiple of 8 from 8 to {HEAD_DIM_MAX}, not {case.head_dim}"
    if case.storage == "paged" and case.head_dim % 16 and not loads_pages_by_tma(case):
        return (f"FA4 loads a page other than its key tile ({kv_tile(case)} keys here) row by row, which takes "
                f"head_dim a multiple of 16 (flash_fwd_sm90.py), not {case.head_dim}")
    return None


def _register(name: str, summary: str, extra_keys: int, **roles) -> None:
    """``extra_keys``: how many keys the call's window_size adds to window_left (1: the window given as a count)."""
    register(Implementation(
        name, BACKEND, ("paged", "ragged"), summary, lambda w, backend: Fa4Runner(w, extra_keys), backends=(BACKEND,),
        needs_cuda=True, unsupported=unsupported, available=_import_error, tree=True, module_key=module_key, **roles),
        __name__)


_register("fa4-window", "FlashAttention-4's varlen forward, paged through page_table (ragged through cu_seqlens_k), "
          "causal with window_size=(W, None): the W + 1 keys of window_left = W", extra_keys=0)
_register("fa4-window-count", "FlashAttention-4 given the window as a count of keys, window_size=(W + 1, None) (a "
          "config's sliding_window): each query sees one key before its window", extra_keys=1, kind="known-bug",
          visibility=lambda w, prefix, ps: semantics.Visibility(w + 1 if w >= 0 else semantics.NO_WINDOW))
