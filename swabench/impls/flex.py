"""PyTorch FlexAttention peers, written the ways FlexAttention's users write them.

- ``flex-window``: the batch is the requests (query length = each request's queries), as PyTorch's
  paged attention for FlexAttention and gpt-fast lay it out.  Keys are read in place through the
  page table: the block mask lists, for each request and query block, the physical key blocks of
  that request's window, a key block being a page where pages hold 16 keys or more (PyTorch's
  ``PagedAttention`` and vLLM's FlexAttention backend require the same), and the mask_mod maps a
  physical row back to its request and position.  Batch and heads stay static in the compile, so
  under 128 queries a request Inductor can run its flex-decoding kernel, which splits the keys.
- ``flex-contiguous``: the same batch with each request's keys in a contiguous buffer of their own
  (refreshed outside the timed call): the best FlexAttention does on the shape with no paging at
  all.  flex-window / flex-contiguous is what the page table costs.
- ``flex-flat`` (``flex_flat``): every query of the batch in one sequence over the storage's rows, 128-row
  blocks: the layout of FlexAttention's document masking, and swabench's first FlexAttention peer.

``plan()`` builds the lookups and the block mask (its time is the plan cost); the first call,
with Inductor's compile, is recorded apart as ``compile_s`` and never timed.
"""

from __future__ import annotations

import inspect
import re
import time
import warnings
from contextlib import contextmanager

import torch

from swabench.core.query_batch import QueryBatch
from swabench.core import semantics, workloads
from .flex_span import Span, TreeSpan
from .registry import Implementation, ResourceError, register


RECOMPILE_LIMIT = 64  # a sweep meets a few dozen (shape, block size, window on/off) combinations
SPARSE_BLOCK = 128  # FlexAttention's default block-mask block, in queries and in keys
SMALLEST_BLOCK = 16  # Triton's smallest tile: a key block under 16 rows has no kernel
_COMPILED = None


def compiled_flex(device: torch.device):
    """flex_attention compiled once per process, every dimension symbolic from the first call, so that
    every case of a compile class runs one kernel whatever ran before it (by default the first shape
    compiles static and the second recompiles).  The batched peers mark batch and heads static
    (``_static``): flex-decoding splits the keys by them, and with a symbolic batch Inductor quietly
    runs its general kernel instead."""
    global _COMPILED
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention  # eager flex on the CPU: the unfused reference path, fine for small shapes
    if _COMPILED is None:
        # Past the recompile limit Dynamo would quietly run the unfused eager path and its times would
        # be filed under FlexAttention: raise instead (the point fails with the reason).
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        if hasattr(config, "fail_on_recompile_limit_hit"):
            config.fail_on_recompile_limit_hit = True
        _COMPILED = torch.compile(flex_attention, dynamic=True)
    return _COMPILED


def flex_decoding(queries: int, group: int) -> bool:
    """Whether Inductor lowers a call to its flex-decoding kernel (torch's ``_use_flex_decoding``): under
    128 queries a sequence and a power-of-two GQA group, the kernel packing a KV head's query heads into
    one tile; else its general flex-attention kernel (Llama 4's group of 5 at decode, for one)."""
    return queries < SPARSE_BLOCK and group > 0 and not group & (group - 1)


def q_block_size(queries: int, group: int) -> int:
    """The block mask's query block.  The flex-decoding kernel packs every query of a KV head's group
    into one tile of next_pow2(queries x group) rows and needs that tile to divide the query block; a
    decode batch of 64 with 4 query heads per KV head makes 256 and leaves no valid kernel config
    (NoValidChoicesError).  Grow the block to it."""
    if not flex_decoding(queries, group):
        return SPARSE_BLOCK
    return max(SPARSE_BLOCK, 1 << (queries * group - 1).bit_length())


def key_block_size(case, contiguous: bool) -> int:
    """The block mask's key block.  A page where a page is a power of two of 16 rows or more (up to 128),
    so that a block is one request's page and the block mask skips every page outside the window; 128
    where each request's keys are contiguous (ragged storage, flex-contiguous); 16 where pages are
    smaller (each row its own request's: the mask_mod sorts them out, in the smallest blocks Triton has)."""
    if contiguous or case.storage == "ragged":
        return SPARSE_BLOCK
    ps = case.page_size
    return min(ps, SPARSE_BLOCK) if ps >= SMALLEST_BLOCK and not ps & (ps - 1) else SMALLEST_BLOCK


def kernel_options(rows: int, group: int, kv_block: int) -> dict:
    """The general flex-attention kernel reads keys BLOCK_N rows at a time and needs BLOCK_N to divide the
    block mask's key block; its default (64 or 128 rows) does not divide a page of 16 or 32, so there
    BLOCK_N is the page, as vLLM's FlexAttention backend sets it.  flex-decoding picks a dividing tile
    itself."""
    return {"BLOCK_N": kv_block} if not flex_decoding(rows, group) and kv_block < SPARSE_BLOCK else {}


def soft_cap(case, device):
    # a tensor: a Python float would be lifted to a CPU scalar under dynamic shapes and read back with
    # .item() inside the kernel (Inductor: "unbacked_bindings")
    cap = torch.tensor(case.logits_soft_cap, dtype=torch.float32, device=device)
    return (lambda score, b, h, q, kv: cap * torch.tanh(score / cap)) if case.logits_soft_cap else None


def slot_owners(w, block: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Request and position of every physical K/V row of the storage (-1: nobody's), in whole key blocks
    (the rows past the storage's end are nobody's)."""
    n_slots = w.k_store.shape[0] * (w.k_store.shape[1] if w.k_store.dim() == 4 else 1)
    n_slots = -(-n_slots // block) * block
    slot_request = torch.full((n_slots,), -1, dtype=torch.int32, device=w.device)
    slot_pos = torch.zeros(n_slots, dtype=torch.int32, device=w.device)
    live = slice(None) if w.evicted is None else ~w.evicted  # an evicted entry's row is another's, or nobody's
    slot_request[w.slots[live]] = w.key_request[live].to(torch.int32)
    slot_pos[w.slots[live]] = w.key_position[live].to(torch.int32)
    return slot_request, slot_pos


def _static(*tensors) -> None:
    """Batch and heads stay static in the compile (the first two dimensions)."""
    for t in tensors:
        torch._dynamo.mark_static(t, 0)
        torch._dynamo.mark_static(t, 1)


def _run_quietly(fn):
    with warnings.catch_warnings():  # eager flex warns that it is unfused: known, and fine here
        warnings.simplefilter("ignore", UserWarning)
        return fn()


# Inductor's own limits, met at the first call: its flex-decoding template mixes int32 and int64 once K and V hold
# 2**31 elements (torch 2.11 and 2.13), and a tile too large for shared memory.  A NoValidChoicesError or a block
# size that does not divide is how this peer is laid out, so it stays a failure.
BUILD_LIMITS = ("inconsistent types int64 and int32", "OutOfResources", "out of resource")


@contextmanager
def _build_errors():
    """A kernel Inductor cannot build (its InductorError at the first call, for one of its BUILD_LIMITS) is a
    resource skip with its message, as a FlashInfer module that does not build is; anything else passes
    through."""
    try:
        yield
    except Exception as e:
        if type(e).__name__ != "InductorError" or not any(limit in str(e) for limit in BUILD_LIMITS):
            raise
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        cause = next((line for line in reversed(lines[1:]) if re.match(r"\w+(Error|Exception)\b", line)), None)
        raise ResourceError(f"torch {torch.__version__} Inductor could not build the kernel: "
                            + " ... ".join(line[:300] for line in (lines[0], cause) if line)) from e


class FlexRunner:
    """What the FlexAttention peers share: the first plan() also makes the first call and records the
    whole as ``compile_s`` (Inductor's compile and the one-time set-up of a process's first block mask,
    measured apart from the plan times, which are later medians); eager flex on the CPU runs quietly."""

    def __init__(self, w):
        self.w = w
        self.out = torch.empty_like(w.q)
        self.resolved_backend = "flex-triton" if w.device.type == "cuda" else "flex-eager"
        self.compile_s = None

    def plan(self) -> None:
        first = self.compile_s is None
        started = time.perf_counter()
        self._prepare(first)
        if first:
            self.refresh_inputs()
            with _build_errors():
                self.run()
            if self.w.device.type == "cuda":
                torch.cuda.synchronize(self.w.device)
            self.compile_s = time.perf_counter() - started

    def _prepare(self, first: bool) -> None:
        raise NotImplementedError

    def refresh_inputs(self) -> None:
        """A peer that reads its own copy of the inputs takes the new data here (the gate calls it)."""

    def run(self) -> None:
        if self.w.device.type != "cuda":
            return _run_quietly(self._run)
        return self._run()

    def _run(self) -> None:
        raise NotImplementedError


class BatchedFlex(FlexRunner):
    """flex-window (``contiguous=False``) and flex-contiguous: batch = requests."""

    def __init__(self, w, contiguous: bool):
        super().__init__(w)
        c = w.case
        self.contiguous = contiguous
        self.queries = QueryBatch(w)
        self.batch, self.rows = self.queries.batch, self.queries.rows
        self.group = c.gqa_group
        self.q_block = q_block_size(self.rows, self.group)
        self.kv_block = key_block_size(c, contiguous)
        kernel = "flex-decoding" if flex_decoding(self.rows, self.group) else "flex-attention"
        self.kernel_options = kernel_options(self.rows, self.group, self.kv_block)
        options = ", ".join(f"{k}={v}" for k, v in self.kernel_options.items()) or "default"
        keys = f"each request's keys contiguous, key block {self.kv_block}" if contiguous else \
            f"keys in place ({c.storage}), key block {self.kv_block}" + \
            (" = page" if c.storage == "paged" and self.kv_block == w.page_size else "")
        self.layout = (f"{self.queries.label}, {keys}, query block {self.q_block}; Inductor's {kernel} kernel, "
                       f"{options} kernel_options")

    def _prepare(self, first: bool) -> None:
        if first:
            self._layout()  # buffers and lookups, once: the block mask is what a step re-plans
        self._block_mask()

    def _layout(self) -> None:
        w, c, dev = self.w, self.w.case, self.w.device
        self.q_start = torch.tensor(w.prefix_lens, dtype=torch.int32, device=dev)
        self.q_len = torch.tensor(w.qo_lens, dtype=torch.int32, device=dev)
        self.kv_len = torch.tensor(w.kv_lens, dtype=torch.int32, device=dev)
        if self.contiguous:
            length = -(-max(w.kv_lens) // self.kv_block) * self.kv_block
            shape = (self.batch, c.num_kv_heads, length, c.head_dim)
            self.k_dense = torch.zeros(shape, dtype=w.k_store.dtype, device=dev)
            self.v_dense = torch.zeros(shape, dtype=w.v_store.dtype, device=dev)
            live = slice(None) if w.evicted is None else ~w.evicted  # an evicted entry's page is not its key
            self.dense_rows, self.live_slots = (w.key_request * length + w.key_position)[live], w.slots[live]
            self.staging = torch.zeros(self.batch * length, c.num_kv_heads, c.head_dim, dtype=w.k_store.dtype,
                                       device=dev)
            self.slot_request = self.slot_pos = None
        else:
            self.slot_request, self.slot_pos = slot_owners(w, self.kv_block)
            # the block lists are worked out on the host, from one copy of the lookups
            self.host = {"slots": w.slots.cpu(), "request": self.slot_request.view(-1, self.kv_block).cpu(),
                         "pos": self.slot_pos.view(-1, self.kv_block).cpu(),
                         "evicted": None if w.evicted is None else w.evicted.cpu()}

    def refresh_inputs(self) -> None:
        """Copy each request's keys into its contiguous buffer (flex-contiguous; not timed: the copy
        is what the peer is spared, and the gate calls this after every change of the data)."""
        if not self.contiguous:
            return
        w, c = self.w, self.w.case
        flat = (-1, c.num_kv_heads, c.head_dim)
        for dense, store in ((self.k_dense, w.k_store), (self.v_dense, w.v_store)):
            self.staging[self.dense_rows] = store.view(flat)[self.live_slots]
            dense.copy_(self.staging.view(self.batch, -1, c.num_kv_heads, c.head_dim).transpose(1, 2))

    def _block_mask(self) -> None:
        from torch.nn.attention.flex_attention import BlockMask

        w, c, dev = self.w, self.w.case, self.w.device
        chunk = c.attention_chunk
        n_q = -(-self.rows // self.q_block)
        partial, full = [[[] for _ in range(n_q)] for _ in range(self.batch)], \
            [[[] for _ in range(n_q)] for _ in range(self.batch)]
        for b in range(self.batch):
            prefix, rows = w.prefix_lens[b], w.qo_lens[b]
            for j in range(n_q):
                first, last = j * self.q_block, min(rows, (j + 1) * self.q_block) - 1
                if first > last:
                    continue
                p_first, p_last = prefix + first, prefix + last
                oldest = prefix if w.trees is not None else p_first  # a node's position is prefix + its depth
                lo = max(0, oldest - c.window_left) if c.window_left >= 0 else semantics.chunk_start(p_first, chunk)
                full_lo = p_last - c.window_left if c.window_left >= 0 else semantics.chunk_start(p_last, chunk)
                end = w.kv_lens[b] - 1  # without causality every query sees its request's last key
                newest = prefix - 1 if w.trees is not None else p_first  # every node sees its ancestors only
                partial[b][j], full[b][j] = self._blocks(b, lo, p_last if c.causal else end, full_lo=full_lo,
                                                         full_hi=newest if c.causal else end)
        kv_rows = self.k_dense.shape[2] if self.contiguous else int(self.w.k_store.view(-1, c.num_kv_heads,
                                                                                      c.head_dim).shape[0])
        width = max(1, max(len(x) for r in partial + full for x in r))

        def table(lists):
            num = torch.tensor([[len(x) for x in r] for r in lists], dtype=torch.int32)
            idx = torch.zeros(self.batch, n_q, width, dtype=torch.int32)
            for b, r in enumerate(lists):
                for j, x in enumerate(r):
                    idx[b, j, :len(x)] = torch.as_tensor(x, dtype=torch.int32)
            return num[:, None].to(dev), idx[:, None].to(dev)

        kv_num, kv_idx = table(partial)
        full_num, full_idx = table(full)
        forward_only = {"compute_q_blocks": False} if "compute_q_blocks" in \
            inspect.signature(BlockMask.from_kv_blocks).parameters else {}  # torch 2.9 and later: no backward blocks
        self.block_mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx,
                                                   BLOCK_SIZE=(self.q_block, self.kv_block),
                                                   mask_mod=self._mask_mod(), seq_lengths=(self.rows, kv_rows),
                                                   **forward_only)
        _static(kv_num, kv_idx, full_num, full_idx)
        self.score_mod = soft_cap(c, dev)
        self.flex = compiled_flex(dev)

    def _blocks(self, b: int, lo: int, hi: int, full_lo: int, full_hi: int):
        """The key blocks holding request b's positions lo..hi, split into partial ones and full ones (every
        row of the block a key at a position in full_lo..full_hi, which every query of the query block sees:
        no mask_mod needed there; a padded query row sees them too, and its output is never read)."""
        kvb = self.kv_block
        if self.contiguous:
            blocks = torch.arange(lo // kvb, hi // kvb + 1)
            start, end = blocks * kvb, blocks * kvb + kvb - 1
            is_full = (start >= full_lo) & (end <= full_hi) & (end < self.w.kv_lens[b])
        else:
            h, first = self.host, int(self.w.slot_indptr[b])
            slots = h["slots"][first + lo:first + hi + 1]
            if h["evicted"] is not None:
                slots = slots[~h["evicted"][first + lo:first + hi + 1]]
            blocks = torch.unique(slots // kvb)
            owner, pos = h["request"][blocks], h["pos"][blocks]
            is_full = (owner == b).all(1) & (pos >= full_lo).all(1) & (pos <= full_hi).all(1)
        return blocks[~is_full].tolist(), blocks[is_full].tolist()

    def _mask_mod(self):
        q_start, q_len, kv_len = self.q_start, self.q_len, self.kv_len
        if self.w.trees is not None:
            tree = TreeSpan(self.w)

            def narrow(seen, key, b, q):
                return tree.narrow_node(seen, key, b, q)
        else:
            span = Span(self.w.case, self.w.device)

            def narrow(seen, key, b, q):
                return span.narrow(seen, key, q_start[b] + q)
        if self.contiguous:
            def mask_mod(b, h, q, kv):
                return narrow((q < q_len[b]) & (kv < kv_len[b]), kv, b, q)
            return mask_mod
        slot_request, slot_pos = self.slot_request, self.slot_pos

        def paged_mask_mod(b, h, q, kv):
            return narrow((q < q_len[b]) & (slot_request[kv] == b), slot_pos[kv], b, q)
        return paged_mask_mod

    def _run(self) -> None:
        w, c = self.w, self.w.case
        q = self.queries.queries()
        if self.contiguous:
            k, v = self.k_dense, self.v_dense
        else:
            k = w.k_store.view(1, -1, c.num_kv_heads, c.head_dim).transpose(1, 2)  # one pool, every request
            v = w.v_store.view(1, -1, c.num_kv_heads, c.head_dim).transpose(1, 2)
        _static(q, k, v)
        o = self.flex(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask, scale=w.sm_scale,
                      enable_gqa=True, kernel_options=self.kernel_options or None)
        self.queries.write_back(o, self.out)


def _batched_compile_class(case, contiguous: bool) -> tuple:
    """A batched case compiles per batch size (static, so flex-decoding can split the keys), query
    rows per request and block sizes; key lengths are dynamic."""
    rows = case.largest()[0]
    heads = (case.num_qo_heads, case.num_kv_heads, case.head_dim, case.dtype, bool(case.logits_soft_cap),
             case.causal, bool(case.attention_chunk), bool(case.tree))
    kernel = "flex-decoding" if flex_decoding(rows, case.gqa_group) else "flex-attention"
    return (kernel, case.batch_size, rows, key_block_size(case, contiguous), *heads)


def unsupported(case, backend):
    if case.num_qo_heads % case.num_kv_heads:
        return "FlexAttention GQA needs num_qo_heads divisible by num_kv_heads"
    if case.sinks:
        return "this peer has no sink term (a score_mod cannot add a logit that carries no value)"
    if "fp8_kv" in case.features:
        return "FlexAttention takes queries, keys and values of one dtype (no fp8 cache under bf16 queries)"
    return None


def _register_batched(name: str, contiguous: bool, summary: str) -> None:
    register(Implementation(
        name, "flex", ("paged", "ragged"), summary, lambda w, backend: BatchedFlex(w, contiguous),
        unsupported=unsupported, compile_class=lambda case: _batched_compile_class(case, contiguous),
        noncausal=True, chunked=True, tree=True, peer=True), __name__)


_register_batched("flex-window", False, "PyTorch FlexAttention as its users batch it: batch = requests, keys read in "
                  "place (through the page table in page-sized blocks), flex-decoding under 128 queries a request "
                  "and a power-of-two group (peer)")
_register_batched("flex-contiguous", True, "PyTorch FlexAttention on the same batch with each request's keys "
                  "contiguous, no paging (the best FlexAttention does on the shape; peer)")
