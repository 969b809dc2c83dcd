"""A trace from FlashInfer's own API log: what every wrapper's ``plan()`` received on a running server,
read back as the steps ``swabench replay`` takes (docs/serving-paths.md, "Capturing a trace").

With ``FLASHINFER_LOGLEVEL=10`` FlashInfer (0.6.1 and later) writes one folder per logged call,
``<time>_pid<PID>_<Class.method>_call<NNNN>/``, holding ``inputs.pt`` (the call's tensors, by
``arg_<i>`` / ``kwarg_<name>``) and ``metadata.jsonl`` (its scalars, the signature it was called
through, and ``execution_status``: ``inputs_saved``, then ``completed``); ``session.jsonl`` beside
them repeats every record in call order.  ``FLASHINFER_DUMP_INCLUDE="*Wrapper.plan"`` keeps the log to
the plan calls, whose tensors are index arrays, never the KV cache.

Each plan with a window (``window_left >= 0``) becomes a trace line: the layer (heads, head_dim, page
size, window, soft-cap, scale, dtypes; sinks for the sink wrapper), each request's [prefix, queries]
from the indptrs and last-page lengths, and the mode (decode for the decode wrapper or one query per
request; verify where every request has the same number of queries, more than one, after a prefix;
extend otherwise).  Identical steps are merged into one line with a count.  Where the log holds the
``run()`` calls too, a plan counts once per run (one per layer that shares it); where it does not,
once per plan, and the summary says so.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from swabench.errors import UserError

CALL_FOLDER = re.compile(r"^(\d{8}_\d{6}_\d{3})_pid(\d+)_(.+)_call(\d{4,})$")
PREFILL_PAGED, PREFILL_RAGGED = "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"
DECODE, SINK, DECODE_SINK = ("BatchDecodeWithPagedKVCacheWrapper", "BatchAttentionWithAttentionSinkWrapper",
                             "BatchDecodeWithAttentionSinkWrapper")
WRAPPERS = (PREFILL_PAGED, PREFILL_RAGGED, DECODE, SINK, DECODE_SINK)
# The decode wrapper's plan takes its options as keywords; older callers passed them positionally after
# page_size, in this order (flashinfer/decode.py, _BATCH_DECODE_PLAN_LEGACY_POS_ARGS), with these defaults.
DECODE_LEGACY = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type",
                 "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens",
                 "fixed_split_size", "disable_split_kv", "q_len_per_req")
DECODE_DEFAULTS = {"window_left": -1, "logits_soft_cap": None, "q_data_type": "float16", "kv_data_type": None,
                   "data_type": None, "sm_scale": None}
INCLUDE = "*Wrapper.plan"  # FLASHINFER_DUMP_INCLUDE: the plan calls alone (add *Wrapper.run to count layers)


class DumpError(UserError, ValueError):
    def __init__(self, where, message: str):
        super().__init__(f"{where}: {message}")


@dataclass
class Imported:
    """What an import found: the trace's lines (JSON objects, counts merged), and what it left out."""

    lines: list[dict]
    plans: int  # plan calls of the wrappers above that completed
    runs_logged: bool  # whether the log held run() calls (then counts weigh the layers that share a plan)
    left_out: Counter = field(default_factory=Counter)  # why -> plan calls not imported
    releases: set = field(default_factory=set)  # the FlashInfer releases that wrote the log

    def summary(self) -> str:
        steps = sum(line["count"] for line in self.lines)
        said = [f"{self.plans} plan calls of FlashInfer {', '.join(sorted(self.releases)) or '(release unknown)'}: "
                f"{len(self.lines)} trace lines, {steps} steps"]
        said += [f"  {n} not imported: {why}" for why, n in self.left_out.most_common()]
        said.append("  counts are run() calls (one per layer that shares a plan)" if self.runs_logged else
                    "  counts are plan calls: the log holds no run() calls, so the layers that share a plan are not "
                    "counted (log *Wrapper.run too to count them; that also writes the KV cache)")
        return "\n".join(said)


@dataclass
class _Call:
    folder: Path
    name: str  # Class.method
    record: dict  # the last record of its metadata.jsonl


def read(dump: Path, bucket: int = 1, progress=None) -> Imported:
    """The trace lines of a FlashInfer API log folder; DumpError naming the problem for a folder that is
    no dump, a truncated or corrupt one, or one with no plan that has a window.  ``progress`` (start,
    advance, finish: the CLI's bar) is told of each plan call read."""
    dump = Path(dump)
    if not dump.is_dir():
        raise DumpError(dump, "not a folder")
    calls = _calls(dump)
    plans = [i for i, c in enumerate(calls) if c.name.endswith(".plan") and c.name.split(".")[0] in WRAPPERS]
    runs: Counter = Counter()
    latest: dict[tuple, int] = {}  # (pid, self_id) -> index of its wrapper's latest plan
    runs_logged = False
    for i, c in enumerate(calls):
        key = (c.record.get("process_id"), c.record.get("self_id"))
        if c.name.endswith(".plan"):
            latest[key] = i
        elif c.name.endswith(".run") and c.name.split(".")[0] in WRAPPERS:
            runs_logged = True
            if key in latest:
                runs[latest[key]] += 1
    steps: Counter = Counter()
    left_out: Counter = Counter()
    refused: dict[str, str | None] = {}  # a distinct step -> why swabench cannot replay it
    done = 0
    if progress:
        progress.start(len(plans), "import", "plan calls")
    for i in plans:
        if progress:
            progress.advance(1)
        c = calls[i]
        if c.record.get("execution_status") != "completed":
            left_out[f"the call did not complete ({c.record.get('execution_status')}: it raised, or the process "
                     f"stopped)"] += 1
            continue
        done += 1
        step, why = _step(c, bucket)
        key = json.dumps(step, sort_keys=True)
        if not why and key not in refused:
            refused[key] = _refused(step)
        why = why or refused[key] or ("planned and never run (no run() call of its wrapper logged after it)"
                                      if runs_logged and not runs[i] else None)
        if why:
            left_out[why] += 1
            continue
        steps[key] += runs[i] if runs_logged else 1
    if progress:
        progress.finish()
    releases = {str(calls[i].record.get("versions", {}).get("flashinfer")) for i in plans
                if calls[i].record.get("versions", {}).get("flashinfer")}
    lines = [{**json.loads(text), "count": n} for text, n in steps.items()]
    if not lines:
        found = f"{done} plans" + (f" (and {len(plans) - done} that did not complete)" if len(plans) > done else "")
        why = "; ".join(f"{n} {reason}" for reason, n in left_out.most_common())
        raise DumpError(dump, f"{found}, none with a window" + (f" ({why})" if why else "") +
                        ": nothing to import (a layer with a window plans with window_left >= 0)")
    return Imported(lines, done, runs_logged, left_out, releases)


def _refused(step: dict) -> str | None:
    """Why swabench cannot replay this step (a shape or dtype no scenario takes), or None."""
    from swabench.spec import axes, traces

    try:
        traces.parse(json.dumps(step).encode(), "<plan>")
    except (traces.TraceError, axes.ScenarioError) as e:
        return f"a step swabench does not take ({str(e).removeprefix('<plan>: ')})"
    return None


def _calls(dump: Path) -> list[_Call]:
    """Every logged call, in call order (session.jsonl's, else the folders' names)."""
    folders = {p.name: p for p in dump.iterdir() if p.is_dir() and CALL_FOLDER.match(p.name)}
    session = dump / "session.jsonl"
    if not folders:
        raise DumpError(dump, "not a FlashInfer API log: no call folders (<time>_pid<PID>_<Class.method>_call<NNNN>); "
                              "set FLASHINFER_LOGLEVEL=10 and FLASHINFER_DUMP_DIR to this folder on the server")
    order = list(folders)
    if session.is_file():
        seen = []
        for n, record in enumerate(_jsonl(session), 1):
            name = Path(str(record.get("dump_dir", ""))).name
            if name not in folders and not record.get("graph_capture_flushed"):
                raise DumpError(session, f"line {n} names a call folder that is not here ({name}): a dump copied "
                                         f"in part?")
            seen.append(name)
        order = list(dict.fromkeys(seen)) + sorted(set(folders) - set(seen))
    else:
        order.sort()
    calls = []
    for name in order:
        folder = folders[name]
        meta = folder / "metadata.jsonl"
        if not meta.is_file():
            raise DumpError(folder, "no metadata.jsonl: a truncated dump (the process stopped while writing this call)")
        records = _jsonl(meta)
        if not records:
            raise DumpError(meta, "empty: a truncated dump")
        calls.append(_Call(folder, CALL_FOLDER.match(name).group(3), records[-1]))
    return calls


def _jsonl(path: Path) -> list[dict]:
    records = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DumpError(path, f"cannot be read ({e})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DumpError(path, f"line {n} is not JSON ({e.msg}): a truncated or corrupt log") from None
        if not isinstance(record, dict):
            raise DumpError(path, f"line {n} is not a JSON object: not a FlashInfer API log")
        records.append(record)
    return records


def _arguments(c: _Call) -> dict:
    """The plan's arguments by name: positional ones bound through the signature it was called with,
    keywords as given, and the defaults of the ones not passed; tensors loaded from inputs.pt."""
    import torch

    wrapper = c.name.split(".")[0]
    meta = c.record.get("input_metadata") or {}
    try:
        tensors = torch.load(c.folder / "inputs.pt", map_location="cpu", weights_only=True) \
            if (c.folder / "inputs.pt").exists() else {}
    except Exception as e:  # a truncated zip, a pickle torch will not load
        raise DumpError(c.folder / "inputs.pt", f"cannot be loaded ({type(e).__name__}: {e}): a truncated or "
                                                 f"corrupt dump") from None
    params = _signature(c.record.get("function_signature", ""))
    names = [p for p, _ in params if not p.startswith("*")]
    star = next((i for i, (p, _) in enumerate(params) if p.startswith("*") and not p.startswith("**")), None)
    args = {**{k: v for k, v in params if not k.startswith("*")}}
    if wrapper in (DECODE, DECODE_SINK):
        args.update(DECODE_DEFAULTS)
    values = {**{k: _value(v) for k, v in meta.items()}, **tensors}
    for key, value in values.items():
        if key.startswith("kwarg_"):
            args[key.removeprefix("kwarg_")] = value
        elif key.startswith("arg_") and "__" not in key:
            i = int(key.removeprefix("arg_"))
            if star is not None and i >= star:  # the decode plan's legacy positional options
                legacy = i - star
                if legacy < len(DECODE_LEGACY):
                    args[DECODE_LEGACY[legacy]] = value
            elif i < len(names):
                args[names[i]] = value
    return args


def _signature(text: str) -> list[tuple[str, object]]:
    """(name, default) of each parameter of ``str(inspect.signature(f))`` (annotations dropped; a default
    that is no Python literal reads as None)."""
    inner = text.strip()[1:text.strip().rfind(")")] if text.strip().startswith("(") else ""
    parts, depth, current = [], 0, ""
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    out = []
    for part in (p.strip() for p in parts if p.strip()):
        if part == "/" or part == "*":
            continue
        name, _, default = part.partition("=")
        name = name.split(":")[0].strip()
        try:
            value = ast.literal_eval(default.strip()) if default else None
        except (ValueError, SyntaxError):
            value = None
        out.append((name, value))
    return out


def _value(v):
    """A scalar of the log as Python: a dtype record as its name ('bfloat16')."""
    if isinstance(v, dict) and v.get("type") == "torch.dtype":
        return str(v.get("value", "")).removeprefix("torch.")
    return v


def _dtype(v) -> str | None:
    return None if v is None else str(v).removeprefix("torch.")


def _ints(t) -> list[int]:
    return [int(x) for x in t.tolist()]


def _step(c: _Call, bucket: int) -> tuple[dict | None, str | None]:
    """A plan's trace line (without its count), or why it is not imported."""
    wrapper = c.name.split(".")[0]
    a = _arguments(c)
    window = a.get("window_left")
    window = -1 if window is None else int(window)
    if a.get("custom_mask") is not None or a.get("packed_custom_mask") is not None:
        return None, "planned with a custom mask (any window is in the mask)"
    if window < 0:
        return None, "no window (window_left = -1): a global layer, or a window the caller applies itself"
    decode = wrapper in (DECODE, DECODE_SINK)
    if not decode and not a.get("causal", False):
        return None, "not causal (swabench times causal windows)"
    try:
        if wrapper == PREFILL_RAGGED:
            qo = _ints(a["qo_indptr"])
            kv = _ints(a["kv_indptr"])
            kv_lens = [kv[i + 1] - kv[i] for i in range(len(kv) - 1)]
            page = {"storage": "ragged"}
        else:
            indptr = _ints(a["indptr" if decode else "paged_kv_indptr"])
            last = _ints(a["last_page_len" if decode else "paged_kv_last_page_len"])
            size = int(a["page_size"])
            kv_lens = [(indptr[i + 1] - indptr[i] - 1) * size + last[i] if indptr[i + 1] > indptr[i] else 0
                       for i in range(len(indptr) - 1)]
            qo = list(range(len(kv_lens) + 1)) if decode else _ints(a["qo_indptr"])
            page = {"page_size": size}
        head_dim = int(a["head_dim"] if decode else a["head_dim_qk"])
        layer = {"num_qo_heads": int(a["num_qo_heads"]), "num_kv_heads": int(a["num_kv_heads"]), "head_dim": head_dim,
                 "window_left": window, **page}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        return None, f"its arguments do not read as a plan ({type(e).__name__}: {e})"
    q_lens = [qo[i + 1] - qo[i] for i in range(len(qo) - 1)]
    if len(q_lens) != len(kv_lens) or any(q < 1 or k < q for q, k in zip(q_lens, kv_lens)):
        return None, "requests with no query or fewer keys than queries"
    prefixes = [k - q for q, k in zip(q_lens, kv_lens)]
    if bucket > 1:
        prefixes = [-(-p // bucket) * bucket for p in prefixes]
    mode = "decode" if decode or all(q == 1 for q in q_lens) else \
        "verify" if len(set(q_lens)) == 1 and all(p > 0 for p in prefixes) else "extend"
    dtype = _dtype(a.get("q_data_type")) or "float16"
    kv_dtype = _dtype(a.get("kv_data_type") or a.get("data_type"))
    layer["dtype"] = dtype
    if kv_dtype and kv_dtype != dtype:
        layer["kv_dtype"] = kv_dtype
    if a.get("logits_soft_cap"):
        layer["logits_soft_cap"] = float(a["logits_soft_cap"])
    scale = a.get("sm_scale")
    if scale is not None and abs(float(scale) - head_dim ** -0.5) > 1e-6 * head_dim ** -0.5:
        layer["sm_scale"] = float(scale)
    if wrapper in (SINK, DECODE_SINK):
        layer["sinks"] = True
    return {"mode": mode, **layer, "requests": [[p, q] for p, q in zip(prefixes, q_lens)]}, None


def to_jsonl(imported: Imported) -> str:
    return "".join(json.dumps(line) + "\n" for line in imported.lines)
