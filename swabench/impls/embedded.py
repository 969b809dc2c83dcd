"""Pure-PyTorch implementations: run anywhere, the embedded default on a machine without a GPU.

Both gather K/V through the page table and call SDPA with a boolean mask; they differ the way the
FlashInfer paths do: ``torch-trim`` gathers only the keys some query's window can reach (the
trimming idea), ``torch-mask`` gathers every key and lets a dense mask do the work (the naive idea).
The ``planted-*`` variants are the same code with the window off by one, kept so every run can show
that the gate catches such mistakes.  SDPA has no soft-cap and no sink term: with either, the
scores are written out by hand (the same gather, the same mask).  An fp8 cache is upcast after
the gather, as a kernel reading it would.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from swabench.core.query_batch import QueryBatch
from swabench.core import semantics, workloads
from .implementation import computed, exact
from .registry import Implementation, register


class GatherRunner:
    def __init__(self, workload, computes, trim: bool, seen=None):
        """``computes(case, prefix_len)``: the Visibility it applies to one request; ``seen``: a bool mask per
        request over its keys, where no Visibility says what a path sees (the gather is then the whole table)."""
        self.w, self.computes, self.trim, self.seen = workload, computes, trim, seen
        self.out = torch.empty_like(workload.q)
        self.resolved_backend = f"torch-sdpa-{workload.device.type}"
        self.parts = []

    def plan(self) -> None:
        """Per request: the slots to gather and the mask (the host work a server would redo each step)."""
        w, c = self.w, self.w.case
        qo_indptr = w.qo_indptr_host
        parts = []
        for b, (qo_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
            vis = self.computes(c, kv_len - qo_len)
            start = semantics.trim_start(kv_len, qo_len, vis.window_left, chunk=vis.chunk) if self.trim else 0
            mask = vis.mask(qo_len, kv_len, key_offset=start, device=w.device, tree=w.trees and w.trees[b]) \
                if self.seen is None else self.seen[b].to(w.device)
            parts.append((qo_indptr[b], qo_indptr[b + 1], w.request_slots(b)[start:], mask))
        self.parts = parts

    def run(self) -> None:
        w, c = self.w, self.w.case
        k_flat = w.k_store.view(-1, c.num_kv_heads, c.head_dim)
        v_flat = w.v_store.view(-1, c.num_kv_heads, c.head_dim)
        by_hand = c.logits_soft_cap or w.sinks is not None
        for lo, hi, slots, mask in self.parts:
            q = w.q[lo:hi].transpose(0, 1)
            k = k_flat[slots].transpose(0, 1).to(q.dtype)
            v = v_flat[slots].transpose(0, 1).to(q.dtype)
            if by_hand:
                o = attend(q, k, v, mask, w.sm_scale, c.logits_soft_cap, w.sinks)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=w.sm_scale, enable_gqa=True)
            self.out[lo:hi] = o.transpose(0, 1)


def as_predicted(impl: Implementation, w, backend: str) -> GatherRunner:
    """A planned runner that computes what ``impl`` is predicted to compute on ``w`` (the keys its semantics or its
    ``seen`` say each query sees, gathered and attended here, without the sinks where it ignores them): the output a
    known mistake should give.  ValueError for a feature it ignores that cannot be left out here."""
    ignored = impl.ignores & w.case.features
    if ignored - {"sinks"}:
        raise ValueError(f"cannot leave {', '.join(sorted(ignored - {'sinks'}))} out of the predicted output")
    source = dataclasses.replace(w, sinks=None) if ignored else w  # the same buffers, the sink term left out
    seen = impl.seen_masks(w.case, w.qo_lens, w.kv_lens, backend) if impl.seen else None
    runner = GatherRunner(source, impl.computes, trim=False, seen=seen)
    runner.plan()
    return runner


class BatchedSdpaRunner:
    """torch-batch: what a PyTorch user calls for a batch of requests.  Each request's window is gathered
    into one padded ``[batch, kv_heads, keys, dim]`` tensor (the gather is part of every step, as in
    torch-trim) and SDPA runs once over the batch; the boolean mask is dropped where every request sees
    every gathered key (decode with full windows), so that SDPA may pick its flash kernel."""

    def __init__(self, w):
        self.w, self.queries = w, QueryBatch(w)
        self.out = torch.empty_like(w.q)
        self.resolved_backend = f"torch-sdpa-{w.device.type}"

    def plan(self) -> None:
        w, c, dev = self.w, self.w.case, self.w.device
        starts = [semantics.trim_start(k, q, c.window_left, chunk=c.attention_chunk) for q, k in zip(w.qo_lens, w.kv_lens)]
        keys = max(k - s for k, s in zip(w.kv_lens, starts))
        batch, rows = self.queries.batch, self.queries.rows
        index = torch.zeros(batch, keys, dtype=torch.long, device=dev)
        mask = torch.zeros(batch, 1, rows, keys, dtype=torch.bool, device=dev)
        for b, (q, k, s) in enumerate(zip(w.qo_lens, w.kv_lens, starts)):
            index[b, :k - s] = w.request_slots(b)[s:]
            mask[b, 0, :q, :k - s] = semantics.of_case(c).mask(q, k, key_offset=s, device=dev, tree=w.trees and w.trees[b])
        self.index = index
        self.mask = None if bool(mask.all()) else mask
        self.layout = (f"{self.queries.label}, {keys} gathered keys a request, one SDPA call, "
                       + ("no mask" if self.mask is None else "boolean mask"))

    def run(self) -> None:
        w, c = self.w, self.w.case
        q = self.queries.queries()
        k = w.k_store.view(-1, c.num_kv_heads, c.head_dim)[self.index].transpose(1, 2).to(q.dtype)
        v = w.v_store.view(-1, c.num_kv_heads, c.head_dim)[self.index].transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=w.sm_scale, enable_gqa=True)
        self.queries.write_back(o, self.out)


def attend(q, k, v, mask, scale: float, soft_cap: float, sinks) -> torch.Tensor:
    """Attention written out, in float32: q [H, n, D], k and v [Hkv, m, D], mask [n, m]; the soft-cap
    bends the scores and each head's sink logit joins the denominator with no value."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, dim=0).float(), v.repeat_interleave(group, dim=0).float()
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks[:, None, None].float().expand(-1, scores.shape[1], 1)], dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., :k.shape[1]]
    return torch.matmul(probs, v).to(q.dtype)


def _gather(visibility, trim, chunk_visibility=None):
    return lambda workload, backend: GatherRunner(
        workload, lambda case, prefix: computed(case, prefix, visibility, chunk_visibility), trim)


BOTH = ("paged", "ragged")
register(Implementation(
    "torch-trim", "torch", BOTH, "gather only the keys the block's windows reach, SDPA with the window mask",
    _gather(exact, trim=True), noncausal=True, chunked=True, tree=True, block=True), __name__)
register(Implementation(
    "torch-mask", "torch", BOTH, "gather every key, SDPA with a dense causal+window mask (naive)",
    _gather(exact, trim=False), baseline=True, noncausal=True, chunked=True, tree=True, block=True), __name__)


register(Implementation(
    "torch-batch", "torch", BOTH, "gather each request's window into one padded batch, one SDPA call (peer)",
    lambda workload, backend: BatchedSdpaRunner(workload),
    unsupported=lambda case, backend: "SDPA has no soft-cap or sink term (torch-trim writes those scores out)"
    if case.logits_soft_cap or case.sinks else None, noncausal=True, chunked=True, tree=True, block=True, peer=True),
    __name__)


def _planted(name, summary, visibility):
    register(Implementation(name, "torch", BOTH, summary, _gather(visibility, trim=True), kind="planted",
                            visibility=visibility), __name__)


def _planted_chunk(name, summary, chunk_visibility):
    register(Implementation(name, "torch", BOTH, summary, _gather(exact, True, chunk_visibility), kind="planted",
                            chunked=True, chunk_visibility=chunk_visibility, requires=frozenset({"chunk"})), __name__)


_planted("planted-wide", "window one key too wide (W + 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w + 1 if w >= 0 else w))
_planted("planted-narrow", "window one key too narrow (W - 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(max(w - 1, 0) if w >= 0 else w))
_planted("planted-future", "one future key visible: the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w, future=1))
_planted_chunk("planted-chunk-window", "chunk of C planned as a window of C - 1 keys (reaches into the previous chunk): "
               "the gate must catch it", lambda chunk, prefix, ps: semantics.Visibility(chunk - 1))
_planted_chunk("planted-chunk-long", "chunks one key too long (C + 1): the gate must catch it",
               lambda chunk, prefix, ps: semantics.Visibility(semantics.NO_WINDOW, chunk=chunk + 1))
