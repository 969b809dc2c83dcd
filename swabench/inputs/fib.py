"""FlashInfer-Bench's format, both ways (docs/flashinfer-bench.md): a trace's steps become Definitions of
sliding-window layers with their Workloads, and one Definition's Workloads become a trace again.

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
one workload, and its count, mode, page layout and seed ride in its blob's safetensors metadata under
``"swabench"`` (FlashInfer-Bench loads tensors by key and never reads the metadata, nor rewrites a blob):
``import_`` then gives the trace back step for step, count for count.  A workload without that metadata
(one of FlashInfer-Bench's own) is one step: decode, or extend for prefill.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swabench.analysis.replay import LAYER_COLUMNS, layer_label
from swabench.errors import UserError
from swabench.inputs import axes, models, scenarios, traces

OP_TYPE = "gqa_paged"
STAGES = {"decode": "decode", "extend": "prefill", "verify": "prefill"}
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "float8_e4m3": "float8_e4m3fn"}
LAYOUT = ("definitions", "workloads", "blob", "solutions", "traces")  # what a FlashInfer-Bench folder holds
META = "swabench"  # the blob metadata key of a step's count, mode, page layout and seed
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
    safetensors = _safetensors()
    source, out = Path(trace_or_run), Path(out_dir)
    _check_out(out, source, replace)
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
    assert len({doc["name"] for doc, _ in groups.values()}) == len(groups), "two layer types, one name"
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


def _check_out(out: Path, source: Path, replace: bool) -> None:
    from swabench.store import paths, run_folder

    paths.folder_out(out, "--out")
    run_folder.refuse_inside_a_run(out, "--out")
    paths.refuse_inside(out, [source], "--out")
    if out.is_dir() and any(out.iterdir()):
        if not replace:
            raise FibError(f"--out {out} exists and is not empty (--force to replace it)")
        other = sorted(p.name for p in out.iterdir() if p.name not in LAYOUT)
        if other:
            raise FibError(f"--out {out} holds {', '.join(other[:3])}, which is not FlashInfer-Bench's layout "
                           f"({', '.join(LAYOUT)}): not replacing it; give another folder")


def _write_folder(out: Path, files: dict[str, bytes], replace: bool) -> str:
    """Write ``files`` into a folder beside ``out``, check it with flashinfer-bench's loaders (``check``, whose
    answer this returns), then put it in ``out``'s place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is the owner's alone; the export is not
        for rel, data in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
        checked = check(staging)
        if out.is_dir():
            shutil.rmtree(out) if replace else out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return checked


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


def _safetensors():
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
    cases = {}
    for i, group in enumerate(doc.get("sweep", [])):
        table = {k: v for k, v in {**fixed, **group}.items() if k not in ("group", "implementations", "backend")}
        checked = axes.check_axes(table, path, f"sweep[{i}]")
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
    lse = "The 2-based log-sum-exp of the attention logits" + (" and the sink" if case.sinks else "") + "."
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
    return meta


REFERENCE = '''"""Sliding-window GQA {stage} over a paged KV cache, written out from its definition (swabench).

Queries are bottom-right aligned: with kv_len keys and qo_len queries, query i sits at position
p = kv_len - qo_len + i and sees keys p - WINDOW_LEFT .. p.{features}  lse is the base-2 log of
the softmax's denominator{sink_lse}.
"""
import math

import torch

WINDOW_LEFT = {window_left}
LOGITS_SOFT_CAP = {cap!r}  # 0.0: none; else logits = cap * tanh(logits / cap), after sm_scale
QUERY_BLOCK = 256  # queries at a time: bounds the logits held at once


@torch.no_grad()
def run({args}):
{body}


def attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale, sinks):
    total_q, num_qo_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert (num_qo_heads, num_kv_heads, head_dim, page_size) == {shape}
    group = num_qo_heads // num_kv_heads
    output = torch.zeros_like(q)
    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.shape[0] - 1):
        q_start, q_end = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        if q_end == q_start or pages.numel() == 0:
            continue
        kv_len = (pages.numel() - 1) * page_size + int(kv_last_page_len[b])
        for i0 in range(q_start, q_end, QUERY_BLOCK):
            i1 = min(q_end, i0 + QUERY_BLOCK)
            pos = torch.arange(i0, i1, device=q.device) - q_end + kv_len
            keys = torch.arange(max(0, int(pos[0]) - WINDOW_LEFT), int(pos[-1]) + 1, device=q.device)
            page, slot = pages[keys // page_size], keys % page_size
            k = k_cache[page, slot].float().repeat_interleave(group, dim=1)  # [keys, heads, head_dim]
            v = v_cache[page, slot].float().repeat_interleave(group, dim=1)
            logits = torch.einsum("qhd,khd->hqk", q[i0:i1].float(), k) * sm_scale
            if LOGITS_SOFT_CAP:
                logits = LOGITS_SOFT_CAP * torch.tanh(logits / LOGITS_SOFT_CAP)
            visible = (keys[None, :] <= pos[:, None]) & (keys[None, :] >= pos[:, None] - WINDOW_LEFT)
            logits = logits.masked_fill(~visible, -math.inf)
            if sinks is not None:  # one more logit per head in every denominator, with no value
                logits = torch.cat([logits, sinks.float()[:, None, None].expand(-1, i1 - i0, 1)], dim=-1)
            norm = torch.logsumexp(logits, dim=-1)  # [heads, queries]
            probs = torch.exp(logits - norm[..., None])[..., :keys.numel()]
            output[i0:i1] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
            lse[i0:i1] = (norm / math.log(2.0)).T
    return output, lse
'''


def reference(case) -> str:
    """The definition's reference: plain torch, a top-level ``run`` taking the inputs in the definition's
    order and returning (output, lse), lse = logsumexp / ln 2 as FlashInfer-Bench's references return it."""
    decode = case.mode == "decode"
    args = ["q", "k_cache", "v_cache", *(["qo_indptr"] * (not decode)), "kv_indptr", "kv_indices",
            "kv_last_page_len", "sm_scale", *(["sinks"] * case.sinks)]
    body = ["    qo_indptr = torch.arange(q.shape[0] + 1, device=q.device)  # decode: one query a request"] * decode
    body.append("    return attend(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, sm_scale, "
                + ("sinks)" if case.sinks else "None)"))
    features = "".join([" Every softmax denominator has one more term per head, exp(sinks[h]), with no value."
                        * case.sinks, " Logits are soft-capped." * bool(case.logits_soft_cap)])
    return REFERENCE.format(stage=STAGES[case.mode], features=features, window_left=case.window_left,
                            sink_lse=" (the sink's term included)" if case.sinks else "",
                            cap=float(case.logits_soft_cap), args=", ".join(args), body="\n".join(body),
                            shape=(case.num_qo_heads, case.num_kv_heads, case.head_dim, case.page_size))


# ---------------------------------------------------------------- import


def import_(fib_dir, definition: str, model: str, out=None) -> Imported:
    """One definition's workloads as a swabench trace for the model preset ``model``, written to ``out`` (JSON
    Lines).  Workloads carry no window: it comes from the preset.  A definition swabench exported carries its
    window (a ``window_left`` const axis), sinks and soft-cap, and they must agree with the preset (the preset's
    plain twin, ``model_features: false``, where the definition has neither); FlashInfer-Bench's own
    definitions carry none, so there the preset says all three.  Each request's keys are
    (pages - 1) * page_size + last_page_len; its prefix is keys - queries (decode: 1 query)."""
    root = Path(fib_dir)
    path, doc = _find_definition(root, definition)
    layer, stage, window_from = _layer(path, doc, model)
    lines, steps = [], 0
    for file, n, workload in _workload_records(root, definition):
        requests, meta = _requests(root, file, n, workload, stage, doc)
        _check_scale(file, n, workload, layer, model, window_from)
        count = int(meta.get("count", 1))
        line = {"mode": meta.get("mode", stage if stage == "decode" else "extend"), **layer,
                **{k: meta[k] for k in ("page_layout", "seed") if k in meta}, "requests": requests}
        lines.append(json.dumps({**line, **({"count": count} if count != 1 else {})}))
        steps += count
    text = "\n".join(lines) + "\n"
    traces.parse(text.encode(), out or "<import-fib>")  # what replay will read, checked before it is written
    if out is not None:
        from swabench.store import run_folder

        run_folder.atomic_write(Path(out), text)
    return Imported(Path(out) if out is not None else None, path, len(lines), steps, window_from)


def _json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FibError(f"{path}: cannot read {what} ({getattr(e, 'strerror', None) or e})") from None


def _find_definition(root: Path, wanted: str) -> tuple[Path, dict]:
    if not root.is_dir():
        raise FibError(f"{root}: no such folder")
    files = sorted((root / "definitions").rglob("*.json")) if (root / "definitions").is_dir() else []
    if not files:
        raise FibError(f"{root}: no definitions (definitions/**/*.json): not a FlashInfer-Bench folder")
    named = [p for p in files if p.stem == wanted]
    if not named:
        known = sorted(p.stem for p in files)
        raise FibError(f"--definition {wanted}: no such definition in {root}{axes.did_you_mean(wanted, known)}; "
                       f"available: {', '.join(known[:40])}" + (f" and {len(known) - 40} more" if len(known) > 40 else ""))
    doc = _json(named[0], "the definition")
    if not isinstance(doc, dict) or doc.get("name") != wanted:
        raise FibError(f"{named[0]}: name: {doc.get('name') if isinstance(doc, dict) else None!r}, not {wanted!r}")
    return named[0], doc


def _layer(path: Path, doc: dict, model: str) -> tuple[dict, str, str]:
    """The trace keys of the definition's layer for ``model`` (checked against it), its stage, and where the
    window came from."""
    name = doc["name"]
    stage = next((s for s in ("decode", "prefill") if name.startswith(f"gqa_paged_{s}")), None)
    if doc.get("op_type") != OP_TYPE or stage is None:
        raise FibError(f"{path}: op_type {doc.get('op_type')!r}, name {name}: not a GQA paged prefill or decode "
                       f"definition (op_type {OP_TYPE}, gqa_paged_prefill_* or gqa_paged_decode_*)")
    need = ["q", "k_cache", *(["qo_indptr"] * (stage == "prefill")), "kv_indptr", "kv_indices"]
    inputs = doc.get("inputs") if isinstance(doc.get("inputs"), dict) else {}
    missing = [k for k in need if not isinstance(inputs.get(k), dict)]
    if missing:
        raise FibError(f"{path}: inputs.{missing[0]}: missing; a GQA paged {stage} definition takes {', '.join(need)}")
    const = {k: a.get("value") for k, a in (doc.get("axes") or {}).items() if isinstance(a, dict)
             and a.get("type") == "const"}
    try:
        preset = models.get(model)
    except ValueError as e:
        raise FibError(f"--model: {e}") from None
    if preset.attention_chunk:
        raise FibError(f"--model {model}: chunked attention (attention_chunk {preset.attention_chunk}), no window")
    for field_ in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size"):
        if not isinstance(const.get(field_), int):
            raise FibError(f"{path}: axes.{field_}: missing, or not a const integer axis")
    for field_ in ("num_qo_heads", "num_kv_heads", "head_dim"):
        if const[field_] != getattr(preset, field_):
            raise FibError(f"{path}: axes.{field_} is {const[field_]}, but {model} has {field_} "
                           f"{getattr(preset, field_)}: the preset's head shape must match the definition's")
    layer = {"model": model}
    window_from = "preset"
    if "window_left" in const:  # one swabench exported: its window, sinks and soft-cap must be the preset's
        window_from = "definition"
        if const["window_left"] != preset.window_left:
            raise FibError(f"{path}: axes.window_left is {const['window_left']}, but {model} has window_left "
                           f"{preset.window_left} (sliding_window {preset.sliding_window}): the definition is "
                           f"another layer's")
        has = ("sinks" in inputs, _soft_cap(path, doc))
        if has == (False, 0.0) and preset.features():
            layer["model_features"] = False
        elif has != (preset.sinks, float(preset.logits_soft_cap)):
            raise FibError(f"{path}: the definition has sinks {has[0]}, soft-cap {has[1]:g}; {model} has sinks "
                           f"{preset.sinks}, soft-cap {preset.logits_soft_cap:g}")
    if const["page_size"] != axes.DEFAULTS["page_size"]:
        layer["page_size"] = const["page_size"]
    names = {v: k for k, v in DTYPES.items()}
    for key, tensor in (("dtype", "q"), ("kv_dtype", "k_cache")):
        dtype = names.get(inputs[tensor].get("dtype"))
        if dtype is None or (key == "dtype" and dtype == "float8_e4m3"):
            raise FibError(f"{path}: inputs.{tensor}.dtype: {inputs[tensor].get('dtype')!r} is not one swabench "
                           f"runs ({', '.join(DTYPES.values())})")
        if dtype != layer.get("dtype", axes.DEFAULTS["dtype"]):
            layer[key] = dtype
    return layer, stage, window_from


def _soft_cap(path: Path, doc: dict) -> float:
    """The reference's top-level ``LOGITS_SOFT_CAP`` (0.0 where it has none)."""
    try:
        tree = ast.parse(doc.get("reference") or "")
    except SyntaxError as e:
        raise FibError(f"{path}: reference: not Python ({e.msg}, line {e.lineno})") from None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["LOGITS_SOFT_CAP"]:
            try:
                return float(ast.literal_eval(node.value))
            except (ValueError, TypeError):
                raise FibError(f"{path}: reference: LOGITS_SOFT_CAP is not a number") from None
    return 0.0


def _workload_records(root: Path, wanted: str):
    """(file, line number, workload) of each of the definition's workload records."""
    files = sorted((root / "workloads").rglob(f"{wanted}.jsonl")) if (root / "workloads").is_dir() else []
    if not files:
        raise FibError(f"{root}: no workloads for {wanted} (workloads/**/{wanted}.jsonl)")
    found = 0
    for file in files:
        for n, text in enumerate(file.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise FibError(f"{file}: line {n}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("workload"), dict):
                raise FibError(f"{file}: line {n}: workload: missing; a workload record has definition and workload")
            if record.get("definition") != wanted:
                raise FibError(f"{file}: line {n}: definition: {record.get('definition')!r}, not {wanted!r}")
            found += 1
            yield file, n, record["workload"]
    if not found:
        raise FibError(f"{files[0]}: no workload records")


def _tensor(root: Path, file: Path, n: int, workload: dict, key: str, blobs: dict):
    """The stored index tensor ``key`` of a workload (a list), and its blob's swabench metadata; ``blobs``
    keeps each blob read."""
    safetensors = _safetensors()
    where = f"{file}: line {n}: workload.inputs.{key}"
    spec = (workload.get("inputs") or {}).get(key)
    if not isinstance(spec, dict) or spec.get("type") != "safetensors":
        kind = spec.get("type") if isinstance(spec, dict) else None
        raise FibError(f"{where}: {'missing' if spec is None else f'type {kind!r}'}: the page table must be stored "
                       f"(safetensors) to be read back")
    blob = root / str(spec.get("path"))
    if not blob.is_file():
        raise FibError(f"{where}.path: the blob {spec.get('path')} is missing")
    if blob not in blobs:
        try:
            with safetensors.safe_open(blob, framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get(META, "{}"))
            blobs[blob] = safetensors.torch.load_file(blob), meta
        except Exception as e:  # a truncated or foreign file: safetensors says what
            raise FibError(f"{where}.path: {spec.get('path')} is not a safetensors file this reads ({e})") from None
    tensors, meta = blobs[blob]
    if spec.get("tensor_key") not in tensors:
        raise FibError(f"{where}.tensor_key: {spec.get('tensor_key')!r} is not in {spec.get('path')}")
    return tensors[spec["tensor_key"]].tolist(), meta


def _requests(root: Path, file: Path, n: int, workload: dict, stage: str, doc: dict) -> tuple[list, dict]:
    """Each request's [prefix, queries] from the workload's index tensors, and its blob's swabench metadata."""
    page_size = doc["axes"]["page_size"]["value"]
    blobs = {}
    kv_indptr, meta = _tensor(root, file, n, workload, "kv_indptr", blobs)
    batch = len(kv_indptr) - 1
    pages = [b - a for a, b in zip(kv_indptr, kv_indptr[1:])]
    if "kv_last_page_len" in doc["inputs"]:
        last = _tensor(root, file, n, workload, "kv_last_page_len", blobs)[0]
    else:  # FlashInfer-Bench's page-size-1 definitions: every page is full
        last = [page_size] * batch
    if stage == "prefill":
        qo_indptr = _tensor(root, file, n, workload, "qo_indptr", blobs)[0]
        queries = [b - a for a, b in zip(qo_indptr, qo_indptr[1:])]
    else:
        queries = [1] * batch
    if batch < 1 or len(last) != batch or len(queries) != batch:
        raise FibError(f"{file}: line {n}: workload.inputs: kv_indptr, kv_last_page_len and qo_indptr disagree on "
                       f"the batch ({batch}, {len(last)}, {len(queries)} requests)")
    requests = []
    for b, (p, tail, q) in enumerate(zip(pages, last, queries)):
        keys = (p - 1) * page_size + tail
        if p < 1 or not 1 <= tail <= page_size or q < 1 or keys < q:
            raise FibError(f"{file}: line {n}: request {b}: {p} pages, last page {tail} of {page_size}, {q} queries: "
                           f"not a step swabench replays (each request needs a query and as many keys)")
        requests.append([keys - q, q])
    if not isinstance(meta, dict):
        raise FibError(f"{file}: line {n}: the blob's {META} metadata is not an object")
    return requests, meta


def _check_scale(file: Path, n: int, workload: dict, layer: dict, model: str, window_from: str) -> None:
    """A swabench export's sm_scale must be the preset's (FlashInfer-Bench's own collection may fall back to
    1/sqrt(128), docs/flashinfer-bench.md, so there the preset's is taken)."""
    spec = (workload.get("inputs") or {}).get("sm_scale")
    if window_from != "definition" or not isinstance(spec, dict) or spec.get("type") != "scalar":
        return
    preset = models.get(model)
    scale = preset.sm_scale or preset.head_dim ** -0.5
    if not isinstance(spec.get("value"), (int, float)) or abs(spec["value"] - scale) > 1e-6 * scale:
        raise FibError(f"{file}: line {n}: workload.inputs.sm_scale is {spec.get('value')!r}, but {model} scales by "
                       f"{scale:.6g}")
