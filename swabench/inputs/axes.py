"""Scenario axes: each axis and the values it takes, the defaults, and how one combination of values
becomes a Case, with the checks that need several fields at once.  Every message names the file,
the field and the allowed values."""

from __future__ import annotations

import math

from swabench.core import footprint, numerics, semantics, stale, trees
from swabench.core.cases import (CACHE_FILLS, LENGTH_SALT, MODES, QO_FIELD, STORAGES, WRAPPER_MODES, Case,
                                  parse_accept, parse_length)
from swabench.errors import UserError, did_you_mean
from swabench.impls import registry
from swabench.inputs import models


PAGE_LAYOUTS = ("scattered", "contiguous", "evicted-reused", "evicted-null")
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
          "half": "float16", "float32": "float32", "fp32": "float32"}


class ScenarioError(UserError, ValueError):
    """A scenario file problem, phrased for the person who wrote the file."""

    def __init__(self, path, field_name: str, message: str):
        self.path, self.field = str(path), field_name
        super().__init__(f"{path}: {field_name}: {message}")


# ---------------------------------------------------------------- field checks

def _int(lo: int, what: str, hi: int | None = None):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise ValueError(f"must be {what}, got {value!r}")
        return value
    return check


def _choice(allowed, aliases=None):
    aliases = aliases or {a: a for a in allowed}

    def check(value):
        if not isinstance(value, str) or value not in aliases:  # a table or list is no name (nor hashable)
            hint = did_you_mean(value, aliases) if isinstance(value, str) else ""
            raise ValueError(f"must be one of {', '.join(allowed)}; got {value!r}{hint}")
        return aliases[value]
    return check


def _backend(value):
    """A backend some registered library takes (asked of the registry when a value is checked)."""
    return _choice(registry.backends())(value)


def _head_dim(value):
    _int(8, "a positive multiple of 8")(value)
    if value % 8:
        raise ValueError(f"must be a positive multiple of 8, got {value!r}")
    return value


WINDOW_MAX = 2 ** 31 - 1  # FlashInfer takes window_left as a C int32
PAGE_SIZE_MAX = 1 << 16  # far past any engine's page; a larger one is no cache layout, only a memory estimate's blame
SEED_MAX = 2 ** 63 - 1


def _sliding_window(value):
    if value == -1:
        return value
    return _int(1, f"an integer from 1 to {WINDOW_MAX + 1} (HF convention: W + 1 keys), or -1 for no window",
                WINDOW_MAX + 1)(value)


def _length(lo: int):
    def check(value):
        return parse_length(value, lo)
    return check


def _accept(value):
    parse_accept(value)
    return value


def _bool(value):
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _float(lo: float, what: str, open_low: bool = False):
    def check(value):
        try:
            number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
        except OverflowError:  # an integer past the largest float (a trace line's JSON may hold one)
            number = None
        if number is None or not math.isfinite(number) or number < lo or (open_low and number == lo):
            raise ValueError(f"must be {what}, got {value!r}")
        return number
    return check


KV_DTYPES = {**DTYPES, "float8_e4m3": "float8_e4m3", "fp8": "float8_e4m3", "fp8_e4m3": "float8_e4m3",
             "float8_e4m3fn": "float8_e4m3"}


AXES = {
    "mode": _choice(MODES),
    "storage": _choice(STORAGES),
    "batch_size": _int(1, "an integer >= 1"),
    "prefix_len": _length(0),
    "seq_len": _length(1),
    "qo_len": _length(1),
    "extend_len": _length(1),
    "draft_tokens": _length(1),
    "accept": _accept,
    "window_left": _int(-1, f"an integer from -1 to {WINDOW_MAX} (-1 = no window; FlashInfer's int32)", WINDOW_MAX),
    "sliding_window": _sliding_window,
    "page_size": _int(1, f"an integer from 1 to {PAGE_SIZE_MAX} (the keys a page holds: engines use 1 to 256)",
                      PAGE_SIZE_MAX),
    "page_layout": _choice(PAGE_LAYOUTS),
    "num_qo_heads": _int(1, "an integer >= 1"),
    "num_kv_heads": _int(1, "an integer >= 1"),
    "head_dim": _head_dim,
    "dtype": _choice(("bfloat16", "float16", "float32"), DTYPES),
    "backend": _backend,
    "seed": _int(0, f"an integer from 0 to 2**63 - 1 = {SEED_MAX} (torch's generators take 64 bits, and the "
                    f"gate seeds some at small offsets from it)", SEED_MAX),
    "sinks": _bool,
    "logits_soft_cap": _float(0.0, "a number >= 0 (0 = off; Gemma 2 uses 50)"),
    "sm_scale": _float(0.0, "a number > 0 (default head_dim ** -0.5)", open_low=True),
    "kv_dtype": _choice(("bfloat16", "float16", "float32", "float8_e4m3"), KV_DTYPES),
    "model": _choice(tuple(models.MODELS)),
    "model_features": _bool,
    "causal": _bool,
    "attention_chunk": _int(0, "an integer >= 0 (0 = off; Llama 4 uses 8192)"),
    "wrapper_mode": _choice(WRAPPER_MODES),
    "tree": trees.parse,
    "block": _int(0, "an integer >= 0 (0 = off; DFlash's draft block is 8 or 16)"),
    "prefills": _int(0, "an integer >= 0 (a mixed step's requests that run a prefill chunk; the rest decode)"),
    "cache_fill": _choice(CACHE_FILLS),
}
MODEL_SETS = ("num_qo_heads", "num_kv_heads", "head_dim", "window_left", "sliding_window", "sinks",
              "logits_soft_cap", "sm_scale", "attention_chunk")  # what a model preset decides
DEFAULTS = {"storage": "paged", "batch_size": 1, "page_size": 16, "page_layout": "scattered",
            "num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dtype": "bfloat16",
            "backend": "fa2", "seed": 0, "accept": "uniform", "sinks": False, "logits_soft_cap": 0.0,
            "model_features": True, "causal": True, "attention_chunk": 0, "wrapper_mode": "cuda-graph", "block": 0,
            "prefills": 0, "cache_fill": "random"}


LENGTHS = ("prefix_len", "seq_len", "qo_len", "extend_len", "draft_tokens")
# The axes only some modes' steps use, and the modes that take each: a group of several modes gives one to those
# that take it, and one given where none of its modes takes it is refused as the scenario is read
MODE_AXES = {**{f: tuple(m for m in QO_FIELD if QO_FIELD[m] == f) for f in QO_FIELD.values()},
             "accept": ("draft_extend",), "tree": ("verify",), "prefills": ("mixed",),
             "block": tuple(m for m in MODES if m != "decode")}


def check_axes(table: dict, path, where: str) -> dict:
    """Validate a [fixed] or [[sweep]] table; every value becomes a non-empty list."""
    if not isinstance(table, dict):
        raise ScenarioError(path, where, "must be a table of axis = value(s)")
    out = {}
    for name, raw in table.items():
        if name not in AXES:
            raise ScenarioError(path, f"{where}.{name}", f"unknown axis{did_you_mean(name, AXES)}; "
                                                         f"allowed: {', '.join(AXES)}")
        values = raw if isinstance(raw, list) else [raw]
        if not values:
            raise ScenarioError(path, f"{where}.{name}", "empty list: give at least one value")
        try:
            out[name] = [AXES[name](v) for v in values]
        except ValueError as e:
            raise ScenarioError(path, f"{where}.{name}", str(e)) from None
    return out


def _one_of(point: dict, names, path, where, required=True):
    given = [n for n in names if n in point]
    if len(given) > 1:
        raise ScenarioError(path, where, f"give only one of {' / '.join(names)}, not {' and '.join(given)}")
    if not given and required:
        raise ScenarioError(path, where, f"needs one of {' / '.join(names)}")
    return given[0] if given else None


def with_model(point: dict) -> dict:
    """The combination with its model preset's axes in place of whatever [fixed] gave them; with
    model_features false, the preset's shape without its sinks and soft-cap (the plain twin that says
    what those cost, and that the paths which cannot apply them run)."""
    if not point.get("model"):
        return point
    rest = {k: v for k, v in point.items() if k not in MODEL_SETS}
    axes = models.get(point["model"]).axes()
    if point.get("model_features") is False:
        axes.update(sinks=False, logits_soft_cap=0.0)
    return {**rest, **axes}


def make_case(point: dict, path="<scenario>", where="sweep") -> Case:
    """A Case from one expanded combination of axis values, with the cross-field checks."""
    p = {**DEFAULTS, **with_model(point)}
    if "mode" not in p:
        raise ScenarioError(path, f"{where}.mode", f"missing; allowed: {', '.join(MODES)}")
    mode = p["mode"]
    window_left = _window_or_chunk(p, path, where)
    if mode == "decode":
        qo_len = p.get("qo_len", 1)
        if not isinstance(qo_len, int) or qo_len != 1:
            raise ScenarioError(path, f"{where}.qo_len", f"decode has exactly one query, got {qo_len}")
    else:
        own = QO_FIELD[mode]
        qo_name = _one_of({k: p[k] for k in (own, "qo_len") if k in p}, (own, "qo_len"), path, where,
                          required=False)
        if qo_name is None and str(p.get("tree", "")).startswith("["):
            p[own] = trees.node_count(p["tree"], None)  # a choice list says how many queries it verifies
            qo_name = own
        if qo_name is None:
            other = [n for n in ("extend_len", "draft_tokens") if n in p and n != own]
            hint = f" ({other[0]} applies to {_modes_of(other[0])})" if other else ""
            raise ScenarioError(path, f"{where}.{own}", f"mode {mode!r} needs {own} (or qo_len){hint}")
        qo_len = p[qo_name]
    if mode == "draft_extend":
        kind, arg = parse_accept(p["accept"])
        if not isinstance(qo_len, int):
            raise ScenarioError(path, f"{where}.draft_tokens", f"draft_extend's draft block is one size for the "
                                                               f"batch (accept draws what each request keeps); got "
                                                               f"{qo_len!r}")
        if kind == "fixed" and arg > qo_len:
            raise ScenarioError(path, f"{where}.accept", f"fixed:{int(arg)} accepts more tokens than "
                                                         f"the draft block of {qo_len}")
    tree = _check_tree(p, mode, qo_len, path, where)
    _check_block(p, mode, tree, path, where)
    _check_mixed(p, mode, qo_len, path, where)
    ctx = _one_of(p, ("prefix_len", "seq_len"), path, where)
    _check_per_request(p, {"qo_len": qo_len, ctx: p[ctx]}, path, where, QO_FIELD.get(mode, "qo_len"))
    if p["num_qo_heads"] % p["num_kv_heads"]:
        raise ScenarioError(path, f"{where}.num_kv_heads", f"{p['num_kv_heads']} must divide "
                                                           f"num_qo_heads {p['num_qo_heads']} (GQA groups)")
    paged = p["storage"] == "paged"
    case = Case(mode=mode, storage=p["storage"], batch_size=p["batch_size"],
                prefix_len=p.get("prefix_len"), seq_len=p.get("seq_len"), qo_len=qo_len,
                accept=p["accept"] if mode == "draft_extend" else None, window_left=window_left,
                page_size=p["page_size"] if paged else None,
                page_layout=p["page_layout"] if paged else None,
                num_qo_heads=p["num_qo_heads"], num_kv_heads=p["num_kv_heads"],
                head_dim=p["head_dim"], dtype=p["dtype"], seed=p["seed"], sinks=p["sinks"],
                logits_soft_cap=p["logits_soft_cap"], sm_scale=_sm_scale(p),
                kv_dtype=_kv_dtype(p, path, where), model=p.get("model"), causal=p["causal"],
                attention_chunk=p["attention_chunk"], wrapper_mode=p["wrapper_mode"], tree=tree, block=p["block"],
                prefills=p["prefills"], cache_fill=p["cache_fill"])
    never = footprint.impossible(case)
    if never:
        raise ScenarioError(path, where, never)
    unfit = stale.refused(case)
    if unfit:
        raise ScenarioError(path, f"{where}.{unfit[0]}", unfit[1])
    _check_probe_fits(case, path, where, "sliding_window" if "sliding_window" in p else "window_left")
    wrong = numerics.out_of_range(case)
    if wrong:
        raise ScenarioError(path, f"{where}.{wrong[0]}", wrong[1])
    return case


def _window_or_chunk(p: dict, path, where) -> int:
    """FlashInfer's W; a chunked layer (attention_chunk > 0) has none, and is causal."""
    win = _one_of(p, ("window_left", "sliding_window"), path, where, required=not p["attention_chunk"])
    window_left = semantics.window_left_from(**{win: p[win]}) if win else semantics.NO_WINDOW
    if p["attention_chunk"] and window_left != semantics.NO_WINDOW:
        raise ScenarioError(path, f"{where}.attention_chunk", f"{p['attention_chunk']} with {win} {p[win]}: a layer is "
                                                              f"chunked or sliding, not both (give {win} = -1 or leave "
                                                              f"it out)")
    if p["attention_chunk"] and not p["causal"]:
        raise ScenarioError(path, f"{where}.causal", "chunked attention is causal: causal = false takes a sliding window")
    if p["attention_chunk"] and str(p.get("page_layout")).startswith("evicted") and p["storage"] == "paged":
        raise ScenarioError(path, f"{where}.page_layout", f"{p['page_layout']} evicts the pages before a window; "
                                                          f"with attention_chunk give scattered or contiguous")
    return window_left


def _check_tree(p: dict, mode: str, qo_len, path, where) -> str | None:
    """A draft tree is a verify block of one size for the batch, on a causal sliding-window (or global) layer."""
    tree = p.get("tree")
    if tree is None:
        return None
    field = f"{where}.tree"
    if mode != "verify":
        raise ScenarioError(path, field, f"a draft tree is verified in one call: mode must be 'verify', not {mode!r}")
    if not isinstance(qo_len, int):
        raise ScenarioError(path, f"{where}.draft_tokens", f"a draft tree has one size for the batch (the engines "
                                                           f"verify one tree shape a step); got {qo_len!r}")
    if p["attention_chunk"] or not p["causal"]:
        raise ScenarioError(path, field, "a draft tree is verified on causal sliding-window layers: leave out "
                                         "attention_chunk and causal = false")
    wrong = trees.check(tree, qo_len)
    if wrong:
        raise ScenarioError(path, field if tree.startswith("[") else f"{where}.draft_tokens", wrong)
    return tree


def _check_block(p: dict, mode: str, tree, path, where) -> None:
    """Bidirectional blocks split a step of several queries; outside its block a query stays causal."""
    if not p["block"]:
        return
    field = f"{where}.block"
    if mode == "decode":
        raise ScenarioError(path, field, "a decode step has one query: give block with mode extend, verify or "
                                         "draft_extend")
    if not p["causal"] or p["attention_chunk"] or tree is not None:
        raise ScenarioError(path, field, "blocks are the bidirectional part of a causal sliding-window (or global) "
                                         "layer: leave out causal = false, attention_chunk and tree")


def _check_mixed(p: dict, mode: str, qo_len, path, where) -> None:
    """A mixed step batches some requests' prefill chunks (one size) with the others' decodes."""
    if mode != "mixed":
        if p["prefills"]:
            raise ScenarioError(path, f"{where}.prefills", f"applies to mode 'mixed', not {mode!r}")
        return
    b = p["batch_size"]
    if not 1 <= p["prefills"] < b:
        raise ScenarioError(path, f"{where}.prefills", f"a mixed step needs 1 to batch_size - 1 = {b - 1} prefill "
                                                       f"requests (the rest decode); got {p['prefills']}")
    if not isinstance(qo_len, int):
        raise ScenarioError(path, f"{where}.extend_len", f"a mixed step's prefill chunks are one size; got {qo_len!r}")


def _check_per_request(p: dict, lengths: dict, path, where, qo_name: str) -> None:
    """An explicit per-request list has one length per request, and with seq_len every request's
    queries fit in its context (the lengths drawn as the case will draw them)."""
    b = p["batch_size"]
    for field, value in lengths.items():
        if isinstance(value, tuple) and len(value) != b:
            name = qo_name if field == "qo_len" else field
            raise ScenarioError(path, f"{where}.{name}", f"{len(value)} per-request values for batch_size {b}")
    if "seq_len" in lengths:
        seed = p["seed"]
        if b > footprint.DRAW_LIMIT:  # the impossible-size check has its say
            return
        from swabench.core.cases import draw_lengths
        qo = draw_lengths(lengths["qo_len"], b, seed, LENGTH_SALT["qo_len"])
        seq = draw_lengths(lengths["seq_len"], b, seed, LENGTH_SALT["seq_len"])
        over = [(i, q, s) for i, (q, s) in enumerate(zip(qo, seq)) if q > s]
        if over:
            i, q, s = over[0]
            said = f"{q} is larger than seq_len {s}" if all(isinstance(v, int) for v in lengths.values()) else \
                f"request {i} has {q} queries but seq_len {s}"
            raise ScenarioError(path, f"{where}.{qo_name}", f"{said}: the queries must fit in the context")


def _sm_scale(p: dict) -> float | None:
    """The query scale when it is not head_dim ** -0.5 (None: the default, one case id for both)."""
    scale = p.get("sm_scale")
    return None if scale is None or scale == p["head_dim"] ** -0.5 else scale


def _kv_dtype(p: dict, path, where) -> str | None:
    """The cache's dtype when it differs from the queries' (None: the same)."""
    kv = KV_DTYPES.get(p.get("kv_dtype"), p.get("kv_dtype"))
    if kv is None or kv == p["dtype"]:
        return None
    if not kv.startswith("float8"):
        raise ScenarioError(path, f"{where}.kv_dtype", f"{kv} with {p['dtype']} queries: a cache dtype other than "
                                                       f"the queries' must be float8_e4m3")
    if p["dtype"] == "float32":
        raise ScenarioError(path, f"{where}.kv_dtype", "an fp8 cache is read with bfloat16 or float16 queries, "
                                                       "not float32")
    return kv


def _check_probe_fits(case: Case, path, where, window_field: str = "window_left") -> None:
    """The gate's probe pass encodes key positions in the head dimension: a head_dim too small for
    the context cannot be checked, so it is refused here rather than failed by the gate.  Where only
    a window far past the context makes it too small, the window is what to change."""
    from swabench.core import probes

    keys = case.largest()[1]
    need = probes.required_head_dim(keys, case.window_left)
    if case.head_dim < need and case.window_left >= keys and case.head_dim >= probes.required_head_dim(keys, keys):
        most = min(WINDOW_MAX, probes.largest_window(keys, case.head_dim))
        given, most = ((case.sliding_window, most + 1) if window_field == "sliding_window" else
                       (case.window_left, most))
        raise ScenarioError(path, f"{where}.{window_field}", f"{given} is larger than the context ({keys} keys) "
                                                             f"by more than the gate's probes at head_dim "
                                                             f"{case.head_dim} can check: give at most {most}, or "
                                                             f"-1 for no window")
    if case.head_dim < need:
        raise ScenarioError(path, f"{where}.head_dim", f"{case.head_dim} is too small for the gate's probe inputs "
                                                       f"at {keys} keys: give head_dim >= {need}")


def _modes_of(qo_field: str) -> str:
    return " and ".join(m for m, f in QO_FIELD.items() if f == qo_field)
