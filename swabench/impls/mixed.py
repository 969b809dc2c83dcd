"""A mixed step (mode ``mixed``: prefill chunks batched with decodes) through FlashInfer, two ways beside the one
prefill-wrapper call every batch-taking path makes of it:

- ``mixed-two-calls``: how an engine without POD serves it, the prefill wrapper over the prefill requests, then the
  decode wrapper (tensor cores) over the decodes, both planned with ``window_left = W``.
- ``pod-window``: POD-Attention, ``BatchPODWithPagedKVCacheWrapper``: both in one launch, the chunks read from the
  paged cache (causal, aligned to its end), one ``window_left`` planned for both (fa2; no sinks, no soft-cap; no
  CUDA-graph mode of its own).  Its ``run()`` returns new outputs: they are copied into the step's buffer, and the
  copy is timed with it.

The prefill requests are the step's first; each half gets its rows of the queries and its slice of the page table.
"""

from __future__ import annotations

import torch

from .flashinfer_impls import Variant, unsupported
from .flashinfer_library import LIBRARY, has_api
from .flashinfer_workspace import WORKSPACE_BYTES, resource_errors, workspace
from .registry import Implementation, register


class Halves:
    """The step cut in two: the prefill requests' and the decodes' query rows and page tables (int32, on the host;
    the indices and last-page lengths on the device as the wrappers keep them)."""

    def __init__(self, w):
        i32, p = torch.int32, w.case.prefills
        rows = w.qo_indptr_host[p]
        self.q_p, self.q_d = w.q[:rows], w.q[rows:]
        indptr, indices, last = w.kv_indptr_host, w.kv_indices_host, w.kv_last_page_len.cpu()
        cut = int(indptr[p])
        self.qo_indptr_p = torch.tensor(w.qo_indptr_host[:p + 1], dtype=i32)
        self.qo_indptr_d = torch.arange(w.batch_size - p + 1, dtype=i32)
        self.table_p = (indptr[:p + 1].to(i32), indices[:cut].to(i32), last[:p].to(i32))
        self.table_d = ((indptr[p:] - cut).to(i32), indices[cut:].to(i32), last[p:].to(i32))
        self.rows = rows


class TwoCallsRunner:
    def __init__(self, w, backend: str):
        import flashinfer

        self.w, self.resolved_backend = w, backend
        self.out = torch.empty_like(w.q)
        self.halves = Halves(w)
        with resource_errors():
            shared = workspace(w.device, WORKSPACE_BYTES)  # one float workspace for both, as the recipes share it
            self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(shared, "NHD", backend=backend)
            self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(shared, "NHD", use_tensor_cores=True,
                                                                        backend=backend)

    def plan(self) -> None:
        w, c, h = self.w, self.w.case, self.halves
        shape = dict(q_data_type=w.dtype, kv_data_type=w.kv_dtype, sm_scale=w.sm_scale, window_left=c.window_left)
        with resource_errors():
            self.prefill.plan(h.qo_indptr_p, *h.table_p, c.num_qo_heads, c.num_kv_heads, c.head_dim, w.page_size,
                              causal=True, **shape)
            self.decode.plan(*h.table_d, c.num_qo_heads, c.num_kv_heads, c.head_dim, w.page_size, **shape)
        self.layout = f"prefill wrapper over {c.prefills}, then decode wrapper over {w.batch_size - c.prefills}"

    def run(self) -> None:
        w, h = self.w, self.halves
        self.prefill.run(h.q_p, (w.k_store, w.v_store), out=self.out[:h.rows])
        self.decode.run(h.q_d, (w.k_store, w.v_store), out=self.out[h.rows:])


class PodRunner:
    def __init__(self, w, backend: str):
        import flashinfer

        self.w, self.resolved_backend = w, "pod"
        self.out = torch.empty_like(w.q)
        self.halves = Halves(w)
        with resource_errors():  # POD splits its float workspace in two, one half a side
            self.wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(workspace(w.device, 2 * WORKSPACE_BYTES),
                                                                      "NHD")

    def plan(self) -> None:
        w, c, h = self.w, self.w.case, self.halves
        with resource_errors():
            self.wrapper.plan(h.qo_indptr_p, *h.table_p, h.qo_indptr_d, *h.table_d, c.num_qo_heads, c.num_kv_heads,
                              c.head_dim, w.page_size, window_left=c.window_left, q_data_type=w.dtype,
                              kv_data_type=w.kv_dtype, sm_scale=w.sm_scale)
        self.layout = f"one launch: {c.prefills} prefill, {w.batch_size - c.prefills} decode; outputs copied"

    def run(self) -> None:
        w, h = self.w, self.halves
        out_p, out_d = self.wrapper.run(h.q_p, (w.k_store, w.v_store), h.q_d, (w.k_store, w.v_store), causal_p=True)
        self.out[:h.rows].copy_(out_p)
        self.out[h.rows:].copy_(out_d)


def _pod_unsupported(case, backend: str) -> str | None:
    if case.logits_soft_cap:
        return "POD applies no soft-cap"
    return unsupported(Variant("paged"))(case, backend)


register(Implementation(
    "mixed-two-calls", LIBRARY.name, ("paged",), "a mixed step as two calls: the prefill wrapper over the prefill "
    "requests, then the tensor-core decode wrapper over the decodes, both planned with window_left=W",
    TwoCallsRunner, wrapper="prefill", backends=("fa2", "fa3"), modes=("mixed",), needs_cuda=True,
    unsupported=unsupported(Variant("paged")), available=has_api("BatchDecodeWithPagedKVCacheWrapper")), __name__)
register(Implementation(
    "pod-window", LIBRARY.name, ("paged",), "POD-Attention (BatchPODWithPagedKVCacheWrapper): the prefill chunks and "
    "the decodes in one launch, one window_left planned for both; its outputs copied into the step's buffer",
    PodRunner, wrapper="pod", backends=("fa2",), modes=("mixed",), needs_cuda=True, unsupported=_pod_unsupported,
    available=has_api("BatchPODWithPagedKVCacheWrapper")), __name__)
