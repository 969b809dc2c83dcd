"""Does FlashInfer-Bench's evaluator take swabench's exported definitions, and do their references agree with
swabench's correct FlashInfer paths?  On a GPU node with flashinfer and flashinfer-bench installed (no network):

    python scripts/fib_evaluate.py TRACE OUT.csv [--folder DIR] [--per-definition 3] [--library flashinfer]

1. TRACE (a trace or a replay's run folder) is exported with ``swabench export-fib``'s code into DIR (default: a
   temporary folder).
2. FlashInfer-Bench's own evaluator: ``Benchmark(TraceSet, BenchmarkConfig(...)).run_all(dump_traces=False)`` over
   the first N workloads of each definition, with two Solutions per definition (Python, value-returning,
   ``main.py::run``): swabench's correct FlashInfer path for the layer (``flashinfer_solution``: the paged prefill
   wrapper planned with ``window_left``, or the sink wrapper, fa2, output and base-2 lse), and the definition's own
   reference (which shows the folder loads, builds and runs there).  FlashInfer-Bench builds both, draws the
   random inputs, loads the stored page tables, runs the definition's reference and compares each solution with
   it: one row per solution and workload with its status and max abs error.
3. Agreement: for the same workloads, swabench builds the step's tensors (``core.workloads``, the page table the
   blob holds), runs its first correct path of LIBRARY that takes the step (in registration order: paged-window,
   or sink-window on a sink layer, for flashinfer), and runs the definition's reference on the same tensors with the blob's index
   tensors: max abs difference of the output, pass at atol = rtol = 1e-2 (FlashInfer-Bench's rule: an element
   fails where both its absolute and its relative error exceed them).

OUT.csv: definition, workload, case_id, steps, check, max_abs_diff, pass, note.  Step 3 runs on the CPU with
``--library torch`` (tests/test_fib.py does), so its logic is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import sys
import tempfile
from pathlib import Path

import torch

COLUMNS = ["definition", "workload", "case_id", "steps", "check", "max_abs_diff", "pass", "note"]
ATOL = RTOL = 1e-2


def reference_scope(source: str) -> dict:
    """The names a definition's reference defines (its ``run``, its constants)."""
    scope = {"__name__": "fib_reference"}
    exec(compile(source, "<definition reference>", "exec"), scope)
    return scope


def load_reference(source: str):
    """The definition reference's ``run``."""
    return reference_scope(source)["run"]


def choose_path(case, library: str, device):
    """(implementation, backend) of the first correct, non-baseline, non-peer path of ``library`` that runs
    ``case`` here, or (None, why not)."""
    from swabench.impls import registry

    lib = registry.library(library)
    reasons = []
    for impl in registry.all_implementations():
        if impl.library != library or impl.kind != "correct" or impl.baseline or impl.peer:
            continue
        for backend in impl.runs_on(lib.chosen_backends if lib else ()):
            why = impl.skip_reason(case, backend, device)
            if why is None:
                return impl, backend
            reasons.append(f"{impl.name} [{backend}]: {why}")
    return None, "; ".join(reasons) or f"no correct path of library {library!r}"


def agrees(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, bool]:
    """(max abs difference, whether no element exceeds both ATOL and RTOL), as FlashInfer-Bench judges."""
    diff = (out.float() - ref.float()).abs()
    bad = (diff > ATOL) & (diff > RTOL * ref.float().abs())
    return float(diff.max()) if diff.numel() else 0.0, not bool(bad.any())


def agreement(doc: dict, case, stored: dict, library: str, device, impl_name: str | None = None) -> dict:
    """One row: the definition's reference on swabench's tensors for ``case`` (with the blob's index tensors
    ``stored``) against swabench's correct path of ``library`` (or the implementation ``impl_name``)."""
    from swabench.core import workloads
    from swabench.impls import registry, upstream
    from swabench.measure import timing

    device = torch.device(device)
    if impl_name:
        impl, backend = registry.get(impl_name), (registry.get(impl_name).backends or (library,))[0]
    else:
        impl, backend = choose_path(case, library, device)
    if impl is None:
        return {"check": f"swabench {library}", "note": f"not run: {backend}"}
    check = f"swabench {impl.name} [{backend}]"
    w = workloads.build(case, device)
    try:
        runner = impl.make(w, backend)
        runner.plan()
        runner.run()
        timing.device_sync(device)()
    except (registry.Unsupported, registry.ResourceError) as e:
        return {"check": check, "note": f"not run: {e}"}
    index = {k: v.to(device) for k, v in stored.items()}
    args = [w.q, w.k_store, w.v_store, *([index["qo_indptr"]] if "qo_indptr" in doc["inputs"] else []),
            index["kv_indptr"], index["kv_indices"], index["kv_last_page_len"], w.sm_scale,
            *([w.sinks] if "sinks" in doc["inputs"] else [])]
    output, _ = load_reference(doc["reference"])(*args)
    max_abs, ok = agrees(runner.out, output)
    bug = upstream.hit(impl.name, case, backend)
    return {"check": check, "max_abs_diff": max_abs, "pass": ok,
            "note": f"declared upstream bug {bug.ref}" if bug else ""}


def picked(folder: Path, source, per_definition: int):
    """(definition doc, workload record, case, count) of the first ``per_definition`` workloads of each
    definition in ``folder``, the steps matched by their uuid."""
    from swabench.inputs import fib, fib_definition

    cases = {fib_definition.workload_uuid(case): (case, count) for case, count in fib.steps(source)}
    for path in sorted((folder / "definitions").rglob("*.json")):
        doc = json.loads(path.read_text())
        lines = (folder / "workloads" / doc["op_type"] / f"{doc['name']}.jsonl").read_text().splitlines()
        for line in lines[:per_definition]:
            record = json.loads(line)
            yield (doc, record, *cases[record["workload"]["uuid"]])


def swabench_rows(folder: Path, source, per_definition: int, library: str, device, impl_name=None) -> list[dict]:
    """Step 3's rows."""
    import safetensors.torch

    rows = []
    for doc, record, case, count in picked(folder, source, per_definition):
        blob = folder / record["workload"]["inputs"]["kv_indptr"]["path"]
        row = agreement(doc, case, safetensors.torch.load_file(blob), library, device, impl_name)
        rows.append({"definition": doc["name"], "workload": record["workload"]["uuid"], "case_id": case.case_id,
                     "steps": count, **row})
    return rows


FLASHINFER_SOLUTION = '''"""swabench's correct FlashInfer path for {name}: {wrapper}, fa2, planned with window_left={window_left}."""
import torch

import flashinfer

_workspace = {{}}


def run({args}):
    if q.device not in _workspace:
        _workspace[q.device] = torch.empty(512 << 20, dtype=torch.uint8, device=q.device)
    {qo_indptr}
    wrapper = {construct}
    host = [t.to("cpu", torch.int32) for t in (qo_indptr, kv_indptr, kv_indices, kv_last_page_len)]
    wrapper.plan(*host, num_qo_heads={h}, num_kv_heads={kv}, head_dim_qk={d}, page_size={ps}, causal=True,
                 window_left={window_left}, sm_scale=float(sm_scale), q_data_type=q.dtype, kv_data_type=k_cache.dtype{cap})
    return wrapper.run(q, (k_cache, v_cache){sinks}, return_lse=True)
'''


def flashinfer_solution(definition):
    """A FlashInfer-Bench Solution that runs the layer as swabench's correct path does (paged-window, or
    sink-window where the definition has sinks), written from the definition's constant axes and inputs."""
    from flashinfer_bench.data import BuildSpec, Solution, SourceFile

    axes = {k: a.value for k, a in definition.axes.items() if getattr(a, "value", None) is not None}
    inputs = list(definition.inputs)
    sinks = "sinks" in inputs
    cap = reference_scope(definition.reference).get("LOGITS_SOFT_CAP", 0.0)
    construct = ("flashinfer.BatchAttentionWithAttentionSinkWrapper(_workspace[q.device], \"NHD\", backend=\"fa2\", "
                 f"q_data_type=q.dtype, kv_data_type=k_cache.dtype, head_dim_qk={axes['head_dim']}, "
                 f"head_dim_vo={axes['head_dim']}, window_left={axes['window_left']})" if sinks else
                 "flashinfer.BatchPrefillWithPagedKVCacheWrapper(_workspace[q.device], \"NHD\", backend=\"fa2\")")
    source = FLASHINFER_SOLUTION.format(
        name=definition.name, wrapper="BatchAttentionWithAttentionSinkWrapper" if sinks else
        "BatchPrefillWithPagedKVCacheWrapper", window_left=axes["window_left"], args=", ".join(inputs),
        qo_indptr="" if "qo_indptr" in inputs else
        "qo_indptr = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)  # decode: one query each",
        construct=construct, h=axes["num_qo_heads"], kv=axes["num_kv_heads"], d=axes["head_dim"], ps=axes["page_size"],
        cap=f", logits_soft_cap={cap!r}" if cap else "", sinks=", sinks, float(sm_scale)" if sinks else "")
    return Solution(name=f"{definition.name}__swabench_flashinfer", definition=definition.name, author="swabench",
                    spec=BuildSpec(language="python", target_hardware=["cuda"], entry_point="main.py::run",
                                   destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=source)])


def reference_solution(definition):
    """A FlashInfer-Bench Solution whose source is ``definition``'s own reference (value-returning Python)."""
    from flashinfer_bench.data import BuildSpec, Solution, SourceFile

    return Solution(name=f"{definition.name}__reference_as_solution", definition=definition.name, author="swabench",
                    spec=BuildSpec(language="python", target_hardware=["cuda"], entry_point="main.py::run",
                                   destination_passing_style=False),
                    sources=[SourceFile(path="main.py", content=definition.reference)])


def fib_rows(folder: Path, source, per_definition: int, makers=None) -> list[dict]:
    """Step 2's rows: FlashInfer-Bench's Benchmark with the Solutions ``makers`` make of each definition (default:
    swabench's FlashInfer path, then the definition's own reference)."""
    from flashinfer_bench import Benchmark, BenchmarkConfig
    from flashinfer_bench.data import TraceSet

    from swabench.inputs import fib, fib_definition

    full = TraceSet.from_path(str(folder))
    trace_set = TraceSet(root=full.root, definitions=full.definitions,
                         solutions={name: [make(d) for make in makers or (flashinfer_solution, reference_solution)]
                                    for name, d in full.definitions.items()},
                         workloads={name: full.workloads.get(name, [])[:per_definition] for name in full.definitions})
    benchmark = Benchmark(trace_set, BenchmarkConfig(warmup_runs=0, iterations=1, num_trials=1, profile_baseline=False))
    try:
        result = benchmark.run_all(dump_traces=False)
    finally:
        benchmark.close()
    steps = {fib_definition.workload_uuid(case): (case.case_id, count) for case, count in fib.steps(source)}
    rows = []
    for name, traces in result.traces.items():
        for t in traces:
            ev = t.evaluation
            case_id, count = steps.get(t.workload.uuid, ("", ""))
            rows.append({"definition": name, "workload": t.workload.uuid, "case_id": case_id, "steps": count,
                         "check": f"flashinfer-bench evaluator: {t.solution.split('__')[-1]}",
                         "max_abs_diff": ev.correctness.max_absolute_error if ev.correctness else "",
                         "pass": ev.status.value == "PASSED", "note": ev.status.value})
    return rows


def write_csv(rows: list[dict], path) -> None:
    """OUT.csv, replaced whole by a rename (never written through a link)."""
    from swabench.store import run_folder

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in COLUMNS})
    run_folder.atomic_write(Path(path), text.getvalue())


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a trace (JSON Lines) or a replay's run folder")
    parser.add_argument("out", help="the CSV of agreement to write")
    parser.add_argument("--folder", help="where to export (default: a temporary folder)")
    parser.add_argument("--per-definition", type=positive, default=3, help="workloads per definition (default 3)")
    parser.add_argument("--library", default="flashinfer", help="whose correct path to hold the reference against")
    parser.add_argument("--no-evaluator", action="store_true", help="skip FlashInfer-Bench's Benchmark (step 2)")
    args = parser.parse_args(argv)

    from swabench.errors import UserError
    from swabench.impls import registry
    from swabench.inputs import fib
    from swabench.store import paths

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    evaluator = not args.no_evaluator and device.type == "cuda"
    try:
        paths.file_out(args.out, "OUT.csv")
        libraries = dict.fromkeys(impl.library for impl in registry.all_implementations())
        if args.library not in libraries:
            raise UserError(f"--library {args.library!r}: no implementation is of it; allowed: {', '.join(libraries)}")
        if evaluator and importlib.util.find_spec("flashinfer_bench") is None:
            raise UserError("FlashInfer-Bench's evaluator needs flashinfer-bench installed (FIB=1's bundle), or give "
                            "--no-evaluator")
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(args.folder or Path(tmp) / "fib")
            exported = fib.export(args.source, folder, replace=True)  # the script's own folder, made again
            print(f"exported {len(exported.definitions)} definitions to {folder}", file=sys.stderr)
            rows = []
            if not args.no_evaluator and not evaluator:
                print("no CUDA device: FlashInfer-Bench's evaluator skipped", file=sys.stderr)
            if evaluator:
                rows += fib_rows(folder, args.source, args.per_definition)
            rows += swabench_rows(folder, args.source, args.per_definition, args.library, device)
        write_csv(rows, args.out)
    except UserError as e:
        parser.error(str(e))
    failed = [r for r in rows if r.get("pass") is False]
    print(f"{len(rows)} rows, {len(failed)} disagree: {args.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
