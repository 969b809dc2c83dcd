"""A reproducer script from traced paths.  Its first screen is the top comment (the call in the library's own
terms, what is expected and observed, whose fault it is, the control) and ``main()``: the case's inputs, each
path's traced lines, then the verdict, one line first (REPRODUCED or NOT REPRODUCED), the control's beside it
and the environment.  The helpers follow, cut to the case (``specialize``).  The script imports torch and the
library under test only, and exits 1 when the bug shows.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass, field


from swabench.core import cases as cases_mod, gate, trees, workloads
from swabench.impls import registry
from swabench.repro import kit, standin, trace
from swabench.repro.source import call, literal

FLASHINFER = "flashinfer"
BUILTINS = {"len", "any", "all", "min", "max", "sum"}  # what a test ``specialize`` evaluates may call besides case


@dataclass(frozen=True)
class Part:
    """One path on one case in the script: ``checked`` against the reference, run ``first`` (to leave the state
    a later part meets), ``timed`` (a call of the decode cliff, whose template times each), or a ``control``: a
    call beside the checked one on the same inputs that pins the cause (the correct call, or the same one planned
    with ``plan_keywords``)."""
    case: cases_mod.Case
    impl: str
    backend: str
    role: str = "checked"
    label: str = ""  # the suffix of its names ("_first", "_control")
    says: str = ""  # what the call is, in the library's terms, where the output names it
    plan_keywords: tuple = ()  # (name, value) pairs added to its plan() call


@dataclass
class Header:
    title: str
    lines: list[str] = field(default_factory=list)  # the top comment under the title


def case_literals(c: cases_mod.Case) -> dict:
    """The script's CASE: every number the inputs and the reference need, per-request lengths as lists."""
    qo, kv = workloads.request_lengths(c)
    drafts = trees.of_case(c)
    return dict(qo_lens=qo, kv_lens=kv, num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads,
                head_dim=c.head_dim, storage=c.storage, page_size=c.page_size or 1, page_layout=c.page_layout or "",
                window_left=c.window_left, causal=c.causal, chunk=c.attention_chunk, soft_cap=c.logits_soft_cap,
                sinks=c.sinks, sm_scale=c.scale, dtype=c.dtype, cache_dtype=c.cache_dtype, seed=c.seed,
                **({"parents": [list(t.parents) for t in drafts]} if drafts else {}),
                **({"block": c.block} if c.block else {}))


def _inputs_of(part: Part, parts: list[Part]) -> str:
    """The label of the inputs a part reads: those of the first part on the same case (a control, or a cliff call,
    reads the first call's inputs, not a copy), else its own."""
    if part.role not in ("control", "timed"):
        return part.label
    return next(p for p in parts if p.case == part.case and p.role != "first").label


def replans(part: Part, parts: list[Part]) -> bool:
    """Whether the part is a control that plans the checked call's own wrapper again with its keywords (#4972's
    ``disable_split_kv=True``): the script re-plans and runs it once more, with no second wrapper."""
    return part.role == "control" and bool(part.plan_keywords) and any(
        q.role == "checked" and (q.impl, q.case, q.backend) == (part.impl, part.case, part.backend) for q in parts)


def _shares_inputs(part: Part, parts: list[Part]) -> bool:
    return _inputs_of(part, parts) != part.label


def no_script(impl) -> str | None:
    """Why an implementation has no standalone script, or None."""
    if impl.library == "flex":
        return (f"{impl.name} ({impl.library}) has no standalone script: its block mask is built by swabench's own "
                f"layout code from the page table, which a script would have to carry")
    if impl.library not in (FLASHINFER, "torch") or impl.wrapper in ("xqa", "fmha-v2", "cudnn"):
        return (f"{impl.name} has no standalone script yet: it calls functions taking block tables (TRT-LLM's "
                f"kernels, cuDNN, FlashAttention-4 and -3), which the script writer does not rebuild")
    if impl.modes == ("mixed",):
        return (f"{impl.name} has no standalone script yet: its two calls write views of the step's output, which "
                f"the script writer does not name")
    if impl.wrapper == "holistic":
        return (f"{impl.name} has no standalone script yet: BatchAttention keeps the kv_indices plan() gets for its "
                f"run, so they must be on the GPU, which a trace on the CPU cannot tell from a host table")
    return None


def traced(part: Part, inputs: str | None = None, tracer_class=trace.Tracer, out: str = "") -> trace.Tracer:
    """Run the part's path on the CPU against the stand-in, tracing its calls; ``inputs``: the suffix of the CASE,
    x and input names it reads (its own label unless it shares another part's); ``out``: its output's name, where
    not ``out`` and its label."""
    impl = registry.get(part.impl)
    why = no_script(impl) or (f"a script's make_inputs writes random data into every slot, so a case with "
                               f"cache_fill {part.case.cache_fill!r} has no script yet"
                               if part.case.cache_fill != "random" else None)
    if why:
        raise trace.Unrenderable(why)
    literals = case_literals(part.case)
    x = kit.make_inputs(literals, "cpu")
    w = workloads.build(part.case, "cpu")
    names = {"q": w.q, "k_cache": w.k_store, "v_cache": w.v_store, "sinks": w.sinks}
    tracer = tracer_class(literals, x, names, impl, part.case, part.label, part.label if inputs is None else inputs,
                          dict(part.plan_keywords))
    with standin.installed(tracer.library_call):
        runner = impl.make(w, part.backend)
        tracer.owned(runner)
        tracer.name(runner.out, out or "out" + part.label)
        runner.plan()
        tracer.phase = "step"
        with tracer:
            runner.run()
    return tracer


def render(parts: list[Part], header: Header) -> str:
    """The script's text: it exits 1 when the checked part is wrong."""
    checked = next((p for p in parts if p.role == "checked"), None)
    tracers = [traced(dataclasses.replace(p, label=checked.label) if replans(p, parts) else p, _inputs_of(p, parts))
               for p in parts]
    flashinfer = any(registry.get(p.impl).library == FLASHINFER for p in parts)
    body, declared = ["env = environment()  # before any call: a crash can take the CUDA context with it"], set()
    for p, t in zip(parts, tracers):
        body += [] if replans(p, parts) else _part(p, t, parts, declared)
    body += _check(parts, tracers)
    text = "\n".join(body)
    case = case_literals(next(p.case for p in parts if p.role == "checked"))
    wanted = [kit.make_inputs, kit.evict_pages, kit.taken_by, kit.block_visible, kit.block_ranges, kit.table_slice,
              kit.key_slots, kit.window_mask, kit.visible, kit.seen, kit.reference, kit.outcome, kit.wrong_rows,
              kit.environment]
    helpers = needed_helpers(wanted, text, case)
    read = case_keys(text, helpers)
    first = tracers[next(i for i, p in enumerate(parts) if p.role == "checked")]
    imports = ["import torch"] + (["import torch.nn.functional as F"] if "F." in text else []) + \
        (["", "import flashinfer"] if flashinfer else [])
    constants = [call(f"CASE{p.label} = dict", [],
                      {k: literal(v) for k, v in case_literals(p.case).items() if k in read})
                 for p in parts if not _shares_inputs(p, parts)]
    constants.append(tolerance_line(parts[-1].case.dtype))
    constants.append('DEVICE = "cuda"' if flashinfer else 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"')
    main = "\n".join(["def main():", "    dev = torch.device(DEVICE)"] + _indent(body))
    return assemble(header, [call_line(first), shape_line(case)], imports, constants, main, helpers)


def tolerance_line(dtype: str) -> str:
    tol = gate.TOLERANCES[dtype]
    return f"TOLERANCE = {{'rel_l2': {tol.rel_l2!r}, 'row_rel_l2': {tol.row_rel_l2!r}}}  # rel-L2 error allowed on " \
           f"random inputs, {dtype}"


def wrapped(lines: list[str], width: int = 110) -> list[str]:
    """A top comment's lines cut at ``width`` columns, each continuation indented four spaces."""
    return [w for line in lines for w in textwrap.wrap(line, width, subsequent_indent="    ", break_on_hyphens=False)]


def assemble(header: Header, said: list[str], imports: list[str], constants: list[str], main: str,
             helpers: list[str]) -> str:
    """A script's text: its top comment (``said``: the call and the shape, then the header's lines), its imports and
    constants, ``main`` (with what it defines), the helpers it calls, and the entry point."""
    said = wrapped(said)
    out = ["#!/usr/bin/env python3", '"""' + header.title, "", *said, *header.lines, '"""', "", "import sys", "",
           *imports, "", *constants, "", "", main]
    for source in helpers:
        out += ["", "", source]
    out += ["", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""]
    return "\n".join(out)


def case_keys(text: str, helpers: list[str]) -> set[str]:
    """The CASE keys the script reads once its helpers are cut to the case: CASE holds those only."""
    keys = {m for source in helpers for m in re.findall(r'case(?:\["|\.get\(")(\w+)"', source)}
    return keys | set(re.findall(r'CASE\w*\["(\w+)"\]', text))


def call_line(t: trace.Tracer) -> str:
    """The checked call in the library's terms: each wrapper, then the calls made on it with their keywords, then
    the library's functions it calls (a PyTorch path makes no library call: its torch calls are main()'s lines)."""
    if not t.api:
        return "Call: PyTorch only, written out in main()"
    return "Call: " + "; ".join(calls[0].removeprefix("flashinfer.") + (", then " + ", ".join(calls[1:])
                                                                          if len(calls) > 1 else "")
                                if name != "flashinfer" else ", ".join(calls) for name, calls in t.api.items())


def shape_line(c: dict) -> str:
    """The case as a maintainer reads a shape: batch, lengths, heads, head_dim, pages, window, causal, features."""
    n = len(c["kv_lens"])

    def lengths(values):
        return str(values[0]) + (" each" if n > 1 else "") if len(set(values)) == 1 else str(values)

    said = [f"batch {n}", f"qo_len {lengths(c['qo_lens'])}", f"kv_len {lengths(c['kv_lens'])}",
            f"{c['num_qo_heads']} query, {c['num_kv_heads']} KV heads", f"head_dim {c['head_dim']}",
            (f"page_size {c['page_size']}" + ("" if c["page_layout"] in ("scattered", "") else
                                                f" ({c['page_layout']} pages)")) if c["storage"] == "paged"
            else "ragged KV",
            *([f"window_left {c['window_left']}"] if c["window_left"] >= 0 else [])] + \
        ([] if c["causal"] else ["non-causal"])
    said += [f"chunks of {c['chunk']}"] if c["chunk"] else []
    said += [] if all(map(is_chain, c.get("parents") or [])) else ["a draft tree"]
    said += (["sinks"] if c["sinks"] else []) + ([f"soft-cap {c['soft_cap']}"] if c["soft_cap"] else [])
    said.append(c["dtype"] + (f" (a {c['cache_dtype']} cache)" if c["cache_dtype"] != c["dtype"] else ""))
    return "Shape: " + "; ".join(said)


def is_chain(parents: list[int]) -> bool:
    """Whether a draft tree is a chain, each node the child of the one before: its mask is the causal one."""
    return parents == list(range(-1, len(parents) - 1))


def needed_helpers(helpers, text: str, case: dict) -> list[str]:
    """The sources of the helpers ``text`` calls, and of those they call in turn, each cut to ``case``, in
    ``helpers``' order."""
    named = {f.__name__: f for f in helpers}
    cut, todo = {}, [text]
    while todo:
        source = todo.pop()
        for name, f in named.items():
            if name not in cut and f"{name}(" in source:
                cut[name] = specialize(f, case)
                todo.append(cut[name])
    return [cut[f.__name__] for f in helpers if f.__name__ in cut]


def specialize(fn, case: dict) -> str:
    """``fn``'s source with every ``if`` whose test reads only ``case`` (and builtins) cut to the branch ``case``
    takes; a comment on the ``if`` line stays, above the branch."""
    lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    while True:
        tree = ast.parse("\n".join(lines))
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.If) and _reads_only_case(n.test)), None)
        if node is None:
            return "\n".join(lines)
        taken = node.body if eval(compile(ast.Expression(node.test), "<test>", "eval"), {"case": case}) \
            else node.orelse
        pad = " " * node.col_offset
        said = lines[node.lineno - 1].partition("#")[2].strip() if taken else ""
        kept = [line[4:] if line.strip() else line for line in lines[taken[0].lineno - 1:taken[-1].end_lineno]] \
            if taken else []
        if not kept and _alone(tree, node):
            kept = [pad + "pass"]
        lines[node.lineno - 1:node.end_lineno] = ([pad + "# " + said] if said else []) + kept


def _reads_only_case(test) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return "case" in names and names - {"case"} <= BUILTINS


def _alone(tree, node) -> bool:
    """Whether ``node`` is the only statement of its block (removing it would leave the block empty)."""
    return any(getattr(parent, name, None) == [node] for parent in ast.walk(tree) for name in ("body", "orelse"))


def _part(p: Part, t: trace.Tracer, parts: list[Part], declared: set) -> list[str]:
    """One part's lines: its inputs (a part on an earlier part's case reads that part's), its output buffer, its
    construction and plan, its step."""
    s, owner = p.label, _inputs_of(p, parts)
    impl = registry.get(p.impl)
    said = (p.says or f"{impl.name} on {impl.library}" + (f" ({p.backend})" if impl.backends else "")
            + f": {impl.summary}")
    lines = [] if p.role == "checked" else textwrap.wrap(  # the checked call is the top comment's
        ("Control: " if p.role == "control" else "") + said, 106, initial_indent="# ", subsequent_indent="# ")
    x = f"x{owner}"
    if owner == s:
        lines.append(f"{x} = make_inputs(CASE{s}, dev)")
    names = [(name + owner, name) for name in trace.INPUTS if name in t.used]
    names = [(local, name) for local, name in names if local not in declared]
    declared.update(local for local, _ in names)
    groups: list[list] = []  # as many inputs a line as fit
    for pair in names:
        line = groups[-1] + [pair] if groups else [pair]
        if groups and len(_unpacked(line, x)) <= 106:
            groups[-1] = line
        else:
            groups.append([pair])
    lines += [_unpacked(g, x) for g in groups]
    lines.append(f'out{s} = torch.empty_like({x}["q"])')
    lines += t.setup
    lines += ["", f"def step{s}():"] + _indent(t.step) + [""]
    if p.role == "first":
        lines += [f"step{s}()  # run first, in this process, before the checked call"]
    return lines


def _unpacked(pairs, x: str) -> str:
    return ", ".join(local for local, _ in pairs) + " = " + ", ".join(f'{x}["{name}"]' for _, name in pairs)


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else "" for entry in lines for line in entry.split("\n")]


def _check(parts: list[Part], tracers: list[trace.Tracer]) -> list[str]:
    """The verdict line first, the worst row's values, the control's verdict (a re-planning control plans the
    checked wrapper again first), the environment."""
    checked = next(p for p in parts if p.role == "checked")
    s = checked.label
    lines = [f"wrong, what, detail = outcome(CASE{s}, x{s}, step{s}, out{s}, TOLERANCE)",
             'verdict = "NOT REPRODUCED" if not wrong else "REPRODUCED (crash)" if what.startswith("crash") else '
             '"REPRODUCED"',
             'print(f"{verdict}: {what}", *detail, sep="\\n")']
    for c, t in ((p, t) for p, t in zip(parts, tracers) if p.role == "control"):
        o, run = _inputs_of(c, parts), s if replans(c, parts) else c.label
        if replans(c, parts):
            lines += [f"# Control: {c.says}"] + [line for line in t.setup if ".plan(" in line.split("\n")[0]]
        lines += [f"print({'CONTROL, ' + (c.says or c.impl) + ': '!r}",
                  f"      + outcome(CASE{o}, x{o}, step{run}, out{run}, TOLERANCE)[1])"]
    return lines + ['print(*env, sep="\\n")', "return 1 if wrong else 0"]

