"""FlashInfer-Bench's format (docs/flashinfer-bench.md): a trace's steps become Definitions of sliding-window
layers with their Workloads (``export``; the way back is ``fib_import``, the reference ``fib_reference``).

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
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swabench.analysis.replay import LAYER_COLUMNS, layer_label
from swabench.errors import UserError
from swabench.inputs import axes, scenarios, traces
from swabench.inputs.fib_reference import STAGES, reference

OP_TYPE = "gqa_paged"
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "float8_e4m3": "float8_e4m3fn"}
LAYOUT = ("definitions", "workloads", "blob")  # what export writes, and all that --force replaces
META = "swabench"  # the blob metadata key of a step's count, mode, page layout, seed and wrapper mode
NAMESPACE = uuid.UUID("6f1c1f0e-5b0a-4c38-9d7e-7a4f2f1e9b10")  # workload uuids: the same step, the same uuid


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


@dataclass
class Imported:
    out: Path
    definition: Path
    lines: int
    steps: int
    window_from: str  # "definition" (a swabench export: checked against the preset) or "preset"


# ---------------------------------------------------------------- export


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
            files[blob] = safetensors.torch.save(tensors, metadata={META: json.dumps(_step_meta(case, count))})
            lines.append(json.dumps({"definition": def_name, "workload": {
                "axes": var_axes, "inputs": _workload_inputs(doc, case, blob), "uuid": uid}}))
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


def workload_uuid(case) -> str:
    """A step's workload uuid: the same step of the same layer gets the same one at every export."""
    return str(uuid.uuid5(NAMESPACE, f"{name(case)}/{case.case_id}"))


def name(case) -> str:
    """The definition's name: its stage and window first, so no one takes it for a causal definition."""
    cap = f"_cap{case.logits_soft_cap:g}".replace(".", "p") if case.logits_soft_cap else ""
    return (f"gqa_paged_{STAGES[case.mode]}_swa_w{case.window_left}_h{case.num_qo_heads}_kv{case.num_kv_heads}"
            f"_d{case.head_dim}_ps{case.page_size}" + ("_sinks" if case.sinks else "") + cap
            + ("" if case.dtype == "bfloat16" else f"_{case.dtype}") + (f"_kv_{case.kv_dtype}" if case.kv_dtype else ""))


def definition(case, source: str = "") -> dict:
    """The Definition of ``case``'s layer type and stage (FlashInfer-Bench's field names and axes, plus the
    window as a const axis), as a JSON document."""
    decode = case.mode == "decode"
    rows = "batch_size" if decode else "total_q"
    dtype, kv = DTYPES[case.dtype], DTYPES[case.cache_dtype]
    const = {"num_qo_heads": case.num_qo_heads, "num_kv_heads": case.num_kv_heads, "head_dim": case.head_dim,
             "page_size": case.page_size, "window_left": case.window_left}
    var = {"batch_size": "Requests in the batch.", "num_pages": "Pages of the KV cache.",
           "len_indptr": "Length of the indptr arrays (batch_size + 1).",
           "num_kv_indices": "Total number of KV page indices."}
    if not decode:
        var["total_q"] = "Total number of query tokens."
    axes_doc = {k: {"type": "const", "value": v} for k, v in const.items()}
    axes_doc["window_left"]["description"] = (f"A query at position p sees keys p - {case.window_left} .. p "
                                              f"(FlashInfer's window_left; sliding_window {case.window_left + 1}).")
    axes_doc.update({k: {"type": "var", "description": v} for k, v in var.items()})
    cache = {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": kv}
    inputs = {"q": {"shape": [rows, "num_qo_heads", "head_dim"], "dtype": dtype},
              "k_cache": {**cache, "description": "Paged key cache (NHD)."},
              "v_cache": {**cache, "description": "Paged value cache (NHD)."}}
    if not decode:
        inputs["qo_indptr"] = {"shape": ["len_indptr"], "dtype": "int32", "description": "Query offsets per request."}
    inputs.update({
        "kv_indptr": {"shape": ["len_indptr"], "dtype": "int32", "description": "KV page offsets per request."},
        "kv_indices": {"shape": ["num_kv_indices"], "dtype": "int32", "description": "Page ids of the KV cache."},
        "kv_last_page_len": {"shape": ["batch_size"], "dtype": "int32",
                             "description": "Valid tokens in each request's last page."},
        "sm_scale": {"shape": None, "dtype": "float32", "description": "Softmax scale, applied before the soft-cap."}})
    if case.sinks:
        inputs["sinks"] = {"shape": ["num_qo_heads"], "dtype": "float32",
                           "description": "Each head's sink logit: one more term of every softmax denominator, "
                                          "with no value."}
    lse = "The base-2 log-sum-exp of the attention logits" + (" and the sink" if case.sinks else "") + "."
    features = "".join([", with one learned sink logit per head in every softmax denominator" * case.sinks,
                        f", logits soft-capped at {case.logits_soft_cap:g} (cap * tanh(logits / cap))"
                        * bool(case.logits_soft_cap)])
    constraints = ["len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1].item()"]
    if not decode:
        constraints.insert(1, "total_q == qo_indptr[-1].item()")
    return {
        "name": name(case), "op_type": OP_TYPE,
        "description": f"Sliding-window grouped query attention, {STAGES[case.mode]}, over a paged KV cache "
                       f"(page_size={case.page_size}): causal and bottom-right aligned, a query at position p "
                       f"sees keys p - {case.window_left} .. p{features}. Layer {layer_label(asdict(case))}; "
                       f"exported by swabench" + (f" from {source}" if source else "") + ".",
        "tags": [f"stage:{STAGES[case.mode]}", f"window_left:{case.window_left}", "source:swabench"],
        "axes": axes_doc, "constraints": constraints, "inputs": inputs,
        "outputs": {"output": {"shape": [rows, "num_qo_heads", "head_dim"], "dtype": dtype},
                    "lse": {"shape": [rows, "num_qo_heads"], "dtype": "float32", "description": lse}},
        "reference": reference(case)}


def index_tensors(case) -> tuple[dict, dict]:
    """The step's stored inputs (int32 index tensors, from ``core.workloads.page_table``) and its var axes."""
    import torch

    from swabench.core import workloads

    qo, kv = workloads.request_lengths(case)
    kv_indptr, kv_indices, last, _, num_pages = workloads.page_table(case, qo, kv)
    tensors = {"kv_indptr": kv_indptr.to(torch.int32), "kv_indices": kv_indices.to(torch.int32),
               "kv_last_page_len": torch.tensor(last, dtype=torch.int32)}
    var = {"batch_size": len(qo), "num_pages": num_pages, "len_indptr": len(qo) + 1,
           "num_kv_indices": len(kv_indices)}
    if case.mode != "decode":
        tensors["qo_indptr"] = torch.cumsum(torch.tensor([0, *qo]), 0).to(torch.int32)
        var["total_q"] = sum(qo)
    return tensors, var


def _workload_inputs(doc: dict, case, blob: str) -> dict:
    stored = {"qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"}
    return {k: {"type": "safetensors", "path": blob, "tensor_key": k} if k in stored else
            {"type": "scalar", "value": case.scale} if k == "sm_scale" else {"type": "random"}
            for k in doc["inputs"]}


def _step_meta(case, count: int) -> dict:
    meta = {"count": count, "mode": case.mode}
    if case.page_layout != axes.DEFAULTS["page_layout"]:
        meta["page_layout"] = case.page_layout
    if case.seed != axes.DEFAULTS["seed"]:
        meta["seed"] = case.seed
    if case.wrapper_mode != axes.DEFAULTS["wrapper_mode"]:
        meta["wrapper_mode"] = case.wrapper_mode
    return meta
