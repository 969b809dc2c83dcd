"""The engines' own recipes (docs/serving-paths.md): an SWA layer as SGLang runs it on FlashInfer, several
wrappers combined the way its source combines them, gated and timed whole.

Read at sgl-project/sglang, ``python/sglang/srt/layers/attention/flashinfer_backend.py``:

- commit 0005834cdb2a (after PR #26513, "extend with a cached prefix on SWA layers"): extend runs
  the new tokens against each other through the ragged wrapper (``begin_forward`` without a window,
  ``forward_return_lse(..., causal=True, window_left=W)``) and against the prefix through the paged
  wrapper over the prefix trimmed to its last W tokens (``effective_start = clamp(prefix - W, 0)``,
  ``kv_start_idx = effective_start``) with the custom mask ``_build_swa_prefix_custom_mask``
  (key ``k`` visible to query ``q`` when ``k >= q - W``), ``causal=False``; then
  ``o, _ = _safe_merge_state(o1, s1, o2, s2)`` (``flashinfer.cascade.merge_state``);
- commit 454e84dab272 (before #26513): the same two parts with no mask on the prefix.

FlashInfer compiles the per-element window in only when ``plan()`` gets ``window_left >= 0``; a
window given at run time (``forward_return_lse(window_left=W)``, which sets the wrapper's
``_window_left`` before its ``run``) then only skips whole key tiles.  So the recipe as written sees
every new token of the chunk in the tiles it does not skip (``sglang-extend-ragged-nowindow``), and
``sglang-extend`` plans the ragged part with the window its run call asks for.

SGLang numbers the KV cache per token (page size 1); on larger pages the trimmed prefix starts at
the page holding key ``prefix - W`` and the mask does the rest.  The new tokens' K/V are copied out
of the cache on every call into the contiguous buffers the ragged wrapper reads: it stands in for
``set_kv_buffer``, which SGLang pays on the same step to write them in (the same bytes, the other
direction).  ``merge_state_in_place`` merges into the ragged output where SGLang's ``merge_state``
allocates a new tensor: the same kernel arithmetic, no allocation inside a captured graph.

EAGLE verify (``python/sglang/srt/speculative/eagle_info.py`` at f1f60ea0258f,
``EagleVerifyInput.generate_attn_arg_prefill``, SGLang issue 22679): the SWA updater cuts the
kernel's KV length to ``min(prefix, W) + draft`` but forwards ``kv_start_idx`` only for DFlash
verify, so EAGLE's indices start at the request's first key: the verify block attends to the
request's first ``min(prefix, W) + draft`` keys (``eagle-verify-untrimmed``; its tree mask is left
out: a chain draft is causal).
"""

from __future__ import annotations

import torch

from swabench.core import semantics, workloads
from swabench.core.cases import WRAPPER_MODES
from . import fa2_run_window, flashinfer_impls as fi
from . import flashinfer_workspace as ws
from .registry import Implementation, register


class SGLangExtendRunner:
    """SGLang's extend with a cached prefix: ragged (new x new) + paged (new x trimmed prefix) + merge."""

    def __init__(self, w: workloads.Workload, backend: str, prefix_mask: bool, ragged_window: bool):
        """Both wrappers built as the case's ``wrapper_mode`` says (plain: as SGLang's uncaptured extend)."""
        import flashinfer

        self.w, self.backend, self.prefix_mask, self.ragged_window = w, backend, prefix_mask, ragged_window
        self.resolved_backend = backend
        self.merge = flashinfer.merge_state_in_place
        c, dev = w.case, w.device
        total_q = sum(w.qo_lens)
        self.out = torch.empty_like(w.q)
        self.prefix_out = torch.empty_like(w.q)
        self.lse_new = torch.empty(total_q, c.num_qo_heads, dtype=torch.float32, device=dev)
        self.lse_prefix = torch.empty_like(self.lse_new)
        self.k_new = torch.empty(total_q, c.num_kv_heads, c.head_dim, dtype=w.kv_dtype, device=dev)
        self.v_new = torch.empty_like(self.k_new)
        self.new_slots = torch.cat([w.request_slots(i, k - q) for i, (q, k) in enumerate(zip(w.qo_lens, w.kv_lens))])
        self.starts = [semantics.trim_start(p, 0, c.window_left, w.page_size) for p in w.prefix_lens]
        graph = c.wrapper_mode == "cuda-graph"
        kept = [p - s for p, s in zip(w.prefix_lens, self.starts)]
        ragged_bufs = fi.graph_buffers(w, paged=False) if graph else {}
        paged_bufs = fi.graph_buffers(w, True, semantics.packed_mask_bytes(w.qo_lens, kept) if prefix_mask else None) \
            if graph else {}
        self._new = {
            "ragged": lambda ws: flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend,
                                                                                 **ragged_bufs),
            "paged": lambda ws: flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend,
                                                                               **paged_bufs)}
        self.wrappers = {part: make(ws.workspace(dev, ws.WORKSPACE_BYTES)) for part, make in self._new.items()}
        self.sizes = dict.fromkeys(self.wrappers, ws.WORKSPACE_BYTES)
        self.workspace_mib: int | None = None
        self.layout = f"{c.wrapper_mode}: ragged (new x new) + paged (new x trimmed prefix) + merge_state_in_place"

    def prefix_visibility_mask(self) -> torch.Tensor:
        """``_build_swa_prefix_custom_mask``: each request's [qo, kept prefix] rows, flattened."""
        w, c = self.w, self.w.case
        rows = [semantics.Visibility(c.window_left).mask(q, k, key_offset=s)[:, :k - q - s]
                for q, k, s in zip(w.qo_lens, w.kv_lens, self.starts)]
        return torch.cat([r.reshape(-1) for r in rows]).to(w.device)

    def plan(self) -> None:
        w, c, i32 = self.w, self.w.case, torch.int32
        qo_indptr = torch.tensor(w.qo_indptr_host, dtype=i32)
        common = dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                      q_data_type=w.dtype, kv_data_type=w.kv_dtype, sm_scale=w.sm_scale)
        if c.logits_soft_cap:
            common["logits_soft_cap"] = c.logits_soft_cap
        ragged = dict(common, causal=True, window_left=c.window_left if self.ragged_window else semantics.NO_WINDOW)
        indptr, indices, last = workloads.slice_page_table(w.kv_indptr_host, w.kv_indices_host, self.starts,
                                                           w.prefix_lens, w.page_size)
        paged = dict(common, causal=False, page_size=w.page_size)
        if self.prefix_mask:
            paged["custom_mask"] = self.prefix_visibility_mask()
        plans = {"ragged": ((qo_indptr, qo_indptr), ragged),
                 "paged": ((qo_indptr, indptr.to(i32), indices.to(i32), last), paged)}
        with ws.resource_errors():
            for part, (args, kwargs) in plans.items():
                if self.workspace_mib is None:
                    self.wrappers[part], self.sizes[part] = ws.plan_in_workspace(
                        self._new[part], self.wrappers[part], self.sizes[part], w.device, args, kwargs)
                else:
                    self.wrappers[part].plan(*args, **kwargs)
        self.workspace_mib = max(self.sizes.values()) // ws.MIB
        if not self.ragged_window:  # what SGLang's forward_return_lse(..., window_left=W) sets before run()
            self.wrappers["ragged"]._window_left = c.window_left
        self.resolved_backend = getattr(self.wrappers["ragged"], "_backend", self.backend)

    def run(self) -> None:
        w, c = self.w, self.w.case
        torch.index_select(w.k_store.view(-1, c.num_kv_heads, c.head_dim), 0, self.new_slots, out=self.k_new)
        torch.index_select(w.v_store.view(-1, c.num_kv_heads, c.head_dim), 0, self.new_slots, out=self.v_new)
        self.wrappers["ragged"].run(w.q, self.k_new, self.v_new, out=self.out, lse=self.lse_new, return_lse=True)
        self.wrappers["paged"].run(w.q, (w.k_store, w.v_store), out=self.prefix_out, lse=self.lse_prefix,
                                   return_lse=True)
        self.merge(self.out, self.lse_new, self.prefix_out, self.lse_prefix)


def _extend_unsupported(case, backend) -> str | None:
    if case.prefix_len is None or case.prefix_len == 0:
        return "the recipe's paged part needs a cached prefix (prefix_len > 0)"
    if case.window_left < 1:
        return "the recipe is SGLang's sliding-window path with a prefix to see (window_left >= 1)"
    return fi.unsupported(fi.Variant("paged", mask=True))(case, backend)


EXTEND_API = fi.missing_api([("BatchPrefillWithRaggedKVCacheWrapper", "plan", "window_left"),
                              ("BatchPrefillWithPagedKVCacheWrapper", "plan", "custom_mask")])


def _register_extend(name, summary, prefix_mask: bool, ragged_window: bool, kind="correct", visibility=None,
                     seen=None, garbled=None):
    def make(w, backend):
        with ws.resource_errors():
            return SGLangExtendRunner(w, backend, prefix_mask, ragged_window)

    extra = {k: v for k, v in (("visibility", visibility), ("seen", seen), ("garbled", garbled)) if v}
    register(Implementation(name, fi.LIBRARY.name, ("paged",), summary, make, kind=kind, wrapper="recipe",
                            backends=fi.BACKENDS, modes=("extend",), wrapper_modes=WRAPPER_MODES, needs_cuda=True,
                            unsupported=_extend_unsupported, available=EXTEND_API, **extra), __name__)


def _nomask_seen(case, qo_lens, kv_lens, backend: str) -> list:
    """What the recipe without the prefix mask shows each query: every key of the prefix table trimmed at the page
    holding the first query's window start, and the new tokens inside its own window."""
    masks = []
    for q, k in zip(qo_lens, kv_lens):
        mask = semantics.Visibility(case.window_left).mask(q, k)
        mask[:, semantics.trim_start(k - q, 0, case.window_left, case.page_size or 1):k - q] = True
        masks.append(mask)
    return masks


def _nomask_visibility(window_left, prefix_len, page_size):
    """The prefix part unmasked: every key from the trimmed table's first on (the interval hull of
    what each query sees; it differs from the exact window exactly where the union does)."""
    return semantics.Visibility(semantics.NO_WINDOW, first_key=semantics.trim_start(prefix_len, 0, window_left,
                                                                                     page_size))


_register_extend("sglang-extend", "SGLang's extend on a cached prefix: ragged (window at plan) for the new tokens + "
                 "paged over the prefix trimmed to W with its custom mask + merge_state", True, True)
_register_extend("sglang-extend-nomask", "SGLang's extend before PR 26513's mask: the prefix part unmasked, so "
                 "every query sees the whole prefix table (trimmed at the page of the first query's window start), "
                 "keys before its own window too", False, True, kind="known-bug", visibility=_nomask_visibility,
                 seen=_nomask_seen)
def _ragged_nowindow_seen(case, qo_lens, kv_lens, backend: str) -> list:
    """The recipe with its ragged part planned without a window and given W at run, as key intervals: a query whose
    window starts in the prefix sees it exactly (the prefix's mask, then every new token up to itself); one whose
    window starts among the new tokens sees them as a window handed only to run() shows them (``fa2_run_window.window_at_run``
    over the new tokens; the recipe plans its ragged part without ``uniform_q_len``)."""
    seen = []
    for (new_lo, _), q, k in zip(fa2_run_window.window_at_run(case, qo_lens, qo_lens, backend, hinted=False), qo_lens, kv_lens):
        positions = semantics.query_positions(q, k)
        exact = (positions - case.window_left).clamp_min(0)
        seen.append((torch.where(exact < k - q, exact, k - q + new_lo), positions))
    return seen


def _ragged_nowindow_garbled(case, qo_lens, kv_lens, backend: str) -> list:
    """The ragged part's rows merged out of step (``fa2_run_window.merged_out_of_step`` over the new tokens, one a page): a
    request whose new tokens' rows are garbled is wrong on every row once the parts are merged."""
    return fa2_run_window.merged_out_of_step(case, qo_lens, qo_lens, backend, page_size=1, hinted=False)


_register_extend("sglang-extend-ragged-nowindow", "SGLang's extend as written at 0005834c: the ragged part planned "
                 "without a window and given W at run, which starts each query tile's new tokens at its first "
                 "query's window: later queries of a tile see new tokens before their window",
                 True, False, kind="known-bug",
                 visibility=lambda w, prefix, ps: semantics.Visibility(w, latest_start=prefix),
                 seen=_ragged_nowindow_seen, garbled=_ragged_nowindow_garbled)


def sglang_serves(case, backend: str) -> str | None:
    """Why SGLang never runs its FlashInfer backend's SWA recipe on the case's model, or None."""
    return sglang_refuses(case.model or "")


def sglang_refuses(model: str) -> str | None:
    """Why SGLang never runs its FlashInfer backend's SWA recipe on ``model`` (a preset's name), or None (read in
    sglang 0.5.23): GPT-OSS is refused that backend (sinks), and Mistral's layers are full attention in SGLang."""
    if model.startswith("gpt-oss"):
        return ("SGLang does not serve GPT-OSS through its FlashInfer backend: it asserts one of triton, trtllm_mha, "
                "fa3, fa4 (FlashInfer takes no sinks there) and picks fa3 on Hopper (sglang 0.5.23: "
                "srt/arg_groups/model_hook.py, model_overrides/gpt_oss.py)")
    if model.startswith("mistral"):
        return ("SGLang runs Mistral's layers as full attention: MistralForCausalLM is LlamaForCausalLM, whose "
                "RadixAttention takes no sliding window (sglang 0.5.23: srt/models/mistral.py, llama.py)")
    return None


def _eagle_keys(case, qo_len, kv_len, page_size):
    """Keys the untrimmed verify keeps: the request's first min(prefix, W) + draft."""
    return min(kv_len - qo_len, case.window_left) + qo_len


def _eagle_visibility(window_left, prefix_len, page_size):
    """Query at p sees keys [0, p - max(0, prefix - W)]: the table cut at the wrong end."""
    return semantics.Visibility(semantics.NO_WINDOW, future=-max(0, prefix_len - window_left))


fi.register_variant("eagle-verify-untrimmed", "EAGLE verify on an SWA layer (SGLang issue 22679): KV length cut to "
                    "min(prefix, W) + draft, table not shifted (kv_start_idx missing): the request's first keys",
                    fi.Variant("paged", window_at_plan=False, end=_eagle_keys, modes=("verify",)), kind="known-bug",
                    visibility=_eagle_visibility, wrapper="recipe", module=__name__, also=sglang_serves)
