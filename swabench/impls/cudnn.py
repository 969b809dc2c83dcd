"""cuDNN's fused attention, two ways an engine reaches it: through FlashInfer's ``flashinfer.cudnn`` entry points, which
build and cache a cuDNN graph per shape, and through the cuDNN frontend's own graph (``import cudnn``), as an engine
that calls cuDNN itself does.  Both read the suite's NHD pages as cuDNN's ``[pages, heads, page_size, dim]`` (a
strided view, no copy).

cuDNN counts its window in keys: with bottom-right alignment, ``diagonal_band_left_bound = B`` keeps the keys ``j``
with ``p - j < B`` (``attn_score_modifiers.h``'s sliding-window mask: ``col + B - (s_kv - s_q) > row``), B keys
ending at the diagonal.  FlashInfer's ``window_left = W`` is ``B = W + 1`` (``flashinfer/cudnn/prefill.py`` says
so: "passing W unchanged drops the oldest key of every window"); B = W is the known mistake.

- ``cudnn-prefill``: ``flashinfer.prefill.cudnn_batch_prefill_with_kv_cache`` (paged through ``block_tables``, ragged
  through ``batch_offsets_k``), every step with queries in a block; ``window_left=None`` for no window (-1 is no
  "off" there).
- ``cudnn-decode``: ``flashinfer.decode.cudnn_batch_decode_with_kv_cache``, decode and verify chains
  (``q_len_per_req``, one draft length for the batch).
- ``cudnn-graph``: the frontend's ``sdpa`` graph with paged K/V tables, ragged query offsets, per-request lengths,
  ``diagonal_band_left_bound = W + 1`` and ``diagonal_band_right_bound = 0``, bottom-right.
- ``cudnn-graph-band-w``: the same graph with ``diagonal_band_left_bound = W`` (a known bug).

Sinks are ``sink_token`` (one logit a query head, in the scaled logits' units); cuDNN refuses a sink on a graph
declared with one query a request on Hopper (``sdpa_support_surface.h``: "decode only mode ... not supported with
sink_token").  No cuDNN path takes a soft-cap with paging (a score modifier excludes the padding mask paging needs).
A graph is built on the first call of its shape: the first plan makes that call and records it as ``compile_s``.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch

from swabench.core import semantics, workloads
from .flashinfer_library import CUDNN, LIBRARY as FLASHINFER, has_api
from .flashinfer_workspace import MIB, resource_errors
from .implementation import first_call
from .library import Library, not_importable
from .registry import Implementation, Unsupported, register, register_library

WORKSPACE_BYTES = 128 * MIB  # FlashInfer's suggestion for its cuDNN entry points
DTYPES = ("bfloat16", "float16")
QUERY_MODES = ("extend", "verify", "draft_extend", "mixed")  # a block of queries a request
SINK_ONE_QUERY = "cuDNN on Hopper takes no sink on a graph declared with one query a request (sdpa_support_surface.h)"
OLDEST = 91300  # the cuDNN library these paths need: sink_token from 9.13 (paged K/V 9.5, ragged queries with it 9.7)
INT32_MAX = 2 ** 31 - 1  # cuDNN's ragged offsets are int32 elements


def _dotted(version: int) -> str:
    """cuDNN's version number (91900) as its release (9.19.0)."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def _library_version() -> str | None:
    """The cuDNN library the frontend loaded (the frontend's own release is the distribution's)."""
    if not_importable("cudnn", "nvidia-cudnn-frontend"):
        return None
    import cudnn

    try:
        return _dotted(cudnn.backend_version())
    except Exception:  # no libcudnn it can load
        return None


LIBRARY = register_library(Library(CUDNN, distributions=("nvidia-cudnn-frontend",), module="cudnn",
                                   backends=(CUDNN,), opt_in=(CUDNN,), served=(CUDNN,), underneath=_library_version))


@lru_cache(maxsize=1)
def _frontend_error() -> str | None:
    missing = not_importable("cudnn", "nvidia-cudnn-frontend")
    if missing:
        return missing
    import cudnn

    try:
        version = cudnn.backend_version()
    except Exception as e:  # no libcudnn it can load
        return f"the cuDNN frontend loads no cuDNN library ({type(e).__name__}: {e}); install nvidia-cudnn-cu13"
    if version < OLDEST:
        return (f"cuDNN {_dotted(version)} is loaded; these paths need 9.13 or later (sink_token; paged K/V with "
                f"ragged queries): put the nvidia-cudnn-cu13 wheel's library first")
    return None


def band(window_left: int, counted: bool = True) -> int | None:
    """cuDNN's ``diagonal_band_left_bound`` for FlashInfer's ``window_left``: W + 1 keys (W where the window is
    given uncounted, the mistake), None for no window."""
    return None if window_left < 0 else window_left + counted


def paged_view(store: torch.Tensor) -> torch.Tensor:
    """The suite's NHD pages ``[pages, page_size, heads, dim]`` as cuDNN's ``[pages, heads, page_size, dim]``."""
    return store.transpose(1, 2)


def _lengths(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device).view(-1, 1, 1, 1)


def _table(w) -> torch.Tensor:
    """The block table, exactly ``ceil(max kv_len / page_size)`` wide (cuDNN's rule for an unpacked table)."""
    return workloads.block_tables(w.kv_indptr_host, w.kv_indices_host).to(w.device)


class CudnnRunner:
    """One cuDNN call a step; its first call (a graph built for the shape) made at the first plan and recorded apart.
    A graph cuDNN declines for the step is a skip with cuDNN's words, as is a step it cannot take: a sink where the
    step's longest query block is one query (an acceptance draw of one token), offsets past int32."""

    def __init__(self, w):
        self.w = w
        self.out = torch.empty_like(w.q)
        self.resolved_backend = CUDNN
        self.compile_s = None

    def plan(self) -> None:
        w = self.w
        if w.sinks is not None and max(w.qo_lens) == 1:
            raise Unsupported(SINK_ONE_QUERY)
        offset = [w.q] + ([w.k_store] if w.case.storage == "ragged" else [])  # pages are reached through tables
        if max(x.numel() for x in offset) > INT32_MAX:
            raise Unsupported("cuDNN's ragged offsets are int32 elements: this step's queries or keys hold more")
        try:
            self._plan()
            self.compile_s = first_call(self, self.compile_s)
        except Exception as e:
            if type(e).__name__ == "cudnnGraphNotSupportedError":
                raise Unsupported(f"cuDNN declines the graph: {str(e).strip().splitlines()[0][:300]}") from e
            raise

    def _plan(self) -> None:
        raise NotImplementedError


class ThroughFlashInfer(CudnnRunner):
    """FlashInfer's cuDNN entry points, which take a scratch workspace."""

    def __init__(self, w):
        super().__init__(w)
        with resource_errors():
            self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=w.device)


class FlashInferCudnnPrefill(ThroughFlashInfer):
    def _plan(self) -> None:
        w, c = self.w, self.w.case
        rows = c.num_qo_heads * c.head_dim
        self.args = dict(max_token_per_sequence=max(w.qo_lens), max_sequence_kv=max(w.kv_lens),
                         actual_seq_lens_q=_lengths(w.qo_lens, w.device),
                         actual_seq_lens_kv=_lengths(w.kv_lens, w.device),
                         batch_offsets_q=w.qo_indptr * rows, batch_offsets_o=w.qo_indptr * rows)
        if c.storage == "paged":
            self.kv = paged_view(w.k_store), paged_view(w.v_store)
            self.args["block_tables"] = _table(w)
        else:
            self.kv = w.k_store, w.v_store
            offsets = w.kv_indptr * (c.num_kv_heads * c.head_dim)
            self.args.update(batch_offsets_k=offsets, batch_offsets_v=offsets)

    def run(self) -> None:
        import flashinfer

        w = self.w
        flashinfer.prefill.cudnn_batch_prefill_with_kv_cache(
            w.q, *self.kv, w.sm_scale, self.workspace, **self.args, causal=True, return_lse=False, out=self.out,
            window_left=None if w.case.window_left < 0 else w.case.window_left, sinks=w.sinks)


class FlashInferCudnnDecode(ThroughFlashInfer):
    def _plan(self) -> None:
        w = self.w
        self.table = _table(w)
        self.max_kv = self.table.shape[1] * w.page_size  # cuDNN's rule: the table is ceil(max_kv / page_size) wide
        self.seq_lens = _lengths(w.kv_lens, w.device)
        self.q_len = w.qo_lens[0]

    def run(self) -> None:
        import flashinfer

        w = self.w
        flashinfer.decode.cudnn_batch_decode_with_kv_cache(
            w.q, paged_view(w.k_store), paged_view(w.v_store), w.sm_scale, self.workspace,
            max_sequence_kv=self.max_kv, actual_seq_lens_kv=self.seq_lens, block_tables=self.table,
            is_cuda_graph_compatible=True, out=self.out, q_len_per_req=self.q_len, window_left=w.case.window_left,
            sinks=w.sinks)


@lru_cache(maxsize=256)
def _handle(device: int, thread: int):
    """A cuDNN handle for a device and a thread: a handle is not to be shared between threads (the warm-up builds in
    several)."""
    import cudnn

    return cudnn.create_handle()


def handle(device: torch.device):
    return _handle(device.index or 0, threading.get_ident())


class FrontendGraph(CudnnRunner):
    """The frontend's SDPA graph, built for the step's shape as an engine builds it (once a shape, then executed):
    paged K/V through per-request tables, queries and output packed through element offsets, per-request lengths
    for the padding mask, the window as a bottom-right band."""

    def __init__(self, w, counted: bool):
        super().__init__(w)
        self.counted = counted
        self.graph = None

    def _plan(self) -> None:
        import cudnn

        w, c = self.w, self.w.case
        table = _table(w)
        batch, pages = table.shape
        rows = c.num_qo_heads * c.head_dim
        self.tensors = dict(q=w.q, k=paged_view(w.k_store), v=paged_view(w.v_store), o=self.out,
                            q_off=(w.qo_indptr * rows).view(-1, 1, 1, 1), o_off=(w.qo_indptr * rows).view(-1, 1, 1, 1),
                            k_table=table.view(batch, 1, pages, 1), v_table=table.view(batch, 1, pages, 1),
                            q_lens=_lengths(w.qo_lens, w.device), kv_lens=_lengths(w.kv_lens, w.device))
        if w.sinks is not None:
            self.tensors["sinks"] = w.sinks.view(1, -1, 1, 1)
        if self.graph is not None:
            return
        io = cudnn.datatypes._torch_to_cudnn_data_type(w.q.dtype)
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle(w.device))
        s_q, s_kv = max(w.qo_lens), pages * w.page_size
        t = {name: g.tensor_like(x) for name, x in self.tensors.items() if name not in ("q", "o")}
        t["q"] = g.tensor(name="q", dim=[batch, c.num_qo_heads, s_q, c.head_dim],
                          stride=[rows, c.head_dim, rows, 1], data_type=io)
        t["q"].set_ragged_offset(t["q_off"])
        bound = band(c.window_left, self.counted)
        o, _ = g.sdpa(name="sdpa", q=t["q"], k=t["k"], v=t["v"], attn_scale=w.sm_scale, generate_stats=False,
                      use_padding_mask=True, seq_len_q=t["q_lens"], seq_len_kv=t["kv_lens"],
                      diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0,
                      **({"diagonal_band_left_bound": bound} if bound is not None else {}),
                      **({"sink_token": t["sinks"]} if "sinks" in t else {}),
                      paged_attention_k_table=t["k_table"], paged_attention_v_table=t["v_table"],
                      paged_attention_max_seq_len_kv=s_kv, compute_data_type=cudnn.data_type.FLOAT)
        o.set_output(True).set_dim([batch, c.num_qo_heads, s_q, c.head_dim]) \
            .set_stride([s_q * rows, c.head_dim, rows, 1]).set_data_type(io)
        o.set_ragged_offset(t["o_off"])
        t["o"] = o
        with resource_errors():
            g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            self.graph_workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=w.device)
        self.graph, self.graph_tensors = g, t

    def run(self) -> None:
        import cudnn

        h = handle(self.w.device)
        cudnn.set_stream(h, torch.cuda.current_stream(self.w.device).cuda_stream)
        self.graph.execute({self.graph_tensors[name]: x for name, x in self.tensors.items()}, self.graph_workspace,
                           handle=h)


def _cudnn_limits(case) -> str | None:
    """What no cuDNN path here takes, from its sources."""
    if case.dtype not in DTYPES or case.kv_dtype not in (None, case.dtype):
        return "cuDNN's Hopper attention takes bfloat16 or float16 queries and caches of one dtype here"
    if case.logits_soft_cap:
        return ("cuDNN takes no soft-cap with paging (a score modifier excludes the padding mask; "
                "sdpa_support_surface.h)")
    if case.head_dim % 8 or case.head_dim > 256:
        return f"cuDNN's Hopper attention takes head_dim a multiple of 8 up to 256, not {case.head_dim}"
    return None


def _one_query(case) -> bool:
    """Whether every request of the case has one query (an acceptance draw of one is found at plan)."""
    return case.mode == "decode" or (isinstance(case.qo_len, int) and case.qo_len == 1 and case.mode != "mixed")


def _unsupported(case, backend: str) -> str | None:
    """A path that declares its graph with the step's longest query block."""
    return SINK_ONE_QUERY if case.sinks and _one_query(case) else _cudnn_limits(case)


def _decode_unsupported(case, backend: str) -> str | None:
    if not isinstance(case.qo_len, int):
        return "cudnn_batch_decode_with_kv_cache takes one draft length for the batch (its q_len_per_req)"
    return SINK_ONE_QUERY if case.sinks and case.qo_len == 1 else _cudnn_limits(case)


def _band_w_unsupported(case, backend: str) -> str | None:
    if case.window_left == 0:
        return "cuDNN takes a left bound of 1 or more: W = 0 given uncounted is no graph"
    return _unsupported(case, backend)


def _through_flashinfer(api: str):
    """``available`` of a path through ``flashinfer.cudnn``: the release has the entry point and the frontend loads."""
    has = has_api(api)
    return lambda: has() or _frontend_error()


def _register_graph(name: str, counted: bool, summary: str, **roles) -> None:
    register(Implementation(
        name, CUDNN, ("paged",), summary, lambda w, backend: FrontendGraph(w, counted), backends=(CUDNN,),
        needs_cuda=True, available=_frontend_error, unsupported=_unsupported if counted else _band_w_unsupported,
        **roles), __name__)


register(Implementation(
    "cudnn-prefill", FLASHINFER.name, ("paged", "ragged"), "cuDNN through flashinfer.cudnn's batch prefill "
    "(window_left=W, which it hands cuDNN as a band of W + 1 keys)", lambda w, backend: FlashInferCudnnPrefill(w),
    wrapper="cudnn",
    backends=(CUDNN,), modes=QUERY_MODES, needs_cuda=True, unsupported=_unsupported,
    available=_through_flashinfer("prefill.cudnn_batch_prefill_with_kv_cache")), __name__)
register(Implementation(
    "cudnn-decode", FLASHINFER.name, ("paged",), "cuDNN through flashinfer.cudnn's batch decode, a chain of "
    "q_len_per_req queries a request", lambda w, backend: FlashInferCudnnDecode(w), wrapper="cudnn", backends=(CUDNN,),
    modes=("decode", "verify"), needs_cuda=True, unsupported=_decode_unsupported,
    available=_through_flashinfer("decode.cudnn_batch_decode_with_kv_cache")), __name__)
_register_graph("cudnn-graph", True, "the cuDNN frontend's paged SDPA graph, built as an engine builds it, with "
                "diagonal_band_left_bound = W + 1")
_register_graph("cudnn-graph-band-w", False, "the cuDNN frontend's graph given diagonal_band_left_bound = W, where "
                "cuDNN counts keys: each query loses the oldest key of its window", kind="known-bug",
                visibility=lambda w, prefix, ps: semantics.Visibility(w - 1 if w > 0 else semantics.NO_WINDOW))
