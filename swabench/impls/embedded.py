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

import torch
import torch.nn.functional as F

from swabench.core import semantics
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


def _gather(visibility, trim):
    return lambda workload, backend: GatherRunner(workload, visibility, trim)


BOTH = ("paged", "ragged")
register(Implementation(
    "torch-trim", "torch", BOTH, "gather only the keys the block's windows reach, SDPA with the window mask",
    _gather(exact, trim=True)), __name__)
register(Implementation(
    "torch-mask", "torch", BOTH, "gather every key, SDPA with a dense causal+window mask (naive)",
    _gather(exact, trim=False), baseline=True), __name__)


def _planted(name, summary, visibility):
    register(Implementation(name, "torch", BOTH, summary, _gather(visibility, trim=True), kind="planted",
                            visibility=visibility), __name__)


_planted("planted-wide", "window one key too wide (W + 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w + 1 if w >= 0 else w))
_planted("planted-narrow", "window one key too narrow (W - 1): the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(max(w - 1, 0) if w >= 0 else w))
_planted("planted-future", "one future key visible: the gate must catch it",
         lambda w, prefix, ps: semantics.Visibility(w, future=1))
