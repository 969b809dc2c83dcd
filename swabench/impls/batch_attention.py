"""FlashInfer's persistent "holistic" kernel, ``flashinfer.BatchAttention``: one launch for a batch's prefill and
decode requests.  Its ``plan()`` takes no ``window_left`` (``attention/_core.py`` in 0.7.4), so a window can only be
a table trimmed to it.

``batch-attention-trim`` plans each request's table from the page that holds the oldest key its queries can see,
causal.  A table starts on a page boundary and nothing masks the keys before a query's own window, so it is exact
only where the trim is: a decode step at page size 1.  Elsewhere a query sees from its request's trim start (up
to ``page_size - 1 + qo_len - 1`` keys too many): declared so, and timed where exact.
"""

from __future__ import annotations

import torch

from swabench.core import semantics, workloads
from .flashinfer_impls import Variant, unsupported
from .flashinfer_library import LIBRARY, has_api
from .flashinfer_workspace import MIB, plan_sized, resource_errors
from .registry import Implementation, register


HOLISTIC_WORKSPACE = 384 * MIB  # the float workspace BatchAttention allocates for itself (attention/_core.py)
OFFSET_WRAPS = 2 ** 32  # K/V elements: where the holistic kernel's page offsets wrap (see wrapped_requests)


class BatchAttentionRunner:
    """``BatchAttention`` planned causal on each request's trimmed table.  Its planner reserves partial outputs for
    ``4 x clusters x (tile sizes)`` KV splits of ``head_dim x num_kv_heads`` (``scheduler.cuh``), whatever the step:
    622 MB on the H200 at Gemma 3 27B's 16 KV heads, more than the 384 MiB it allocates.  Its float workspace is an
    attribute its plan() reads, so it is grown on overflow, as every other wrapper's is."""

    def __init__(self, w, backend: str):
        import flashinfer

        self.w, self.resolved_backend = w, "holistic"
        self.out = torch.empty_like(w.q)
        self.lse = torch.empty(w.q.shape[:2], dtype=torch.float32, device=w.device)
        with resource_errors():
            self.wrapper = flashinfer.BatchAttention(kv_layout="NHD", device=w.device)
        self._workspace_bytes, self.workspace_mib = HOLISTIC_WORKSPACE, None

    def _new_wrapper(self, space: torch.Tensor):
        self.wrapper.float_workspace_buffer = space
        return self.wrapper

    def plan(self) -> None:
        w, c, i32 = self.w, self.w.case, torch.int32
        starts = trim_starts(c, w.qo_lens, w.kv_lens)
        indptr, indices, _ = workloads.slice_page_table(w.kv_indptr_host, w.kv_indices_host, starts, w.kv_lens,
                                                        w.page_size)
        kept = torch.tensor([k - s for k, s in zip(w.kv_lens, starts)], dtype=i32)
        args = (torch.tensor(w.qo_indptr_host, dtype=i32), indptr.to(i32), indices.to(device=w.device, dtype=i32),
                kept, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.head_dim, w.page_size)
        kwargs = dict(causal=True, sm_scale=w.sm_scale, logits_soft_cap=c.logits_soft_cap or None,
                      q_data_type=w.dtype, kv_data_type=w.kv_dtype)
        plan_sized(self, args, kwargs, grows=("holistic_partial",))
        self.layout = "trimmed table, causal"

    def run(self) -> None:
        w = self.w
        self.wrapper.run(w.q, (w.k_store, w.v_store), out=self.out, lse=self.lse,
                         logits_soft_cap=w.case.logits_soft_cap or 0.0)


def trim_starts(case, qo_lens, kv_lens) -> list[int]:
    """Each request's first key in its trimmed table: the page holding the oldest key its queries can see."""
    return [semantics.trim_start(k, q, case.window_left, case.page_size or 1) for q, k in zip(qo_lens, kv_lens)]


def wrapped_requests(case) -> list[int]:
    """The requests whose trimmed table holds a page that ends past 2^32 elements of its K (or V) cache (a page
    only partly filled counts whole: an upper bound at page sizes above 1).

    The holistic kernel addresses K and V as ``indices[page] * kv_stride_page + ...`` with an int32 index and
    uint32 strides (``prefetch_offest`` in ``attention/persistent.cuh``, 0.6.18.post1 to 0.7.4), so the offset
    wraps at 2^32 elements (8 GiB of bfloat16) and such a page's keys are read from the wrong place.  The prefill
    and decode kernels widen the index first (``paged_kv_t::get_elem_offset``); FlashInfer's pull request 3136
    fixed the same product in the MLA kernels."""
    if case.storage != "paged":
        return []
    stride = case.page_size * case.num_kv_heads * case.head_dim
    qo_lens, kv_lens = workloads.request_lengths(case)
    if sum(-(-k // case.page_size) for k in kv_lens) * stride <= OFFSET_WRAPS:
        return []  # no page of the cache reaches that far: the table need not be built
    indptr, indices, *_ = workloads.page_table(case, qo_lens, kv_lens)
    trimmed_indptr, trimmed, _ = workloads.slice_page_table(indptr, indices, trim_starts(case, qo_lens, kv_lens),
                                                            kv_lens, case.page_size)
    wraps = ((trimmed + 1) * stride > OFFSET_WRAPS).split(trimmed_indptr.diff().tolist())
    return [b for b, w in enumerate(wraps) if bool(w.any())]


def _computes(window_left: int, prefix_len: int, page_size: int) -> semantics.Visibility:
    """From the request's trim start on, causal, no window: the trimmed table is the only window."""
    return semantics.Visibility(semantics.NO_WINDOW, first_key=semantics.buggy_trim_start(prefix_len, window_left,
                                                                                         page_size))


def _unsupported(case, backend: str) -> str | None:
    if case.window_left < 0:
        return "trims the table to the window: it models a sliding-window layer (window_left >= 0)"
    return unsupported(Variant("paged"))(case, backend)


register(Implementation(
    "batch-attention-trim", LIBRARY.name, ("paged",),
    "BatchAttention (the persistent holistic kernel; its plan() takes no window_left) on the table trimmed to the "
    "window's first page, causal: exact only where the trim is (decode at page size 1)",
    BatchAttentionRunner, kind="known-bug", wrapper="holistic", backends=("fa2",), needs_cuda=True,
    visibility=_computes, timed_where_exact=True, unsupported=_unsupported, available=has_api("BatchAttention")),
    __name__)
