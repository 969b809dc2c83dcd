"""The reference a FlashInfer-Bench Definition of a sliding-window layer carries: plain torch, causal and
bottom-right aligned, applying the window, the sinks and the soft-cap, returning FlashInfer-Bench's (output,
base-2 lse).  Written out per layer type, so that the file a kernel author reads states the layer in full."""

from __future__ import annotations

STAGES = {"decode": "decode", "extend": "prefill", "verify": "prefill"}


REFERENCE = '''"""Sliding-window GQA {stage} over a paged KV cache, written out from its definition (swabench).

Queries are bottom-right aligned: with kv_len keys and qo_len queries, query i sits at position
p = kv_len - qo_len + i and sees keys p - WINDOW_LEFT .. p.{features}  lse is the base-2 log of
the softmax's denominator{sink_lse}.
"""
import math

import torch

WINDOW_LEFT = {window_left}
LOGITS_SOFT_CAP = {cap!r}  # 0.0: none; else logits = cap * tanh(logits / cap), after sm_scale
QUERY_BLOCK = 256  # queries at a time: bounds the logits held at once


@torch.no_grad()
def run({args}):
{body}


def attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale, sinks):
    total_q, num_qo_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert (num_qo_heads, num_kv_heads, head_dim, page_size) == {shape}
    group = num_qo_heads // num_kv_heads
    output = torch.zeros_like(q)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        q_start, q_end = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        if q_end == q_start or pages.numel() == 0:
            continue
        kv_len = (pages.numel() - 1) * page_size + int(kv_last_page_len[b])
        for i0 in range(q_start, q_end, QUERY_BLOCK):
            i1 = min(q_end, i0 + QUERY_BLOCK)
            pos = torch.arange(i0, i1, device=q.device) - q_end + kv_len
            keys = torch.arange(max(0, int(pos[0]) - WINDOW_LEFT), int(pos[-1]) + 1, device=q.device)
            page, slot = pages[keys // page_size], keys % page_size
            k = k_cache[page, slot].float().repeat_interleave(group, dim=1)  # [keys, heads, head_dim]
            v = v_cache[page, slot].float().repeat_interleave(group, dim=1)
            logits = torch.einsum("qhd,khd->hqk", q[i0:i1].float(), k) * sm_scale
            if LOGITS_SOFT_CAP:
                logits = LOGITS_SOFT_CAP * torch.tanh(logits / LOGITS_SOFT_CAP)
            visible = (keys[None, :] <= pos[:, None]) & (keys[None, :] >= pos[:, None] - WINDOW_LEFT)
            logits = logits.masked_fill(~visible, -math.inf)
            if sinks is not None:  # one more logit per head in every denominator, with no value
                logits = torch.cat([logits, sinks.float()[:, None, None].expand(-1, i1 - i0, 1)], dim=-1)
            norm = torch.logsumexp(logits, dim=-1)  # [heads, queries]
            probs = torch.exp(logits - norm[..., None])[..., :keys.numel()]
            output[i0:i1] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
            lse[i0:i1] = (norm / math.log(2.0)).T
    return output, lse
'''


def reference(case) -> str:
    """The definition's reference: plain torch, a top-level ``run`` taking the inputs in the definition's
    order and returning (output, lse), lse = logsumexp / ln 2 as FlashInfer-Bench's references return it."""
    decode = case.mode == "decode"
    args = ["q", "k_cache", "v_cache", *(["qo_indptr"] * (not decode)), "kv_indptr", "kv_indices",
            "kv_last_page_len", "sm_scale", *(["sinks"] * case.sinks)]
    body = ["    qo_indptr = torch.arange(q.shape[0] + 1, device=q.device)  # decode: one query a request"] * decode
    body.append("    return attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale, "
                + ("sinks)" if case.sinks else "None)"))
    features = "".join([" Every softmax denominator has one more term per head, exp(sinks[h]), with no value."
                        * case.sinks, " Logits are soft-capped." * bool(case.logits_soft_cap)])
    return REFERENCE.format(stage=STAGES[case.mode], features=features, window_left=case.window_left,
                            sink_lse=" (the sink's term included)" if case.sinks else "",
                            cap=float(case.logits_soft_cap), args=", ".join(args), body="\n".join(body),
                            shape=(case.num_qo_heads, case.num_kv_heads, case.head_dim, case.page_size))
