"""Window arithmetic, in one place, in FlashInfer's convention.

``window_left = W`` lets the query at absolute position ``p`` see keys ``[p - W, p]`` (W + 1 keys,
clipped at 0); ``W = -1`` means no window.  Queries are bottom-right aligned: with ``kv_len`` keys
and ``qo_len`` queries, query ``i`` sits at ``p = kv_len - qo_len + i``.  Every visible set is an
interval of key positions, so masks, trims, pair counts and "does this bug show here" are all
interval arithmetic.

A bidirectional block is an interval too.  With ``block = B`` the step's queries fall in blocks of B from
the first one on; a query sees every key of its own block, both ways, and causally the keys before it from
``p - W`` on (FlashInfer's ranges wrapper with each query's span its block, ``range_window_left = 0``).

One exception, in one place: a verify block laid out as a draft tree (``core.trees``).  Node ``i`` sits at
position ``prefix + depth`` and sees the cached keys of its window plus its ancestors among the draft keys: an
interval over the cache and a set over the draft (``TreeView``).  On a chain the two are the same interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where tensors are made: reading a scenario needs none
    import torch

    from swabench.core.trees import Tree

NO_WINDOW = -1


def window_left_from(window_left: int | None = None, sliding_window: int | None = None) -> int:
    """FlashInfer's W from either convention (HF configs give ``sliding_window = W + 1``)."""
    if (window_left is None) == (sliding_window is None):
        raise ValueError("give exactly one of window_left and sliding_window")
    if window_left is not None:
        return int(window_left)
    return NO_WINDOW if sliding_window == NO_WINDOW else int(sliding_window) - 1


def sliding_window_of(window_left: int) -> int:
    """HF ``sliding_window`` for a FlashInfer W (-1 stays -1: no window)."""
    return NO_WINDOW if window_left < 0 else window_left + 1


@dataclass(frozen=True)
class Visibility:
    """Which keys a query sees: ``[min(max(first_key, p - window_left), latest_start), p + future]``.

    The exact semantics is ``Visibility(window_left=W)``; known bugs and planted mistakes are the
    same shape with other numbers, which is what lets the suite say where each must fail: a table
    that starts too early (``first_key``), a part that sees every key from ``latest_start`` on, or
    keys cut at the wrong end (a negative ``future``).

    Two neighbours of the causal window are the same shape too.  ``causal=False`` is FlashInfer's
    ``plan(causal=False, window_left=W)``: a query at p sees every key of its request at position
    ``>= p - W``, future ones included.  ``chunk=C`` is chunked local attention (Llama 4's
    ``attention_chunk_size``): a query sees, causally, only its own chunk, keys ``floor(p / C) * C``
    through ``p``; a window of ``C - 1`` keys is not the same (it reaches into the previous chunk).
    ``block=B`` splits the queries into blocks of B (from the first query on) that attend both ways within
    themselves: a query sees ``[min(p - W, its block's first key), its block's last key]``, the causal window
    and its whole block (a block wider than the window keeps all of itself).  ``interval`` then needs every
    query of the request, in order, to know where the blocks start.
    """

    window_left: int
    first_key: int = 0
    future: int = 0
    latest_start: int | None = None
    causal: bool = True
    chunk: int = 0
    by_slot: bool = False  # on a draft tree: the window measured from a node's slot (its row), not its depth
    block: int = 0

    def interval(self, positions: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch
        lo = torch.full_like(positions, self.first_key)
        if self.window_left >= 0:
            lo = torch.maximum(lo, positions - self.window_left)
        if self.chunk > 0:
            lo = torch.maximum(lo, positions - positions % self.chunk)
        if self.latest_start is not None:
            lo = torch.clamp(lo, max=self.latest_start)
        hi = torch.clamp(positions + self.future, max=kv_len - 1) if self.causal \
            else torch.full_like(positions, kv_len - 1)
        if self.block > 0:
            first = kv_len - len(positions)  # the first query's position: blocks count from it
            start = first + (positions - first) // self.block * self.block
            lo, hi = torch.minimum(lo, start), torch.maximum(hi, torch.clamp(start + self.block - 1, max=kv_len - 1))
        return lo, hi

    def mask(self, qo_len: int, kv_len: int, key_offset: int = 0, device=None, tree: Tree | None = None) \
            -> torch.Tensor:
        """Bool ``[qo_len, kv_len - key_offset]``, row-major, True = visible (FlashInfer's custom_mask); over a
        draft tree, each node's window and its ancestors."""
        import torch
        if tree is not None:
            return TreeView(self, tree, qo_len, kv_len).mask(key_offset, device)
        positions = query_positions(qo_len, kv_len, device)
        lo, hi = self.interval(positions, kv_len)
        keys = torch.arange(key_offset, kv_len, device=device)
        return (keys[None, :] >= lo[:, None]) & (keys[None, :] <= hi[:, None])


def of_case(case) -> Visibility:
    """The exact semantics of a case: its window, its causality, its chunk and its blocks."""
    return Visibility(case.window_left, causal=case.causal, chunk=case.attention_chunk, block=case.block)


def chunk_start(position: int, chunk: int) -> int:
    """First key of the chunk that holds ``position`` (0 without chunks)."""
    return position - position % chunk if chunk > 0 else 0


def query_positions(qo_len: int, kv_len: int, device=None) -> torch.Tensor:
    import torch
    return torch.arange(kv_len - qo_len, kv_len, device=device)


def interval_mask(lo: torch.Tensor, hi: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Bool ``[len(lo), kv_len]``: query j sees keys ``lo[j]`` through ``hi[j]``."""
    import torch
    keys = torch.arange(kv_len)
    return (keys[None, :] >= lo[:, None]) & (keys[None, :] <= hi[:, None])


def intervals_differ(lo, hi, other_lo, other_hi):
    """Per query, whether the key intervals ``[lo, hi]`` and ``[other_lo, other_hi]`` hold different keys."""
    return ~(((lo == other_lo) & (hi == other_hi)) | ((lo > hi) & (other_lo > other_hi)))


def interval_missed(lo, hi, truth_lo, truth_hi):
    """Per query, how many keys of ``[truth_lo, truth_hi]`` the interval ``[lo, hi]`` leaves out."""
    import torch
    both = (torch.minimum(hi, truth_hi) - torch.maximum(lo, truth_lo) + 1).clamp_min(0)
    return (truth_hi - truth_lo + 1).clamp_min(0) - both


class TreeView:
    """What each node of a draft tree sees under a Visibility: the cached keys ``[lo, hi]`` (``hi < prefix``;
    empty where ``lo > hi``) and the draft keys ``draft[i, s]``.

    A node's position is ``prefix + depth``; so is its key's.  The window keeps the keys whose position is at
    least the node's position minus W, and the tree keeps, of the draft keys, the node's ancestors and itself:
    what the node would see in the linear sequence of its own branch.  ``by_slot`` measures both positions by
    slot instead (``prefix + i``), as a kernel that ANDs a tree mask with its own window does.  ``future``
    moves the last column a node sees from its own slot, as on a chain."""

    def __init__(self, visibility: Visibility, tree: Tree, qo_len: int, kv_len: int):
        import torch
        if tree.size != qo_len:
            raise ValueError(f"a tree of {tree.size} nodes verified as {qo_len} queries")
        self.prefix, self.kv_len = kv_len - qo_len, kv_len
        slots = torch.arange(qo_len)
        position = self.prefix + (slots if visibility.by_slot else torch.tensor(tree.depths))
        lo, _ = visibility.interval(position, kv_len)
        last = torch.clamp(self.prefix + slots + visibility.future, max=kv_len - 1)  # the last column it sees
        self.lo, self.hi = lo, torch.clamp(last, max=self.prefix - 1)
        later = slots[None, :] > slots[:, None]  # a draft key after the node: seen only where ``future`` reaches it
        self.draft = (tree.ancestors() | later) & (position[None, :] >= lo[:, None]) \
            & (self.prefix + slots[None, :] <= last[:, None])

    def cached_counts(self):
        return (self.hi - self.lo + 1).clamp_min(0)

    def counts(self):
        """Keys each node sees."""
        return self.cached_counts() + self.draft.sum(dim=1)

    def mask(self, key_offset: int = 0, device=None) -> torch.Tensor:
        import torch
        cached = torch.arange(key_offset, self.prefix)
        seen = (cached[None, :] >= self.lo[:, None]) & (cached[None, :] <= self.hi[:, None])
        return torch.cat([seen, self.draft], dim=1).to(device)

    def missed(self, truth: TreeView):
        """Per node, the keys ``truth`` shows it that this view does not."""
        import torch
        both = (torch.minimum(self.hi, truth.hi) - torch.maximum(self.lo, truth.lo) + 1).clamp_min(0)
        return truth.cached_counts() - both + (truth.draft & ~self.draft).sum(dim=1)

    def rows_differ(self, other: TreeView):
        """Per node, whether it sees another set of keys under ``other``."""
        empty, other_empty = self.lo > self.hi, other.lo > other.hi
        cached = (empty & other_empty) | ((self.lo == other.lo) & (self.hi == other.hi))
        return ~cached | (self.draft != other.draft).any(dim=1)


def rows_differ(a: Visibility, b: Visibility, qo_len: int, kv_len: int, tree: Tree | None = None):
    """Per query of this request, whether it sees a different set of keys under a and b (a bool tensor)."""
    if tree is not None:
        return TreeView(a, tree, qo_len, kv_len).rows_differ(TreeView(b, tree, qo_len, kv_len))
    positions = query_positions(qo_len, kv_len)
    return intervals_differ(*a.interval(positions, kv_len), *b.interval(positions, kv_len))


def differs(a: Visibility, b: Visibility, qo_len: int, kv_len: int, tree: Tree | None = None) -> bool:
    """True when some query of this request sees a different set of keys under a and b."""
    return bool(rows_differ(a, b, qo_len, kv_len, tree).any())


def keys_missed(path: Visibility, truth: Visibility, qo_len: int, kv_len: int, tree: Tree | None = None):
    """Per query, how many keys of what ``truth`` shows it ``path`` leaves out (a tensor of ``qo_len`` counts)."""
    if tree is not None:
        return TreeView(path, tree, qo_len, kv_len).missed(TreeView(truth, tree, qo_len, kv_len))
    positions = query_positions(qo_len, kv_len)
    return interval_missed(*path.interval(positions, kv_len), *truth.interval(positions, kv_len))


def trim_start(kv_len: int, qo_len: int, window_left: int, page_size: int = 1, chunk: int = 0) -> int:
    """First key the correct ``paged-trim`` keeps: the oldest key any query of the block can see,
    rounded down to a page boundary (a page table can only start on one).  Under chunked attention
    that is the first query's chunk start."""
    if chunk > 0:
        start = chunk_start(kv_len - qo_len, chunk)
    elif window_left < 0:
        return 0
    else:
        start = max(0, kv_len - (window_left + qo_len))
    return start - start % page_size


def buggy_trim_start(prefix_len: int, window_left: int, page_size: int = 1) -> int:
    """``paged-trim-causal``'s start: request-granular ``prefix - W``, which is right for the first
    query of the block only; query j then sees j keys too many."""
    if window_left < 0:
        return 0
    start = max(0, prefix_len - window_left)
    return start - start % page_size


def _sum_to(n: int) -> int:
    """0 + 1 + ... + n (0 for n < 0)."""
    return n * (n + 1) // 2 if n > 0 else 0


def useful_pairs(qo_len: int, kv_len: int, window_left: int, causal: bool = True, chunk: int = 0,
                 tree: Tree | None = None, block: int = 0) -> int:
    """Exact count of (query, key) pairs inside causal ∩ window for one request and one head.

    Query at p sees min(p, W) + 1 keys (p + 1 without a window); sum over p in [prefix, kv_len).
    Without ``causal`` it sees kv_len - max(0, p - W) keys (every key without a window).  Under
    chunked attention it sees p % C + 1 keys.  A draft tree's node sees its window of the cache and its
    ancestors (TreeView).  In bidirectional blocks it sees its interval (``Visibility.interval``).
    """
    first, last = kv_len - qo_len, kv_len - 1
    if qo_len <= 0:
        return 0
    if block > 0:
        lo, hi = Visibility(window_left, block=block).interval(query_positions(qo_len, kv_len), kv_len)
        return int((hi - lo + 1).sum())
    if tree is not None:
        return int(TreeView(Visibility(window_left), tree, qo_len, kv_len).counts().sum())
    if chunk > 0:
        def upto(n: int) -> int:  # sum of (p % C + 1) over p < n
            return n // chunk * _sum_to(chunk) + _sum_to(n % chunk)
        return upto(last + 1) - upto(first)
    if not causal:
        if window_left < 0:
            return qo_len * kv_len
        return qo_len * kv_len - (_sum_to(last - window_left) - _sum_to(first - 1 - window_left))
    if window_left < 0:
        return _sum_to(last + 1) - _sum_to(first)
    w = window_left
    below = max(0, min(last, w) - first + 1)  # queries with p <= W see p + 1 keys
    below_sum = _sum_to(min(last, w) + 1) - _sum_to(first) if below else 0
    above = qo_len - below  # queries with p > W see W + 1 keys
    return below_sum + above * (w + 1)


def window_keys(qo_len: int, kv_len: int, window_left: int, chunk: int = 0, page_size: int = 1) -> int:
    """Keys some query of the block can see, counted from the start of the page that holds the first of
    them: the K/V rows a kernel reading whole pages of its table must read.  A page table starts on a page
    boundary, so on paged storage the rows before the first visible key in its page count too (a kernel
    could skip them, at the cost of a table that starts mid-page, which no path here has); ragged storage
    is ``page_size`` 1 (the trim start on one-token pages)."""
    return kv_len - trim_start(kv_len, qo_len, window_left, page_size, chunk)


def attention_flops(pairs: int, head_dim: int, num_qo_heads: int) -> int:
    """QK^T and PV: two multiply-adds per pair per head-dim element."""
    return 4 * head_dim * pairs * num_qo_heads


def minimum_traffic(qo_lens, kv_lens, window_left, num_qo_heads, num_kv_heads, head_dim, elem_bytes,
                    kv_elem_bytes: int | None = None, chunk: int = 0, page_size: int = 1) -> tuple[int, int]:
    """(bytes read, bytes written) by a kernel that reads whole pages of its table and nothing twice: Q and
    every K/V row some query can see read once (from its page's start, ``window_keys``; the cache at its own
    width ``kv_elem_bytes`` when it differs from the queries'), O written once.  min_bytes is their sum;
    the roofline's floor and the read amplification start here."""
    q_rows = sum(qo_lens)
    kv_rows = sum(window_keys(q, k, window_left, chunk, page_size) for q, k in zip(qo_lens, kv_lens))
    kv_bytes = elem_bytes if kv_elem_bytes is None else kv_elem_bytes
    queries = q_rows * num_qo_heads * head_dim * elem_bytes
    return queries + 2 * kv_rows * num_kv_heads * head_dim * kv_bytes, queries


def custom_mask(qo_lens, kv_lens, visibility: Visibility, device=None, trees=None, starts=None) -> torch.Tensor:
    """FlashInfer's flattened ``custom_mask``: each request's bool [qo_len, kv_len - start] mask over the keys
    its table holds from ``start`` on (0 without ``starts``), row-major, concatenated (what the naive ``*-mask``
    paths build on every step); ``trees``: each request's draft tree."""
    import torch
    trees = trees or [None] * len(qo_lens)
    starts = starts or [0] * len(qo_lens)
    return torch.cat([visibility.mask(q, k, key_offset=s, device=device, tree=t).reshape(-1)
                      for q, k, s, t in zip(qo_lens, kv_lens, starts, trees)])


def packed_mask_bytes(qo_lens, kv_lens) -> int:
    """Size of the bit-packed mask FlashInfer keeps per step: ceil(qo * kv / 8) bytes per request."""
    return sum((q * k + 7) // 8 for q, k in zip(qo_lens, kv_lens))


def pack_bits_little(bits: torch.Tensor) -> torch.Tensor:
    """Bool vector -> uint8, little-endian bit order within each byte (numpy.packbits(bitorder="little"),
    FlashInfer's packed custom-mask layout for one segment)."""
    import torch
    n = bits.numel()
    padded = torch.zeros((n + 7) // 8 * 8, dtype=torch.uint8, device=bits.device)
    padded[:n] = bits.reshape(-1).to(torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=bits.device)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.int32).to(torch.uint8)
