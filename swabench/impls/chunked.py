"""Chunked local attention through FlashInfer, which has no mode for it (Llama 4's ``attention_chunk_size``:
a query at p sees, causally, the keys of its own chunk, floor(p / C) * C through p).

- ``chunk-virtual``: vLLM's virtual batches.  Each request becomes one batch entry per chunk its queries
  touch, whose page table is cut at the chunk's start, planned causal without a window; the queries stay
  where they are (a request's queries split into consecutive runs), so the output needs no gather.  The
  table can only start on a page: C must be a multiple of the page size.
- ``chunk-trim``: the table trimmed to the first query's chunk start, planned causal without a window:
  exact where every request's queries lie in one chunk (decode, and a verify block inside one chunk).
- ``chunk-as-window``: planned with ``window_left = C - 1``, the natural mistake: a query sees the previous
  chunk's last keys wherever it is not the last position of its chunk (a known bug, never timed).
"""

from __future__ import annotations

import torch

from swabench.core import semantics
from . import flashinfer_impls as fi


CHUNKED = dict(chunked=True, requires=frozenset({"chunk"}))  # runs chunked cases, and only those


class VirtualBatch:
    """A workload seen as vLLM's virtual batches: one entry per (request, chunk its queries touch), each with
    the chunk's keys up to its last query.  Everything else (the queries, the caches, the case) is the
    workload's own, read through."""

    def __init__(self, w):
        self.workload = w
        chunk, ps = w.case.attention_chunk, w.page_size
        qo, kv, indptr, indices = [], [], [0], []
        for b, (q_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
            pages = w.kv_indices_host[int(w.kv_indptr_host[b]):int(w.kv_indptr_host[b + 1])]
            p = kv_len - q_len
            while p < kv_len:
                start = semantics.chunk_start(p, chunk)
                end = min(kv_len, start + chunk)  # the chunk's keys up to its last query
                qo.append(end - p)
                kv.append(end - start)
                indices.append(pages[start // ps:-(-end // ps)])
                indptr.append(indptr[-1] + len(indices[-1]))
                p = end
        self.qo_lens, self.kv_lens, self.batch_size = qo, kv, len(qo)
        self.qo_indptr_host = [0, *torch.tensor(qo).cumsum(0).tolist()]
        self.kv_indptr_host = torch.tensor(indptr)
        self.kv_indices_host = torch.cat(indices) if indices else torch.zeros(0, dtype=torch.int64)
        self.kv_last_page_len = torch.tensor([k - (-(-k // ps) - 1) * ps for k in kv], dtype=torch.int32)

    def __getattr__(self, name):
        if name in ("qo_indptr", "kv_indptr", "kv_indices", "prefix_lens", "slot_indptr", "request_slots"):
            raise AttributeError(f"{name} is the workload's, not the virtual batch's")
        return getattr(self.workload, name)


class VirtualRunner(fi.FlashInferRunner):
    """The wrapper sized for the virtual batch; every plan() cuts the batch again (host work a server
    redoes each step, so it counts in the plan time)."""

    def __init__(self, w, backend: str, variant: fi.Variant, graph_wrapper: bool = True):
        super().__init__(VirtualBatch(w), backend, variant, graph_wrapper)

    def plan(self) -> None:
        self.w = VirtualBatch(self.w.workload)
        super().plan()
        self.layout += f", {self.w.batch_size} virtual requests"


def _pages_hold_chunks(case, backend: str) -> str | None:
    """A table cut at a chunk start must start on a page."""
    if case.attention_chunk % case.page_size:
        return (f"a table cut at a chunk start starts on a page: attention_chunk {case.attention_chunk} must be a "
                f"multiple of page_size {case.page_size}")
    return None


def _one_chunk(case, backend: str) -> str | None:
    """chunk-trim is exact only where its table starts at the chunk and each request's queries share a chunk."""
    from swabench.core import workloads

    unaligned = _pages_hold_chunks(case, backend)
    if unaligned:
        return unaligned
    chunk = case.attention_chunk
    qo_lens, kv_lens = workloads.request_lengths(case)
    if any((k - q) // chunk != (k - 1) // chunk for q, k in zip(qo_lens, kv_lens)):
        return "a block crosses a chunk start: the trimmed table would show its later queries the earlier chunk " \
               "(chunk-virtual runs it)"
    return None


fi.register_variant("chunk-virtual", "vLLM's virtual batches: one entry per request and chunk, table cut at the "
                    "chunk start, plan(causal=True) without a window", fi.Variant("paged"), runner=VirtualRunner,
                    also=_pages_hold_chunks, module=__name__, **CHUNKED)
fi.register_variant("chunk-trim", "table trimmed to the first query's chunk start, plan(causal=True) without a "
                    "window: one chunk per request's block", fi.Variant("paged", start=fi.trim), also=_one_chunk,
                    module=__name__, **CHUNKED)
fi.register_variant("chunk-as-window", "the chunk planned as a sliding window, window_left = C - 1: a query sees "
                    "the previous chunk's last keys", fi.Variant("paged", plan_window=lambda c: c.attention_chunk - 1),
                    kind="known-bug", chunk_visibility=lambda chunk, prefix, ps: semantics.Visibility(chunk - 1),
                    module=__name__, **CHUNKED)
