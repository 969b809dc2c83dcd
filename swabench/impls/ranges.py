"""FlashInfer's bidirectional-range wrapper on bidirectional blocks (the ``block`` axis: DFlash's draft block).

``BatchPrefillWithCausalBidirectionalRangesWrapper`` (0.7.2.post1 on, fa2, paged) keeps a key where
``(causal AND causal_window) OR (in_range AND range_window)``, with each query's inclusive ``[start, end]`` span
given per row to ``run()``.  ``ranges-window`` gives each query its block as its span, the window to the causal part
(``causal_window_left = W``, FlashInfer's ``window_left`` contract: ``N`` keeps ``N + 1`` keys) and leaves the spans
unclamped (``range_window_left = 0``; that argument counts keys, ``N`` keeps ``N``, deliberately not
``window_left``'s contract).  The wrapper evaluates its mask on every KV tile and sets its own window to the
request's length, so it skips no tile: it costs what non-causal attention over the whole table costs, whatever the
windows (``flashinfer/jit/attention/variants.py`` in 0.7.4).  No sinks, no soft-cap.
"""

from __future__ import annotations

import torch

from swabench.core.cases import WRAPPER_MODES
from .flashinfer_impls import FlashInferRunner, Variant, graph_buffers, missing_api, unsupported
from .flashinfer_library import LIBRARY
from .flashinfer_workspace import WORKSPACE_BYTES, resource_errors, workspace
from .registry import Implementation, register

WRAPPER = "BatchPrefillWithCausalBidirectionalRangesWrapper"


def block_spans(w) -> torch.Tensor:
    """Each query row's block, ``[first, last]`` key positions within its request: int32 ``[total_q, 2]``,
    contiguous (the wrapper refuses a copy, so the pointer stays put under CUDA-graph capture)."""
    c = w.case
    prefix = torch.tensor(w.prefix_lens, device=w.device)[w.query_request]
    first = prefix + (w.query_position - prefix) // c.block * c.block
    last = torch.minimum(first + c.block - 1, torch.tensor(w.kv_lens, device=w.device)[w.query_request] - 1)
    return torch.stack([first, last], dim=1).to(torch.int32).contiguous()


class RangesRunner(FlashInferRunner):
    """The ranges wrapper planned on the whole table (no ``window_left``, no ``causal``: its variant owns the
    mask), run with each query's block as its span."""

    def __init__(self, w, backend: str):
        import flashinfer

        c = w.case
        self.w, self.resolved_backend = w, backend
        self.graph_wrapper = c.wrapper_mode == "cuda-graph"
        self.out = torch.empty_like(w.q)
        bufs = graph_buffers(w, paged=True) if self.graph_wrapper else {}
        cls = getattr(flashinfer, WRAPPER)  # its JIT module is chosen at construction: dtypes and head_dim
        self._new_wrapper = lambda space: cls(space, "NHD", q_data_type=w.dtype, kv_data_type=w.kv_dtype,
                                              head_dim_qk=c.head_dim, head_dim_vo=c.head_dim, **bufs)
        self._workspace_bytes = WORKSPACE_BYTES
        with resource_errors():
            self.wrapper = self._new_wrapper(workspace(w.device, WORKSPACE_BYTES))
        self.workspace_mib = None
        self.spans = block_spans(w)

    def plan(self) -> None:
        w, c, i32 = self.w, self.w.case, torch.int32
        args = (torch.tensor(w.qo_indptr_host, dtype=i32), w.kv_indptr_host.to(i32), w.kv_indices_host.to(i32),
                w.kv_last_page_len.cpu())
        self._plan(args, dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim_qk=c.head_dim,
                              page_size=w.page_size, sm_scale=w.sm_scale, q_data_type=w.dtype,
                              kv_data_type=w.kv_dtype))
        self.layout = ("cuda-graph" if self.graph_wrapper else "plain") + f", spans of {c.block}"

    def run(self) -> None:
        w = self.w
        self.wrapper.run(w.q, (w.k_store, w.v_store), self.spans, causal_window_left=w.case.window_left,
                         range_window_left=0, out=self.out)


def _unsupported(case, backend: str) -> str | None:
    if case.logits_soft_cap:
        return "the ranges wrapper takes no soft-cap (its plan() refuses logits_soft_cap)"
    return unsupported(Variant("paged"))(case, backend)


register(Implementation(
    "ranges-window", LIBRARY.name, ("paged",),
    "BatchPrefillWithCausalBidirectionalRangesWrapper: each query's block as its span (range_window_left=0), "
    "run(causal_window_left=W); its mask is evaluated on every KV tile, none skipped",
    RangesRunner, wrapper="ranges", backends=("fa2",), modes=("extend", "verify", "draft_extend"),
    requires=frozenset({"block"}), wrapper_modes=WRAPPER_MODES, needs_cuda=True, unsupported=_unsupported,
    available=missing_api([(WRAPPER, "run", "range_window_left")]), block=True), __name__)
