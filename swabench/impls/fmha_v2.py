"""TRT-LLM's fmha v2 through FlashInfer (``trtllm_fmha_v2_prefill``): prefill, extend and verify on the paged cache.

- ``fmha-v2-window``: ``mask_mode="sliding_window"`` with ``window_left = W``.  Its C++ sets the kernel's
  ``sliding_window_size = W + 1`` and masks ``col >= row + 1 - size`` with ``row`` the query's absolute position
  (the prefix included): FlashInfer's convention, a query at ``p`` sees ``p - W`` through ``p``
  (``fmha_v2_run.cu``, ``warpspec/epilogue.h``).
- ``fmha-v2-chunked``: ``mask_mode="chunked"`` with ``chunked_attention_size = C``, a power of two: a query sees its
  own chunk up to itself, chunks aligned to absolute positions.  Only Hopper's warp-specialized kernels have it.

The query is token-major, each request's lengths come from ``cum_seq_lens_q`` and ``cum_seq_lens_kv`` (its
``seq_lens`` is not read), sinks are one float32 logit per query head.  The workload keeps K and V as the two halves
of one allocation, so the separate-cache form applies: block tables ``[batch, 2, pages]``, V's rows offset by the
pool's page count.  No soft-cap is mapped here.  JIT-built from ``csrc/fmha_v2``: about 130 kernel files a module,
a long first build.
"""

from __future__ import annotations

import torch

from swabench.core import workloads
from swabench.core.cases import WRAPPER_MODES
from .flashinfer_impls import Variant, unsupported
from .flashinfer_library import FMHA_V2, LIBRARY, has_api
from .flashinfer_workspace import MIB, resource_errors
from .registry import Implementation, register

WORKSPACE_BYTES = 128 * MIB  # what FlashInfer's own tests give it
HEAD_DIMS = (32, 40, 48, 64, 80, 96, 104, 128, 160, 192, 256)  # the SM90 kernels built (fmha_library.py)


class FmhaV2Runner:
    """One ``trtllm_fmha_v2_prefill`` call a step, its tables and lengths built at plan."""

    def __init__(self, w, backend: str, chunks: bool):
        self.w, self.chunks = w, chunks
        self.resolved_backend = FMHA_V2
        self.out = torch.empty_like(w.q)
        with resource_errors():  # the persistent scheduler's tile counter lives here
            self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=w.device)

    def plan(self) -> None:
        w, i32 = self.w, torch.int32
        page_bytes = w.k_store[0].numel() * w.k_store.element_size()
        v_offset = (w.v_store.data_ptr() - w.k_store.data_ptr()) // page_bytes  # V's pages, counted from K's base
        self.tables = torch.stack([workloads.block_tables(w.kv_indptr_host, w.kv_indices_host, add)
                                   for add in (0, v_offset)], dim=1).to(w.device)
        self.cum_q = torch.tensor(w.qo_indptr_host, dtype=i32, device=w.device)
        self.cum_kv = w.slot_indptr.to(device=w.device, dtype=i32)  # each request's keys, summed
        self.seq_lens = torch.tensor(w.kv_lens, dtype=i32, device=w.device)
        self.layout = f"Q_PAGED_KV_NHD, mask_mode={'chunked' if self.chunks else 'sliding_window'}"

    def run(self) -> None:
        import flashinfer

        w, c = self.w, self.w.case
        mask = dict(mask_mode="chunked", chunked_attention_size=c.attention_chunk) if self.chunks else \
            dict(mask_mode="sliding_window" if c.window_left >= 0 else "causal", window_left=c.window_left)
        flashinfer.trtllm_fmha_v2_prefill(
            (w.q, (w.k_store, w.v_store)), "Q_PAGED_KV_NHD", self.workspace, self.seq_lens, max(w.qo_lens),
            max(w.kv_lens), w.sm_scale, 1.0, w.batch_size, self.cum_q, self.cum_kv, block_tables=self.tables,
            out=self.out, sinks=w.sinks, **mask)


def _unsupported(chunks: bool):
    def check(case, backend: str) -> str | None:
        if case.head_dim not in HEAD_DIMS:
            return f"fmha v2's SM90 kernels are built for head_dim {'/'.join(map(str, HEAD_DIMS))}, not {case.head_dim}"
        if case.page_size & (case.page_size - 1):
            return f"fmha v2 takes pages of a power-of-two size, not {case.page_size}"
        if case.logits_soft_cap:
            return "no soft-cap is mapped to fmha v2 here"
        if chunks and case.attention_chunk & (case.attention_chunk - 1):
            return f"fmha v2 takes a power-of-two chunk, not {case.attention_chunk}"
        if case.dtype not in ("bfloat16", "float16"):
            return f"fmha v2 takes bfloat16 or float16 queries here, not {case.dtype}"
        return unsupported(Variant("paged", sinks="apply"), head_dims=None)(case, backend)
    return check


def _register(name: str, summary: str, chunks: bool, **roles) -> None:
    register(Implementation(
        name, LIBRARY.name, ("paged",), summary, lambda w, backend: FmhaV2Runner(w, backend, chunks),
        wrapper="fmha-v2", backends=(FMHA_V2,), modes=("extend", "verify", "draft_extend"),
        wrapper_modes=WRAPPER_MODES, needs_cuda=True, unsupported=_unsupported(chunks),
        available=has_api("trtllm_fmha_v2_prefill"), **roles), __name__)


_register("fmha-v2-window", "TRT-LLM's fmha v2, trtllm_fmha_v2_prefill(mask_mode='sliding_window', window_left=W) on "
          "the paged cache", chunks=False)
_register("fmha-v2-chunked", "TRT-LLM's fmha v2, trtllm_fmha_v2_prefill(mask_mode='chunked', chunked_attention_size=C) "
          "on the paged cache", chunks=True, chunked=True, requires=frozenset({"chunk"}))
