"""PyTorch FlexAttention peer: one flex_attention call over the whole batch, the window and the
request boundaries expressed as a mask_mod, compiled into a block mask.

Keys are the storage's own rows, read in place: the ragged store (dense K/V), or every physical
slot of the paged store (the page table becomes a slot -> (request, position) lookup the mask_mod
reads).  So on a paged cache a key block of 128 slots mixes pages of several requests: the block
mask can skip fewer blocks than the window alone would allow, which is what using FlexAttention on
a page table costs.  plan() builds the lookups and the block mask (its time is the plan cost);
the first compile is recorded apart as ``compile_s``.
"""

from __future__ import annotations

import time
import warnings

import torch

from .registry import Implementation, register


RECOMPILE_LIMIT = 64  # a sweep meets a few dozen (shape, block size, window on/off) combinations
SPARSE_BLOCK = 128  # FlexAttention's default block-mask block, in queries and in keys


def _compiled_flex(device: torch.device):
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention  # eager flex on the CPU: the unfused reference path, fine for small shapes
    global _COMPILED
    if _COMPILED is None:
        # Past the recompile limit Dynamo would quietly run the unfused eager path and its times would
        # be filed under FlexAttention: raise instead (the point fails with the reason).
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        if hasattr(config, "fail_on_recompile_limit_hit"):
            config.fail_on_recompile_limit_hit = True
        # Dynamic from the first call: every case of a compile class then runs the one kernel, whatever
        # ran before it in this process (by default the first shape compiles static, and the second
        # recompiles dynamic: which case paid which compile would hang on the order of the sweep).
        _COMPILED = torch.compile(flex_attention, dynamic=True)
    return _COMPILED


_COMPILED = None


def q_block_size(total_queries: int, group: int) -> int:
    """The block mask's query block.  Under 128 queries Inductor lowers to its flex-decoding kernel,
    which packs every query of a KV head's group into one tile of next_pow2(queries x group) rows
    and needs that tile to divide the query block; a decode batch of 64 with 4 query heads per KV
    head makes 256 and leaves no valid kernel config (NoValidChoicesError).  Grow the block to it."""
    if total_queries >= SPARSE_BLOCK:
        return SPARSE_BLOCK
    return max(SPARSE_BLOCK, 1 << (total_queries * group - 1).bit_length())


class FlexRunner:
    def __init__(self, w):
        self.w = w
        self.out = torch.empty_like(w.q)
        self.resolved_backend = "flex-triton" if w.device.type == "cuda" else "flex-eager"
        self.compile_s = None

    def plan(self) -> None:
        """Build the slot lookups and the block mask.  The first plan also makes the first call and
        records the whole as ``compile_s``: Inductor's compile, and the one-time set-up a process pays
        on its first block mask (measured apart from the plan times, which are later medians)."""
        first = self.compile_s is None
        started = time.perf_counter()
        self._build_block_mask()
        if first:
            self.run()
            if self.w.device.type == "cuda":
                torch.cuda.synchronize(self.w.device)
            self.compile_s = time.perf_counter() - started

    def _build_block_mask(self) -> None:
        from torch.nn.attention.flex_attention import create_block_mask

        w, c, dev = self.w, self.w.case, self.w.device
        n_slots = w.k_store.shape[0] * (w.k_store.shape[1] if w.k_store.dim() == 4 else 1)
        slot_request = torch.full((n_slots,), -1, dtype=torch.int32, device=dev)
        slot_pos = torch.zeros(n_slots, dtype=torch.int32, device=dev)
        live = slice(None) if w.evicted is None else ~w.evicted  # an evicted entry's row is another's, or nobody's
        slot_request[w.slots[live]] = w.key_request[live].to(torch.int32)
        slot_pos[w.slots[live]] = w.key_position[live].to(torch.int32)
        q_request, q_pos = w.query_request.to(torch.int32), w.query_position.to(torch.int32)
        windowed = c.window_left >= 0
        window = torch.tensor(c.window_left, dtype=torch.int32, device=dev)  # a tensor: no recompile per W

        def mask_mod(b, h, q, kv):
            seen = (slot_request[kv] == q_request[q]) & (slot_pos[kv] <= q_pos[q])
            return seen & (q_pos[q] - slot_pos[kv] <= window) if windowed else seen

        # a tensor, like the window: a Python float would be lifted to a CPU scalar under dynamic=True
        # and read back with .item() inside the kernel (Inductor: "unbacked_bindings")
        cap = torch.tensor(c.logits_soft_cap, dtype=torch.float32, device=dev)
        self.score_mod = (lambda score, b, h, q, kv: cap * torch.tanh(score / cap)) if c.logits_soft_cap else None
        block = (q_block_size(len(q_pos), c.num_qo_heads // c.num_kv_heads), SPARSE_BLOCK)
        self.block_mask = create_block_mask(mask_mod, 1, None, len(q_pos), n_slots, device=dev, BLOCK_SIZE=block)
        self.flex = _compiled_flex(dev)

    def run(self) -> None:
        if self.w.device.type != "cuda":
            with warnings.catch_warnings():  # eager flex warns that it is unfused: known, and fine here
                warnings.simplefilter("ignore", UserWarning)
                return self._run()
        return self._run()

    def _run(self) -> None:
        w, c = self.w, self.w.case
        k = w.k_store.view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)[None]
        v = w.v_store.view(-1, c.num_kv_heads, c.head_dim).transpose(0, 1)[None]
        q = w.q.transpose(0, 1)[None]
        o = self.flex(q, k, v, score_mod=self.score_mod, block_mask=self.block_mask, scale=w.sm_scale,
                      enable_gqa=True)
        self.out.copy_(o[0].transpose(0, 1))


def _compile_class(case) -> tuple:
    """Which kernel Inductor builds for the case: under 128 queries in all, a flex-decoding kernel
    per tile of next_pow2(queries x group) rows (b32 and b64 decode compiled apart on the H200, 10 s
    and 29 s); else the flex-attention kernel.  Lengths do not recompile (dynamic shapes).  Queries
    are counted at the most a case can have (some modes draw fewer per request)."""
    queries, group = case.batch_size * case.largest()[0], case.num_qo_heads // max(case.num_kv_heads, 1)
    heads = (case.num_qo_heads, case.num_kv_heads, case.head_dim, case.dtype, bool(case.logits_soft_cap))
    if queries < SPARSE_BLOCK:
        return ("flex-decoding", 1 << (queries * group - 1).bit_length(), *heads)
    return ("flex-attention", *heads)


def _unsupported(case, backend):
    if case.num_qo_heads % case.num_kv_heads:
        return "FlexAttention GQA needs num_qo_heads divisible by num_kv_heads"
    if case.sinks:
        return "this peer has no sink term (a score_mod cannot add a logit that carries no value)"
    if "fp8_kv" in case.features:
        return "FlexAttention takes queries, keys and values of one dtype (no fp8 cache under bf16 queries)"
    return None


register(Implementation(
    "flex-window", "flex", ("paged", "ragged"),
    "PyTorch FlexAttention, window and request boundaries as a mask_mod over the storage's rows (peer)",
    lambda w, backend: FlexRunner(w), unsupported=_unsupported, compile_class=_compile_class), __name__)
