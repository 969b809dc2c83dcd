"""Reference attention: float64 on the CPU, float32 on a GPU, with the explicit window mask, the
soft-cap ``l = cap * tanh(l / cap)`` and the sinks (one logit per head in every denominator, with
no value) written out from their definitions (docs/semantics.md).  An fp8 cache is read upcast.

It reads K/V back through the workload's page table, so it sees exactly the numbers the
implementation under test reads.  It shares no code with the implementations: the mask is built
here from the definition (``p - W <= j <= p``; without ``causal``, every ``j >= p - W`` of the
request; under chunked attention ``floor(p / C) * C <= j <= p``; in bidirectional blocks of B, also every key
of the query's own block, the queries counted in B's from the first; for a draft tree, each node's own
branch: the cached keys from ``prefix + depth - W`` on and its ancestors, walked up its parents), not
from ``semantics.Visibility``.
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
        if w.trees is not None:
            out[row:row + qo_len] = _tree_request(w, b, queries, acc)
            row += qo_len
            continue
        step = max(1, CHUNK_ELEMENTS // max(1, kv_len * c.num_qo_heads))
        for i0 in range(0, qo_len, step):
            i1 = min(qo_len, i0 + step)
            pos = torch.arange(kv_len - qo_len + i0, kv_len - qo_len + i1, device=w.device)
            # gather only keys some query of the chunk could see; the mask below decides exactly
            lo = 0 if c.window_left < 0 else max(0, int(pos[0]) - c.window_left)
            if c.attention_chunk:
                lo = int(pos[0]) - int(pos[0]) % c.attention_chunk
            if c.block:  # a block wider than the window reaches further back than the window
                lo = min(lo, kv_len - qo_len + i0 - i0 % c.block)
            hi = int(pos[-1]) + 1 if c.causal and not c.block else kv_len
            keys = w.keys(b, lo, hi).to(acc).repeat_interleave(group, dim=1)  # [n, H, D]
            values = w.values(b, lo, hi).to(acc).repeat_interleave(group, dim=1)
            j = torch.arange(lo, hi, device=w.device)
            visible = j[None, :] <= pos[:, None] if c.causal else torch.ones(len(pos), hi - lo, dtype=torch.bool,
                                                                              device=w.device)
            if c.window_left >= 0:
                visible &= j[None, :] >= pos[:, None] - c.window_left
            if c.attention_chunk:  # its own chunk only: from floor(p / C) * C on
                visible &= j[None, :] >= pos[:, None] - pos[:, None] % c.attention_chunk
            if c.block:  # and its own block, both ways: the B queries' keys from prefix + floor(i / B) * B
                i = pos[:, None] - (kv_len - qo_len)
                first = kv_len - qo_len + i - i % c.block
                visible |= (j[None, :] >= first) & (j[None, :] < first + c.block)
            out[row + i0:row + i1] = _attend(w, queries[i0:i1], keys, values, visible)
        row += qo_len
    return out


def _attend(w: Workload, queries, keys, values, visible) -> torch.Tensor:
    """Softmax attention of some queries over the keys ``visible`` marks, from the definition: the soft-cap
    bends the scores, and each head's sink logit joins the denominator with no value."""
    c = w.case
    scores = torch.einsum("qhd,khd->hqk", queries, keys) * w.sm_scale
    if c.logits_soft_cap:
        scores = c.logits_soft_cap * torch.tanh(scores / c.logits_soft_cap)
    scores.masked_fill_(~visible, float("-inf"))
    if w.sinks is not None:
        sink = w.sinks.to(scores.dtype)[:, None, None].expand(-1, len(queries), 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def branch_visible(parents, prefix: int, kv_len: int, window_left: int, first: int = 0) -> torch.Tensor:
    """Bool ``[n, kv_len - first]``: what each node of a draft tree sees, as it would in the linear sequence of
    its own branch (the cached keys, then its ancestors root first, itself last), positions by depth."""
    n = len(parents)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    visible = torch.zeros(n, kv_len - first, dtype=torch.bool)
    for i in range(n):
        position = prefix + depth[i]
        oldest = 0 if window_left < 0 else position - window_left
        visible[i, max(oldest, first) - first:prefix - first] = True
        node = i
        while node >= 0:
            if prefix + depth[node] >= oldest:
                visible[i, prefix + node - first] = True
            node = parents[node]
    return visible


def _tree_request(w: Workload, b: int, queries: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """One request verified as a draft tree, its queries in chunks (the keys from the root's window on)."""
    c, qo_len, kv_len = w.case, w.qo_lens[b], w.kv_lens[b]
    prefix = kv_len - qo_len
    first = 0 if c.window_left < 0 else max(0, prefix - c.window_left)
    visible = branch_visible(w.trees[b].parents, prefix, kv_len, c.window_left, first).to(w.device)
    keys = w.keys(b, first, kv_len).to(acc).repeat_interleave(c.gqa_group, dim=1)
    values = w.values(b, first, kv_len).to(acc).repeat_interleave(c.gqa_group, dim=1)
    out = torch.empty(qo_len, c.num_qo_heads, c.head_dim, dtype=acc, device=w.device)
    step = max(1, CHUNK_ELEMENTS // max(1, (kv_len - first) * c.num_qo_heads))
    for i0 in range(0, qo_len, step):
        out[i0:i0 + step] = _attend(w, queries[i0:i0 + step], keys, values, visible[i0:i0 + step])
    return out
