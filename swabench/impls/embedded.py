"""Pure-PyTorch implementations: run anywhere, the embedded default on a machine without a GPU.

Both gather K/V through the page table and call SDPA with a boolean mask; they differ the way the
FlashInfer paths do: ``torch-trim`` gathers only the keys some query's window can reach (the
trimming idea), ``torch-mask`` gathers every key and lets a dense mask do the work (the naive idea).
The ``planted-*`` variants are the same code with the window off by one, kept so every run can show
that the gate catches such mistakes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import semantics
from .registry import Implementation, exact, register


class GatherRunner:
    def __init__(self, workload, visibility, trim: bool):
        self.w, self.visibility, self.trim = workload, visibility, trim
        self.out = torch.empty_like(workload.q)
        self.resolved_backend = f"torch-sdpa-{workload.device.type}"
        self.parts = []

    def plan(self) -> None:
        """Per request: the slots to gather and the mask (the host work a server would redo each step)."""
        w, c = self.w, self.w.case
        qo_indptr = w.qo_indptr_host
        parts = []
        for b, (qo_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
            vis = self.visibility(c.window_left, kv_len - qo_len, w.page_size)
            start = semantics.trim_start(kv_len, qo_len, vis.window_left) if self.trim else 0
            mask = vis.mask(qo_len, kv_len, key_offset=start, device=w.device)
            parts.append((qo_indptr[b], qo_indptr[b + 1], w.request_slots(b)[start:], mask))
        self.parts = parts

    def run(self) -> None:
        c = self.w.case
        k_flat = self.w.k_store.view(-1, c.num_kv_heads, c.head_dim)
        v_flat = self.w.v_store.view(-1, c.num_kv_heads, c.head_dim)
        for lo, hi, slots, mask in self.parts:
            q = self.w.q[lo:hi].transpose(0, 1)
            k, v = k_flat[slots].transpose(0, 1), v_flat[slots].transpose(0, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.w.sm_scale, enable_gqa=True)
            self.out[lo:hi] = o.transpose(0, 1)


def _gather(visibility, trim):
    return lambda workload, backend: GatherRunner(workload, visibility, trim)


BOTH = ("paged", "ragged")
register(Implementation(
    "torch-trim", "torch", BOTH, "gather only the keys the block's windows reach, SDPA with the window mask",
    _gather(exact, trim=True)))
register(Implementation(
    "torch-mask", "torch", BOTH, "gather every key, SDPA with a dense causal+window mask (naive)",
    _gather(exact, trim=False), baseline=True))


def _planted(name, summary, visibility):
    register(Implementation(name, "torch", BOTH, summary, _gather(visibility, trim=True), kind="planted",
                            visibility=visibility))


_planted("planted-wide", "window one key too wide (W + 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w + 1 if w >= 0 else w))
_planted("planted-narrow", "window one key too narrow (W - 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(max(w - 1, 0) if w >= 0 else w))
_planted("planted-future", "one future key visible: the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w, future=1))
