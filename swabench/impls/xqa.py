"""TRT-LLM's XQA kernel through FlashInfer, on decode steps and speculative chains (verify with one draft length for
the batch).  JIT-built from ``csrc/xqa/`` for SM90; pages of 16, 32, 64 or 128 tokens; sinks; no soft-cap.

XQA counts its window in keys: ``sliding_win_size = N`` shows a query at ``p`` the keys after ``p - N``, the current
one included (``mha.cu``: ``cacheSeqLen - slidingWinSize`` tokens skipped; on a chain, row ``r`` from ``p_r - N + 1``).
That is FlashInfer's ``window_left = N - 1``, and ``xqa_batch_decode_with_kv_cache`` passes ``window_left + 1``
(``decode.py`` in 0.6.18.post1 through 0.7.4).

- ``xqa-window``: ``flashinfer.decode.xqa_batch_decode_with_kv_cache(..., window_left=W)``, FlashInfer's call.
- ``xqa-window-off-by-one``: ``flashinfer.xqa(..., sliding_win_size=W)``, the kernel called directly with
  ``window_left`` where it takes a count: every query loses the oldest key of its window (a known bug).

A chain's rows see each other causally through XQA's mask (one bit per draft key, packed in 32-bit words), the mask
FlashInfer's decode wrapper builds for its own MTP route.  The KV cache holds the drafts' keys already.
"""

from __future__ import annotations

import dataclasses

import torch

from swabench.core import semantics, workloads
from swabench.core.cases import WRAPPER_MODES
from .flashinfer_impls import Variant, unsupported
from .flashinfer_library import LIBRARY, XQA, has_api
from .flashinfer_workspace import MIB, resource_errors
from .registry import Implementation, register

PAGE_SIZES = (16, 32, 64, 128)  # jit/xqa.py raises on any other
CTA_TOKENS = 256  # mha.cu's CTA tile on a bfloat16 cache (4 warps of 64 tokens): whole tiles are loaded
SEMAPHORE_BYTES = 8 * MIB  # xqa_batch_decode_with_kv_cache's split of the workspace: semaphores first, then scratch
WORKSPACE_BYTES = 256 * MIB


def tokens_read(kv_len: int, window_left: int) -> int:
    """The keys a decode query's KV head loads through ``mha.cu``: from the window's start rounded down to a CTA
    tile (``nbSkipLeadingTiles = (cacheSeqLen - slidingWinSize) / ctaTile.x``) to the end, so
    ``(kv_len - window_left - 1) mod 256`` more than the window."""
    if window_left < 0 or kv_len <= window_left + 1:
        return kv_len
    return kv_len - (kv_len - window_left - 1) // CTA_TOKENS * CTA_TOKENS


def chain_mask(batch: int, qo_len: int, device) -> torch.Tensor:
    """XQA's spec-dec mask for causal chains: row r sees draft keys 0..r, bit j of 32-bit word j // 32 (least
    significant first), uint16 ``[batch, qo_len, 2 * ceil(qo_len / 32)]`` (``_make_xqa_mtp_causal_mask``)."""
    words = -(-qo_len // 32)
    seen = torch.arange(words * 32, device=device)[None, :] <= torch.arange(qo_len, device=device)[:, None]
    bits = (seen.view(qo_len, words, 32).to(torch.int64) << torch.arange(32, device=device)).sum(dim=-1)
    return bits.to(torch.uint32).expand(batch, qo_len, words).contiguous().view(torch.uint16)


class XqaRunner:
    """One XQA call a step: the block tables and lengths built at plan, the kernel called at run."""

    def __init__(self, w, backend: str, direct: bool):
        self.w, self.direct = w, direct
        self.resolved_backend = "xqa"
        self.out = torch.empty_like(w.q)
        with resource_errors():  # XQA's semaphores must start at zero
            self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=w.device)

    def plan(self) -> None:
        w = self.w
        self.tables = workloads.block_tables(w.kv_indptr_host, w.kv_indices_host).to(w.device)
        self.seq_lens = torch.tensor(w.kv_lens, dtype=torch.uint32, device=w.device)  # the drafts' keys included
        self.q_len = w.qo_lens[0]
        self.mask = chain_mask(w.batch_size, self.q_len, w.device) if self.q_len > 1 else None
        self.layout = f"{'xqa()' if self.direct else 'xqa_batch_decode_with_kv_cache'}, {self.q_len} per request"

    def run(self) -> None:
        import flashinfer

        w, c = self.w, self.w.case
        if not self.direct:  # it views the queries as [batch, q_len, heads, dim]: the output it is given too
            out = self.out.view(w.batch_size, self.q_len, c.num_qo_heads, c.head_dim) if self.q_len > 1 else self.out
            flashinfer.decode.xqa_batch_decode_with_kv_cache(
                w.q, (w.k_store, w.v_store), self.workspace, self.tables, self.seq_lens, max(w.kv_lens),
                bmm1_scale=w.sm_scale, bmm2_scale=1.0, window_left=c.window_left, out=out, sinks=w.sinks,
                kv_layout="NHD", q_len_per_req=self.q_len, mask=self.mask)
            return
        shape = (w.batch_size, 1, self.q_len, c.num_qo_heads, c.head_dim) if self.q_len > 1 else \
            (w.batch_size, 1, c.num_qo_heads, c.head_dim)
        flashinfer.xqa(
            w.q.view(shape), w.k_store, w.v_store, self.tables, self.seq_lens[:, None], self.out.view(shape),
            self.workspace[SEMAPHORE_BYTES:], self.workspace[:SEMAPHORE_BYTES], c.num_kv_heads, w.page_size,
            sinks=None if w.sinks is None else w.sinks.view(c.num_kv_heads, -1),
            q_scale=w.sm_scale * c.head_dim ** 0.5, kv_scale=1.0, sliding_win_size=max(c.window_left, 0),
            kv_layout="NHD", q_seq_len=self.q_len, mask=self.mask)


def _unsupported(case, backend: str) -> str | None:
    """Why XQA cannot run a case (beyond what every FlashInfer path needs)."""
    if case.page_size not in PAGE_SIZES:
        return f"XQA takes pages of {', '.join(map(str, PAGE_SIZES))} tokens (jit/xqa.py), not {case.page_size}"
    if case.logits_soft_cap:
        return "XQA applies no soft-cap"
    if not isinstance(case.qo_len, int):
        return "XQA is run here with one draft length for the batch (its q_len_per_req)"
    if case.head_dim % 16 or case.head_dim > 256:
        return f"XQA's SM90 kernels take head_dim a multiple of 16 up to 256, not {case.head_dim}"
    return unsupported(dataclasses.replace(Variant("paged"), sinks="apply"), head_dims=None)(case, backend)


def _module_key(case) -> str:
    """XQA's JIT module is built per page size, head group and draft length (``jit/xqa.py``'s module name)."""
    return f"ps{case.page_size} g{case.num_qo_heads // case.num_kv_heads} q{case.qo_len}"


def _register(name: str, summary: str, direct: bool, **roles) -> None:
    register(Implementation(
        name, LIBRARY.name, ("paged",), summary, lambda w, backend: XqaRunner(w, backend, direct), wrapper="xqa",
        backends=(XQA,), modes=("decode", "verify"), wrapper_modes=WRAPPER_MODES, needs_cuda=True,
        unsupported=_unsupported, available=has_api("xqa" if direct else "decode.xqa_batch_decode_with_kv_cache"),
        module_key=_module_key,
        **roles), __name__)


_register("xqa-window", "TRT-LLM's XQA through xqa_batch_decode_with_kv_cache(window_left=W), which hands the kernel "
          "W + 1 keys", direct=False)
_register("xqa-window-off-by-one", "flashinfer.xqa(sliding_win_size=W): window_left given where XQA counts keys, so "
          "each query loses the oldest key of its window", direct=True, kind="known-bug",
          visibility=lambda w, prefix, ps: semantics.Visibility(w - 1 if w > 0 else semantics.NO_WINDOW))
