"""Reference attention: float64 on the CPU, float32 on a GPU, with the explicit window mask, the
soft-cap ``l = cap * tanh(l / cap)`` and the sinks (one logit per head in every denominator, with
no value) written out from their definitions (docs/semantics.md).  An fp8 cache is read upcast.

It reads K/V back through the workload's page table, so it sees exactly the numbers the
implementation under test reads.  It shares no code with the implementations: the mask is built
here from the definition (``p - W <= j <= p``; without ``causal``, every ``j >= p - W`` of the
request; under chunked attention ``floor(p / C) * C <= j <= p``), not from ``semantics.Visibility``.
"""

from __future__ import annotations

import torch

from swabench.core.footprint import REFERENCE_CHUNK_ELEMENTS as CHUNK_ELEMENTS
from swabench.core.workloads import Workload


def accumulate_dtype(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type == "cpu" else torch.float32


def attention(w: Workload) -> torch.Tensor:
    """Exact output ``[total_q, num_qo_heads, head_dim]`` in the accumulate dtype."""
    acc = accumulate_dtype(w.device)
    c = w.case
    group = c.gqa_group
    out = torch.empty(w.q.shape, dtype=acc, device=w.device)
    row = 0
    for b, (qo_len, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
        queries = w.queries(b).to(acc)
        step = max(1, CHUNK_ELEMENTS // max(1, kv_len * c.num_qo_heads))
        for i0 in range(0, qo_len, step):
            i1 = min(qo_len, i0 + step)
            pos = torch.arange(kv_len - qo_len + i0, kv_len - qo_len + i1, device=w.device)
            # gather only keys some query of the chunk could see; the mask below decides exactly
            lo = 0 if c.window_left < 0 else max(0, int(pos[0]) - c.window_left)
            if c.attention_chunk:
                lo = int(pos[0]) - int(pos[0]) % c.attention_chunk
            hi = int(pos[-1]) + 1 if c.causal else kv_len
            keys = w.keys(b, lo, hi).to(acc).repeat_interleave(group, dim=1)  # [n, H, D]
            values = w.values(b, lo, hi).to(acc).repeat_interleave(group, dim=1)
            j = torch.arange(lo, hi, device=w.device)
            visible = j[None, :] <= pos[:, None] if c.causal else torch.ones(len(pos), hi - lo, dtype=torch.bool,
                                                                              device=w.device)
            if c.window_left >= 0:
                visible &= j[None, :] >= pos[:, None] - c.window_left
            if c.attention_chunk:  # its own chunk only: from floor(p / C) * C on
                visible &= j[None, :] >= pos[:, None] - pos[:, None] % c.attention_chunk
            scores = torch.einsum("qhd,khd->hqk", queries[i0:i1], keys) * w.sm_scale
            if c.logits_soft_cap:
                scores = c.logits_soft_cap * torch.tanh(scores / c.logits_soft_cap)
            scores.masked_fill_(~visible, float("-inf"))
            if w.sinks is not None:
                sink = w.sinks.to(acc)[:, None, None].expand(-1, i1 - i0, 1)
                probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            else:
                probs = torch.softmax(scores, dim=-1)
            out[row + i0:row + i1] = torch.einsum("hqk,khd->qhd", probs, values)
        row += qo_len
    return out
