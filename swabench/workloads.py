"""Tensors for a case: queries, a paged or ragged K/V store, page tables, per-request lengths.

Everything is deterministic in the case's seed.  Every implementation reads the same buffers, and
the reference reads them back through the same page table (``keys``/``values``), so a wrong page
table shows up as a wrong answer rather than as two consistent mistakes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cases import Case, parse_accept

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def request_lengths(case: Case) -> tuple[list[int], list[int]]:
    """Per-request (qo_len, kv_len). draft_extend draws each request's accepted tokens."""
    b = case.batch_size
    if case.mode == "draft_extend":
        qo = draw_accept_lengths(case.accept, case.qo_len, b, case.seed)
    else:
        qo = [case.qo_len] * b
    if case.seq_len is not None:
        return qo, [case.seq_len] * b
    return qo, [case.prefix_len + q for q in qo]


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
    data: tuple = ()  # what the buffers hold now, e.g. ("random", seed): the gate caches references by it
    references: dict = field(default_factory=dict, repr=False)

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
        return self.case.head_dim ** -0.5


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
        """Fresh N(0, 1) data in place (the buffers, page tables and plans stay the same)."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        for t in (self.q, self.k_store, self.v_store):
            t.copy_(torch.randn(t.shape, generator=g, device=self.device, dtype=torch.float32))
        self.data = ("random", seed)

    def write_kv(self, k_by_position: torch.Tensor, v_rows: torch.Tensor) -> None:
        """Set every request's key at position j to ``k_by_position[j]`` (shape [max_kv, H|1, D]),
        and the values to ``v_rows`` ([total_kv, H, D], request-major), through the page table."""
        self.data = ()
        k = k_by_position[self.key_position].expand(-1, self.case.num_kv_heads, -1)
        self._flat(self.k_store)[self.slots] = k.to(self.dtype)
        self._flat(self.v_store)[self.slots] = v_rows.to(self.dtype)


def build(case: Case, device="cpu") -> Workload:
    """Allocate and fill the tensors for a case."""
    device = torch.device(device)
    dtype = TORCH_DTYPES[case.dtype]
    qo_lens, kv_lens = request_lengths(case)
    h, hkv, d = case.num_qo_heads, case.num_kv_heads, case.head_dim
    slot_indptr = _indptr(kv_lens)
    req, pos = _owners(kv_lens)
    q_req, q_index = _owners(qo_lens)
    q_pos = q_index + torch.tensor([k - q for q, k in zip(qo_lens, kv_lens)], dtype=torch.int64)[q_req]
    if case.storage == "paged":
        ps = case.page_size
        pages_per_req = [(n + ps - 1) // ps for n in kv_lens]
        num_pages = sum(pages_per_req)
        g = torch.Generator().manual_seed(case.seed + 1)
        order = torch.randperm(num_pages, generator=g) if case.page_layout == "scattered" \
            else torch.arange(num_pages)
        kv_indptr_host = _indptr(pages_per_req)
        kv_indices_host = order.to(torch.int64)
        last = [n - (p - 1) * ps for n, p in zip(kv_lens, pages_per_req)]
        # flat row of (request b, position j) = page(b, j // ps) * ps + j % ps
        slots = kv_indices_host[kv_indptr_host[req] + pos // ps] * ps + pos % ps
        k_store = torch.empty(num_pages, ps, hkv, d, dtype=dtype, device=device)
        kv_indices = kv_indices_host.to(device, torch.int32)
        kv_last = torch.tensor(last, dtype=torch.int32, device=device)
    else:
        kv_indptr_host, kv_indices_host = slot_indptr, None
        slots = torch.arange(int(slot_indptr[-1]))
        k_store = torch.empty(int(slot_indptr[-1]), hkv, d, dtype=dtype, device=device)
        kv_indices = kv_last = None
    w = Workload(case=case, device=device, dtype=dtype, qo_lens=qo_lens, kv_lens=kv_lens,
                 q=torch.empty(sum(qo_lens), h, d, dtype=dtype, device=device),
                 k_store=k_store, v_store=torch.empty_like(k_store),
                 qo_indptr=_indptr(qo_lens).to(device, torch.int32), qo_indptr_host=_indptr(qo_lens).tolist(),
                 kv_indptr=kv_indptr_host.to(device, torch.int32), kv_indices=kv_indices,
                 kv_last_page_len=kv_last, kv_indptr_host=kv_indptr_host,
                 kv_indices_host=kv_indices_host, slots=slots.to(device), slot_indptr=slot_indptr,
                 key_request=req.to(device), key_position=pos.to(device), query_request=q_req.to(device),
                 query_position=q_pos.to(device))
    w.fill_random(case.seed)
    return w


def trim_page_table(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens, starts, page_size: int):
    """Drop each request's whole pages before its start key (``kv_start_idx`` trimming).

    ``starts`` must be page-aligned. Returns (indptr, indices, kv_lens) of the trimmed table, all
    on the CPU; the last page of every request is unchanged.
    """
    first = torch.tensor([s // page_size for s in starts], dtype=torch.int64)
    begin = kv_indptr[:-1] + first
    kept = (kv_indptr[1:] - begin).tolist()
    req, offset = _owners(kept)
    return _indptr(kept), kv_indices[begin[req] + offset], [k - s for k, s in zip(kv_lens, starts)]


# ---------------------------------------------------------------- memory, before anything is allocated

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PY_LIST_ENTRY = 36  # a per-request Python list costs a pointer and an int object per entry


@dataclass(frozen=True)
class Limits:
    """Beyond these a case can never run, on any machine."""

    int32_index: int = 2**31 - 1  # FlashInfer's indptr and page-table entries are int32
    ceiling_bytes: int = 2 << 40  # 2 TiB: more memory than any single node has


LIMITS = Limits()


@dataclass(frozen=True)
class Footprint:
    """What a case costs in memory, estimated from its axes alone (worst-case lengths)."""

    device_bytes: int  # workload, one runner's output, the reference and the gate's temporaries
    host_bytes: int  # the CPU-side arrays and per-request lists ``build`` makes before moving them
    mask_bytes: int  # the dense bool custom mask (and its packed copy) the ``*-mask`` paths build per plan
    kv_bytes: int  # the K and V stores, part of device_bytes

    def describe(self) -> str:
        return f"{human_bytes(self.device_bytes)} on the device (K/V {human_bytes(self.kv_bytes)})"


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _worst_lengths(case: Case) -> tuple[int, int]:
    """(qo_len, kv_len) of the largest request: draft_extend draws at most the whole block."""
    kv = case.seq_len if case.seq_len is not None else case.prefix_len + case.qo_len
    return case.qo_len, kv


def _reference_chunk(case: Case, qo: int, kv: int, acc: int) -> int:
    """The reference's largest live chunk (as ``reference.attention`` steps through a request): three
    [H, rows, keys] arrays at once (the scores, their scaled copy or the probabilities, the copy the
    second einsum makes), and the keys and values widened to every query head."""
    from . import reference  # reference imports this module

    h = case.num_qo_heads
    rows = min(qo, max(1, reference.CHUNK_ELEMENTS // max(1, kv * h)))
    keys = kv if case.window_left < 0 else min(kv, rows + case.window_left)
    return acc * h * keys * (3 * rows + 2 * case.head_dim)


def footprint(case: Case, device_type: str = "cpu") -> Footprint:
    """Bytes the sweep needs for a case, by integer arithmetic only: safe for absurd axes.

    Runners live one at a time (the sweep frees each before making the next), so one output buffer."""
    b, (qo, kv) = case.batch_size, _worst_lengths(case)
    h, hkv, d, e = case.num_qo_heads, case.num_kv_heads, case.head_dim, ELEMENT_BYTES[case.dtype]
    acc = 8 if device_type == "cpu" else 4  # reference.accumulate_dtype: float64 on the CPU
    queries, keys = b * qo, b * kv
    paged = case.storage == "paged"
    pages = b * -(-kv // case.page_size) if paged else 0
    rows = pages * case.page_size if paged else keys  # K/V rows at the storage's layout
    kv_bytes = 2 * rows * hkv * d * e
    q_bytes = queries * h * d * e  # q, and again the runner's output
    indices = (8 * (3 * keys + 2 * queries)  # slots, key_request, key_position; query request, position
               + 4 * (2 * (b + 1) + (pages + b if paged else 0)))  # int32 indptrs, page table, last-page lens
    if device_type == "cpu":  # the host copies the workload keeps (indptrs, page table) share this memory
        indices += 8 * (2 * (b + 1) + pages)
    else:  # a FlashInfer runner's CUDA-graph copies of the indptrs and page table
        indices += 4 * (3 * (b + 1) + pages + b)
    checked = queries * h * d * acc  # one output in the accumulate dtype: the reference's, or a gate temporary
    # the gate's passes go one after another: the peak is the largest of filling the buffers (fill_random's
    # float32 draw; probes.fill's float64 queries, or its float32 values, float64 keys and their cast),
    # the reference's chunk, and the gate's float copy of the output and its diff
    fill = max(4 * rows * hkv * d, queries * h * d * (16 + e), keys * (hkv * d * (4 + e) + 8 * d))
    transient = max(fill, _reference_chunk(case, qo, kv, acc), 2 * checked)
    device = 2 * q_bytes + kv_bytes + indices + checked + transient
    # int64 per key (owners, positions, slots, two temporaries of the slot arithmetic), per query (4),
    # per page (order, table) and per request (lengths, indptrs); and ~6 per-request Python lists
    host = 8 * (5 * keys + 4 * queries + 2 * pages + 4 * (b + 1)) + 6 * b * PY_LIST_ENTRY
    mask = b * (qo * kv + (qo * kv + 7) // 8)  # semantics.custom_mask + packed_mask_bytes
    return Footprint(device_bytes=device, host_bytes=host, mask_bytes=mask, kv_bytes=kv_bytes)


def _keys_phrase(case: Case) -> str:
    """The axis fields that set keys per request, as the scenario writer named them."""
    from .scenarios import QO_FIELD

    if case.seq_len is not None:
        return f"seq_len {case.seq_len}"
    qo_name = QO_FIELD.get(case.mode, "qo_len")
    return f"(prefix_len {case.prefix_len} + {qo_name} {case.qo_len})"


def impossible(case: Case) -> str | None:
    """Why the case can never run anywhere, phrased for the scenario's author; None if it might."""
    b, (_, kv) = case.batch_size, _worst_lengths(case)
    limit = LIMITS.int32_index
    if b * kv > limit:  # queries never outnumber keys (qo_len <= kv_len), so this bounds qo_indptr too
        return (f"batch_size {b} x {kv} keys {_keys_phrase(case)} = {b * kv} keys: more than the "
                f"{limit} a FlashInfer page table can index (int32)")
    f = footprint(case, "cuda")  # the smaller estimate (float32 reference): a GPU is its best chance
    if max(f.device_bytes, f.host_bytes) > LIMITS.ceiling_bytes:
        return (f"batch_size {b} x {kv} keys {_keys_phrase(case)} x {case.num_kv_heads} KV heads x head_dim "
                f"{case.head_dim} ({case.dtype}) needs {f.describe()} and {human_bytes(f.host_bytes)} on the "
                f"host: above the {human_bytes(LIMITS.ceiling_bytes)} ceiling, more memory than any single "
                f"node has")
    return None
