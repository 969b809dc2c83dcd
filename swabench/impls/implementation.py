"""What one implementation is.  An implementation is a recipe: ``make(workload, backend)`` returns a Runner whose
``plan()`` does the host-side work a serving step pays (timed apart) and whose ``run()`` launches the attention into
a pre-allocated ``out`` (gated, then timed).  Beside it, an ``Implementation`` declares where it runs, what it
computes (so where it must fail), and the role it plays in the results.  ``registry`` holds them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Protocol

from swabench.core import semantics, trees

if TYPE_CHECKING:
    import torch


class Runner(Protocol):
    out: torch.Tensor
    resolved_backend: str

    def plan(self) -> None: ...

    def run(self) -> None: ...


def first_call(runner, recorded: float | None) -> float:
    """The seconds of a runner's first call, made at its first plan (a kernel compiled, a graph built for the
    shape): what ``compile_s`` records, apart from the plan and run times, which never include it; ``recorded``
    where it was made already."""
    if recorded is not None:
        return recorded
    import time

    import torch

    started = time.perf_counter()
    runner.run()
    torch.cuda.synchronize(runner.w.device)
    return time.perf_counter() - started


def exact(window_left: int, prefix_len: int, page_size: int) -> semantics.Visibility:
    return semantics.Visibility(window_left)


def computed(case, prefix_len: int, visibility=exact, chunk_visibility=None) -> semantics.Visibility:
    """What a path with these visibilities computes for one request of ``case`` (``prefix_len`` keys before
    its queries): on a chunked case its chunk visibility (the exact chunk where it has none), else its
    window visibility with the case's causality."""
    page_size = case.page_size or 1
    if case.attention_chunk:
        return chunk_visibility(case.attention_chunk, prefix_len, page_size) if chunk_visibility \
            else semantics.of_case(case)
    return dataclasses.replace(visibility(case.window_left, prefix_len, page_size), causal=case.causal,
                               block=case.block)


@dataclass(frozen=True)
class Implementation:
    name: str
    library: str
    storages: tuple[str, ...]
    summary: str
    make: Callable[..., Runner]
    kind: str = "correct"
    wrapper: str = ""  # the wrapper family it goes through (prefill, decode, sink, recipe); "" = its library
    backends: tuple[str, ...] = ()  # its library's backends it has kernels for (a scenario makes no point on
    # another); () = the library has no backends
    modes: tuple[str, ...] = ()  # the serving steps it models (a scenario makes no point of another); () = every one
    requires: frozenset[str] = frozenset()  # case features it exists for (the sink wrapper: sinks), as modes
    # how its wrappers can be built (Case.wrapper_mode), as modes: a path with no wrapper has the one way,
    # captured for timing as every path is
    wrapper_modes: tuple[str, ...] = ("cuda-graph",)
    needs_cuda: bool = False
    # What the implementation actually computes, as (window_left, prefix_len, page_size) -> Visibility.
    # Known bugs and planted mistakes differ from the exact semantics; that is how the gate knows
    # where each must fail.
    visibility: Callable[[int, int, int], semantics.Visibility] = exact
    unsupported: Callable[..., str | None] = lambda case, backend: None
    available: Callable[[], str | None] = lambda: None  # None = usable here, else why not
    # For an implementation whose kernels are compiled inside the process that first runs them
    # (Inductor): case -> which compiled kernel the case runs.  Points share a compile only when
    # they run in one worker, so sharding gathers them (shards._units).  None: nothing compiled.
    compile_class: Callable[..., Hashable] | None = None
    # What else names the JIT module a case runs, beyond its dtype, head_dim, window and features (XQA builds one
    # module per page size, head group and draft length): case -> a label; None: nothing else.
    module_key: Callable[..., str] | None = None
    # Roles.  baseline: the naive path that ``speedup_vs_mask`` of its library's paths on its storages
    # divides.  reference: the backend on which this implementation is the path every other path of
    # its storage is compared with ("against fa2's window path").
    baseline: bool = False
    reference: str | None = None
    # peer: another library's way to run the layer, timed beside the engines' paths (FlexAttention, a batched
    # SDPA call); a whole-model price leaves it out, since no engine serves its layers that way.
    peer: bool = False
    # A known bug whose mistake cannot show on a point (must_fail is False there) computes the exact
    # answer there; when engines run it that way (SGLang's decode recipe at page size 1), time it.
    timed_where_exact: bool = False
    # Case features (Case.features) this known bug takes and does not apply: it must fail on every
    # point whose case uses one, whatever its visibility.
    ignores: frozenset[str] = frozenset()
    # Whether it takes non-causal windows (Case.causal False: every key of the request from p - W on);
    # a path that does not skips such a case, saying so.
    noncausal: bool = False
    # Whether it takes chunked local attention (Case.attention_chunk > 0: a query sees its own chunk);
    # a path that does not skips such a case, saying so.
    chunked: bool = False
    # What it computes on a chunked case, as (chunk, prefix_len, page_size) -> Visibility, where that is
    # not the exact chunk (a chunk planned as a window is the natural mistake).
    chunk_visibility: Callable[[int, int, int], semantics.Visibility] | None = None
    # Whether it verifies draft trees (Case.tree): a path that does not skips such a case, saying so.
    tree: bool = False
    # Whether it takes bidirectional blocks (Case.block > 0: DFlash's draft block); a path that does not skips
    # such a case, saying so.
    block: bool = False
    # What it shows each query where no Visibility says it (a mask read out of step with its table, a window that
    # reaches the kernel only at run()): (case, qo_lens, kv_lens, backend) -> per request, a bool [qo_len, kv_len]
    # mask over the request's key positions, or where each query sees one run of keys, the pair of int tensors
    # (lo, hi): query j sees keys lo[j] through hi[j] (cheap to hold against the exact window at any length).
    seen: Callable[..., list] | None = None
    # Rows the library writes out of step whatever the keys say (a split request's partial rows merged at the wrong
    # stride): (case, qo_lens, kv_lens, backend) -> per request a bool tensor, True where the row's output is
    # another row's; such a row is wrong wherever it occurs, and no key set says what it holds.
    garbled: Callable[..., list] | None = None

    @property
    def family(self) -> str:
        """The ``wrapper`` column: the wrapper family, else the library."""
        return self.wrapper or self.library

    @property
    def expected_to_fail(self) -> bool:
        return self.kind != "correct"

    def must_fail(self, case, qo_lens, kv_lens, backend: str) -> bool:
        """Whether some query of this workload sees a different key set than the exact semantics on ``backend``."""
        return self.expected_to_fail and any(bool(rows.any())
                                             for rows in self.rows_wrong(case, qo_lens, kv_lens, backend))

    def rows_wrong(self, case, qo_lens, kv_lens, backend: str) -> list:
        """Per request, which of its queries see a different key set on this path and backend than the exact
        semantics (every query where the case uses a feature it ignores): a bool tensor each, all False on a correct
        path."""
        import torch

        if not self.expected_to_fail or self.ignores & case.features:
            return [torch.full((q,), self.expected_to_fail) for q in qo_lens]
        rows = self._against_truth(case, qo_lens, kv_lens, backend, _rows_off, semantics.rows_differ)
        return [r | g for r, g in zip(rows, self.garbled_rows(case, qo_lens, kv_lens, backend))]

    def garbled_rows(self, case, qo_lens, kv_lens, backend: str) -> list:
        """Per request, the rows the library writes out of step (``garbled``): all False where it has no such hook."""
        import torch

        return self.garbled(case, qo_lens, kv_lens, backend) if self.garbled \
            else [torch.zeros(q, dtype=torch.bool) for q in qo_lens]

    def keys_lost(self, case, qo_lens, kv_lens, backend: str) -> tuple[int, float]:
        """(the most keys of its window one query misses, the share of queries that miss any), from what this
        path computes on ``backend`` against the exact semantics: 0 for a correct path."""
        if not self.expected_to_fail:
            return 0, 0.0
        missed = self._against_truth(case, qo_lens, kv_lens, backend, _missed, semantics.keys_missed)
        rows = [int(x) for m in missed for x in m]
        return max(rows, default=0), sum(x > 0 for x in rows) / max(1, len(rows))

    def _against_truth(self, case, qo_lens, kv_lens, backend: str, by_seen, by_visibility) -> list:
        """Per request, ``by_seen(seen, truth, qo_len, kv_len, tree)`` where the path says what each query sees
        (``seen``), else ``by_visibility(what it computes, truth, qo_len, kv_len, tree)``."""
        truth, drafts = semantics.of_case(case), trees.of_case(case) or [None] * len(qo_lens)
        if self.seen:
            return [by_seen(seen, truth, q, k, t)
                    for seen, q, k, t in zip(self.seen(case, qo_lens, kv_lens, backend), qo_lens, kv_lens, drafts)]
        return [by_visibility(self.computes(case, k - q), truth, q, k, t) for q, k, t in zip(qo_lens, kv_lens, drafts)]

    def seen_masks(self, case, qo_lens, kv_lens, backend: str) -> list:
        """``seen`` as one bool mask per request, whichever form the path gives it in."""
        return [_mask(seen, k) for seen, k in zip(self.seen(case, qo_lens, kv_lens, backend), kv_lens)]

    def computes(self, case, prefix_len: int) -> semantics.Visibility:
        """What it computes for one request of ``case`` with ``prefix_len`` keys before its queries."""
        return computed(case, prefix_len, self.visibility, self.chunk_visibility)

    def availability(self, device: torch.device) -> str | None:
        """Why this implementation cannot run on this device at all, or None."""
        if self.needs_cuda and device.type != "cuda":
            return f"{self.library} needs CUDA (device is {device.type})"
        return self.available()

    def models(self, storage: str, mode: str, features: frozenset[str], wrapper_mode: str = "cuda-graph") -> bool:
        """Whether a scenario makes a point of this implementation on such a step: its storage, a mode it
        models, a case with the features it exists for, a wrapper mode it has (the rest of what it cannot
        run is a skip row)."""
        return self.unmodelled(storage, mode, features, wrapper_mode) is None

    def unmodelled(self, storage: str, mode: str, features: frozenset[str], wrapper_mode: str,
                   backends=None) -> str | None:
        """Why a scenario makes no point of this implementation on such a step through any of ``backends`` (None
        where it makes one), as its skip rows say it."""
        if storage not in self.storages:
            return f"runs on {' or '.join(self.storages)} storage, not {storage}"
        if self.modes and mode not in self.modes:
            return f"models {' and '.join(self.modes)} steps, not {mode}"
        if backends is not None and not self.runs_on(backends):
            return f"has kernels on {' and '.join(self.backends)} only, not {' or '.join(backends)}"
        if self.requires - features:
            return f"runs only cases with {' and '.join(sorted(self.requires - features))}"
        if wrapper_mode not in self.wrapper_modes:
            return f"has no wrapper to build {wrapper_mode} (wrapper_mode is how FlashInfer's wrappers are built)"
        return None

    def runs_on(self, backends) -> list[str]:
        """The backends of ``backends`` this implementation has kernels for (its library's name when the
        library has no backends): the points a scenario makes of it."""
        return [b for b in backends if b in self.backends] if self.backends else [self.library]

    def skip_reason(self, case, backend: str, device: torch.device | None) -> str | None:
        """Why this point cannot run here (recorded as a skip row), or None; with no ``device``, why it
        cannot run anywhere, whatever is installed here."""
        unmodelled = self.unmodelled(case.storage, case.mode, case.features, case.wrapper_mode, [backend])
        if unmodelled:
            return unmodelled
        if not case.causal and not self.noncausal:
            return "takes causal windows only"
        if case.attention_chunk and not self.chunked:
            return "takes no chunked attention (attention_chunk)"
        if case.tree not in (None, trees.CHAIN) and not self.tree:
            return "verifies chains only: it has no draft-tree mask (tree)"
        if case.block and not self.block:
            return "takes no bidirectional blocks (block)"
        return (self.availability(device) if device is not None else None) or self.unsupported(case, backend)


def _mask(seen, kv_len: int):
    """One request's ``seen`` as a bool mask, where it was given as key intervals."""
    return semantics.interval_mask(*seen, kv_len) if isinstance(seen, tuple) else seen


def _rows_off(seen, truth: semantics.Visibility, qo_len: int, kv_len: int, tree) -> torch.Tensor:
    """Per query of a request, whether what it is ``seen`` to see differs from ``truth``'s (by interval, where it
    can)."""
    if isinstance(seen, tuple) and tree is None:
        return semantics.intervals_differ(*seen, *truth.interval(semantics.query_positions(qo_len, kv_len), kv_len))
    return (_mask(seen, kv_len) != truth.mask(qo_len, kv_len, tree=tree)).any(dim=1)


def _missed(seen, truth: semantics.Visibility, qo_len: int, kv_len: int, tree) -> torch.Tensor:
    """Per query of a request, how many keys of ``truth``'s what it is ``seen`` to see leaves out."""
    if isinstance(seen, tuple) and tree is None:
        return semantics.interval_missed(*seen, *truth.interval(semantics.query_positions(qo_len, kv_len), kv_len))
    return (truth.mask(qo_len, kv_len, tree=tree) & ~_mask(seen, kv_len)).sum(dim=1)
