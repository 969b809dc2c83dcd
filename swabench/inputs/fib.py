"""FlashInfer-Bench's format (docs/flashinfer-bench.md): a trace's steps become Definitions of sliding-window
layers with their Workloads (``export``; each step's records are ``fib_definition``, the way back is ``fib_import``,
the reference ``fib_reference``).

Why: FlashInfer-Bench's own GQA paged definitions carry no window, sinks or soft-cap, so a sliding-window
layer collected there is checked against full causal attention.  The definitions written here carry the
window in their name (``gqa_paged_decode_swa_w1023_h8_kv2_d128_ps16``), as a const axis ``window_left``
and in their reference, with ``_sinks`` / ``_cap50`` (a ``sinks`` input, a ``LOGITS_SOFT_CAP`` constant of
the reference) where the layer has them.

``export`` writes, under its folder (FlashInfer-Bench's layout, read by ``TraceSet.from_path``):

- ``definitions/gqa_paged/NAME.json``: one per layer type (``analysis.replay.LAYER_COLUMNS`` and the page
  size) and stage (decode; prefill for extend and verify steps);
- ``workloads/gqa_paged/NAME.jsonl``: one workload record (``definition`` and ``workload`` only) per distinct
  step;
- ``blob/workloads/gqa_paged/NAME/UUID.safetensors``: that step's ``qo_indptr`` (prefill), ``kv_indptr``,
  ``kv_indices`` and ``kv_last_page_len``, int32.  The page table is the one ``core.workloads.page_table``
  builds for the step's case (deterministic in its seed and page layout), so FlashInfer-Bench reads the
  pages swabench's gate reads.  ``q``, ``k_cache``, ``v_cache`` and ``sinks`` are ``random``, ``sm_scale`` a
  ``scalar``.

FlashInfer-Bench has no notion of how often a step occurs, nor of extend against verify.  So each step is
one workload, and its count, mode, page layout, seed and wrapper mode ride in its blob's safetensors metadata under
``"swabench"`` (FlashInfer-Bench loads tensors by key and never reads the metadata, nor rewrites a blob):
``fib_import.import_`` then gives the trace back step for step, count for count.  A workload without that metadata
(one of FlashInfer-Bench's own) is one step: decode, or extend for prefill.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from swabench.analysis.replay import LAYER_COLUMNS
from swabench.errors import UserError
from swabench.inputs import axes, scenarios, traces
from swabench.inputs.fib_definition import OP_TYPE, definition, index_tensors, step_meta, workload_inputs, workload_uuid
from swabench.inputs.fib_reference import STAGES

LAYOUT = ("definitions", "workloads", "blob")  # what export writes, and all that --force replaces
META = "swabench"  # the blob metadata key of a step's count, mode, page layout, seed and wrapper mode


class FibError(UserError):
    pass


@dataclass
class Written:
    """One definition as export wrote it: its name, files, workloads and the steps they stand for."""

    name: str
    definition: Path
    workloads: Path
    count: int  # workloads (distinct steps)
    steps: int  # steps of the trace they stand for


@dataclass
class Exported:
    out: Path
    definitions: list[Written] = field(default_factory=list)
    checked: str = ""  # the flashinfer-bench release whose loaders read the folder back ("" when not installed)
    left_out: list[tuple[str, int, str]] = field(default_factory=list)  # (step, its count, why) of steps not written


def export(trace_or_run, out_dir, replace: bool = False) -> Exported:
    """Write the FlashInfer-Bench folder of a trace (JSON Lines) or a replay's run folder (its scenario.toml's
    steps, weighted by its meta.json's trace) into ``out_dir``: absent or empty, or with ``replace`` a folder
    of FlashInfer-Bench's layout that it replaces.  Everything is written beside it first and read back with
    flashinfer-bench's loaders where it is installed, so bad input leaves nothing behind."""
    safetensors = safetensors_package()
    source, out = Path(trace_or_run), Path(out_dir)
    out = _check_out(out, source, replace)
    out = Path(os.path.realpath(out))  # a link to a folder is written through, never replaced
    groups: dict[tuple, tuple[dict, list]] = {}  # layer type (analysis.replay's) and stage -> definition, steps
    left_out = []
    for case, count in steps(source):
        why = _not_exportable(case)
        if why:
            left_out.append((case.label, count, why))
            continue
        key = (STAGES[case.mode], case.page_size, *(getattr(case, c) for c in LAYER_COLUMNS))
        groups.setdefault(key, (definition(case, source.name), []))[1].append((case, count))
    if not groups:
        raise FibError(f"{source}: no step to export: step {left_out[0][0]}: {left_out[0][2]}; export-fib writes "
                       f"sliding-window layers on a paged cache")
    files: dict[str, bytes] = {}
    result = Exported(out, left_out=left_out)
    for doc, members in sorted(groups.values(), key=lambda g: g[0]["name"]):
        def_name = doc["name"]
        doc["tags"] += sorted({f"model:{c.model}" for c, _ in members if c.model})
        def_path = f"definitions/{OP_TYPE}/{def_name}.json"
        lines = []
        for case, count in members:
            tensors, var_axes = index_tensors(case)
            uid = workload_uuid(case)
            blob = f"blob/workloads/{OP_TYPE}/{def_name}/{uid}.safetensors"
            files[blob] = safetensors.torch.save(tensors, metadata={META: json.dumps(step_meta(case, count))})
            lines.append(json.dumps({"definition": def_name, "workload": {
                "axes": var_axes, "inputs": workload_inputs(doc, case, blob), "uuid": uid}}))
        files[def_path] = (json.dumps(doc, indent=2) + "\n").encode()
        wl_path = f"workloads/{OP_TYPE}/{def_name}.jsonl"
        files[wl_path] = ("\n".join(lines) + "\n").encode()
        result.definitions.append(Written(def_name, out / def_path, out / wl_path, len(members),
                                          sum(c for _, c in members)))
    result.checked = _write_folder(out, files, replace)
    return result


def _check_out(out: Path, source: Path, replace: bool) -> Path:
    """``out`` as the path to write (store.paths), or FibError (OutputError) unless it may be replaced."""
    from swabench.store import paths, places

    out = paths.folder_out(out, "--out")
    paths.makeable_folder(out.parent, "--out")  # the export is made beside --out, then renamed into its place
    places.refuse_inside_a_run(out, "--out")
    paths.refuse_inside(out, [source], "--out")
    if out.resolve() in source.resolve().parents:
        raise FibError(f"{source} lies inside --out {out}, which export-fib replaces: the export would delete what it "
                       f"reads; give another --out")
    if out.is_dir() and any(out.iterdir()):
        if not replace:
            raise FibError(f"--out {out} exists and is not empty (--force to replace it)")
        if Path.cwd().resolve() == out.resolve() or out.resolve() in Path.cwd().resolve().parents:
            raise FibError(f"--out {out} holds the working folder, which replacing it would remove; give another "
                           f"folder")
        other = sorted(p.name for p in out.iterdir() if p.name not in LAYOUT)
        if other:
            raise FibError(f"--out {out} holds {', '.join(other[:3])}, which export-fib does not write (it writes "
                           f"{', '.join(LAYOUT)}): not replacing it (a FlashInfer-Bench evaluation's solutions or "
                           f"traces would be lost); give another folder")
        foreign = next((f for f in sorted(out.rglob("*")) if not f.is_dir() and not _exported(f, out)), None)
        if foreign is not None:
            raise FibError(f"--out {out} holds {foreign.relative_to(out)}, which export-fib did not write: not "
                           f"replacing the folder (it would be lost); move it, or give another folder")
    return out


def _exported(path: Path, root: Path) -> bool:
    """Whether ``path`` in the FlashInfer-Bench folder ``root`` is a file export-fib writes, by its content: a
    definition tagged ``source:swabench``, the workloads of such a definition, or a blob whose metadata carries
    the step (``META``).  Links and anything else are not."""
    if path.is_symlink() or not path.is_file():
        return False
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    parts = path.relative_to(root).parts
    if parts[0] == "definitions" and path.suffix == ".json":
        return b'"source:swabench"' in head
    if parts[0] == "workloads" and path.suffix == ".jsonl":
        definition = root / "definitions" / Path(*parts[1:]).with_suffix(".json")
        return definition.is_file() and _exported(definition, root)
    if parts[0] == "blob" and path.suffix == ".safetensors":
        return f'"{META}"'.encode() in head
    return False


def _write_folder(out: Path, files: dict[str, bytes], replace: bool) -> str:
    """Write ``files`` into a folder beside ``out``, check it with flashinfer-bench's loaders (``check``, whose
    answer this returns), then put it in ``out``'s place."""
    from swabench.store import paths

    if out.is_dir():
        _refuse_unremovable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    except OSError as e:
        raise FibError(f"--out {out}: cannot write beside it ({e.strerror or e})") from None
    try:
        os.chmod(staging, 0o777 & ~paths.UMASK)  # mkdtemp's folder is the owner's alone; the export is not
        for rel, data in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        checked = check(staging)
        if out.is_dir():
            shutil.rmtree(out) if replace else out.rmdir()
        os.replace(staging, out)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):
            raise FibError(f"--out {out}: {e.strerror or e} ({e.filename or out})") from None
        raise
    return checked


def _refuse_unremovable(out: Path) -> None:
    """FibError, before anything is written or removed, when some file or folder of the old export cannot be removed
    (read-only or immutable): replacing it would stop halfway, the workloads left without their blobs."""
    for folder, _, files in os.walk(out):
        for path in [Path(folder), *(Path(folder) / f for f in files)]:
            if not os.access(path, os.W_OK):
                raise FibError(f"--out {out}: {path} cannot be removed (read-only or immutable); make it writable, "
                               f"or give another folder")


def check(root) -> str:
    """Read a FlashInfer-Bench folder back with flashinfer-bench's own loaders (each definition, each workload
    file, the whole folder as a TraceSet, and each workload's stored tensors against its definition's shapes and
    dtypes): its version, or "" when flashinfer-bench is not installed.  Raises what the loaders raise."""
    try:
        from flashinfer_bench.bench.utils import load_safetensors
        from flashinfer_bench.data import Definition, Trace, TraceSet, load_json_file, load_jsonl_file
    except ImportError:
        return ""
    from importlib.metadata import version

    root = Path(root)
    for p in sorted((root / "definitions").rglob("*.json")):
        load_json_file(Definition, p)
    for p in sorted((root / "workloads").rglob("*.jsonl")):
        load_jsonl_file(Trace, p)
    trace_set = TraceSet.from_path(str(root))
    for name, records in trace_set.workloads.items():
        for record in records:
            load_safetensors(trace_set.definitions[name], record.workload, root)
    return version("flashinfer-bench")


def safetensors_package():
    """The safetensors package, or a plain error naming how to install it (an optional extra)."""
    try:
        import safetensors
        import safetensors.torch
    except ImportError:
        raise FibError("safetensors is not installed: pip install 'swabench[fib]' (or pip install safetensors)") \
            from None
    return safetensors


def steps(source) -> list:
    """(case, count) of each distinct step of a trace file or a replay's run folder."""
    source = Path(source)
    if source.is_dir():
        return _run_steps(source)
    if not source.exists():
        raise FibError(f"{source}: no such trace or run folder")
    merged: dict[str, list] = {}
    for step, count in traces.read(source).items():
        case = axes.make_case(step.axes(), source, "trace")
        merged.setdefault(case.case_id, [case, 0])[1] += count
    return [tuple(v) for v in merged.values()]


def _run_steps(folder: Path) -> list:
    """A replay's steps: the cases of its scenario.toml (one sweep group a step), each weighted by meta.json's
    trace weights."""
    import itertools

    from swabench.store import schema, tables

    trace = tables.read_meta(folder).get("trace")
    if not isinstance(trace, dict) or not isinstance(trace.get("weights"), dict):
        raise FibError(f"{folder}: meta.json has no trace: not the run folder of a replay (swabench replay, price)")
    path = folder / schema.SCENARIO
    doc, _ = scenarios.read(path)
    fixed = {k: v for k, v in doc.get("fixed", {}).items() if k != "backend"}
    cases, expanded = {}, 0
    for i, group in enumerate(doc.get("sweep", [])):
        table = {k: v for k, v in {**fixed, **group}.items() if k not in ("group", "implementations", "backend")}
        checked = axes.check_axes(table, path, f"sweep[{i}]")
        expanded = scenarios.check_size(path, f"sweep[{i}]", checked, 1, 1, expanded)
        for values in itertools.product(*checked.values()):
            case = axes.make_case(dict(zip(checked, values)), path, f"sweep[{i}]")
            cases[case.case_id] = case
    missing = [c for c in trace["weights"] if c not in cases]
    if missing:
        raise FibError(f"{folder}: meta.json's trace weighs case {missing[0]}, which {schema.SCENARIO} does not hold")
    return [(cases[c], int(n)) for c, n in trace["weights"].items()]


def _not_exportable(case) -> str | None:
    """Why a step has no GQA paged sliding-window definition, or None."""
    return ("ragged storage (the GQA paged definitions read a paged cache)" if case.storage != "paged" else
           f"mode {case.mode} (a trace's modes are {', '.join(STAGES)})" if case.mode not in STAGES else
           f"chunked attention (attention_chunk {case.attention_chunk}), not a window" if case.attention_chunk else
           "non-causal (the definitions are causal)" if not case.causal else
           f"bidirectional blocks of {case.block} (the definitions are causal)" if case.block else
           "no window (window_left -1): that layer is FlashInfer-Bench's own causal definition"
           if case.window_left < 0 else None)
