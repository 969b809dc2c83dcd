"""Trace replay (docs/serving-paths.md): the steps a server really ran, each distinct step gated and timed once
and weighted by how often it occurs.

A trace is JSON Lines, one serving step a line::

    {"mode": "decode", "model": "gpt-oss-120b", "requests": [[8191, 1], [20480, 1]]}
    {"mode": "extend", "num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128, "sliding_window": 4096,
     "page_size": 16, "requests": [[0, 2048], [6144, 512]], "count": 3}

``requests`` lists each request's [prefix, queries] (keys already cached, tokens of this step);
``mode`` is extend (prefill, chunked prefill, draft extend), verify or decode; the layer is a
``model`` preset (``"model_features": false`` drops its sinks and soft-cap) or its shape (any
scenario axis but the lengths, the batch and the mode);
``count`` (default 1, at most MAX_COUNT, as is the trace's sum) says how many such steps the line stands for.  A trace becomes a scenario
with one sweep group per distinct step, so replay runs through the same gate, timers and run
folder as any scenario, and the folder's meta.json keeps each case's weight.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from swabench.inputs import axes, models, scenarios
from swabench.inputs.plan_calls import VERIFY_MAX
from swabench.core import semantics
from swabench.core.cases import QO_FIELD
from swabench.errors import UserError
from swabench.store import reading

MODES = ("extend", "verify", "decode")
LAYER = ("model", "model_features", "num_qo_heads", "num_kv_heads", "head_dim", "sliding_window", "window_left",
         "sinks", "logits_soft_cap", "sm_scale", "kv_dtype", "dtype", "page_size", "page_layout", "storage", "seed",
         "causal", "attention_chunk", "wrapper_mode")
KEYS = ("mode", "requests", "count", *LAYER)


MAX_COUNT = 10 ** 12  # a line's count and the trace's sum: far past any server's steps, far from int64's end


class TraceError(UserError, ValueError):
    def __init__(self, path, line: int | None, message: str):
        super().__init__(f"{path}" + (f": line {line}" if line else "") + f": {message}")


@dataclass(frozen=True)
class Step:
    """One distinct serving step: the layer, the mode, and each request's (prefix, queries)."""

    mode: str
    layer: tuple  # sorted (axis, value) pairs
    requests: tuple  # ((prefix, queries), ...)

    def axes(self) -> dict:
        """The case axes of this step (a per-request length is a tuple)."""
        prefixes, queries = zip(*self.requests)
        qo = {} if self.mode == "decode" else {QO_FIELD[self.mode]: _one_or_each(queries)}
        return {"mode": self.mode, "batch_size": len(self.requests), "prefix_len": _one_or_each(prefixes), **qo,
                **dict(self.layer)}


def _one_or_each(values):
    return values[0] if len(set(values)) == 1 else tuple(values)


def _as_scenario_values(values: dict) -> dict:
    """Case axes as a sweep group writes them: a per-request list is a list inside the list."""
    return {k: [list(v)] if isinstance(v, tuple) else v for k, v in values.items()}


MAX_BYTES = reading.TRACE


def read_bytes(path) -> bytes:
    """The trace file's bytes: a regular file of at most MAX_BYTES."""
    return reading.read_bytes(path, MAX_BYTES, lambda reason: TraceError(path, None, reason))


def read(path) -> Counter:
    """The trace's distinct steps and how many steps each stands for (TraceError naming the line)."""
    return parse(read_bytes(path), path)


def parse(data: bytes, path="<trace>") -> Counter:
    """``read`` on bytes already in hand."""
    try:
        lines = data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise TraceError(path, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    steps, total = Counter(), 0
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            line = reading.json_value(text, lambda reason: TraceError(path, n, reason), keys_once)
        except json.JSONDecodeError as e:
            raise TraceError(path, n, f"not JSON ({e.msg})") from None
        except RepeatedKey as e:
            raise TraceError(path, n, f"key {e.args[0]!r} given twice: give each key once") from None
        step, count = _step(path, n, line)
        axes.make_case(step.axes(), path, f"line {n}")
        steps[step] += count
        total += count
        if total > MAX_COUNT:
            raise TraceError(path, n, f"count: the trace's counts add up to more than {MAX_COUNT} steps")
    if not steps:
        raise TraceError(path, None, "no steps: one JSON object a line, see `swabench replay --help`")
    return steps


def verify_problem(requests, verify_max: int = VERIFY_MAX) -> str | None:
    """Why [prefix, queries] requests are no verify step, or None: a verify step checks one draft block of at most
    ``verify_max`` tokens a request, the same for every request (the rule ``swabench import`` reads plans by)."""
    blocks = sorted({q for _, q in requests})
    if len(blocks) > 1 or blocks[0] > verify_max:
        return (f"a verify step's requests each check one draft block of the same size, at most {verify_max} tokens; "
                f"these have {', '.join(map(str, blocks[:4]))}{' ...' if len(blocks) > 4 else ''}")
    return None


class RepeatedKey(Exception):
    pass


def keys_once(pairs: list) -> dict:
    """A JSON object whose keys are each given once (json.loads would keep the last silently)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise RepeatedKey(key)
        seen.add(key)
    return dict(pairs)


def _step(path, n: int, line) -> tuple[Step, int]:
    if not isinstance(line, dict):
        raise TraceError(path, n, "must be a JSON object")
    unknown = [k for k in line if k not in KEYS]
    if unknown:
        raise TraceError(path, n, f"unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    if line.get("mode") not in MODES:
        raise TraceError(path, n, f"mode: must be one of {', '.join(MODES)} (a draft extend step is an extend); "
                                  f"got {line.get('mode')!r}")
    requests = line.get("requests")
    if not isinstance(requests, list) or not requests or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
            and r[0] >= 0 and r[1] >= 1 for r in requests):
        raise TraceError(path, n, "requests: must be a non-empty list of [prefix >= 0, queries >= 1] pairs")
    if line["mode"] == "decode" and any(q != 1 for _, q in requests):
        raise TraceError(path, n, "requests: a decode step has one query per request")
    wrong = verify_problem(requests)
    if line["mode"] == "verify" and wrong:
        raise TraceError(path, n, f"requests: {wrong}; give mode extend")
    count = line.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise TraceError(path, n, f"count: must be an integer from 1 to {MAX_COUNT}, got {count!r}")
    layer = {k: v for k, v in line.items() if k in LAYER}
    if any(isinstance(v, list) for v in layer.values()):
        raise TraceError(path, n, "one value per layer key (a trace line is one step, not a sweep)")
    layer = {k: v[0] for k, v in axes.check_axes(layer, path, f"line {n}").items()}  # checked, aliases resolved
    if "model_features" in layer and "model" not in layer:
        raise TraceError(path, n, "model_features applies to a model preset: give model too")
    if "model_features" in layer and (layer["model_features"] or not models.get(layer["model"]).features()):
        del layer["model_features"]  # as served, or a preset with nothing to drop: the same step either way
    clash = [k for k in axes.MODEL_SETS if k in layer] if "model" in layer else []
    if clash:
        raise TraceError(path, n, f"the model preset sets {clash[0]}: give the model or the shape, not both")
    if "sliding_window" in layer and "window_left" in layer:
        raise TraceError(path, n, "give only one of window_left / sliding_window, not both (window_left "
                                  f"{layer['window_left']}, sliding_window {layer['sliding_window']})")
    if "sliding_window" in layer:  # one spelling of the window, so equal steps are one step
        layer["window_left"] = semantics.window_left_from(sliding_window=layer.pop("sliding_window"))
    for key in ("causal", "attention_chunk"):  # at their defaults: the same step as without them
        if key in layer and layer[key] == axes.DEFAULTS[key]:
            del layer[key]
    if "model" not in layer and "window_left" not in layer and "attention_chunk" not in layer:
        raise TraceError(path, n, "give the layer: a model preset, or its shape with window_left or sliding_window "
                                  "(or attention_chunk)")
    return Step(line["mode"], tuple(sorted(layer.items())), tuple(tuple(r) for r in requests)), count


def scenario(path, steps: Counter, implementations: list[str], backends=("fa2", "fa3")) -> scenarios.Scenario:
    """The scenario of a trace: one sweep group per distinct step, named by its first line's order,
    each through every backend in ``backends``."""
    groups = [{"group": f"step-{i}", **_as_scenario_values(step.axes())} for i, step in enumerate(steps)]
    doc = {"name": "replay-" + scenarios.declared_name({}, path), "implementations": implementations,
           "description": f"replay of {Path(path).name}: {len(steps)} distinct steps, {sum(steps.values())} in all",
           "fixed": {"backend": list(backends)}, "sweep": groups}
    return scenarios.parse(doc, path, _toml(doc))


def weights(steps: Counter) -> dict[str, int]:
    """case_id -> how many steps of the trace it stands for."""
    out = Counter()
    for step, count in steps.items():
        out[axes.make_case(step.axes()).case_id] += count
    return dict(out)


def _toml(doc: dict) -> str:
    """The generated scenario as TOML (what the run folder keeps as scenario.toml)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"{k} = {value(doc[k])}" for k in ("name", "description", "implementations")]
    lines += ["", "[fixed]"] + [f"{k} = {value(v)}" for k, v in doc["fixed"].items()]
    for group in doc["sweep"]:
        lines += ["", "[[sweep]]"] + [f"{k} = {value(v)}" for k, v in group.items()]
    return "\n".join(lines) + "\n"
