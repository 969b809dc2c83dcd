"""FlashInfer-Bench workloads back as a swabench trace (``swabench import-fib``): the requests from each
workload's stored page table, the layer from a model preset, since workloads carry no window."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from swabench.errors import did_you_mean
from swabench.inputs import axes, models, traces
from swabench.inputs.fib import META, FibError, safetensors_package
from swabench.inputs.fib_definition import DTYPES, OP_TYPE
from swabench.store import reading


@dataclass
class Imported:
    out: Path
    definition: Path
    lines: int
    steps: int
    window_from: str  # "definition" (a swabench export: checked against the preset) or "preset"


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
        count, mode = meta.get("count", 1), meta.get("mode", stage if stage == "decode" else "extend")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1 or mode not in traces.MODES:
            raise FibError(f"{file}: line {n}: its blob's {META} metadata says count {count!r}, mode {mode!r}: a "
                           f"count is an integer >= 1 and a mode one of {', '.join(traces.MODES)}")
        stage_modes = ("decode",) if stage == "decode" else ("extend", "verify")
        if mode not in stage_modes:
            raise FibError(f"{file}: line {n}: its blob's {META} metadata says mode {mode!r}, but the definition is a "
                           f"{stage} definition ({' or '.join(stage_modes)})")
        wrong = traces.verify_problem(requests) if mode == "verify" else None
        if wrong:
            raise FibError(f"{file}: line {n}: its blob's {META} metadata says mode verify, but {wrong}")
        line = {"mode": mode, **layer, **{k: meta[k] for k in ("page_layout", "seed", "wrapper_mode") if k in meta},
                "requests": requests}
        lines.append(json.dumps({**line, **({"count": count} if count != 1 else {})}))
        steps += count
    text = "\n".join(lines) + "\n"
    traces.parse(text.encode(), f"{root} ({definition})")  # what replay will read, checked before it is written
    if out is not None:
        from swabench.store import run_folder

        run_folder.atomic_write(Path(out), text)
    return Imported(Path(out) if out is not None else None, path, len(lines), steps, window_from)


def _json(path: Path, what: str):
    def error(reason: str) -> FibError:
        return FibError(f"{path}: {what}: {reason}")

    try:
        return reading.json_file(path, reading.TRACE, error, traces.keys_once)
    except traces.RepeatedKey as e:
        raise FibError(f"{path}: {what}: key {e.args[0]!r} is given twice") from None


def _find_definition(root: Path, wanted: str) -> tuple[Path, dict]:
    if not root.is_dir():
        raise FibError(f"{root}: no such folder")
    files = sorted((root / "definitions").rglob("*.json")) if (root / "definitions").is_dir() else []
    if not files:
        raise FibError(f"{root}: no definitions (definitions/**/*.json): not a FlashInfer-Bench folder")
    named = [p for p in files if p.stem == wanted]
    if not named:
        known = sorted(p.stem for p in files)
        raise FibError(f"--definition {wanted}: no such definition in {root}{did_you_mean(wanted, known)}; "
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
    if not isinstance(doc.get("axes") or {}, dict):
        raise FibError(f"{path}: axes: {type(doc['axes']).__name__}, not an object of named axes "
                       f"({{\"page_size\": {{\"type\": \"const\", \"value\": 16}}, ...}})")
    odd = next((k for k, a in (doc.get("axes") or {}).items() if not isinstance(a, dict)), None)
    if odd is not None:
        raise FibError(f"{path}: axes.{odd}: {json.dumps(doc['axes'][odd])[:80]} is not an axis (an object such as "
                       f"{{\"type\": \"const\", \"value\": 16}} or {{\"type\": \"var\"}})")
    const = {k: a.get("value") for k, a in (doc.get("axes") or {}).items() if a.get("type") == "const"}
    try:
        preset = models.get(model)
    except ValueError as e:
        raise FibError(f"--model: {e}") from None
    if preset.attention_chunk:
        raise FibError(f"--model {model}: chunked attention (attention_chunk {preset.attention_chunk}), no window")
    for field_ in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size"):
        if isinstance(const.get(field_), bool) or not isinstance(const.get(field_), int):
            raise FibError(f"{path}: axes.{field_}: missing, or not a const integer axis")
    for field_ in ("num_qo_heads", "num_kv_heads", "head_dim"):
        if const[field_] != getattr(preset, field_):
            raise FibError(f"{path}: axes.{field_} is {const[field_]}, but {model} has {field_} "
                           f"{getattr(preset, field_)}: the preset's head shape must match the definition's")
    layer = {"model": model}
    window_from = "preset"
    if "window_left" in const:  # one swabench exported: its window, sinks and soft-cap must be the preset's
        window_from = "definition"
        if isinstance(const["window_left"], bool) or not isinstance(const["window_left"], int):
            raise FibError(f"{path}: axes.window_left: {const['window_left']!r} is not an integer (FlashInfer's "
                           f"window_left: -1, or W >= 0)")
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
    found, seen = 0, {}
    for file in files:
        lines = reading.read_text(file, reading.TRACE, lambda reason: FibError(f"{file}: the workload file: {reason}"))
        for n, text in enumerate(lines.splitlines(), 1):
            if not text.strip():
                continue
            try:
                record = reading.json_value(text, lambda reason: FibError(f"{file}: line {n}: {reason}"),
                                            traces.keys_once)
            except traces.RepeatedKey as e:
                raise FibError(f"{file}: line {n}: key {e.args[0]!r} is given twice") from None
            except json.JSONDecodeError as e:
                raise FibError(f"{file}: line {n}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("workload"), dict):
                raise FibError(f"{file}: line {n}: workload: missing; a workload record has definition and workload")
            if record.get("definition") != wanted:
                raise FibError(f"{file}: line {n}: definition: {record.get('definition')!r}, not {wanted!r}")
            uuid = record["workload"].get("uuid")
            if uuid is not None and uuid in seen:
                raise FibError(f"{file}: line {n}: workload.uuid {uuid!r} was given at {seen[uuid]} already: a step "
                               f"would count twice")
            seen[uuid] = f"{file.name} line {n}"
            found += 1
            yield file, n, record["workload"]
    if not found:
        raise FibError(f"{files[0]}: no workload records")


def _tensor(root: Path, file: Path, n: int, workload: dict, key: str, blobs: dict):
    """The stored index tensor ``key`` of a workload (a list), and its blob's swabench metadata; ``blobs``
    keeps each blob read."""
    safetensors = safetensors_package()
    where = f"{file}: line {n}: workload.inputs.{key}"
    spec = (workload.get("inputs") or {}).get(key)
    if not isinstance(spec, dict) or spec.get("type") != "safetensors":
        kind = spec.get("type") if isinstance(spec, dict) else None
        raise FibError(f"{where}: {'missing' if spec is None else f'type {kind!r}'}: the page table must be stored "
                       f"(safetensors) to be read back")
    given = str(spec.get("path"))
    blob = root / given
    if Path(given).is_absolute() or root.resolve() not in blob.resolve().parents:
        raise FibError(f"{where}.path: {given[:200]} lies outside {root}: a folder's blobs are its own")
    reading.regular(blob, reading.TRACE, lambda reason: FibError(f"{where}.path: the blob {given[:200]}: {reason}"))
    if blob not in blobs:
        try:
            with safetensors.safe_open(blob, framework="pt") as f:
                said = (f.metadata() or {}).get(META, "{}")
            tensors = safetensors.torch.load_file(blob)
        except Exception as e:  # a truncated or foreign file: safetensors says what
            raise FibError(f"{where}.path: {spec.get('path')} is not a safetensors file this reads ({e})") from None
        error = lambda reason: FibError(f"{where}.path: {blob}: its metadata {META!r}: {reason}")  # noqa: E731
        try:
            blobs[blob] = tensors, reading.json_value(said, error)
        except json.JSONDecodeError as e:
            raise error(f"not valid JSON ({e})") from None
    tensors, meta = blobs[blob]
    if spec.get("tensor_key") not in tensors:
        raise FibError(f"{where}.tensor_key: {spec.get('tensor_key')!r} is not in {spec.get('path')}")
    tensor = tensors[spec["tensor_key"]]
    if tensor.is_floating_point() or tensor.is_complex() or str(tensor.dtype) == "torch.bool":
        raise FibError(f"{where}: {spec.get('tensor_key')!r} holds {tensor.dtype}, not integers: an index tensor "
                       f"is int32 or int64")
    return tensor.tolist(), meta


def _requests(root: Path, file: Path, n: int, workload: dict, stage: str, doc: dict) -> tuple[list, dict]:
    """Each request's [prefix, queries] from the workload's index tensors, and its blob's swabench metadata."""
    page_size = doc["axes"]["page_size"]["value"]
    blobs = {}
    kv_indptr, meta = _tensor(root, file, n, workload, "kv_indptr", blobs)
    batch = len(kv_indptr) - 1
    pages = [b - a for a, b in zip(kv_indptr, kv_indptr[1:])]
    kv_indices = _tensor(root, file, n, workload, "kv_indices", blobs)[0]
    if not kv_indptr or kv_indptr[0] != 0 or len(kv_indices) != kv_indptr[-1] or min(kv_indices, default=0) < 0:
        raise FibError(f"{file}: line {n}: workload.inputs.kv_indices: {len(kv_indices)} page ids from "
                       f"{min(kv_indices, default=0)}; kv_indptr from {kv_indptr[0] if kv_indptr else None} to "
                       f"{kv_indptr[-1] if kv_indptr else None} wants as many page ids as it ends at, each >= 0")
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
