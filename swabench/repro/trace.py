"""Trace one suite path into script lines: the path's own ``make``, ``plan()`` and ``run()`` run on the CPU
against the FlashInfer stand-in, with every torch call of ``run()`` seen through a TorchFunctionMode.
Each library call and each torch call becomes a line; each tensor it takes is named by where it came
from: an input of the case, a buffer the path allocated, or a value the path computed on the host,
written as the script's helper call that gives the same value (checked on the spot) or as a literal.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from swabench.core import semantics
from swabench.repro import kit, standin
from swabench.repro.source import DTYPES, call, empty, index, literal, shape

INPUTS = ("q", "k_cache", "v_cache", "sinks", "qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "slots")
LITERAL_LIMIT = 4096  # the most elements a computed index is written out as a literal
OPERATORS = {"__mul__": "{} * {}", "__rmul__": "{1} * {0}", "__truediv__": "{} / {}", "__add__": "{} + {}",
             "__radd__": "{1} + {0}", "__sub__": "{} - {}", "__rsub__": "{1} - {0}", "__and__": "{} & {}",
             "__or__": "{} | {}", "__ge__": "{} >= {}", "__le__": "{} <= {}", "__gt__": "{} > {}",
             "__lt__": "{} < {}", "__eq__": "{} == {}", "__ne__": "{} != {}", "__invert__": "~{}",
             "__neg__": "-{}", "__floordiv__": "{} // {}", "__mod__": "{} % {}"}
NO_OPS = ("to", "contiguous", "float", "view_as")  # calls that may hand back their receiver unchanged


class Unrenderable(Exception):
    """A path makes a call whose arguments have no faithful form in a script (a FlexAttention block mask)."""


class Tracer(TorchFunctionMode):
    """Lines for one path on one case: ``setup`` (construction and plan) and ``step`` (what ``run()`` does).
    ``case``: the script's CASE dict; ``x``: its inputs built on the CPU (``kit.make_inputs``); ``names``:
    the suite workload's own tensors by the names the script gives them."""

    def __init__(self, case: dict, x: dict, names: dict, impl, suite_case, suffix: str = "", inputs: str | None = None,
                 plan_keywords: dict | None = None):
        super().__init__()
        self.case, self.x, self.impl, self.suite_case, self.suffix = case, x, impl, suite_case, suffix
        self.inputs = suffix if inputs is None else inputs  # the suffix of the CASE, x and inputs it reads
        self.plan_keywords = plan_keywords or {}  # added to its plan() (a control's disable_split_kv)
        self.names: dict[int, str] = {}
        self.alive: list = []  # tensors named here stay alive, so their ids are not reused
        self.used: set[str] = set()  # the case's inputs the lines read
        self.setup: list[str] = []
        self.step: list[str] = []
        self.phase = "setup"
        self.quiet = 0
        self.counts: dict[str, int] = {}
        self.owner_attrs: dict[int, str] = {}
        self.tables: list[tuple[list, list]] = []  # (starts, ends) of the tables this path planned
        self.api: dict[str, list[str]] = {}  # per wrapper (or "flashinfer"): its calls with their scalar keywords
        for name, t in names.items():
            self.name(t, name + self.inputs)

    # ---------------------------------------------------------------- names

    def name(self, t, name: str) -> str:
        self.names[id(t)] = name
        self.alive.append(t)
        return name

    def _fresh(self, stem: str) -> str:
        self.counts[stem] = self.counts.get(stem, 0) + 1
        return f"{stem}{self.counts[stem]}{self.suffix}" if stem in ("t", "m", "idx") else \
            f"{stem}_{self.counts[stem]}{self.suffix}"

    def _emit(self, line: str) -> None:
        (self.setup if self.phase == "setup" else self.step).append(line)

    def _declare(self, line: str) -> None:
        self.setup.append(line)

    def owned(self, runner) -> None:
        """Name the runner's own tensors by its attributes (``prefix_out``, ``lse_new``)."""
        for attr, value in vars(runner).items():
            if isinstance(value, torch.Tensor):
                self.owner_attrs[id(value)] = attr

    @contextmanager
    def paused(self):
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1

    # ---------------------------------------------------------------- values

    def value(self, v, *, buffer: bool = False) -> str:
        if isinstance(v, torch.Tensor):
            return self.tensor(v, buffer=buffer)
        if isinstance(v, tuple):
            return "(" + ", ".join(self.value(e, buffer=buffer) for e in v) + ("," if len(v) == 1 else "") + ")"
        if isinstance(v, list):
            return literal(v) if all(isinstance(e, (int, float)) for e in v) else \
                "[" + ", ".join(self.value(e, buffer=buffer) for e in v) + "]"
        if isinstance(v, torch.dtype):
            return DTYPES[v]
        if isinstance(v, torch.device):
            return "dev"
        if v is Ellipsis:
            return "..."
        if isinstance(v, slice):
            return ":".join("" if e is None else self.value(e) for e in (v.start, v.stop)) + \
                ("" if v.step is None else f":{self.value(v.step)}")
        if isinstance(v, str) and '"' not in v:
            return f'"{v}"'
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            return f'float("{v}")'
        if v is None or isinstance(v, (bool, int, float, str)):
            return repr(v)
        raise Unrenderable(f"{self.impl.name} passes a {type(v).__name__}, which a script cannot write out")

    def tensor(self, t: torch.Tensor, buffer: bool = False) -> str:
        if id(t) in self.names:
            name = self.names[id(t)]
            self.used.add(name.removesuffix(self.inputs) if self.inputs else name)
            return name
        for other in self.alive:  # a new view of a named tensor (the shared workspace)
            if isinstance(other, torch.Tensor) and other.data_ptr() == t.data_ptr() and other.shape == t.shape \
                    and other.stride() == t.stride() and other.dtype == t.dtype:
                return self.tensor(other)
        if buffer:
            return self._buffer(t)
        with self.paused():
            return self._computed(t)

    def _buffer(self, t: torch.Tensor) -> str:
        """A buffer the path allocated (its contents are written before they are read)."""
        stem = self.owner_attrs.get(id(t)) or ("workspace" if t.dtype == torch.uint8 and t.dim() == 1 else "buf")
        name = stem + self.suffix if stem not in {n.removesuffix(self.suffix) for n in self.names.values()} \
            else self._fresh(stem)
        fill = "empty" if stem == "workspace" else "zeros"
        self._declare(f"{name} = torch.{fill}({shape(t)}, dtype={DTYPES[t.dtype]}, device=dev)")
        return self.name(t, name)

    def _computed(self, t: torch.Tensor) -> str:
        """A tensor the path computed on the host: an input of the case, a slice of one, a table or mask
        the script's helpers rebuild (checked equal here), or a literal."""
        host = t.dtype != torch.bool and self.phase == "setup"
        for name in INPUTS:
            ref = self.x.get(name)
            if isinstance(ref, torch.Tensor) and ref.shape == t.shape and ref.dtype == t.dtype and torch.equal(ref, t):
                self.used.add(name)
                return name + self.inputs
        if t.dtype in (torch.int32, torch.int64) and t.dim() == 1:
            to = ("" if t.dtype == self.x["slots"].dtype else f".to({DTYPES[t.dtype]})") + ("" if host else ".to(dev)")
            span = _slice_of(self.x["slots"], t)
            if span is not None:
                self.used.add("slots")
                return self._assign(f"slots{self.inputs}[{span[0]}:{span[1]}]{to}", t)
            ranges = _key_ranges(self.x, t)
            if ranges is not None:
                return self._assign(f"key_slots(x{self.inputs}, starts={literal(ranges[0])}, "
                                    f"ends={literal(ranges[1])}){to}", t)
        if t.dim() == 2 and t.shape[-1] == 2 and self.case.get("block"):  # the ranges wrapper's spans
            spans = kit.block_ranges(self.case)
            if spans.shape == t.shape and torch.equal(spans, t.cpu().to(spans.dtype)):
                return self._assign(f"block_ranges(CASE{self.inputs})" + ("" if host else ".to(dev)"), t)
        if t.dtype == torch.bool:
            expr = self._mask(t)
            if expr:
                return self._assign(expr, t)
        if t.dtype in (torch.int32, torch.int64, torch.bool) and t.numel() <= LITERAL_LIMIT:
            device = "" if host else ", device=dev"
            return self._assign(f"torch.tensor({t.tolist()}, dtype={DTYPES[t.dtype]}{device})", t)
        raise Unrenderable(f"{self.impl.name}: a {tuple(t.shape)} {t.dtype} tensor computed by the path has no "
                           f"form a script can rebuild")

    def _assign(self, expr: str, t: torch.Tensor) -> str:
        name = self._fresh("m" if t.dtype == torch.bool else "idx")
        self._declare(f"{name} = {expr}")
        return self.name(t, name)

    def _mask(self, t: torch.Tensor) -> str | None:
        """A custom mask: every request's rows of the exact visibility over the keys [start, end) its
        table holds (flattened), or one request's mask under the path's own visibility (2-D)."""
        c, device = self.case, ", device=dev"
        if t.dim() == 1:
            for starts, ends in self.tables + [([0] * len(c["kv_lens"]), list(c["kv_lens"]))]:
                for window in (None, -1):  # the exact mask, or the tree alone where plan() takes the window
                    m = kit.window_mask(c, starts, ends, window_left=window) if len(starts) == len(c["kv_lens"]) \
                        else None
                    if m is not None and m.shape == t.shape and torch.equal(m, t):
                        alone = "" if window is None else ", window_left=-1"
                        return (f"window_mask(CASE{self.inputs}, starts={literal(starts)}, ends={literal(ends)}"
                                f"{device}{alone})")
            return None
        if t.dim() != 2:
            return None
        n, m = t.shape
        drafts = c.get("parents") or [None] * len(c["qo_lens"])
        for b, (qo, kv, parents) in enumerate(zip(c["qo_lens"], c["kv_lens"], drafts)):
            if qo != n or kv < m:
                continue
            for vis in (self.impl.computes(self.suite_case, kv - qo), semantics.of_case(self.suite_case)):
                args = {f.name: getattr(vis, f.name) for f in dataclasses.fields(vis)
                        if getattr(vis, f.name) != f.default}
                block = args.pop("block", 0)
                got = kit.visible(qo, kv, key_offset=kv - m, parents=parents, **args)
                if block:
                    got = got | kit.block_visible(qo, kv, block, key_offset=kv - m)
                if torch.equal(got, t):
                    kwargs = "".join(f", {k}={v!r}" for k, v in args.items())
                    tree = f', parents=CASE{self.inputs}["parents"][{b}]' if parents else ""
                    said = f"visible({qo}, {kv}{kwargs}, key_offset={kv - m}{tree}{device})"
                    return said if not block else \
                        f"({said} | block_visible({qo}, {kv}, {block}, key_offset={kv - m}{device}))"
        return None

    def table(self, indptr, indices, last) -> str | None:
        """A paged table that is not the case's whole one: named as the slice of it that gives it."""
        x, ps = self.x, self.case["page_size"]
        if indptr.shape == x["kv_indptr"].shape and torch.equal(indptr, x["kv_indptr"]) and \
                indices.shape == x["kv_indices"].shape and torch.equal(indices, x["kv_indices"]) and \
                torch.equal(last, x["kv_last_page_len"]):
            for name, t in zip(("kv_indptr", "kv_indices", "kv_last_page_len"), (indptr, indices, last)):
                self.name(t, name + self.inputs)
            return None
        requests, starts, ends, request = [], [], [], 0
        full = [x["kv_indices"][int(x["kv_indptr"][b]):int(x["kv_indptr"][b + 1])].tolist()
                for b in range(len(x["kv_indptr"]) - 1)]
        for e in range(len(indptr) - 1):
            pages = indices[int(indptr[e]):int(indptr[e + 1])].tolist()
            found = next(((b, f) for b in range(request, len(full)) for f in range(len(full[b]) - len(pages) + 1)
                          if full[b][f:f + len(pages)] == pages), None)
            if found is None:
                return None
            request = found[0]
            requests.append(request)
            starts.append(found[1] * ps)
            ends.append((found[1] + len(pages) - 1) * ps + int(last[e]))
        identity = requests == list(range(len(full)))
        got = kit.table_slice(self.case, x, starts, ends, None if identity else requests)
        if not all(g.shape == t.shape and torch.equal(g, t.to(torch.int32)) for g, t in zip(got, (indptr, indices, last))):
            return None
        self.tables.append((starts, ends)) if identity else None
        names = [self._fresh(stem) for stem in ("kv_indptr", "kv_indices", "kv_last_page_len")]
        for name, t in zip(names, (indptr, indices, last)):
            self.name(t, name)
        self.used.add("kv_indptr")
        self._declare(call(f"{', '.join(names)} = table_slice", [f"CASE{self.inputs}", f"x{self.inputs}"],
                           {"starts": literal(starts), "ends": literal(ends),
                            **({} if identity else {"requests": literal(requests)})}))
        return names[0]

    # ---------------------------------------------------------------- calls

    def library_call(self, obj, cls_name, method, args, kwargs):
        """The stand-in's callback: one line per wrapper call."""
        with self.paused():
            if method == "__init__":
                name = standin.WRAPPERS[cls_name] + self.suffix
                if name in self.names.values():
                    name = self._fresh(standin.WRAPPERS[cls_name])
                first = [self.tensor(args[0], buffer=True)] if args else []  # the workspace, where it takes one
                line = call(f"flashinfer.{cls_name}", first + [self.value(a, buffer=True) for a in args[1:]],
                            {k: self.value(v, buffer=True) if not isinstance(v, torch.Tensor)
                             else empty(v) for k, v in kwargs.items()})
                self._emit(f"{name} = {line}")
                self.name(obj, name)
                self.api[name] = [f"flashinfer.{cls_name}({_scalars(kwargs)})"]
                return None
            target = "flashinfer" if obj is None else self.names[id(obj)]
            if method == "__setattr__":
                said = f"  # as forward(..., window_left={args[1]}) sets it for run()" if args[0] == "_window_left" \
                    else ""
                self._emit(f"{target}.{args[0]} = {self.value(args[1])}{said}")
                return None
            if method == "plan" and obj is not None:
                tables = [i for i in range(len(args) - 2) if all(isinstance(a, torch.Tensor) and a.dtype != torch.bool
                                                                 for a in args[i:i + 3])]
                if tables and cls_name != "BatchPrefillWithRaggedKVCacheWrapper":
                    i = tables[-1]
                    self.table(*args[i:i + 3])
            if method == "plan":
                kwargs.update(self.plan_keywords)
            optional = {k: kwargs.pop(k) for k in standin.OPTIONAL_PLAN_KEYWORDS if k in kwargs} \
                if method == "plan" else {}
            rendered = {k: self.value(v, buffer=k in ("out", "lse")) for k, v in kwargs.items()}
            if optional:  # the suite passes these only where the release takes them
                rendered["**taken_by"] = f"{target}.plan, " + ", ".join(f"{k}={self.value(v)}"
                                                                          for k, v in optional.items())
            line = call(f"{target}.{method}", [self.value(a) for a in args], rendered)
            said = f"{method}({_scalars({**kwargs, **optional})})"
            if said not in self.api.setdefault(target, []):
                self.api[target].append(said)
            if method == "forward":
                result = torch.empty_like(args[0])
                self._emit(f"{self.name(result, self._fresh('t'))} = {line}")
                return result
            self._emit(line)
            return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.quiet or self.phase != "step":
            return result
        with self.paused():
            name = getattr(func, "__name__", "")
            if not isinstance(result, torch.Tensor) and name != "__setitem__":
                return result  # shapes, dtypes, Python numbers: the script reads them the same way
            if name in ("__get__", "__set__"):
                return result
            if result is args[0] and name in NO_OPS:
                return result
            line = self._render(func, name, args, kwargs)
            if result is None or any(result is a for a in (*args, *kwargs.values())):
                self._emit(line)
            else:
                self._emit(f"{self.name(result, self._fresh('t'))} = {line}")
        return result

    def _render(self, func, name: str, args, kwargs) -> str:
        out_kw = {k: self.value(v, buffer=k == "out") for k, v in kwargs.items()}
        if getattr(torch.Tensor, name, None) is func or name in OPERATORS:
            receiver = self.value(args[0], buffer=name == "__setitem__")
            rest = [self.value(a) for a in args[1:]]
            if name == "__getitem__":
                return f"{receiver}[{index(rest, args[1])}]"
            if name == "__setitem__":
                return f"{receiver}[{index(rest[:1], args[1])}] = {rest[1]}"
            if name in OPERATORS:
                return OPERATORS[name].format(receiver, *rest)
            return call(f"{receiver}.{name}", rest, out_kw)
        for prefix, namespace in (("F", torch.nn.functional), ("torch", torch)):
            if getattr(namespace, name, None) is func:
                return call(f"{prefix}.{name}", [self.value(a) for a in args], out_kw)
        raise Unrenderable(f"{self.impl.name} calls {func!r}, which a script cannot name")


SHAPE_KEYWORDS = {"num_qo_heads", "num_kv_heads", "head_dim", "head_dim_qk", "head_dim_vo", "q_data_type",
                  "kv_data_type", "data_type", "o_data_type", "sm_scale", "page_size", "return_lse",
                  "uniform_q_len"}  # and the plan's hint of the query count, which the shape says too


def _scalars(kwargs: dict) -> str:
    """The keywords a reader of the call needs: the scalars that are not the shape (the header says that), and
    a mask or the sinks by name alone."""
    said = [f"{k}={v!r}" for k, v in kwargs.items() if k not in SHAPE_KEYWORDS and
            (v is None or isinstance(v, (bool, int, float, str)))]
    return ", ".join(said + [f"{k}=..." for k, v in kwargs.items() if isinstance(v, torch.Tensor) and
                             ("mask" in k or k == "sinks")])


def _key_ranges(x: dict, t: torch.Tensor) -> tuple[list, list] | None:
    """(starts, ends) where ``t`` is the slots of keys [start, end) of each request in turn (``kit.key_slots``)."""
    slots, first, values, at = x["slots"].tolist(), x["slot_start"], t.tolist(), 0
    starts, ends = [], []
    for b in range(len(first) - 1):
        mine = slots[first[b]:first[b + 1]]
        s = mine.index(values[at]) if at < len(values) and values[at] in mine else len(mine)
        e = s
        while e < len(mine) and at < len(values) and mine[e] == values[at]:
            e, at = e + 1, at + 1
        starts.append(s), ends.append(e)
    return (starts, ends) if at == len(values) and len(values) else None


def _slice_of(base: torch.Tensor, t: torch.Tensor) -> tuple[int, int] | None:
    """(lo, hi) where base[lo:hi] equals t, or None."""
    if t.numel() == 0 or t.numel() > base.numel():
        return None
    for lo in (base == t[0]).nonzero().flatten().tolist():
        if lo + t.numel() <= base.numel() and torch.equal(base[lo:lo + t.numel()], t.to(base.dtype)):
            return lo, lo + t.numel()
    return None
