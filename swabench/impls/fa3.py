"""FlashAttention-3 (Hopper's FlashAttention, ``hopper/`` of flash-attention) as the engines run it: vLLM's build
through vLLM's call, and SGLang's build through SGLang's call.  Neither engine is installed: each build is the
prebuilt library its engine's wheel ships for the node's torch (docs/backends.md, "FlashAttention-3").

- ``vllm-fa3``: vllm 0.26.0's ``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so`` and ``flash_attn_interface.py`` (vllm
  0.26.0 pins torch 2.11.0; the library uses torch's C++ API, so it loads on that torch only).  vLLM's FlashAttention
  backend (``vllm/v1/attention/backends/flash_attn.py``) calls ``flash_attn_varlen_func(q=, k=, v=, out=,
  cu_seqlens_q=, max_seqlen_q=, seqused_k=, max_seqlen_k=, softmax_scale=, causal=True, window_size=[W, 0],
  block_table=, softcap=, fa_version=3, s_aux=sinks)`` (l.1014-1039), its window ``(sliding_window - 1, 0)``
  (l.756-761); the interface is flash_attn_interface.py:176-215, where ``fa_version`` defaults to 2.
- ``sgl-fa3``: sglang-kernel 0.4.5's ``sgl_kernel/flash_ops.abi3.so`` and ``flash_attn.py`` (sglang 0.5.17 pins both
  and torch 2.11.0).  SGLang's backend (``srt/layers/attention/flashattention_backend.py``, sglang 0.5.17) calls
  ``flash_attn_with_kvcache(q, k_cache, v_cache, page_table=..., cache_seqlens=..., cu_seqlens_q=...,
  cu_seqlens_k_new=..., max_seqlen_q=..., softmax_scale=..., causal=True, window_size=(W, 0), softcap=...,
  sinks=...)`` for extend (l.1453-1472), decode (l.1925-1944, no ``cu_seqlens_k_new``, one query a request) and
  target verify at topk 1 (the extend call over ``seq_lens + draft``), where W is ``layer.sliding_window_size``, which
  the models set to ``config.sliding_window - 1`` (gpt_oss.py:123-124, gemma2.py:52-53), and the page table is the
  request's whole table in the SWA pool (``translate_loc_from_full_to_swa``, l.1033-1046): not trimmed.

FA3's window (``hopper/mask.h:118-133``): query ``i`` of a request sits at ``p = kv_len - q_len + i`` and
``window_size = (W, 0)`` keeps keys ``p - W .. p``: the W + 1 keys of FlashInfer's ``window_left = W``.  ``-1`` on a
side is no bound there (``(-1, -1)`` is no window), a left window of at least the batch's longest key count less one
counts as none (flash_api.cpp:839-840), and ``causal`` sets the right side to 0 (l.848), so a causal call with a
window runs FA3's local kernel.  FA3 skips the key blocks wholly before a query block's window itself, so both calls
take the full table.  The known mistake beside it: the window given as a count of keys (a config's
``sliding_window``), ``(W + 1, 0)``: each query sees one key before its window (``fa3-window-count``).

``sglang-fa3-tree``: SGLang's FA3 backend on a sliding-window layer in EAGLE target verify at topk > 1 (sglang
0.5.17, ``python/sglang/srt/layers/attention/flashattention_backend.py``).  SGLang runs the cascade (a prefix call
and an "expand" call, each with ``return_softmax_lse=True``, joined by ``merge_state_v2``) on the other layers only:
``use_cascade_attn`` is ``is_target_verify() and topk > 1 and not is_swa_layer`` (l.1260-1268; its comment: FA3 takes
one window a call, not one a query), so a sliding-window layer takes ``swa_spec_metadata`` (l.1313-1319) and makes
one call (l.1453-1471): ``causal=True``, ``window_size=(W, 0)``, ``return_softmax_lse=False``, one query a row
(``max_seqlen_q=1``).  The rows are built per step in ``init_forward_metadata`` (l.826-923): the prefix metadata
(``cache_seqlens = seq_lens``, the page table ``req_to_token[:, :max(seq_lens)]``), the expand metadata (one row a
draft token; its ancestors and itself among the draft slots, read from the tree mask, sorted to the front in slot
order; ``cache_seqlens`` their count), and, where the model has a window, ``_init_sliding_window_attn_spec_metadata``
(l.3215-3272): each row the request's whole prefix table then its expand row (``prepare_swa_spec_page_table_triton``,
``sglang/kernels/ops/attention/metadata.py`` l.63-158), ``cache_seqlens = prefix + depth + 1``, ``cu_seqlens_k``
their prefix sums (handed as ``cu_seqlens_k_new``, which FA3 ignores without new keys).  It asserts page size 1
(l.3221-3224), so other page sizes skip, naming it.  The CUDA-graph replay builds the same rows
(l.2929-2933).  Nothing else refuses the pair: SGLang picks FA3 by default at topk > 1 only for GPT-OSS on SM90
(``arg_groups/overrides.py:874-882``; ``server_args.py:5681-5689`` leaves other models on FlashInfer), and
``--attention-backend fa3`` is accepted at topk > 1 (``speculative_hook.py:667-681``).  In row ``(b, i)`` FA3's query
sits at ``p = prefix + depth`` and column ``prefix + t`` holds the ancestor at depth ``t``, so ``(W, 0)`` keeps the
cached keys from ``prefix + depth - W`` and the ancestors at depth ``>= depth - W``: the window by depth over the
node's own branch, the suite's reference.  A correct path.

GPT-OSS's sinks go in as ``s_aux`` (vLLM) or ``sinks`` (SGLang): bfloat16 only (flash_api.cpp:1211-1224), one logit
per query head in the scaled logits' units (softmax.h:156-175), so the suite's float32 sinks are rounded to
bfloat16 for the call.  Gemma 2's soft-cap is ``softcap``.  FA3 compiles nothing at run time: its first call
(``compile_s``) is a launch.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import lru_cache
from pathlib import Path

import torch

from swabench.core import semantics, trees, workloads
from .implementation import first_call
from .library import Library
from .registry import Implementation, register, register_library

VLLM, SGL = "vllm-fa3", "sgl-fa3"
DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 96, 128, 192, 256)  # the head dims FA3's Hopper build instantiates (hopper/setup.py)
SINK_HEADS_MAX = 64  # s_aux: at most 64 query heads (flash_api.cpp)
BUILD_FILE = "SWABENCH_BUILD"  # beside a bundled build's files: which wheel they came from and the torch it needs

MODULES = {VLLM: ("vllm.vllm_flash_attn.flash_attn_interface", "vllm.vllm_flash_attn._vllm_fa3_C"),
           SGL: ("sgl_kernel.flash_attn", "sgl_kernel.flash_ops")}
INSTALL = {VLLM: "FA3=1's bundle (scripts/gpu-bundle.sh) or vllm 0.26.0",
           SGL: "SGL_FA3=1's bundle (scripts/gpu-bundle.sh) or sglang-kernel 0.4.5"}


def bundled_build(backend: str) -> str | None:
    """What a bundled build says of itself ('built for torch 2.11.0, CUDA 13'; scripts/subset-wheel.py writes it),
    recorded beside its release."""
    try:
        spec = importlib.util.find_spec(MODULES[backend][0].rpartition(".")[0])
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        said = Path(folder) / BUILD_FILE
        if said.is_file():
            return said.read_text().strip()[:200] or None
    return None


# the engine's own package where it is installed, else the bundle's subset of its wheel (scripts/subset-wheel.py)
for _backend, _distributions in ((VLLM, ("vllm", "swabench-vllm-fa3")), (SGL, ("sglang-kernel", "swabench-sgl-fa3"))):
    register_library(Library(_backend, distributions=_distributions, backends=(_backend,), opt_in=(_backend,),
                             served=(_backend,), underneath=lambda b=_backend: bundled_build(b)))


@lru_cache(maxsize=None)
def import_error(backend: str) -> str | None:
    """Why a build does not load here, with the loader's own message (a library built for another torch fails on a
    missing symbol), or None.  The interface swallows its library's ImportError, so the library is imported itself."""
    for module in MODULES[backend][::-1]:
        try:
            importlib.import_module(module)
        except Exception as e:
            return f"{module} does not load ({type(e).__name__}: {str(e)[:300]}); install {INSTALL[backend]}"
    return None


def window(window_left: int, extra_keys: int = 0) -> tuple[int, int]:
    """FA3's ``window_size`` for FlashInfer's ``window_left``: (W, 0), and (-1, -1) for no window."""
    return (window_left + extra_keys, 0) if window_left >= 0 else (-1, -1)


class Fa3Runner:
    """One FA3 forward a step: lengths and tables built at plan, the engine's call at run."""

    def __init__(self, w, backend: str, extra_keys: int):
        self.w, self.backend, self.extra_keys = w, backend, extra_keys
        self.out = torch.empty_like(w.q)
        self.resolved_backend = backend
        self.compile_s = None

    def plan(self) -> None:
        w, i32 = self.w, torch.int32
        self.cu_seqlens_q = w.qo_indptr.to(i32)
        self.max_seqlen_q, self.max_seqlen_k = max(w.qo_lens), max(w.kv_lens)
        if w.case.storage == "paged":
            self.table = workloads.block_tables(w.kv_indptr_host, w.kv_indices_host).to(w.device)
            self.seqused_k = torch.tensor(w.kv_lens, dtype=i32, device=w.device)
        else:
            self.cu_seqlens_k = w.kv_indptr.to(i32)
        self.window_size = window(w.case.window_left, self.extra_keys)
        self.sinks = w.sinks_as(torch.bfloat16)  # kept equal to the sinks the gate writes (a probe zeroes them)
        self.compile_s = first_call(self, self.compile_s)

    def run(self) -> None:
        (self._vllm if self.backend == VLLM else self._sglang)()

    def _vllm(self) -> None:
        from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func

        w = self.w
        kv = dict(seqused_k=self.seqused_k, block_table=self.table) if w.case.storage == "paged" else \
            dict(cu_seqlens_k=self.cu_seqlens_k)
        flash_attn_varlen_func(q=w.q, k=w.k_store, v=w.v_store, out=self.out, cu_seqlens_q=self.cu_seqlens_q,
                               max_seqlen_q=self.max_seqlen_q, max_seqlen_k=self.max_seqlen_k, **kv,
                               softmax_scale=w.sm_scale, causal=True, window_size=list(self.window_size),
                               softcap=w.case.logits_soft_cap or 0.0, fa_version=3, s_aux=self.sinks)

    def _sglang(self) -> None:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache

        w = self.w
        new_keys = dict(cu_seqlens_k_new=self.cu_seqlens_q) if w.case.mode != "decode" else {}
        flash_attn_with_kvcache(w.q, w.k_store, w.v_store, page_table=self.table, cache_seqlens=self.seqused_k,
                                cu_seqlens_q=self.cu_seqlens_q, **new_keys, max_seqlen_q=self.max_seqlen_q,
                                softmax_scale=w.sm_scale, causal=True, window_size=self.window_size,
                                softcap=w.case.logits_soft_cap or 0.0, sinks=self.sinks, out=self.out)


def unsupported(case, backend: str) -> str | None:
    """Why FA3's Hopper forward cannot run a case as one call over each request's table."""
    if case.tree not in (None, trees.CHAIN):
        return "FA3 takes no tree mask (SGLang runs a draft tree on an SWA layer as one row a draft token: " \
               "sglang-fa3-tree)"
    return fa3_limits(case)


def fa3_limits(case) -> str | None:
    """Why FA3's Hopper forward cannot run a case, from its own checks (flash_api.cpp)."""
    if case.dtype not in DTYPES or case.kv_dtype not in (None, case.dtype):
        return f"FA3 here takes {' and '.join(DTYPES)} queries and caches of one dtype (its FP8 path is not built here)"
    if case.head_dim not in HEAD_DIMS:
        return f"FA3's Hopper build instantiates head_dim {', '.join(map(str, HEAD_DIMS))}, not {case.head_dim}"
    if case.sinks and (case.dtype != "bfloat16" or case.num_qo_heads > SINK_HEADS_MAX):
        return f"FA3 takes sinks with bfloat16 and at most {SINK_HEADS_MAX} query heads (flash_api.cpp)"
    return None


def sglang_runs_no_window(case) -> str | None:
    """The models SGLang runs with no sliding window at all (sglang 0.5.17: Mistral's ``MistralForCausalLM`` is
    ``LlamaForCausalLM``, whose RadixAttention takes none)."""
    if (case.model or "").startswith("mistral"):
        return "SGLang runs Mistral's layers as full attention (srt/models/mistral.py, llama.py): no SWA layer to run"
    return None


def sglang_unsupported(case, backend: str) -> str | None:
    return sglang_runs_no_window(case) or unsupported(case, backend)


def _register(name: str, summary: str, backend: str, extra_keys: int, storages=("paged", "ragged"),
              refuses=unsupported, **roles) -> None:
    """``extra_keys``: how many keys the call's window adds to window_left (1: the window given as a count)."""
    register(Implementation(
        name, backend, storages, summary, lambda w, b: Fa3Runner(w, b, extra_keys), backends=(backend,),
        needs_cuda=True, unsupported=refuses, available=lambda: import_error(backend), tree=True, **roles),
        __name__)


_register("fa3-window", "FlashAttention-3 as vLLM calls it (vLLM's build): flash_attn_varlen_func with the whole "
          "block table (ragged: cu_seqlens_k), causal, window_size=[W, 0], fa_version=3", VLLM, 0)
_register("fa3-window-count", "FlashAttention-3 (vLLM's build) given the window as a count of keys, window_size="
          "[W + 1, 0] (a config's sliding_window): each query sees one key before its window", VLLM, 1,
          kind="known-bug", visibility=lambda w, prefix, ps: semantics.Visibility(w + 1 if w >= 0 else semantics.NO_WINDOW))
_register("sglang-fa3", "SGLang's FA3 backend on an SWA layer (SGLang's build): flash_attn_with_kvcache over the "
          "request's whole page table, cache_seqlens, causal, window_size=(sliding_window - 1, 0)", SGL, 0,
          storages=("paged",), refuses=sglang_unsupported)


# ---------------------------------------------------------------- EAGLE verify at topk > 1 on a sliding-window layer

def swa_spec_rows(w) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's rows for a sliding-window layer in EAGLE target verify at topk > 1, built as ``init_forward_metadata``
    and ``_init_sliding_window_attn_spec_metadata`` build them (page size 1): the page table ``[batch * n, max prefix +
    n]``, each row its request's whole prefix, then its draft token's ancestors and itself in slot order, zeros after;
    and each row's key count, ``prefix + depth + 1``."""
    n, device = w.qo_lens[0], w.device
    req_to_token = workloads.block_tables(w.kv_indptr_host, w.kv_indices_host).to(device)
    seq_lens = torch.tensor(w.prefix_lens, device=device)
    prefix_table = req_to_token[:, :max(w.prefix_lens)]  # metadata.page_table
    mask = torch.cat([t.ancestors() for t in w.trees]).to(device)  # the tree mask's draft columns, a row a token
    cols = torch.arange(n, device=device).expand(len(mask), n)
    order = torch.sort(torch.where(mask, cols, cols + n), dim=1).indices  # its ancestors first, in slot order
    drafts = req_to_token.gather(1, seq_lens[:, None] + cols[:1]).repeat_interleave(n, dim=0)
    expand_table, expand_lens = drafts.gather(1, order), mask.sum(dim=1)
    prefix_of_row = seq_lens.repeat_interleave(n)[:, None]
    col = torch.arange(prefix_table.shape[1] + n, device=device)[None, :]
    from_prefix = torch.nn.functional.pad(prefix_table.repeat_interleave(n, dim=0), (0, n))
    from_expand = expand_table.gather(1, (col - prefix_of_row).clamp(0, n - 1))
    table = torch.where(col < prefix_of_row, from_prefix,
                        torch.where(col < prefix_of_row + expand_lens[:, None], from_expand, 0))
    return table.to(torch.int32), (prefix_of_row[:, 0] + expand_lens).to(torch.int32)


class SwaSpecRunner(Fa3Runner):
    """SGLang's one FA3 call on a sliding-window layer in EAGLE verify at topk > 1: its rows built at plan (SGLang
    builds them every step), the call at run."""

    def plan(self) -> None:
        w, i32 = self.w, torch.int32
        self.page_table, self.cache_seqlens = swa_spec_rows(w)
        self.cu_seqlens_q = torch.arange(len(self.cache_seqlens) + 1, dtype=i32, device=w.device)
        self.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(self.cache_seqlens, 0, dtype=i32), (1, 0))
        self.window_size = window(w.case.window_left)
        self.sinks = w.sinks_as(torch.bfloat16)
        self.compile_s = first_call(self, self.compile_s)

    def run(self) -> None:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache

        w = self.w
        flash_attn_with_kvcache(q=w.q, k_cache=w.k_store, v_cache=w.v_store, page_table=self.page_table,
                                cache_seqlens=self.cache_seqlens, cu_seqlens_q=self.cu_seqlens_q,
                                cu_seqlens_k_new=self.cu_seqlens_k, max_seqlen_q=1, softmax_scale=w.sm_scale,
                                causal=True, window_size=self.window_size, softcap=w.case.logits_soft_cap or 0.0,
                                return_softmax_lse=False, num_splits=0, out=self.out, ver=3, sinks=self.sinks)


def sglang_tree_unsupported(case, backend: str) -> str | None:
    """Where SGLang's FA3 backend does not run a draft tree as one row a draft token."""
    if case.page_size != 1:
        return (f"SGLang's FA3 backend asserts page size 1 for topk > 1 on a model with sliding-window layers "
                f"(flashattention_backend.py:3221-3224, sglang 0.5.17), not {case.page_size}")
    if case.window_left < 0:
        return "a layer without a window takes SGLang's cascade at topk > 1 (flashattention_backend.py:1260-1268)"
    return sglang_runs_no_window(case) or fa3_limits(case)


register(Implementation(
    "sglang-fa3-tree", SGL, ("paged",), "SGLang's FA3 backend on an SWA layer in EAGLE verify at topk > 1 (SGLang's "
    "build): flash_attn_with_kvcache, one row a draft token over its request's whole prefix and its ancestors, page "
    "size 1, causal, window_size=(sliding_window - 1, 0), no cascade", lambda w, b: SwaSpecRunner(w, b, extra_keys=0),
    backends=(SGL,), modes=("verify",), requires=frozenset({"tree"}), tree=True, needs_cuda=True,
    unsupported=sglang_tree_unsupported, available=lambda: import_error(SGL)), __name__)
