"""What a case costs in memory, estimated from its axes alone before anything is allocated, and the
limits past which a case can never run: pure integer arithmetic, safe for absurd values (a batch of
10**9, a prefix of 10**12), so scenario validation refuses those before any work and the sweep can
skip a case too big for this device instead of dying in the allocator."""

from __future__ import annotations

from dataclasses import dataclass

from swabench.core import stale
from swabench.core.cases import QO_FIELD, Case, length_label

REFERENCE_CHUNK_ELEMENTS = 1 << 26  # scores per chunk of the reference (256 MiB in float32): bounds 32k contexts

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3": 1}
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

    device_bytes: int  # the workload, one runner's output, the reference, the largest transient (fill, gate)
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
    """(qo_len, kv_len) of the largest request (every request is counted at that size)."""
    return case.largest()


DRAW_LIMIT = 10 ** 6  # a batch of per-request lengths up to this size is drawn and summed; beyond, bounded


def _totals(case: Case) -> tuple[int, int, int]:
    """Queries, keys and pages over the batch: the drawn lengths where each request has its own (a
    lognormal bound times the batch would overstate a real mix many times over), else by arithmetic."""
    b, (qo, kv), ps = case.batch_size, _worst_lengths(case), case.page_size or 1
    if case.uniform_lengths or b > DRAW_LIMIT:
        return b * qo, b * kv, b * -(-kv // ps)
    q, k = _drawn(case)
    return sum(q), sum(k), sum(-(-n // ps) for n in k)


def _pool(case: Case) -> tuple[int, int, int, int]:
    """Queries, keys, pages and K/V rows the workload allocates: the pages with the shared page an evicted layout
    may add and the cache fill's spare pages (core.stale), a ragged store's rows with its spare rows; no pages
    for a ragged store."""
    queries, keys, pages = _totals(case)
    filled = case.cache_fill != "random"
    if case.storage != "paged":
        return queries, keys, 0, keys + stale.SPARE_ROWS * filled
    pages += str(case.page_layout).startswith("evicted") + case.batch_size * filled
    return queries, keys, pages, pages * case.page_size


def _drawn(case: Case) -> tuple[list[int], list[int]]:
    q = case.drawn("qo_len")
    return q, case.drawn("seq_len") if case.seq_len is not None else [p + x for p, x in zip(case.drawn("prefix_len"), q)]


def _requests(case: Case) -> list[tuple[int, int, int]]:
    """(requests, queries, keys) of each request shape: the drawn lengths where each request has its own, else the
    batch at its worst lengths."""
    if case.uniform_lengths or case.batch_size > DRAW_LIMIT:
        return [(case.batch_size, *_worst_lengths(case))]
    return [(1, q, k) for q, k in zip(*_drawn(case))]


def _span(case: Case, kv: int) -> int:
    """Keys before a query's own that a window or a chunk lets it reach (every key without either)."""
    return case.attention_chunk or (case.window_left + 1 if case.window_left >= 0 else kv)


def call_work(case: Case, library: str, every_key: bool = False) -> tuple[int, int]:
    """(multiply-adds, bytes written) of one call of a path of ``library`` on the CPU, QK^T then PV over the keys it
    gathers: a request's every key (``every_key``, a masked path) or those its window reaches, each widened to every
    query head with its scores (``_torch_call``); eager FlexAttention over its largest layout (``_flex_layouts``)."""
    h, d = case.num_qo_heads, case.head_dim
    if library == "flex":
        n, q, k, _ = max(_flex_layouts(case), key=lambda x: x[0] * x[1] * x[2])
        return 2 * n * q * k * h * d, n * h * k * (3 * ELEMENT_BYTES[case.dtype] * d + 16 * q)
    shapes = [(n, q, k if every_key else min(k, q + _span(case, k))) for n, q, k in _requests(case)]
    return (sum(2 * n * q * k * h * d for n, q, k in shapes),
            sum(n * _torch_call(case, q, k) for n, q, k in shapes))


def buffer_elements(case: Case) -> int:
    """Elements of the workload's queries and K/V stores: what each fill of its data draws."""
    queries, _, _, rows = _pool(case)
    return queries * case.num_qo_heads * case.head_dim + 2 * rows * case.num_kv_heads * case.head_dim


def _reference_chunk(case: Case, qo: int, kv: int, acc: int) -> int:
    """The reference's largest live chunk (as ``reference.attention`` steps through a request): three
    [H, rows, keys] arrays at once (the scores, their scaled copy or the probabilities, the copy the
    second einsum makes), and the keys and values widened to every query head."""
    h = case.num_qo_heads
    rows = min(qo, max(1, REFERENCE_CHUNK_ELEMENTS // max(1, kv * h)))
    keys = kv if case.window_left < 0 else min(kv, rows + case.window_left)
    return acc * h * keys * (3 * rows + 2 * case.head_dim)


def footprint(case: Case, device_type: str = "cpu") -> Footprint:
    """Bytes the sweep needs for a case, by integer arithmetic only: safe for absurd axes.

    Runners live one at a time (the sweep frees each before making the next), so one output buffer."""
    b, (qo, kv) = case.batch_size, _worst_lengths(case)
    h, hkv, d, e = case.num_qo_heads, case.num_kv_heads, case.head_dim, ELEMENT_BYTES[case.dtype]
    acc = 8 if device_type == "cpu" else 4  # reference.accumulate_dtype: float64 on the CPU
    queries, keys, pages, rows = _pool(case)
    paged = case.storage == "paged"
    kv_bytes = 2 * rows * hkv * d * ELEMENT_BYTES[case.cache_dtype]
    q_bytes = queries * h * d * e  # q, and again the runner's output
    indices = (8 * (3 * keys + 2 * queries)  # slots, key_request, key_position; query request, position
               + 4 * (2 * (b + 1) + (pages + b if paged else 0))  # int32 indptrs, page table, last-page lens
               + 8 * rows * (case.cache_fill != "random"))  # the rows no request holds, which the fill writes
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


def _torch_call(case: Case, rows: int, keys: int) -> int:
    """Bytes PyTorch writes for one SDPA over ``keys`` gathered keys and ``rows`` queries: the gathered K and V,
    widened to every query head and upcast to float32 by its math path (K scaled once more), 20 bytes a key
    element; float32 [H, rows, keys] scores, mask and softmax (24 bytes an element where a soft-cap or sinks are
    written out by hand)."""
    by_hand = bool(case.logits_soft_cap or case.sinks)
    return keys * case.num_qo_heads * (20 * case.head_dim + (24 if by_hand else 12) * rows)


def _flex_layouts(case: Case) -> list[tuple[int, int, int, int]]:
    """(batch, rows, keys, own copies' bytes) of eager FlexAttention's calls: flex-window's batch over the whole
    storage, flex-contiguous's over the longest request (with its three copies of the keys), flex-flat's one
    sequence of every query."""
    (qo, kv), b, (queries, keys, _, rows) = _worst_lengths(case), case.batch_size, _pool(case)
    copies = 3 * b * case.num_kv_heads * kv * case.head_dim * ELEMENT_BYTES[case.cache_dtype]
    return [(b, qo, rows, 0), (b, qo, kv, copies), (1, queries, rows, 0)]


RETAINED_MAX = 256 << 20  # what the allocator's arenas keep of a call's freed blocks, at most (see call_bytes)


def call_bytes(case: Case, library: str, device_type: str) -> int:
    """What a path of ``library`` takes beside the case's footprint: on the CPU, PyTorch's SDPA and eager
    FlexAttention materialize what a GPU kernel keeps on chip.  glibc hands a freed block above its mmap threshold
    (32 MiB at most) back at once, but its per-thread arenas keep smaller ones apart from the next call's (timed
    calls come back to back) and from the gate's: up to a call's worth more, RETAINED_MAX at most (the peaks
    measured in tests/test_refusals.py).  0 where nothing is known."""
    if device_type != "cpu" or library not in ("torch", "flex"):
        return 0
    (qo, kv), h, d = _worst_lengths(case), case.num_qo_heads, case.head_dim
    if library == "torch":  # over a request's every key (torch-mask), or the batch's window-trimmed keys padded to
        # the longest (torch-batch, which takes no soft-cap or sinks)
        batch = 0 if case.logits_soft_cap or case.sinks else case.batch_size * min(kv, qo + _span(case, kv))
        call = _torch_call(case, qo, max(kv, batch))
    else:  # eager FlexAttention widens K and V to [batch, H, keys, D] in the queries' dtype (and copies one of them
        # once more), and scores every query row against every key of its layout (16 bytes a score with the
        # mask_mod's evaluation)
        e = ELEMENT_BYTES[case.dtype]
        call = max(n * h * k * (3 * e * d + 16 * q) + copies for n, q, k, copies in _flex_layouts(case))
    return call + min(call, RETAINED_MAX)


def _keys_phrase(case: Case) -> str:
    """The axis fields that set keys per request, as the scenario writer named them."""
    if case.seq_len is not None:
        return f"(seq_len {length_label(case.seq_len)})"
    qo_name = QO_FIELD.get(case.mode, "qo_len")
    return f"(prefix_len {length_label(case.prefix_len)} + {qo_name} {length_label(case.qo_len)})"


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
