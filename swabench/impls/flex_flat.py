"""PyTorch FlexAttention over one flattened sequence (``flex-flat``): every query of the batch in one
sequence over the storage's rows, 128-row blocks, the window and the request boundaries a mask_mod: the layout
of FlexAttention's document masking, and swabench's first FlexAttention peer, kept beside the batched ones of
``flex`` to show what the layout costs."""

from __future__ import annotations

import torch

from .flex import (SPARSE_BLOCK, FlexRunner, compiled_flex, flex_decoding, q_block_size, slot_owners, soft_cap,
                   unsupported)
from .flex_span import Span
from .registry import Implementation, register


class FlatFlex(FlexRunner):
    """flex-flat: one flex_attention call over the whole batch as one sequence, the window and the
    request boundaries a mask_mod over the storage's rows.  On a paged cache a key block of 128 rows
    mixes pages of several requests, and a query block mixes requests: the block mask skips fewer
    blocks than the window alone would allow."""

    def __init__(self, w):
        super().__init__(w)
        group = w.case.gqa_group
        self.layout = (f"one sequence of {len(w.q)} queries over the storage's rows, query block "
                       f"{q_block_size(len(w.q), group)}, key block {SPARSE_BLOCK}, default kernel_options")

    def _prepare(self, first: bool) -> None:
        """The slot lookups and the block mask, at every plan."""
        from torch.nn.attention.flex_attention import create_block_mask

        w, c, dev = self.w, self.w.case, self.w.device
        slot_request, slot_pos = slot_owners(w)
        q_request, q_pos = w.query_request.to(torch.int32), w.query_position.to(torch.int32)
        span = Span(c, dev)

        def mask_mod(b, h, q, kv):
            return span.narrow(slot_request[kv] == q_request[q], slot_pos[kv], q_pos[q])

        self.score_mod = soft_cap(c, dev)
        block = (q_block_size(len(q_pos), c.gqa_group), SPARSE_BLOCK)
        self.block_mask = create_block_mask(mask_mod, 1, None, len(q_pos), slot_request.numel(), device=dev,
                                            BLOCK_SIZE=block)
        self.flex = compiled_flex(dev)

    def _run(self) -> None:
        w, c = self.w, self.w.case
        k = w.k_store.view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)[None]
        v = w.v_store.view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)[None]
        q = w.q.transpose(0, 1)[None]
        o = self.flex(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask, scale=w.sm_scale,
                      enable_gqa=True)
        self.out.copy_(o[0].transpose(0, 1))


def compile_class(case) -> tuple:
    """Which kernel Inductor builds for a flex-flat case: under 128 queries in all, a flex-decoding
    kernel per tile of next_pow2(queries x group) rows (b32 and b64 decode compiled apart on the
    H200, 10 s and 29 s); else the flex-attention kernel.  Lengths do not recompile (dynamic
    shapes).  Queries are counted at the most a case can have (some modes draw fewer per request)."""
    queries, group = case.batch_size * case.largest()[0], case.gqa_group
    heads = (case.num_qo_heads, case.num_kv_heads, case.head_dim, case.dtype, bool(case.logits_soft_cap),
             case.causal, bool(case.attention_chunk))  # each narrows the mask_mod differently
    if flex_decoding(queries, group):
        return ("flex-decoding", 1 << (queries * group - 1).bit_length(), *heads)
    return ("flex-attention", *heads)




register(Implementation(
    "flex-flat", "flex", ("paged", "ragged"),
    "PyTorch FlexAttention over one flattened sequence: every query of the batch, window and request "
    "boundaries as a mask_mod over the storage's rows (peer)",
    lambda w, backend: FlatFlex(w), unsupported=unsupported, compile_class=compile_class, noncausal=True,
    chunked=True, peer=True),
    __name__)
