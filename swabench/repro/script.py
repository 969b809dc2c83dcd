"""A reproducer script from traced paths: the case as literals, the helpers it needs (``kit``), each
path's traced lines, then the check against the reference (exit 1 when wrong) or the timing of a path
against its correct twin (exit 1 past a stated ratio).  The script imports torch and the library
under test only.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field

import torch

from swabench.core import cases as cases_mod, gate, trees, workloads
from swabench.impls import registry
from swabench.repro import kit, standin, trace

FLASHINFER = "flashinfer"


@dataclass(frozen=True)
class Part:
    """One path on one case in the script: ``checked`` against the reference, run ``first`` (to leave
    the state a later part meets), or ``timed`` against the other timed part."""
    case: cases_mod.Case
    impl: str
    backend: str
    role: str = "checked"
    label: str = ""  # the suffix of its names ("_first")


@dataclass
class Header:
    title: str
    lines: list[str] = field(default_factory=list)  # what is wrong, where it shows, upstream, the command


def case_literals(c: cases_mod.Case) -> dict:
    """The script's CASE: every number the inputs and the reference need, per-request lengths as lists."""
    qo, kv = workloads.request_lengths(c)
    drafts = trees.of_case(c)
    return dict(qo_lens=qo, kv_lens=kv, num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads,
                head_dim=c.head_dim, storage=c.storage, page_size=c.page_size or 1, page_layout=c.page_layout or "",
                window_left=c.window_left, causal=c.causal, chunk=c.attention_chunk, soft_cap=c.logits_soft_cap,
                sinks=c.sinks, sm_scale=c.scale, dtype=c.dtype, cache_dtype=c.cache_dtype, seed=c.seed,
                **({"parents": [list(t.parents) for t in drafts]} if drafts else {}))


def traced(part: Part) -> trace.Tracer:
    """Run the part's path on the CPU against the stand-in, tracing its calls."""
    impl = registry.get(part.impl)
    if impl.library not in (FLASHINFER, "torch"):
        raise trace.Unrenderable(
            f"{impl.name} ({impl.library}) has no standalone script: its block mask is built by swabench's own "
            f"layout code from the page table, which a script would have to carry")
    literals = case_literals(part.case)
    x = kit.make_inputs(literals, "cpu")
    w = workloads.build(part.case, "cpu")
    tracer = trace.Tracer(literals, x, {"q": w.q, "k_cache": w.k_store, "v_cache": w.v_store, "sinks": w.sinks},
                          impl, part.case, part.label)
    with standin.installed(tracer.library_call):
        runner = impl.make(w, part.backend)
        tracer.owned(runner)
        tracer.name(runner.out, "out" + part.label)
        runner.plan()
        tracer.phase = "step"
        with tracer:
            runner.run()
    return tracer


def render(parts: list[Part], header: Header, threshold: float | None = None) -> str:
    """The script's text.  With ``threshold`` its two timed parts are timed and it exits 1 when the first
    takes more than ``threshold`` times the second; else it exits 1 when the checked part is wrong."""
    tracers = [traced(p) for p in parts]
    flashinfer = any(registry.get(p.impl).library == FLASHINFER for p in parts)
    body = [line for p, t in zip(parts, tracers) for line in _part(p, t)]
    body += _timing(parts) if threshold else _check(parts)
    text = "\n".join(body)
    helpers = [kit.make_inputs] + [f for f in (kit.taken_by, kit.table_slice, kit.window_mask)
                                   if f.__name__ + "(" in text] + [kit.visible, kit.reference, kit.report]
    dtype = parts[-1].case.dtype
    tol = gate.TOLERANCES[dtype]
    out = ["#!/usr/bin/env python3", '"""' + header.title, "", *header.lines, '"""', "", "import sys", "",
           "import torch"]
    out += ["import torch.nn.functional as F"] if "F." in text else []
    out += ["", "import flashinfer"] if flashinfer else []
    out += [""] + [trace.call(f"CASE{p.label} = dict", [], {k: trace.literal(v) for k, v in case_literals(p.case).items()})
                   for p in parts]
    out.append(f"TOLERANCE = {{'rel_l2': {tol.rel_l2!r}, 'row_rel_l2': {tol.row_rel_l2!r}}}  # swabench's gate on "
               f"random inputs, {dtype}")
    if threshold:
        out.append(f"THRESHOLD = {threshold!r}  # the most the path may take, in multiples of its correct twin's time")
    out.append('DEVICE = "cuda"' if flashinfer else 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"')
    for f in helpers + ([time_us] if threshold else []):
        out += ["", "", inspect.getsource(f).rstrip()]
    version = "flashinfer {flashinfer.__version__}, " if flashinfer else ""
    out += ["", "", "def main():", "    dev = torch.device(DEVICE)",
            f'    print(f"torch {{torch.__version__}}, {version}"',
            '          + (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"))']
    out += _indent(body)
    out += ["", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""]
    return "\n".join(out)


def time_us(step, repeats=200):
    """Microseconds a call of ``step``: CUDA events around ``repeats`` calls, after 10 to warm up."""
    for _ in range(10):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def _part(p: Part, t: trace.Tracer) -> list[str]:
    """One part's lines: its inputs, its output buffer, its construction and plan, its step."""
    s = p.label
    impl = registry.get(p.impl)
    used = [n for n in trace.INPUTS if n in t.used]
    said = f"{impl.name} on {impl.library}" + (f" ({p.backend})" if impl.backends else "") + f": {impl.summary}"
    lines = textwrap.wrap(said, 106, initial_indent="# ", subsequent_indent="# ") + [f"x{s} = make_inputs(CASE{s}, dev)"]
    lines += [f'{n}{s} = x{s}["{n}"]' for n in used]
    lines.append(f'out{s} = torch.empty_like(x{s}["q"])')
    lines += t.setup
    lines += ["", f"def step{s}():"] + _indent(t.step) + [""]
    if p.role == "first":
        lines += [f"step{s}()  # run first, in this process, before the checked call"]
    return lines


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else "" for entry in lines for line in entry.split("\n")]


def _check(parts: list[Part]) -> list[str]:
    s = next(p.label for p in parts if p.role == "checked")
    return [f'out{s}.fill_(float("nan"))  # a row the call never writes reads as wrong', f"step{s}()",
            'if dev.type == "cuda":', "    torch.cuda.synchronize()",
            f"return report(CASE{s}, out{s}, reference(CASE{s}, x{s}), TOLERANCE)"]


def _timing(parts: list[Part]) -> list[str]:
    """Both timed parts checked first (each must be right), then timed."""
    bug, twin = (p for p in parts if p.role == "timed")
    lines = ["wrong = 0"]
    for p in (bug, twin):
        s = p.label
        lines += [f"step{s}()", 'if dev.type == "cuda":', "    torch.cuda.synchronize()", f'print("{p.impl}: ", end="")',
                  f"wrong |= report(CASE{s}, out{s}, reference(CASE{s}, x{s}), TOLERANCE)"]
    lines += [f"slow, fast = time_us(step{bug.label}), time_us(step{twin.label})",
              f'print(f"{bug.impl} {{slow:.1f}} us, {twin.impl} {{fast:.1f}} us a call: {{slow / fast:.2f}}x '
              f'(threshold {{THRESHOLD}}x)")',
              'print("SLOW" if slow > THRESHOLD * fast else "FAST")',
              "return 1 if wrong or slow > THRESHOLD * fast else 0"]
    return lines
