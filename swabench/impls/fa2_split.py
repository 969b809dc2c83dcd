"""FlashInfer fa2's query tiles and split-KV schedule for batch prefill, as its scheduler lays them out: where
a window handed only to ``run()`` starts each tile's keys, and where flashinfer#4972 shows: with
``plan(causal=False, window_left=W)`` a query tile reads the keys from its first query's window start for as many
KV chunks as the scheduler sized for ``W + tile`` keys, so a tile whose non-causal window reaches further (to the end
of its request) misses the keys past its chunks.

The arithmetic follows ``PrefillSplitQOKVIndptr`` and ``FA2DetermineCtaTileQ`` of FlashInfer's
``include/flashinfer/attention/scheduler.cuh`` and ``utils.cuh`` (0.6.18 to 0.7.4), and the tile's first
key in the fa2 prefill kernels (``kv_start = max(0, kv_len + first_row - qo_len - W)``).  Lengths are in
pages for a paged cache and in tokens for a ragged one (``page_size = 1``).
"""

from __future__ import annotations

MIN_KV_CHUNK_TOKENS = 128  # the scheduler's smallest KV chunk, in tokens
H200_SMS = 132  # the SMs the schedule is sized by where no GPU is here to ask: the H200's, of the published runs


def device_sms() -> int:
    """The SM count the scheduler sizes its chunks by: this process's GPU's, else ``H200_SMS``."""
    import torch

    if not torch.cuda.is_available():
        return H200_SMS
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cta_tile_q(packed_rows: int, head_dim: int) -> int:
    """fa2's query tile (``FA2DetermineCtaTileQ``) for a batch whose requests pack ``packed_rows`` rows
    (queries x query heads per KV head) on average; head_dims of 512 and up are not modelled here."""
    if packed_rows > 64 and head_dim < 256:
        return 128
    return 64 if packed_rows > 16 else 16


def query_tile(qo_lens, group: int, head_dim: int, cuda_graph: bool = True, uniform: bool = True) -> int:
    """The batch's query tile (``PrefillSplitQOKVIndptr``): under CUDA graphs (as swabench plans) sized by the query
    count ``uniform_q_len`` promised where ``uniform`` (a batch of one query count, planned with the hint), else by
    the longest request its rows could hold (``total - batch + 1``); without CUDA graphs by the average request."""
    if not cuda_graph:
        return cta_tile_q(sum(qo_lens) * group // len(qo_lens), head_dim)
    rows = qo_lens[0] if uniform and len(set(qo_lens)) == 1 else sum(qo_lens) - len(qo_lens) + 1
    return cta_tile_q(rows * group, head_dim)


def run_window_first_keys(qo_len: int, kv_len: int, window_left: int, group: int, tile: int) -> list[int]:
    """The first key each query of a request reads when ``window_left`` reaches the fa2 kernel only at ``run()``
    (planned without a window, so no window mask is built): its tile's ``kv_start``, the window start of the tile's
    first query (a tile that splits a query's heads is read at the query's first head), which is exact for that
    query and ``i - first`` keys early for each later query ``i`` of the tile."""
    firsts = [(i * group) // tile * tile // group for i in range(qo_len)]
    return [max(0, kv_len + first - qo_len - window_left) for first in firsts]


def kv_chunk(qo_lens, kv_lens, plan_window: int, page_size: int, group: int, num_kv_heads: int, head_dim: int,
             num_sms: int, cuda_graph: bool = True, uniform: bool = True) -> tuple[int, bool, list[int]]:
    """(the KV chunk in pages, whether the kernel runs split, each request's chunk count) as the scheduler plans
    them (``PrefillBinarySearchKVChunkSize``): the smallest chunk whose CTAs fit two a SM per KV head, over each
    request's pages, or ``plan_window + tile`` keys of them where plan() has a window.  Under CUDA graphs (as
    swabench plans) the kernel always runs split."""
    packed = [q * group for q in qo_lens]
    tile = query_tile(qo_lens, group, head_dim, cuda_graph, uniform)
    lengths = [cdiv(k, page_size) for k in kv_lens]  # the scheduler's unit: pages (tokens when ragged)
    effective = [min(cdiv(plan_window + tile, page_size), n) if plan_window >= 0 else n for n in lengths]
    most, budget = max(max(effective), 1), 2 * num_sms // num_kv_heads
    lo, hi = max(MIN_KV_CHUNK_TOKENS // page_size, 1), most
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(cdiv(p, tile) * cdiv(max(e, 1), mid) for p, e in zip(packed, effective)) > budget:
            lo = mid + 1
        else:
            hi = mid
    return lo, cuda_graph or lo < most, [cdiv(max(e, 1), lo) for e in effective]


def run_window_mixed(qo_lens, kv_lens, window_left: int, page_size: int, group: int, num_kv_heads: int,
                     head_dim: int, num_sms: int, cuda_graph: bool = True, uniform: bool = True) -> list[bool]:
    """Per request, whether a window handed only to run() mixes its rows: plan() (without a window) split the
    request into P chunks, but the kernel lays each row's partial outputs out ``ceil(min(kv_len, W + tile) /
    chunk)`` apart, fewer than P, so the merge reads rows' partials out of step (``num_kv_chunks`` in the fa2
    batch prefill kernels).  A request of one query reads its chunks where they were written; one of more gets
    every row wrong."""
    if window_left < 0 or not qo_lens:
        return [False for _ in qo_lens]
    tile = query_tile(qo_lens, group, head_dim, cuda_graph, uniform)
    chunk, split, planned = kv_chunk(qo_lens, kv_lens, -1, page_size, group, num_kv_heads, head_dim, num_sms,
                                     cuda_graph, uniform)
    return [split and q > 1 and cdiv(min(max(k, 1), window_left + tile), chunk * page_size) < p
            for q, k, p in zip(qo_lens, kv_lens, planned)]


def wrong_rows(qo_lens, kv_lens, window_left: int, page_size: int, group: int, num_kv_heads: int,
               head_dim: int, num_sms: int, cuda_graph: bool = True, uniform: bool = True) -> list[range]:
    """Per request, the query rows fa2 gets wrong under ``plan(causal=False, window_left=W)`` (empty where it
    gets every row right): the leading tiles whose chunks end before the request's last key."""
    if window_left < 0 or not qo_lens:
        return [range(0) for _ in qo_lens]
    tile = query_tile(qo_lens, group, head_dim, cuda_graph, uniform)
    chunk, split, planned = kv_chunk(qo_lens, kv_lens, window_left, page_size, group, num_kv_heads, head_dim,
                                     num_sms, cuda_graph, uniform)
    if not split:
        return [range(0) for _ in qo_lens]
    out = []
    for qo, kv, chunks in zip(qo_lens, kv_lens, planned):
        covered = chunks * chunk * page_size
        bad = 0
        for t in range(cdiv(qo * group, tile)):
            first = t * tile // group
            if max(0, kv + first - qo - window_left) + covered < kv:
                bad = min(qo, cdiv((t + 1) * tile, group))
        out.append(range(bad))
    return out
