"""Draft trees verified on a sliding-window layer through FlashInfer (docs/trees.md): the correct paths, the
slot rule, the engines' recipes, and the tree paths FlashInfer cannot run on Hopper, each saying why.

A node at depth ``d`` sits at position ``prefix + d`` and must see the cached keys from ``prefix + d - W`` on and
its ancestors.  FlashInfer's fa2 kernel ANDs a custom mask with its own window test
``kv_idx + qo_len + window_left >= kv_len + qo_idx``, where ``qo_idx`` is the node's slot: planned with the
window, every node whose slot is past its depth loses the cached keys ``[prefix + d - W, prefix + slot - W)``.

- ``tree-mask-depth`` (naive): the full table, the custom mask = tree AND the window by depth, no window at plan.
- ``tree-trim-depth``: the table from the page holding key ``prefix - W``, the same mask over its columns only
  (``n x (W + n)`` bits, not ``n x kv_len``): what sglang#39287 proposes for SGLang's FlashInfer backend.
- ``tree-window-slot``: the tree as the custom mask and ``window_left = W`` at plan, the kernel's own window (a
  known mistake, exact on chains).
- ``tree-sink-mask``: the sink wrapper (GPT-OSS) given the tree mask; 0.7.4's AttentionSink variant reads no
  custom mask, so plan(custom_mask=...) is taken and the tree, and causality, dropped.
- ``tree-branches`` / ``tree-branches-sink``: SGLang's fa3 recipe for trees on SWA layers
  (``FlashAttentionBackend._init_sliding_window_attn_spec_metadata``): one request per node, whose one-token
  pages are its window of the cache and then its ancestors, planned causal with the window: exact, page size 1.
- ``sglang-verify-tree``: SGLang's EAGLE target verify on an SWA layer, as its FlashInfer backend writes it
  (``flashinfer_backend.py`` at 0005834cdb2a, ``eagle_info.py`` at 0007d13b0099,
  ``EagleVerifyInput.generate_attn_arg_prefill``): the SWA wrapper's KV cut to ``min(prefix, W) + n`` keys from the
  request's first (``kv_start_idx`` is computed but EAGLE does not pass it), planned without a window, handed the
  full-prefix tree mask (``n x (prefix + n)`` per request, which FlashInfer reads ``n x`` the planned length at a
  time), and given ``window_left = W`` at run, which only moves each query tile's first key.
- ``vllm-tree-window``: vLLM's tree attention (``tree_attn.py``, its Triton ``unified_attention``) applies the window
  and causality by the node's slot and adds the tree bias: its rule, emulated in PyTorch (vLLM is not installed) on
  the keys from ``prefix - W`` on, the oldest its first node's window reaches.
- ``tree-xqa``, ``tree-trtllm-gen``: what 0.7.4 offers for trees elsewhere, skipped with the reason.
"""

from __future__ import annotations

import torch

from swabench.core import semantics, trees, workloads
from . import fa2_run_window, flashinfer_impls as fi
from .embedded import GatherRunner
from .fa2_split import run_window_first_keys
from .implementation import computed
from .recipes import sglang_serves
from .registry import Implementation, register

TREES = dict(tree=True, requires=frozenset({"tree"}))  # verifies draft trees, and only those
VERIFY = ("verify",)


def _slot_rule(window_left, prefix_len, page_size):
    return semantics.Visibility(window_left, by_slot=True)


fi.register_variant("tree-mask-depth", "full table, custom mask = tree AND the window by depth, no window at plan "
                    "(naive)", fi.Variant("paged", mask=True, modes=VERIFY), module=__name__, **TREES)
fi.register_variant("tree-trim-depth", "table from the page holding key prefix - W, custom mask = tree AND the window "
                    "by depth over its columns only, no window at plan",
                    fi.Variant("paged", mask=True, start=fi.trim, modes=VERIFY), module=__name__, **TREES)
fi.register_variant("tree-window-slot", "full table, custom mask = the tree, window_left=W at plan: the kernel "
                    "measures the window from the node's slot, not its depth",
                    fi.Variant("paged", mask=True, mask_window=True, modes=VERIFY), kind="known-bug",
                    visibility=_slot_rule, timed_where_exact=True, module=__name__, **TREES)


def _mask_dropped(case, qo_lens, kv_lens, backend: str) -> list:
    """The sink wrapper under a custom mask: the window by slot alone, no tree, no causality."""
    rule = semantics.Visibility(case.window_left, causal=False)
    return [rule.mask(q, k) for q, k in zip(qo_lens, kv_lens)]


fi.register_variant("tree-sink-mask", "BatchAttentionWithAttentionSinkWrapper planned with the tree as custom_mask "
                    "and window_left=W: its AttentionSink variant reads no custom mask, so the tree and causality "
                    "are dropped", fi.Variant("paged", sinks="apply", mask=True, mask_window=True, modes=VERIFY),
                    kind="known-bug", seen=_mask_dropped, module=__name__, tree=True,
                    requires=frozenset({"tree", "sinks"}))


# ---------------------------------------------------------------- one request per node

class Branches:
    """A tree workload seen as one request per node (SGLang's fa3 recipe): its one query, and its branch as a
    table of one-token pages: the cached keys from ``prefix + depth - W`` on, then its ancestors, root first.
    Queries and caches are the workload's own, read through."""

    def __init__(self, w):
        self.workload = w
        qo, kv, indices = [], [], []
        for b, tree in enumerate(w.trees):
            pages = w.kv_indices_host[int(w.kv_indptr_host[b]):int(w.kv_indptr_host[b + 1])]
            prefix, anc = w.prefix_lens[b], tree.ancestors()
            for i, d in enumerate(tree.depths):
                first = 0 if w.case.window_left < 0 else max(0, prefix + d - w.case.window_left)
                line = pages[prefix:][anc[i]]  # ancestors in slot order: root first, the node last
                indices.append(torch.cat([pages[first:prefix], line]))
                qo.append(1)
                kv.append(len(indices[-1]))
        self.qo_lens, self.kv_lens, self.batch_size = qo, kv, len(qo)
        self.qo_indptr_host = list(range(len(qo) + 1))
        self.kv_indptr_host = torch.tensor([0, *torch.tensor(kv).cumsum(0).tolist()])
        self.kv_indices_host = torch.cat(indices)
        self.kv_last_page_len = torch.ones(len(qo), dtype=torch.int32)

    def __getattr__(self, name):
        if name in ("qo_indptr", "kv_indptr", "kv_indices", "prefix_lens", "slot_indptr", "request_slots"):
            raise AttributeError(f"{name} is the workload's, not the branches'")
        return getattr(self.workload, name)

    @property
    def trees(self):
        return None  # each branch is a chain of one query


class BranchRunner(fi.FlashInferRunner):
    """The wrapper sized for one request per node; every plan() lays the branches out again (host work a server
    redoes each step)."""

    def __init__(self, w, backend: str, variant: fi.Variant, graph_wrapper: bool = True):
        super().__init__(Branches(w), backend, variant, graph_wrapper)

    def plan(self) -> None:
        self.w = Branches(self.w.workload)
        super().plan()
        self.layout += f", {self.w.batch_size} branches of one-token pages"


def _one_token_pages(case, backend: str) -> str | None:
    if case.page_size != 1:
        return (f"a branch's keys are its window and its ancestors, scattered over the draft: one-token pages only "
                f"(page_size 1, not {case.page_size}; SGLang's fa3 backend asserts the same)")
    return None


fi.register_variant("tree-branches", "one request per node (SGLang's fa3 recipe): its window of the cache and its "
                    "ancestors as one-token pages, plan(causal=True, window_left=W)",
                    fi.Variant("paged", modes=VERIFY), runner=BranchRunner, also=_one_token_pages, module=__name__,
                    **TREES)
fi.register_variant("tree-branches-sink", "the sink wrapper with one request per node (SGLang's fa3 recipe, "
                    "GPT-OSS): its window of the cache and its ancestors as one-token pages",
                    fi.Variant("paged", sinks="apply", modes=VERIFY), runner=BranchRunner, also=_one_token_pages,
                    module=__name__, tree=True, requires=frozenset({"tree", "sinks"}))


# ---------------------------------------------------------------- SGLang's EAGLE target verify

def sglang_kept(case, qo_len: int, kv_len: int) -> int:
    """Keys the SWA wrapper's table holds in SGLang's EAGLE verify: ``min(prefix, W) + n``, from the first (every
    key on a layer without a window, which is not this recipe's and skips)."""
    return kv_len if case.window_left < 0 else min(kv_len - qo_len, case.window_left) + qo_len


def full_prefix_mask(qo_lens, kv_lens, drafts) -> torch.Tensor:
    """SGLang's FULL_MASK (``build_tree_kernel_efficient``): per request ``n x (prefix + n)``, every cached key
    True, and the node's ancestors and itself among the draft keys; row-major, the requests one after another."""
    return torch.cat([torch.cat([torch.ones(q, k - q, dtype=torch.bool), t.ancestors()], dim=1).reshape(-1)
                      for q, k, t in zip(qo_lens, kv_lens, drafts)])


def _sglang_seen(case, qo_lens, kv_lens, backend: str) -> list:
    """What each query sees under SGLang's recipe: the planned table's column c is the request's key c; FlashInfer
    reads request b's mask bits from the offset of the planned sizes before it, ``K`` a row, so a request whose
    table was cut reads rows of the full-prefix mask out of step; and the window given at run moves each query
    tile's first key to its first query's window start over the planned keys (``fa2_split.run_window_first_keys``;
    the recipe runs on fa2 only, as fa3 takes no custom mask)."""
    drafts = trees.of_case(case)
    bits = full_prefix_mask(qo_lens, kv_lens, drafts)
    tile = fa2_run_window.run_window_tile(case, qo_lens)
    out, offset = [], 0
    for q, k in zip(qo_lens, kv_lens):
        kept = sglang_kept(case, q, k)
        read = torch.zeros(q * kept, dtype=torch.bool)
        chunk = bits[offset:offset + q * kept]
        read[:len(chunk)] = chunk
        first_key = torch.zeros(q, dtype=torch.int64)  # no window at run: the kernel skips nothing
        if case.window_left >= 0:
            first_key = torch.tensor(run_window_first_keys(q, kept, case.window_left, case.gqa_group, tile))
        seen = torch.zeros(q, k, dtype=torch.bool)
        seen[:, :kept] = read.view(q, kept) & (torch.arange(kept)[None, :] >= first_key[:, None])
        out.append(seen)
        offset += q * kept
    return out


class SGLangVerifyRunner(fi.FlashInferRunner):
    """SGLang's SWA wrapper in EAGLE verify: the cut table, the full-prefix mask, no window at plan, W at run (the
    variant's ``end`` sizes the mask buffer for what FlashInfer packs: ``n x`` the planned keys a request)."""

    def plan(self) -> None:
        w, c, i32 = self.w, self.w.case, torch.int32
        kept = [sglang_kept(c, q, k) for q, k in zip(w.qo_lens, w.kv_lens)]
        indptr, indices, last = workloads.slice_page_table(w.kv_indptr_host, w.kv_indices_host, [0] * len(kept), kept,
                                                           w.page_size)
        shape = dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                     page_size=w.page_size, q_data_type=w.dtype, kv_data_type=w.kv_dtype, sm_scale=w.sm_scale,
                     causal=False, custom_mask=full_prefix_mask(w.qo_lens, w.kv_lens, w.trees).to(w.device))
        if c.logits_soft_cap:
            shape["logits_soft_cap"] = c.logits_soft_cap
        self._plan((torch.tensor(w.qo_indptr_host, dtype=i32), indptr.to(i32), indices.to(i32), last), shape)
        self.wrapper._window_left = c.window_left  # what forward(..., window_left=W) sets before its run
        self.resolved_backend = getattr(self.wrapper, "_backend", self.backend)
        self.layout = ("cuda-graph" if self.graph_wrapper else "plain") + ": table cut to min(prefix, W) + n keys " \
            "from the first, the full-prefix tree mask, W at run"


fi.register_variant("sglang-verify-tree", "SGLang's EAGLE target verify on an SWA layer (FlashInfer backend): KV cut "
                    "to min(prefix, W) + n keys from the request's first, the full-prefix tree mask, W at run only",
                    fi.Variant("paged", mask=True, end=lambda case, q, k, ps: sglang_kept(case, q, k), modes=VERIFY),
                    kind="known-bug", wrapper="recipe", runner=SGLangVerifyRunner, seen=_sglang_seen,
                    timed_where_exact=True, also=sglang_serves, module=__name__, **TREES)


# ---------------------------------------------------------------- vLLM's rule, and what FlashInfer lacks

register(Implementation(
    "vllm-tree-window", "torch", ("paged", "ragged"), "vLLM's tree attention rule (Triton unified_attention): the "
    "window and causality by the node's slot, the tree bias on top; emulated in PyTorch",
    lambda w, backend: GatherRunner(w, lambda case, prefix: computed(case, prefix, _slot_rule), trim=True),
    kind="known-bug", wrapper="recipe", modes=VERIFY, visibility=_slot_rule, **TREES), __name__)


def _never(reason: str):
    return lambda case, backend: reason


def _no_runner(w, backend):
    raise AssertionError("a path that names why it cannot run is never made")


XQA_REASON = ("flashinfer.xqa verifies chains only: its docstring says tree-structured drafts are not supported with a "
              "sliding window, and its JIT module is built with IS_SPEC_DEC_TREE=0, so a tree mask would be read as a "
              "chain's rows, the window by row (nothing refuses it)")
TRTLLM_REASON = ("trtllm-gen's attention kernels are built for Blackwell (SM100) only, and no FlashInfer release here "
                 "takes a tree mask for them (flashinfer#3585, closed unmerged, folded the window in by slot)")
for _name, _wrapper, _reason in (("tree-xqa", "xqa", XQA_REASON), ("tree-trtllm-gen", "trtllm-gen", TRTLLM_REASON)):
    register(Implementation(_name, fi.LIBRARY.name, ("paged",), f"draft trees through {_wrapper}: skipped, "
                            f"saying why", _no_runner, wrapper=_wrapper, modes=VERIFY, needs_cuda=True,
                            unsupported=_never(_reason), **TREES), __name__)
