"""Tensors for a case: queries, a paged or ragged K/V store, page tables, per-request lengths.

Everything is deterministic in the case's seed.  Every implementation reads the same buffers, and
the reference reads them back through the same page table (``keys``/``values``), so a wrong page
table shows up as a wrong answer rather than as two consistent mistakes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from swabench.core import stale, trees
from swabench.core.cases import Case, parse_accept

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
                "float8_e4m3": torch.float8_e4m3fn}
EVICTED_VALUE = 100.0  # what an evicted page holds: finite in bf16/fp16/fp8, and a leaked key's logit rules its row
SINK_MEAN, SINK_STD = 3.0, 2.0  # the sink logits drawn per head: large enough to move every row (docs/semantics.md)
# With a soft-cap, random logits are drawn around 0.3 cap with std 0.1 cap, where tanh bends them: a
# path that ignores the cap then moves the output by 5% at 8 keys (35% at 4096), while tanh.approx's
# error (2^-11, relative) stays under 5e-3.
SOFT_CAP_LOGITS = (0.3, 0.1)


def request_lengths(case: Case) -> tuple[list[int], list[int]]:
    """Per-request (qo_len, kv_len): each length axis drawn per request (Case.drawn); draft_extend
    draws each request's accepted tokens from its block."""
    if case.mode == "draft_extend":
        qo = draw_accept_lengths(case.accept, case.qo_len, case.batch_size, case.seed)
    else:
        qo = case.drawn("qo_len")
    if case.seq_len is not None:
        return qo, case.drawn("seq_len")
    return qo, [p + q for p, q in zip(case.drawn("prefix_len"), qo)]


def draw_accept_lengths(spec: str, block: int, batch: int, seed: int) -> list[int]:
    """Accepted tokens per request, in 1..block (the bonus token always counts)."""
    kind, arg = parse_accept(spec)
    g = torch.Generator().manual_seed(seed)
    if kind == "full":
        return [block] * batch
    if kind == "fixed":
        return [int(arg)] * batch
    if kind == "uniform":
        return torch.randint(1, block + 1, (batch,), generator=g).tolist()
    # geometric: each draft token is accepted with probability arg until the first rejection
    accepted = torch.rand(batch, block - 1, generator=g) < arg
    return (1 + accepted.int().cumprod(dim=1).sum(dim=1)).tolist()


def _indptr(lengths) -> torch.Tensor:
    return torch.cumsum(torch.tensor([0, *lengths], dtype=torch.int64), 0)


def _owners(lengths) -> tuple[torch.Tensor, torch.Tensor]:
    """For a request-major array of rows: each row's request, and its index within the request."""
    request = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths), dtype=torch.int64))
    return request, torch.arange(int(sum(lengths))) - _indptr(lengths)[request]


@dataclass
class Workload:
    case: Case
    device: torch.device
    dtype: torch.dtype
    qo_lens: list[int]
    kv_lens: list[int]
    q: torch.Tensor  # [total_q, num_qo_heads, head_dim]
    k_store: torch.Tensor  # paged: [num_pages, page_size, H, D] (NHD); ragged: [total_kv, H, D]
    v_store: torch.Tensor
    qo_indptr: torch.Tensor  # int32, device
    qo_indptr_host: list[int]
    kv_indptr: torch.Tensor  # int32, device: pages per request (paged) or tokens (ragged)
    kv_indices: torch.Tensor | None  # int32, device: page ids (paged only)
    kv_last_page_len: torch.Tensor | None  # int32, device (paged only)
    kv_indptr_host: torch.Tensor  # int64, CPU copies for plan-time arithmetic
    kv_indices_host: torch.Tensor | None
    slots: torch.Tensor  # int64, device: flat K/V row of every (request, key position)
    slot_indptr: torch.Tensor  # int64, CPU: request b's keys are slots[slot_indptr[b]:slot_indptr[b+1]]
    key_request: torch.Tensor  # int64, device: request of every entry of slots
    key_position: torch.Tensor  # int64, device: its position j within the request
    query_request: torch.Tensor  # int64, device: request of every query row
    query_position: torch.Tensor  # int64, device: its absolute position p = prefix + i
    sinks: torch.Tensor | None = None  # float32 [num_qo_heads], device: each head's sink logit
    evicted: torch.Tensor | None = None  # bool per entry of slots: its page was evicted (another's, or shared)
    evicted_pages: torch.Tensor | None = None  # pages only evicted entries point at (filled with EVICTED_VALUE)
    trees: tuple | None = None  # each request's draft tree (core.trees) where the verify block is one
    base_rows: torch.Tensor | None = None  # where the stores' rows (pages) without spare room sit (None: all of them)
    unheld: torch.Tensor | None = None  # flat K/V rows no request holds a key of its own in, given the cache fill
    data: tuple = ()  # what the buffers hold now, e.g. ("random", seed): the gate caches references by it
    references: dict = field(default_factory=dict, repr=False)
    sink_copies: dict = field(default_factory=dict, repr=False)  # dtype -> the sinks in it (sinks_as)

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    @property
    def prefix_lens(self) -> list[int]:
        return [k - q for q, k in zip(self.qo_lens, self.kv_lens)]

    @property
    def page_size(self) -> int:
        return self.case.page_size or 1

    @property
    def sm_scale(self) -> float:
        return self.case.scale

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.k_store.dtype

    def _flat(self, store: torch.Tensor) -> torch.Tensor:
        return store.view(-1, self.case.num_kv_heads, self.case.head_dim)

    def request_slots(self, b: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Flat K/V rows of request b's key positions lo..hi-1."""
        start, end = int(self.slot_indptr[b]), int(self.slot_indptr[b + 1])
        return self.slots[start + lo:end if hi is None else start + hi]

    def keys(self, b: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Request b's keys in position order, read through its page table: [kv_len, H, D]."""
        return self._flat(self.k_store)[self.request_slots(b, lo, hi)]

    def values(self, b: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        return self._flat(self.v_store)[self.request_slots(b, lo, hi)]

    def queries(self, b: int) -> torch.Tensor:
        lo, hi = self.qo_indptr_host[b:b + 2]
        return self.q[lo:hi]

    def fill_random(self, seed: int) -> None:
        """Fresh N(0, 1) data in place (the buffers, page tables and plans stay the same), the same
        numbers in the same rows whatever the cache fill, which then overwrites the rows no request
        holds.  With a soft-cap, every key's first feature is 1 and the queries' first feature sets the
        logits' mean (SOFT_CAP_LOGITS); with sinks, each head's sink logit is drawn from N(SINK_MEAN,
        SINK_STD) with its own generator."""
        c = self.case
        g = torch.Generator(device=self.device).manual_seed(seed)
        for t in (self.q, self.k_store, self.v_store):
            spread = t is not self.q and self.base_rows is not None
            shape = (len(self.base_rows), *t.shape[1:]) if spread else t.shape
            drawn = torch.randn(shape, generator=g, device=self.device, dtype=torch.float32)
            if spread:
                t[self.base_rows] = drawn.to(t.dtype)
            else:
                t.copy_(drawn)
        if c.logits_soft_cap:
            mean, std = (x * c.logits_soft_cap / self.sm_scale for x in SOFT_CAP_LOGITS)
            self.q.mul_(std / (c.head_dim - 1) ** 0.5)
            self.q[..., 0] = mean
            self.k_store[..., 0] = 1
        if self.sinks is not None:
            gs = torch.Generator(device=self.device).manual_seed(seed + 7)
            self.write_sinks(SINK_MEAN + SINK_STD * torch.randn(self.sinks.shape, generator=gs, device=self.device))
        self.fill_evicted(EVICTED_VALUE)
        self.fill_unheld()
        self.data = ("random", seed)

    def sinks_as(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The sinks in ``dtype`` (FA3 takes bfloat16 only): one tensor that ``write_sinks`` keeps equal to ``sinks``,
        so a runner that took it at plan sees every value the gate writes afterwards, with no copy in its run."""
        if self.sinks is None:
            return None
        if dtype not in self.sink_copies:
            self.sink_copies[dtype] = self.sinks.to(dtype)
        return self.sink_copies[dtype]

    def write_sinks(self, values: torch.Tensor | float) -> None:
        """Write each head's sink logit, into every copy ``sinks_as`` handed out too."""
        self.sinks.copy_(torch.as_tensor(values, dtype=self.sinks.dtype, device=self.device).expand_as(self.sinks))
        for copy in self.sink_copies.values():
            copy.copy_(self.sinks)

    def fill_evicted(self, value: float) -> None:
        """Write ``value`` into the pages that only evicted entries point at (the shared null page)."""
        if self.evicted_pages is not None and len(self.evicted_pages):
            self.k_store[self.evicted_pages] = value
            self.v_store[self.evicted_pages] = value

    def fill_unheld(self, fill: float | None = None) -> None:
        """Write the case's cache fill (core.stale), or ``fill``, into every row no request holds a key of its
        own in (none where the fill is random data)."""
        fill = stale.value(self.case.cache_fill, self.kv_dtype) if fill is None else fill
        if self.unheld is not None:
            for store in (self.k_store, self.v_store):
                self._flat(store).index_fill_(0, self.unheld, fill)

    def write_kv(self, k_by_position: torch.Tensor, v_rows: torch.Tensor) -> None:
        """Set each request's key at position j to ``k_by_position[j]`` (shape [max_kv, H|1, D]),
        and the values to ``v_rows`` ([total_kv, H, D], request-major), through the page table; an
        evicted entry is skipped (its page is another request's, or the shared one)."""
        self.data = ()
        k = k_by_position[self.key_position].expand(-1, self.case.num_kv_heads, -1)
        live = slice(None) if self.evicted is None else ~self.evicted  # an evicted entry's page is not its own
        self._flat(self.k_store)[self.slots[live]] = k[live].to(self.kv_dtype)
        self._flat(self.v_store)[self.slots[live]] = v_rows[live].to(self.kv_dtype)
        self.fill_evicted(EVICTED_VALUE)
        self.fill_unheld()


def build(case: Case, device="cpu") -> Workload:
    """Allocate and fill the tensors for a case."""
    device = torch.device(device)
    dtype, kv_dtype = TORCH_DTYPES[case.dtype], TORCH_DTYPES[case.cache_dtype]
    qo_lens, kv_lens = request_lengths(case)
    h, hkv, d = case.num_qo_heads, case.num_kv_heads, case.head_dim
    slot_indptr = _indptr(kv_lens)
    req, pos = _owners(kv_lens)
    q_req, q_index = _owners(qo_lens)
    q_pos = q_index + torch.tensor([k - q for q, k in zip(qo_lens, kv_lens)], dtype=torch.int64)[q_req]
    base_rows = None
    if case.storage == "paged":
        ps = case.page_size
        kv_indptr_host, kv_indices_host, last, evicted_pages, num_pages, base_rows = _pages(case, qo_lens, kv_lens)
        # flat row of (request b, position j) = page(b, j // ps) * ps + j % ps
        slots = kv_indices_host[kv_indptr_host[req] + pos // ps] * ps + pos % ps
        evicted = (pos // ps) < torch.tensor(evicted_before(case, kv_lens, qo_lens))[req] \
            if evicted_pages is not None else None
        # K and V as the two halves of one allocation, V after K (TRT-LLM's kernels address V from K's base)
        k_store, v_store = torch.empty(2, num_pages, ps, hkv, d, dtype=kv_dtype, device=device).unbind(0)
        kv_indices = kv_indices_host.to(device, torch.int32)
        kv_last = torch.tensor(last, dtype=torch.int32, device=device)
    else:
        kv_indptr_host, kv_indices_host = slot_indptr, None
        evicted = evicted_pages = None
        slots = torch.arange(int(slot_indptr[-1]))
        spare = 0 if case.cache_fill == "random" else stale.SPARE_ROWS  # room past the last request's keys
        base_rows = torch.arange(len(slots)) if spare else None
        k_store = torch.empty(len(slots) + spare, hkv, d, dtype=kv_dtype, device=device)
        v_store = torch.empty_like(k_store)
        kv_indices = kv_last = None
    w = Workload(case=case, device=device, dtype=dtype, qo_lens=qo_lens, kv_lens=kv_lens,
                 q=torch.empty(sum(qo_lens), h, d, dtype=dtype, device=device),
                 k_store=k_store, v_store=v_store,
                 qo_indptr=_indptr(qo_lens).to(device, torch.int32), qo_indptr_host=_indptr(qo_lens).tolist(),
                 kv_indptr=kv_indptr_host.to(device, torch.int32), kv_indices=kv_indices,
                 kv_last_page_len=kv_last, kv_indptr_host=kv_indptr_host,
                 kv_indices_host=kv_indices_host, slots=slots.to(device), slot_indptr=slot_indptr,
                 key_request=req.to(device), key_position=pos.to(device), query_request=q_req.to(device),
                 query_position=q_pos.to(device),
                 sinks=torch.empty(h, dtype=torch.float32, device=device) if case.sinks else None,
                 evicted=None if evicted is None else evicted.to(device),
                 evicted_pages=None if evicted_pages is None else evicted_pages.to(device),
                 trees=trees.of_case(case), base_rows=None if base_rows is None else base_rows.to(device),
                 unheld=None if case.cache_fill == "random" else
                 _unheld(k_store.numel() // (hkv * d), slots, evicted).to(device))
    w.fill_random(case.seed)
    return w


def _unheld(rows: int, slots: torch.Tensor, evicted: torch.Tensor | None) -> torch.Tensor:
    """The flat K/V rows that hold no request's own key (an evicted entry's row is another's, or nobody's)."""
    held = torch.zeros(rows, dtype=torch.bool)
    held[slots if evicted is None else slots[~evicted]] = True
    return (~held).nonzero()[:, 0]


def page_table(case: Case, qo_lens, kv_lens):
    """A paged case's page table, on the CPU and deterministic in its seed, page layout and cache fill:
    (kv_indptr, kv_indices (int64), each request's last page length, the pages only evicted entries reach
    (None but for an evicted layout), the number of pages the cache needs)."""
    return _pages(case, qo_lens, kv_lens)[:5]


def _pages(case: Case, qo_lens, kv_lens):
    """page_table, and where each page of the layout without spare room went (None: nowhere else).  Pages are
    dealt out in a random order (seed + 1) unless the layout is contiguous; an evicted layout then replaces the
    pages before each window; a cache fill other than random adds a spare page after each request's last."""
    ps = case.page_size
    pages_per_req = [(n + ps - 1) // ps for n in kv_lens]
    num_pages = sum(pages_per_req)
    g = torch.Generator().manual_seed(case.seed + 1)
    order = torch.randperm(num_pages, generator=g) if case.page_layout != "contiguous" else torch.arange(num_pages)
    kv_indptr, kv_indices, evicted_pages = _indptr(pages_per_req), order.to(torch.int64), None
    if case.page_layout.startswith("evicted"):
        kv_indices, evicted_pages = evict(case, kv_indptr, kv_indices, kv_lens, qo_lens)
        num_pages = max(num_pages, int(kv_indices.max()) + 1)
    last = [n - (p - 1) * ps for n, p in zip(kv_lens, pages_per_req)]
    moved = None
    if case.cache_fill != "random":
        kv_indices, moved, _, num_pages = stale.spare_pages(kv_indptr, kv_indices, num_pages)
        evicted_pages = None if evicted_pages is None else moved[evicted_pages]
    return kv_indptr, kv_indices, last, evicted_pages, num_pages, moved


def evicted_before(case: Case, kv_lens, qo_lens) -> list[int]:
    """Per request, how many of its first pages lie wholly before the first key any of its queries
    can see (the first query's window start): the pages an engine frees (docs/serving-paths.md)."""
    if case.window_left < 0:
        return [0] * len(kv_lens)
    return [max(0, k - q - case.window_left) // case.page_size for q, k in zip(qo_lens, kv_lens)]


def evict(case: Case, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens, qo_lens):
    """The page table with every evicted page replaced: ``evicted-null`` points them all at one
    shared page past the others (vLLM's null block); ``evicted-reused`` at pages other requests
    still hold, round robin (SGLang frees them and hands them out), or at a spare page past the
    others where no other request has one.  Returns (indices, the pages only evicted entries reach)."""
    indices, spare = kv_indices.clone(), int(kv_indices.max()) + 1
    gone = evicted_before(case, kv_lens, qo_lens)
    starts = kv_indptr[:-1].tolist()
    kept = [kv_indices[s + n:e].tolist() for s, e, n in zip(starts, kv_indptr[1:].tolist(), gone)]
    pool = [(owner, page) for owner, pages in enumerate(kept) for page in pages]  # pages requests still hold
    turn = 0
    for b, (start, n) in enumerate(zip(starts, gone)):
        someone_else = any(owner != b for owner, _ in pool) and case.page_layout == "evicted-reused"
        for i in range(n):
            if not someone_else:
                indices[start + i] = spare
                continue
            while pool[turn % len(pool)][0] == b:  # round robin over the other requests' pages
                turn += 1
            indices[start + i] = pool[turn % len(pool)][1]
            turn += 1
    return indices, torch.tensor([spare] if (indices == spare).any() else [], dtype=torch.int64)


def trim_page_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens, starts, page_size: int):
    """Drop each request's whole pages before its start key (``kv_start_idx`` trimming).

    ``starts`` must be page-aligned. Returns (indptr, indices, kv_lens) of the trimmed table, all
    on the CPU; the last page of every request is unchanged.
    """
    indptr, indices, _ = slice_page_table(kv_indptr, kv_indices, starts, kv_lens, page_size)
    return indptr, indices, [k - s for k, s in zip(kv_lens, starts)]


def slice_page_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, starts, ends, page_size: int):
    """The table of each request's keys ``[start, end)``: (indptr, indices, last_page_len), on the CPU.

    ``starts`` must be page-aligned and each slice non-empty; the last page holds ``end`` minus the
    keys of the pages before it, so a slice may end inside a page (the keys after it are not seen)."""
    first = torch.tensor([s // page_size for s in starts], dtype=torch.int64)
    pages = torch.tensor([-(-e // page_size) for e in ends], dtype=torch.int64) - first
    begin = kv_indptr[:-1] + first
    req, offset = _owners(pages.tolist())
    last = torch.tensor([e - (-(-e // page_size) - 1) * page_size for e in ends], dtype=torch.int32)
    return _indptr(pages.tolist()), kv_indices[begin[req] + offset], last


def block_tables(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, add: int = 0) -> torch.Tensor:
    """The page table as TRT-LLM's kernels take it: a row of page indices per request (each plus ``add``),
    zero-padded to the longest, int32 ``[batch, pages]`` on the CPU."""
    pages = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
    tables = torch.zeros(len(pages), max(pages), dtype=torch.int32)
    req, offset = _owners(pages)
    tables[req, offset] = (kv_indices[kv_indptr[:-1][req] + offset] + add).to(torch.int32)
    return tables


def free_bytes(device: torch.device) -> int:
    """Memory this process could still take on ``device``: the GPU's free memory plus what PyTorch's
    allocator holds unused, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - \
            torch.cuda.memory_allocated(device)
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
