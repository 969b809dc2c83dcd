"""Run a scenario: for each case build the workload once, then for each implementation
plan -> gate -> time, and hand every finished row to the store before moving on.

Library code: it yields rows and never prints; the CLI draws the progress bar.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import torch

from swabench.core import footprint, gate, semantics, trees, workloads
from swabench.measure import clocks, counters, timing
from swabench.core.cases import Case, Point
from swabench.errors import first_line
from swabench.impls import registry, upstream
from swabench.measure.markers import nvtx_range, point_range_name
from swabench.run import memory, signals
from swabench.run.verdict import verdict, xpass_note
from swabench.inputs.axes import make_case

HOST = socket.gethostname()
PLAN_TIMER = timing.HostTimerOptions(warmup=1, min_repeats=3, max_repeats=50, budget_s=0.05)
MAX_TINY_DRAFT = 16  # a warm-up case keeps a draft length up to this, so a module built per draft length is the one


@dataclass(frozen=True)
class SweepOptions:
    device: torch.device
    timed: bool = True  # False: gate only (``swabench check``)
    host_timer: timing.HostTimerOptions = field(default_factory=timing.HostTimerOptions)
    graph_timer: timing.GraphTimerOptions = field(default_factory=timing.GraphTimerOptions)
    unbuildable: dict = field(default_factory=dict)  # module signature -> why the warm-up could not build it
    counted: bool = False  # one counted call per gated point, for Nsight Compute (``measure.counters``)

    @property
    def kernel_timer(self) -> str:
        return "cuda-graph" if self.device.type == "cuda" else "host"


def timer_method(options: SweepOptions) -> dict:
    """How every number of the run was measured, for meta.json."""
    kernel = options.graph_timer.describe() if options.kernel_timer == "cuda-graph" else options.host_timer.describe()
    untimed = "one call per gated point counted under Nsight Compute (not timed)" if options.counted \
        else "not timed (gate only)"
    return {"kernel_time": kernel if options.timed else untimed,
            "clocks": "NVML's SM clock and clocks-event reasons read before and after each timed point; "
                      "throttled = a power or thermal reason in either reading, or NVML's violation time grew",
            "plan_time": f"host wall clock of plan(), median of {PLAN_TIMER.min_repeats}+ calls after "
                         f"{PLAN_TIMER.warmup} warm-up (the warm-up absorbs module loading)",
            "gate": "random N(0,1) pass + probe passes (swabench.core.probes) against the reference "
                    "(float64 on CPU, float32 on GPU); output poisoned with NaN before each call",
            "tolerances": {k: vars(v) for k, v in gate.TOLERANCES.items()}}


def base_row(point: Point, w: workloads.Workload | None, device: torch.device, lengths=None) -> dict:
    """Every axis of the point, and the counts that do not depend on timing (from the workload, or from
    the case's ``lengths`` where none was built)."""
    impl, c = registry.get(point.impl), point.case
    row = {"case_id": c.case_id, "case": c.label, "impl": point.impl, "kind": impl.kind, "library": impl.library,
           "wrapper": impl.family, "backend": point.backend, "device": str(device), "host": HOST,
           "gpu_id": gpu_identity(device), **c.axes()}
    if w is not None or lengths is not None:
        qo_lens, kv_lens = (w.qo_lens, w.kv_lens) if w is not None else lengths
        drafts = trees.of_case(c) or [None] * len(qo_lens)
        pairs = sum(semantics.useful_pairs(q, k, c.window_left, c.causal, c.attention_chunk, t, c.block)
                    for q, k, t in zip(qo_lens, kv_lens, drafts))
        page = c.page_size if c.storage == "paged" and c.page_size else 1
        read, written = semantics.minimum_traffic(qo_lens, kv_lens, c.window_left, c.num_qo_heads, c.num_kv_heads,
                                                  c.head_dim, footprint.ELEMENT_BYTES[c.dtype],
                                                  footprint.ELEMENT_BYTES[c.cache_dtype], c.attention_chunk, page)
        row.update(total_qo=sum(qo_lens), total_kv=sum(kv_lens), pairs=pairs,
                   flops=semantics.attention_flops(pairs, c.head_dim, c.num_qo_heads),
                   min_bytes=read + written, min_read_bytes=read,
                   must_fail=impl.must_fail(c, qo_lens, kv_lens, point.backend))
        row["keys_lost"], row["rows_losing"] = impl.keys_lost(c, qo_lens, kv_lens, point.backend)
    return row


def gpu_identity(device: torch.device) -> str | None:
    """Which physical GPU ran the row: the index a multi-GPU launch gave the worker."""
    if device.type != "cuda":
        return None
    return os.environ.get("SWABENCH_GPU_ID") or os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]


def skip_reason(point: Point, options: SweepOptions) -> str | None:
    """Why the point skips whatever its data (the device, the library, a module the warm-up could not
    build), or None: known before its case's workload is built."""
    skip = registry.get(point.impl).skip_reason(point.case, point.backend, options.device)
    failed = options.unbuildable.get(module_signature(point))
    return skip or (f"resource: the module could not be built in the warm-up ({failed})" if failed else None)


def measure_point(point: Point, w: workloads.Workload, options: SweepOptions, skip: str | None) -> dict:
    """One point's row: ``skip`` (its skip_reason, known before the workload was built), or gated and timed."""
    impl = registry.get(point.impl)
    row = base_row(point, w, options.device)
    if skip:
        return {**row, "status": "skip", "reason": skip}
    sync = timing.device_sync(options.device)
    bug = upstream.speaks(point.impl, point.case, point.backend, row["must_fail"])
    row["upstream"] = bug.ref if bug else None
    try:
        runner = impl.make(w, point.backend)
        with nvtx_range("plan"):
            if options.timed:
                plan = timing.host_time(runner.plan, sync, PLAN_TIMER)
                row["plan_us"] = plan.median_us
            else:
                runner.plan()
        row.update(resolved_backend=runner.resolved_backend, layout=getattr(runner, "layout", None),
                   compile_s=getattr(runner, "compile_s", None), workspace_mib=getattr(runner, "workspace_mib", None))
        predicted = torch.cat(impl.rows_wrong(point.case, w.qo_lens, w.kv_lens, point.backend)) \
            if impl.expected_to_fail else None
        with nvtx_range("check"):
            result = gate.check(runner, w, predicted=predicted)
            row["reads_evicted"] = gate.reads_evicted(runner, w) if result.passed else None
        row.update(result.columns())
        del row["passed"]
        status, note = verdict(impl.expected_to_fail, row["must_fail"], result.passed, bug)
        if status == "xpass":
            note = xpass_note(impl, w, point.backend)
        row.update(status=status, reason="; ".join(s for s in (note, result.reason) if s))
        samples = {"plan": plan.samples_us} if options.timed else {}
        exact = not impl.expected_to_fail or (impl.timed_where_exact and not row["must_fail"])
        if status == "pass" and options.timed and exact:
            samples.update(time_kernel(runner, sync, options, row))
        if status == "pass" and options.counted and exact:
            row["reason"] = "; ".join(filter(None, (row["reason"], count(runner, point))))
        row["samples"] = samples
        return row
    except registry.Unsupported as e:
        return {**row, "status": "skip", "reason": str(e)}
    except registry.ResourceError as e:
        return {**row, "status": "skip", "reason": f"resource: {e}"}
    except Exception as e:  # a crash is a failed point, not a failed sweep (or the declared bug's)
        signals.raise_if_received(e)  # a library that turned Ctrl-C into its own error (Inductor) is still Ctrl-C
        refused = memory.out_of_memory(e)
        unbuilt = f"out of memory ({refused})" if refused else registry.build_failure(e, impl.library)
        if unbuilt:
            return {**row, "status": "skip", "reason": f"resource: {unbuilt}"}
        declared = [bug.describe()] if bug else []
        return {**row, "status": "xfail" if bug else "fail", "reason": "; ".join(declared + [f"{type(e).__name__}: {e}"])}


def count(runner, point: Point) -> str:
    """The counted call of a gated point; what went wrong with it, if anything (the gate's verdict stands:
    a point that cannot be counted is only left without counters)."""
    try:
        counters.count_call(runner.run, counters.range_name(point.impl, point.backend, point.case.case_id))
    except Exception as e:
        return f"not counted: {first_line(e)}"
    return ""


def time_kernel(runner, sync, options: SweepOptions, row: dict) -> dict:
    """Time the gated runner; fill the row's timing columns; return the raw samples."""
    if options.kernel_timer == "cuda-graph":
        before = clocks.read(options.device)
        kernel, eager = timing.cuda_graph_time(runner.run, options.graph_timer)
        row.update(eager_us=eager.median_us, **kernel.extra, **clocks.columns(before, clocks.read(options.device)))
        samples = {"kernel": kernel.samples_us, "eager": eager.samples_us}
    else:
        kernel = timing.host_time(runner.run, sync, options.host_timer)
        samples = {"kernel": kernel.samples_us}
    seconds = kernel.median_us * 1e-6
    row.update(timer=options.kernel_timer, repeats=len(kernel.samples_us), median_us=kernel.median_us,
               iqr_us=kernel.iqr_us, noise=kernel.noise,
               tflops=row["flops"] / seconds / 1e12, tbps=row["min_bytes"] / seconds / 1e12)
    return samples


@dataclass
class WarmUp:
    seconds: dict[str, float]  # per module signature (impl, backend, dtype, head_dim, window or not)
    built: list[str]  # FlashInfer JIT modules this warm-up compiled (the rest were loaded from the cache)
    wall_s: float
    jobs: int
    cache_dir: str | None
    failed: dict[str, str] = field(default_factory=dict)  # signature -> the library's message (its points skip)

    def describe(self) -> dict:
        return {"jit_warmup_s": {k: round(v, 3) for k, v in self.seconds.items()}, "jit_built": self.built,
                "jit_warmup_wall_s": round(self.wall_s, 1), "jit_warmup_jobs": self.jobs,
                "jit_cache_dir": self.cache_dir, "jit_failed": self.failed}

    def text(self) -> str:
        """What ``swabench warmup`` prints: each signature's seconds, slowest first, and what was built."""
        lines = [f"{seconds:8.1f} s  {label}" + (f"  FAILED: {self.failed[label]}" if label in self.failed else "")
                 for label, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])]
        lines += [f"JIT cache: {self.cache_dir}", f"compiled {len(self.built)} module(s)"]
        lines += [f"  {m}" for m in self.built]
        lines.append(f"{len(self.seconds)} module signatures: {self.wall_s:.1f} s wall with {self.jobs} at once "
                     f"(their times add up to {sum(self.seconds.values()):.1f} s)")
        return "\n".join(lines)


def module_signature(p: Point) -> str:
    """What decides which JIT module a point runs (its implementation, backend, dtype, head_dim,
    whether it has a window, and the serving features it asks for: a soft-cap, sinks, an fp8
    cache): points with one signature share a module."""
    c = p.case
    features = "".join(f" {f}" for f in sorted(c.features))
    # a chunk planned as a window (chunk-as-window) runs the window's module
    impl = registry.get(p.impl)
    windowed = c.window_left >= 0 or (c.attention_chunk > 0 and impl.computes(c, 0).window_left >= 0)
    key = f" {impl.module_key(c)}" if impl.module_key else ""
    return f"{p.impl} {p.backend} {c.dtype} d{c.head_dim} {'window' if windowed else 'no-window'}{features}{key}"


def modules_needed(points: list[Point], device: torch.device | None) -> dict[str, Point]:
    """One point per module signature the GPU points need, in order.  ``device=None`` asks it of the
    scenario alone (what a GPU node would build; the libraries need not be installed here)."""
    todo: dict[str, Point] = {}
    for p in points:
        impl = registry.get(p.impl)
        if not impl.needs_cuda:
            continue
        why = impl.unsupported(p.case, p.backend) if device is None else impl.skip_reason(p.case, p.backend, device)
        if not why:
            todo.setdefault(module_signature(p), p)
    return todo


def tiny_case(c: Case) -> Case:
    """A small case that runs the same modules as ``c``: its step, storage, head shape and features, its draft
    length where it is short (XQA builds a module per draft length), a window where it has one, a chunk (one every
    chunk-only path can run) where it is chunked, a chain where it verifies a tree, its blocks where it has them, one
    prefill and one decode where it is a mixed step."""
    draft = c.qo_len if isinstance(c.qo_len, int) and c.qo_len <= MAX_TINY_DRAFT else 4
    queries = {"decode": {}, "extend": {"extend_len": 4},
               "mixed": {"extend_len": 4, "prefills": 1, "batch_size": 2}}.get(c.mode, {"qo_len": draft})
    return make_case(dict(
        mode=c.mode, prefix_len=64, window_left=8 if c.window_left >= 0 else -1,
        attention_chunk=2 * (c.page_size or 16) if c.attention_chunk else 0, storage=c.storage,
        page_size=c.page_size or 16, num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        dtype=c.dtype, sinks=c.sinks, logits_soft_cap=c.logits_soft_cap, kv_dtype=c.kv_dtype,
        tree="chain" if c.tree else None, block=c.block, **queries))


def warm_up(points: list[Point], device: torch.device, jobs: int = 1, on_built=None, on_start=None) -> WarmUp:
    """Build every GPU module the points will need on a tiny case, before anything is timed, so
    no JIT compile or module load lands in a timed region; ``jobs`` builds run at once (threads:
    the compiles are ninja subprocesses, and FlashInfer's file locks keep two builds of one module
    apart).  ``on_built(signature, seconds, error)`` hears each build end (error: why it failed, a resource
    problem or another error its points will meet), so a warm-up cut short still says which finished;
    ``on_start(signature)`` hears each build begin (a build that kills its process is then known by name)."""
    todo = modules_needed(points, device)

    def build(item: tuple[str, Point]) -> tuple[str, float, str | None]:
        """(signature, seconds, why it could not be built or None).  A resource problem (a module the
        library cannot build, memory) is remembered, so its points skip without building again; any
        other error is left for each point to meet again and record as its own failure."""
        label, p = item
        if on_start:
            on_start(label)
        tiny = tiny_case(p.case)
        t0, error, other = time.perf_counter(), None, None
        with nvtx_range(f"warm-up {label}"):
            try:
                runner = registry.get(p.impl).make(workloads.build(tiny, device), p.backend)
                runner.plan()
                runner.run()
                torch.cuda.synchronize(device)
            except (registry.ResourceError, torch.cuda.OutOfMemoryError) as e:
                error = first_line(e)
            except Exception as e:
                unbuilt = registry.build_failure(e, registry.get(p.impl).library)
                error, other = (f"{type(e).__name__}: {unbuilt}", None) if unbuilt else \
                    (None, f"{first_line(e)} (left to its points)")
        seconds = time.perf_counter() - t0
        if on_built:
            on_built(label, seconds, error or other)
        return label, seconds, error

    libraries = registry.libraries()
    before, started = [lib.jit_modules() for lib in libraries], time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        built_or_not = [b for group in pool.map(lambda items: [build(i) for i in items], build_groups(todo))
                        for b in group]
    wall = time.perf_counter() - started
    seconds = {label: t for label, t, _ in built_or_not}
    failed = {label: error for label, _, error in built_or_not if error}
    built = sorted(name for lib, old in zip(libraries, before)
                   for name, mtime in lib.jit_modules().items() if old.get(name) != mtime)
    cache = ", ".join(filter(None, (lib.jit_cache_dir() for lib in libraries))) or None
    return WarmUp(seconds, built, wall, jobs, cache, failed)


def build_groups(todo: dict[str, Point]) -> list[list[tuple[str, Point]]]:
    """The warm-up's builds, grouped: signatures whose library modules may carry one name (the library's
    ``shared_module``) are one group, built one after another; every other signature is its own."""
    together: dict = {}
    for label, p in todo.items():
        lib = registry.library(registry.get(p.impl).library)
        key = lib.shared_module(p.impl, p.case, p.backend) if lib else None
        together.setdefault(label if key is None else key, []).append((label, p))
    return list(together.values())


def points_by_case(points: list[Point]) -> dict:
    grouped: dict = {}
    for p in points:
        grouped.setdefault(p.case, []).append(p)
    return grouped


def run(points: list[Point], store, options: SweepOptions, name: str = "") -> Iterator[dict]:
    """Measure ``points`` in this process (a case's together: one workload build), hand each row to the store, and
    yield it once it is recorded.  ``run.isolation`` runs the same cases in a supervised worker instead."""
    todo = points_by_case(points)
    with nvtx_range(f"run {name}", payload=len(todo)):
        for case_index, (case, points) in enumerate(todo.items()):
            for row in case_rows(case, points, options, case_index, on_start=store.start):
                store.append(row)
                yield row


def case_rows(case: Case, points: list[Point], options: SweepOptions, case_index: int = 0,
              on_start=None) -> Iterator[dict]:
    """The rows of one case's points, in order: the workload built once (none where every point skips anyway);
    ``on_start(point)`` hears each point begin, before any of its work."""
    with nvtx_range(f"case {case.label}", payload=case_index):
        started, w = time.perf_counter(), None
        skip = memory.too_big(case, options.device)
        known = {p: skip_reason(p, options) or (None if skip else memory.call_too_big(p, options.device))
                 for p in points}
        if not skip and not all(known.values()):  # no workload where every point skips anyway
            try:
                w = workloads.build(case, options.device)
            except Exception as e:
                refused = memory.out_of_memory(e)
                if not refused:
                    raise
                skip = f"resource: out of memory building the workload ({refused})"
        workload_s = time.perf_counter() - started
        lengths = workloads.request_lengths(case) if w is None and not skip else None
        for point in points:
            if on_start:
                on_start(point)
            started = time.perf_counter()
            if lengths is not None:
                row = {**base_row(point, None, options.device, lengths), "status": "skip", "reason": known[point]}
            elif w is None:
                row = {**base_row(point, None, options.device), "status": "skip", "reason": skip}
            else:
                with nvtx_range(point_range_name(point.impl, point.backend, case.case_id)):
                    row = measure_point(point, w, options, known[point])
            # where the sweep's time goes (plan, gate, timing and compiles), for the next run's shards
            row.update(point_s=time.perf_counter() - started, workload_s=workload_s)
            yield row
        if w is not None and options.device.type == "cuda" and w.k_store.numel() > 1 << 28:
            del w
            torch.cuda.empty_cache()  # hand big caches back before the next case allocates
