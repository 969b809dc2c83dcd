"""Library bugs on correct calls, declared in one place (the table below): each with its upstream
issue, the paths it hits and the condition where it shows.

A correct path (or a known-bug path where its own mistake does not show) that fails the gate where a
declared bug's condition holds is recorded ``xfail`` with that issue in the ``upstream`` column; where the
condition holds and it passes, the row records the issue too (the release at hand does not show it there), so a
release matrix can say which release has which bug.  A failure outside every declared condition is still a
failure, and exits 1.

A known-bug *implementation* (registry kind ``known-bug``) is a wrong call a user or an engine makes;
an upstream bug is the library's own mistake on a call made right.  A *documented precondition* (``documented``:
where the library's documentation states it) is declared in the same table: a condition on the inputs that the
library says its callers must meet and the case breaks on purpose (a cache whose slots no query reads hold NaN).
Its rows are ``xfail`` too, their reason saying "documented precondition", and it is no bug to file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class UpstreamBug:
    ref: str  # "flashinfer#4972": the upstream issue (or pull request) that reports or fixes it; else a stable name
    url: str  # "" where nothing upstream reports it yet
    library: str
    summary: str
    impls: frozenset[str]  # the paths it can hit
    shows: Callable[..., bool]  # (impl, case, backend) -> whether the condition holds on this point
    fixed_in: str | None = None  # the first release with the fix, where upstream has one
    documented: str = ""  # a documented precondition, not a bug: the release and file:line that state it

    def describe(self) -> str:
        """What a row's reason says of it: 'upstream bug REF: SUMMARY', or 'documented precondition REF: ...'."""
        if self.documented:
            return f"documented precondition {self.ref}: {self.summary} ({self.documented})"
        return f"upstream bug {self.ref}: {self.summary}"


def _sink_head_dims_mixed(impl: str, case, backend: str) -> bool:
    from swabench.impls import flashinfer_library

    return flashinfer_library.sink_head_dims_mixed(case, backend)


def _holistic_offset_wraps(impl: str, case, backend: str) -> bool:
    from swabench.impls import batch_attention

    return bool(batch_attention.wrapped_requests(case))


def _fa2_noncausal_split(impl: str, case, backend: str) -> bool:
    """flashinfer#4972's rows, from fa2's split-KV schedule (impls.fa2_split) on this GPU's SM count, over
    the lengths the path plans (paged-trim plans each request from its trimmed table's first page)."""
    if backend != "fa2" or case.causal or case.window_left < 0 or case.mode == "decode":
        return False
    import torch

    from swabench.impls import fa2_split

    if not torch.cuda.is_available():
        return False
    return any(len(r) for r in fa2_noncausal_wrong_rows(impl, case, fa2_split.device_sms()))


def _fa4_tma_page_not_finite(impl: str, case, backend: str) -> bool:
    """flash-attn-4's page_table precondition: a page its SM90 forward loads by TMA (a page of exactly its key
    tile) holds NaN or Inf past some request's last key."""
    from swabench.impls import fa4

    return case.cache_fill in ("nan", "inf") and fa4.loads_pages_by_tma(case) and \
        fa4.last_page_partly_used(case)


def _fa3_ragged_rows_not_finite(impl: str, case, backend: str) -> bool:
    """FA3's varlen shape: a ragged K/V buffer longer than the batch's keys (the cache_fill axis's spare rows) holds
    NaN or Inf past the last request's keys."""
    return case.storage == "ragged" and case.cache_fill in ("nan", "inf")


def fa2_noncausal_wrong_rows(impl: str, case, num_sms: int) -> list[range]:
    """Per request, the rows fa2's split-KV schedule gets wrong for this path under a non-causal window, over
    the lengths it plans."""
    from swabench.core import workloads
    from swabench.impls import fa2_run_window, fa2_split, flashinfer_impls

    qo_lens, kv_lens = workloads.request_lengths(case)
    kv_lens = flashinfer_impls.planned_kv_lens(impl, case, qo_lens, kv_lens)
    return fa2_split.wrong_rows(qo_lens, kv_lens, case.window_left, case.page_size or 1, case.gqa_group,
                                case.num_kv_heads, case.head_dim, num_sms, case.wrapper_mode != "plain",
                                fa2_run_window.uniform_hint(qo_lens))


# The table: every library bug on a correct call that swabench knows, with where it shows.
_DECLARED: list[UpstreamBug] = [
    UpstreamBug(
        "flashinfer#1679", "https://github.com/flashinfer-ai/flashinfer/pull/1679", "flashinfer",
        "the sink wrapper's JIT module is named by query dtype, window and backend only (since the wrapper came in "
        "flashinfer#1679; 0.7.4 adds the head_dims and cache dtype, no upstream report found): a process that built "
        "it at one head_dim runs that module again at another: rows unwritten or wrong, or the CUDA context lost",
        frozenset({"sink-window"}), _sink_head_dims_mixed, fixed_in="0.7.4"),
    UpstreamBug(
        "flashinfer#4972", "https://github.com/flashinfer-ai/flashinfer/issues/4972", "flashinfer",
        "fa2 with plan(causal=False, window_left=W): where the scheduler splits a request along KV, it sizes the "
        "chunks for W + one query tile of keys, so the leading query tiles, whose non-causal window reaches to "
        "the request's last key, miss the keys past their chunks (fix proposed in flashinfer#4992)",
        frozenset({"paged-window", "paged-trim", "ragged-window"}), _fa2_noncausal_split),
    UpstreamBug(
        "holistic-offset", "", "flashinfer",
        "BatchAttention (the persistent holistic kernel) computes a page's K/V offset as the int32 page index times "
        "the uint32 page stride in 32 bits (prefetch_offest, attention/persistent.cuh): a page that ends past 2^32 "
        "elements of its cache (8 GiB of bfloat16) is read from the wrong place (flashinfer#3136 fixed the same "
        "product in the MLA kernels)",
        frozenset({"batch-attention-trim"}), _holistic_offset_wraps),
    UpstreamBug(
        "fa4-tma-page-finite", "https://github.com/Dao-AILab/flash-attention", "fa4",
        "a page FA4 loads by TMA (a page of exactly its key tile; on SM90 128 keys up to head_dim 128) is loaded "
        "whole, the rows past seqused_k in a request's last page too: their scores are masked, but P = 0 times a "
        "NaN or Inf V row is NaN, so the library asks for those rows to be finite",
        frozenset({"fa4-window", "fa4-window-count"}), _fa4_tma_page_not_finite,
        documented="flash-attn-4 4.0.0b36, flash_attn/cute/interface.py:4277-4281 (flash_attn_varlen_func's "
                   "docstring, page_table)"),
    UpstreamBug(
        "fa3-varlen-total-k", "https://github.com/Dao-AILab/flash-attention/issues/1228", "vllm-fa3",
        "flash_attn_varlen_func takes k and v of exactly the batch's key count (cu_seqlens_k[-1] rows): a longer "
        "buffer's rows past the last sequence are loaded with its last key tile, masked, and P = 0 times a NaN or "
        "Inf V row is NaN (flash-attention#1228 reports it; sgl-flash-attn#47 would assert on a longer buffer)",
        frozenset({"fa3-window", "fa3-window-count"}), _fa3_ragged_rows_not_finite,
        documented="vllm 0.26.0, vllm/vllm_flash_attn/flash_attn_interface.py:240-241 (flash_attn_varlen_func's "
                   "docstring: k and v are (total_k, nheads_k, headdim), total_k the batch's key count)"),
]


def declared() -> list[UpstreamBug]:
    return list(_DECLARED)


def hit(impl_name: str, case, backend: str) -> UpstreamBug | None:
    """The declared bug whose condition holds on this point of a path it names, or None."""
    return next((b for b in _DECLARED if impl_name in b.impls and b.shows(impl_name, case, backend)), None)


def speaks(impl_name: str, case, backend: str, must_fail: bool) -> UpstreamBug | None:
    """The declared bug that answers for this point's verdict: its condition holds, and the path's own mistake
    (``must_fail``: a known-bug path where it shows) does not speak first."""
    return None if must_fail else hit(impl_name, case, backend)


def get(ref: str) -> UpstreamBug | None:
    return next((b for b in _DECLARED if b.ref == ref), None)
