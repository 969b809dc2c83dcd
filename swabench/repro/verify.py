"""A rendered script makes the suite's calls: both run on the CPU against the FlashInfer stand-in, and
every construction, ``plan()``, ``run()`` and merge must match in order, argument by argument (index
tensors, masks and inputs by value, buffers by shape and dtype).  A PyTorch path has no stand-in: its
script's output must equal the suite's bit for bit.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import types

import torch

from swabench.core import workloads
from swabench.impls import registry
from swabench.repro import script, standin
from swabench.repro.script import Part

BUFFERS = ("out", "lse")  # run() keywords that take an output buffer


class Drift(Exception):
    """The script's calls are not the suite's."""


def _recorder(calls: list, plan_keywords: dict | None = None):
    """The stand-in's callback, recording each call; ``plan_keywords`` (a dict the caller fills per part) joins
    every plan() call's keywords, as a control's script adds them."""
    def on_call(obj, cls_name, method, args, kwargs):
        if method == "plan" and plan_keywords:
            kwargs = {**kwargs, **plan_keywords}
        buffers = method in ("__init__", "merge_state_in_place")
        calls.append((cls_name, method, _snap(args, buffers), {k: _snap(v, buffers or k in BUFFERS)
                                                                 for k, v in kwargs.items()}))
        return torch.zeros_like(args[0]) if method == "forward" else None
    return on_call


def _snap(v, buffer: bool):
    if isinstance(v, torch.Tensor):
        return ("tensor", v.dtype, tuple(v.shape), None if buffer else v.detach().cpu().clone())
    if isinstance(v, (tuple, list)):
        return type(v)(_snap(e, buffer) for e in v)
    return v


def same(a, b) -> bool:
    if isinstance(a, tuple) and a and a[0] == "tensor":
        return isinstance(b, tuple) and b[:3] == a[:3] and (a[3] is None or b[3] is not None and torch.equal(a[3], b[3]))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def suite_calls(parts: list[Part], sequential: bool = False) -> tuple[list, list[torch.Tensor]]:
    """The suite's own calls for the parts, in the script's order (each part built and planned in turn, a
    part run ``first`` run at once, the others after every part is planned; ``sequential``: each part run as
    soon as it is planned, as one screen reads), and their outputs."""
    calls, outputs, later, extra, checked, starts = [], [], [], {}, None, []
    with standin.installed(_recorder(calls, extra)):
        for p in parts:
            if sequential:
                for runner, keywords in later:
                    _run(runner, keywords, extra, outputs)
                later.clear()
            starts.append((len(calls), p.role))
            if script.replans(p, parts):  # the checked runner, planned again once it has run
                later.append((checked, dict(p.plan_keywords)))
                continue
            w = workloads.build(p.case, "cpu")
            runner = registry.get(p.impl).make(w, p.backend)
            checked = runner if p.role == "checked" else checked
            extra.update(p.plan_keywords)
            runner.plan()
            extra.clear()
            if p.role == "first":
                runner.run()
            else:
                later.append((runner, None))
        for runner, keywords in later:
            _run(runner, keywords, extra, outputs)
    return (_reused(calls, starts) if sequential else calls), outputs


def _reused(calls: list, starts: list) -> list:
    """The calls without a control's constructions that an earlier part made the same way (one screen plans the
    earlier wrapper again there), nor its plans of such a wrapper that repeat the earlier part's last plan of it."""
    ends = [at for at, _ in starts[1:]] + [len(calls)]
    kept = []
    for (start, role), end in zip(starts, ends):
        reused = set()
        for call in calls[start:end]:
            earlier = calls[:start]
            if role == "control" and call[1] == "__init__" and any(c[1] == "__init__" and same(c, call)
                                                                    for c in earlier):
                reused.add(call[0])
                continue
            planned = [c for c in earlier if c[:2] == (call[0], "plan")]
            if role == "control" and call[1] == "plan" and call[0] in reused and planned and same(planned[-1], call):
                continue
            kept.append(call)
    return kept


def _run(runner, keywords: dict | None, extra: dict, outputs: list) -> None:
    """Run a planned runner (planned again first with ``keywords``, a control's), keeping its output."""
    if keywords is not None:
        extra.update(keywords)
        runner.plan()
        extra.clear()
    runner.run()
    outputs.append(runner.out.clone())


def script_calls(text: str) -> tuple[list, list[torch.Tensor]]:
    """The script's calls on the CPU, and the outputs it checks (its reference, verdict, timing and environment
    left out)."""
    calls, outputs = [], []
    ns = {"__name__": "swabench_repro_script"}

    def outcome(*args):  # (case, x, step, out, tolerance) in the traced scripts, (step, out, expected) in brief's
        at = next(i for i, a in enumerate(args) if callable(a))
        step, out = args[at], args[at + 1]
        step()
        outputs.append(out.clone())
        return (False, "", []) if len(args) == 5 else (False, "")

    with standin.installed(_recorder(calls)), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(text, "<repro script>", "exec"), ns)
        report = types.SimpleNamespace(stdout="(environment)")  # what collect_env prints, for a script to print
        ns.update(DEVICE="cpu", outcome=outcome, graph_time_us=lambda step: 1.0, environment=lambda: [],
                  subprocess=types.SimpleNamespace(run=lambda *a, **k: report))
        ns["main"](*(["cpu"] if inspect.signature(ns["main"]).parameters else []))  # brief's main(dev)
    return calls, outputs


def check(parts: list[Part], text: str, sequential: bool = False) -> None:
    """Drift where the script's calls (or, for a PyTorch path, its output) differ from the suite's."""
    (want, want_out), (got, got_out) = suite_calls(parts, sequential), script_calls(text)
    same_calls(want, got)
    torch_paths = [registry.get(p.impl).library == "torch" for p in parts if p.role != "first"]
    for i, (a, b, is_torch) in enumerate(zip(want_out, got_out, torch_paths)):
        if is_torch and not torch.equal(a, b):
            raise Drift(f"part {i + 1}: the script's output differs from the suite's")


def same_calls(want: list, got: list) -> None:
    """Drift at the first call the script makes otherwise than the suite, or where it makes more or fewer."""
    for i, (a, b) in enumerate(zip(want, got)):
        if not same(a, b):
            raise Drift(f"call {i + 1}: the suite makes {describe(a)}, the script {describe(b)}")
    if len(want) != len(got):
        raise Drift(f"the suite makes {len(want)} library calls, the script {len(got)}")


def describe(call) -> str:
    cls_name, method, args, kwargs = call
    return f"{cls_name or 'flashinfer'}.{method} with {len(args)} arguments and keywords {sorted(kwargs)}"
