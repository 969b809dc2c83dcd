"""A reproducer on one screen: one request, its inputs and float32 reference written out in ``main()`` in
FlashInfer's terms, then the call under test and its control, traced from the suite's own paths on the same
inputs, each with its verdict, and FlashInfer's ``collect_env``.  A maintainer reads it top to bottom; the
traced lines are held to the suite's calls (``verify``) before a script is written.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from string import Template

import torch

from swabench.core import gate
from swabench.impls import registry
from swabench.repro import compact, kit, script, trace
from swabench.repro.compact import WIDTH
from swabench.repro.script import Part
from swabench.repro.source import literal


OUTCOME = '''
def outcome(step, out, expected, rel_l2=$rel, row_rel_l2=$row):
    """(wrong, what): step() writes out (NaN first: a row it never writes is wrong), held to expected."""
    out.fill_(float("nan"))
    try:
        step()
        torch.cuda.synchronize()
    except RuntimeError as e:  # an illegal memory access or a launch failure: the call never finished
        return True, f"crash: {str(e).strip().splitlines()[0]}"
    err = (out.float() - expected).nan_to_num(nan=float("inf"))
    row = (err.norm(dim=-1) / expected.norm(dim=-1).clamp_min(1e-6)).amax(dim=-1)  # rel-L2 of each row's worst head
    rel, bad = float(err.norm() / expected.norm()), (row > row_rel_l2).nonzero().flatten().tolist()
    rows = f"{len(bad)} of {len(row)} rows wrong, {bad[0]}-{bad[-1]}" if bad else "every row right"
    return rel > rel_l2 or bool(bad), f"{rows} (rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances " \\
                                      f"{rel_l2:g}, {row_rel_l2:g})"
'''

TAKEN_BY = '''
def taken_by(fn, **keywords):  # the keywords this release's fn takes: 0.6 plans without uniform_q_len
    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}
'''

# FlashInfer's own report (every release since 0.6.16): the GPU and its SM count, driver, CUDA, torch, cubin and
# JIT-cache packages, from a child process, so a crashed CUDA context cannot stop it
ENVIRONMENT = ['print(subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, '
               'text=True).stdout)']


DRAWN = ("q", "k_cache", "v_cache", "sinks")  # what a part's own inputs are; the tables are the request's


class ScreenTracer(trace.Tracer):
    """The tracer in one request's terms: a table trimmed from the request's is a slice of ``kv_indices``, and a
    custom mask is a slice of the reference's own ``seen`` (or ``allowed``, the mask without the window)."""

    def table(self, indptr, indices, last) -> str | None:
        x, ps = self.x, self.case["page_size"]
        full = x["kv_indices"].tolist()
        if len(indptr) != 2 or indices.dtype != torch.int32 or indptr.dtype != torch.int32:
            return None
        pages = indices.tolist()
        if pages == full and last.tolist() == x["kv_last_page_len"].tolist():
            for name, t in zip(("kv_indptr", "kv_indices", "kv_last_page_len"), (indptr, indices, last)):
                self.name(t, name)
            return None
        first = next((f for f in range(len(full) - len(pages) + 1) if full[f:f + len(pages)] == pages), None)
        if first is None or not pages:
            return None
        self.tables.append(([first * ps], [(first + len(pages) - 1) * ps + int(last[0])]))
        said = (f"torch.tensor({indptr.tolist()}, dtype=i32)", f"kv_indices[{first}:{first + len(pages)}]",
                f"torch.tensor({last.tolist()}, dtype=i32)")
        for expr, t in zip(said, (indptr, indices, last)):  # written where the call takes them
            self.name(t, expr)
        self.used.add("kv_indices")
        return said[1]

    def _computed(self, t: torch.Tensor) -> str:
        """As the tracer names it, a table the parts share named plainly (a part on its own q, K and V reads the
        request's tables)."""
        said = super()._computed(t)
        shared = {name + self.inputs for name in trace.INPUTS if name not in DRAWN}
        return said.removesuffix(self.inputs) if self.inputs and said in shared else said

    def _assign(self, expr: str, t: torch.Tensor) -> str:
        """A slice of the reference's mask is written where the call takes it; anything else gets a name."""
        return self.name(t, expr) if expr.startswith(("seen", "allowed")) else super()._assign(expr, t)

    def _mask(self, t: torch.Tensor) -> str | None:
        c = self.case
        if t.dim() != 1:
            raise trace.Unrenderable(f"{self.impl.name} builds a 2-D mask, which one screen does not write out")
        for starts, ends in self.tables + [([0], list(c["kv_lens"]))]:
            for window, name in ((None, "seen"), (-1, "allowed")):
                m = kit.window_mask(c, starts, ends, window_left=window)
                if m.shape == t.shape and torch.equal(m, t.cpu()):
                    self.used.add(name)
                    cols = "" if (starts[0], ends[0]) == (0, c["kv_lens"][0]) else f"[:, {starts[0]}:{ends[0]}]"
                    return f"{name}{cols}.flatten()"
        return None


WRAPPER_MODES = ("plain", "cuda-graph")  # a wrapper without plan buffers first: fewer lines, where the bug shows


def one_request(parts: list[Part], wrapper_mode: str) -> list[Part] | None:
    """The parts on their case's first request alone, their wrappers built in ``wrapper_mode``; None where a part's
    path does not run so."""
    one = [dataclasses.replace(p, case=dataclasses.replace(p.case, batch_size=1, wrapper_mode=wrapper_mode))
           for p in parts]
    return one if all(registry.get(p.impl).skip_reason(p.case, p.backend, None) is None for p in one) else None


def traced(part: Part, inputs: str = "") -> ScreenTracer:
    """The part's path run on the CPU against the stand-in, its calls traced in one request's names (a control
    writes into the call's ``out``; ``inputs``: the suffix of q, K, V and the sinks it reads, where they are its
    own)."""
    if part.case.batch_size != 1 or (part.case.page_layout or "scattered") != "scattered" or part.case.block:
        raise trace.Unrenderable(f"one screen writes one request on scattered pages, not {part.case.label}")
    return script.traced(part, inputs, ScreenTracer, "out" if part.role == "control" else "")


def outcome_source(dtype: str) -> str:
    """``outcome()`` as a script carries it, its tolerances those of ``dtype``."""
    tol = gate.TOLERANCES[dtype]
    return Template(OUTCOME).substitute(rel=tol.rel_l2, row=tol.row_rel_l2).strip()


def inputs(c: dict, needs: set[str], designed: bool = False) -> list[str]:
    """main()'s first lines: the request's inputs as the suite draws them, the float32 reference over its mask,
    and the tables the calls read; ``designed``: also the reference over the window counted from each query's row
    (``designed``), what the library computes by design where its docs do not say so."""
    qo, kv, h, hkv, d = c["qo_lens"][0], c["kv_lens"][0], c["num_qo_heads"], c["num_kv_heads"], c["head_dim"]
    dtype = {"bfloat16": "bf16", "float16": "torch.float16"}[c["dtype"]]
    paged, ps = c["storage"] == "paged", c["page_size"]
    pages = -(-kv // ps)
    lines = drawn(c)
    if "slots" in needs:
        lines.append(f"slots = (kv_indices.long()[:, None] * {ps} + torch.arange({ps})).flatten()[:{kv}]  # each "
                     f"key's cache slot" if paged else f"slots = torch.arange({kv})")
    gathered = f"c[kv_indices.long()].flatten(0, 1)[:{kv}]" if paged else "c"
    lines.append(f"k, v = ({gathered}.float().repeat_interleave({h // hkv}, dim=1) for c in (k_cache, v_cache))")
    lines += _mask(c, qo, kv, "allowed" in needs or designed)
    scores = f"torch.einsum(\"qhd,khd->hqk\", q.float(), k) * {c['sm_scale']!r}"
    if designed:
        lines += _designed(c, qo, kv, scores)
        return lines + _tables(c, needs, qo, kv)
    if c["soft_cap"]:
        lines += [f"s = {scores}", f"s = {c['soft_cap']!r} * torch.tanh(s / {c['soft_cap']!r})  # the soft-cap",
                  's = s.masked_fill(~seen, float("-inf"))']
    else:
        lines.append(f's = ({scores}).masked_fill(~seen, float("-inf"))')
    if c["sinks"]:
        lines.append(f"s = torch.cat([s, sinks[:, None, None].expand(-1, {qo}, 1)], dim=-1)  # each head's sink "
                     f"joins the softmax")
    cut = f"[..., :{kv}]" if c["sinks"] else ""
    reference = f"expected, out = torch.einsum(\"hqk,khd->qhd\", s.softmax(dim=-1){cut}, v), torch.empty_like(q)"
    lines.append(reference + ("  # float32" if len(reference) <= WIDTH - 16 else ""))
    return lines + _tables(c, needs, qo, kv)


def _designed(c: dict, qo: int, kv: int, scores: str) -> list[str]:
    """The two float32 references of a docs gap: ``expected`` over the window by depth, ``designed`` over the window
    counted from each query's row, as the kernel applies it with a custom mask."""
    if c["soft_cap"] or c["sinks"]:
        raise trace.Unrenderable("the designed window is written for a plain softmax, without soft-cap or sinks")
    rows = f"torch.arange({kv - qo}, {kv}, device=dev)[:, None]"
    return [f"row_seen = allowed & (torch.arange({kv}, device=dev) >= {rows} - {c['window_left']})",
            f"s = {scores}",
            'attend = lambda m: torch.einsum("hqk,khd->qhd", s.masked_fill(~m, float("-inf")).softmax(dim=-1), v)',
            "expected, designed, out = attend(seen), attend(row_seen), torch.empty_like(q)  # float32"]


def rows_apart(c: dict) -> list[int]:
    """The rows whose window from the row (``designed_mask``) and window by depth differ: what a docs gap names."""
    qo, kv = c["qo_lens"][0], c["kv_lens"][0]
    return (designed_mask(c) != kit.window_mask(c, [0], [kv]).view(qo, kv)).any(dim=1).nonzero().flatten().tolist()


def designed_mask(c: dict) -> torch.Tensor:
    """``row_seen`` as the script computes it, for the check against the path's declared visibility."""
    qo, kv, w = c["qo_lens"][0], c["kv_lens"][0], c["window_left"]
    allowed = kit.window_mask(c, [0], [kv], window_left=-1).view(qo, kv)
    return allowed & (torch.arange(kv) >= torch.arange(kv - qo, kv)[:, None] - w)


def _tables(c: dict, needs: set[str], qo: int, kv: int) -> list[str]:
    """The request's tables the calls read, as one line."""
    paged, ps = c["storage"] == "paged", c["page_size"]
    pages = -(-kv // ps)
    lines = []
    tables = [("qo_indptr", [0, qo])] + ([("kv_indptr", [0, pages]), ("kv_last_page_len", [kv - (pages - 1) * ps])]
                                        if paged else [("kv_indptr", [0, kv])])
    tables = [(n, v) for n, v in tables if n in needs]
    if len(tables) == 1:
        lines.append(f"{tables[0][0]} = torch.tensor({tables[0][1]}, dtype=i32)")
    elif tables:
        names, values = zip(*tables)
        lines.append(f"{', '.join(names)} = (torch.tensor(v, dtype=i32) for v in ({', '.join(map(str, values))}))")
    return lines


def drawn(c: dict) -> list[str]:
    """main()'s first lines: the aliases, the page table (its pages shuffled) and the data, as the suite draws
    them (every request's, one after another)."""
    pages = sum(-(-k // c["page_size"]) for k in c["kv_lens"])
    table = [f"kv_indices = torch.randperm({pages}, generator=torch.Generator().manual_seed({c['seed'] + 1}))"
             f".to(i32)  # pages, shuffled"] if c["storage"] == "paged" else []
    return ["bf16, i32 = torch.bfloat16, torch.int32", *table, *draws(c)]


def draws(c: dict, suffix: str = "") -> list[str]:
    """q, K, V (and the sinks) drawn as the suite draws them, named with ``suffix``; the page table is drawn
    before them."""
    qo, kv, h, hkv, d = sum(c["qo_lens"]), sum(c["kv_lens"]), c["num_qo_heads"], c["num_kv_heads"], c["head_dim"]
    dtype, ps = {"bfloat16": "bf16", "float16": "torch.float16"}[c["dtype"]], c["page_size"]
    pages = sum(-(-k // ps) for k in c["kv_lens"])
    cache = f"({pages}, {ps}, {hkv}, {d})" if c["storage"] == "paged" else f"({kv}, {hkv}, {d})"
    q, k, v, sinks = (name + suffix for name in ("q", "k_cache", "v_cache", "sinks"))
    lines = [f"g = torch.Generator(dev).manual_seed({c['seed']})",
             f"{q}, {k}, {v} = (torch.randn(shape, generator=g, device=dev).to({dtype})",
             f"{' ' * len(f'{q}, {k}, {v} = (')}for shape in (({qo}, {h}, {d}), {cache}, {cache}))"]
    if c["soft_cap"]:
        cap, scale = c["soft_cap"], c["sm_scale"]
        lines += [f"{q}.mul_({0.1 * cap / scale / (d - 1) ** 0.5!r})  # logits near 0.3 of the cap, where tanh bends",
                  f"{q}[..., 0], {k}[..., 0] = {0.3 * cap / scale!r}, 1"]
    if c["sinks"]:
        lines.append(f"{sinks} = 3.0 + 2.0 * torch.randn({h}, generator=torch.Generator(dev).manual_seed("
                     f"{c['seed'] + 7}), device=dev)")
    return lines


def _mask(c: dict, qo: int, kv: int, alone: bool) -> list[str]:
    """``seen`` (and ``allowed``, the mask before the window, where a call takes it): which keys each query sees."""
    w, prefix = c["window_left"], kv - qo
    window = [f"key >= position - {w}"] if w >= 0 else []
    parents = c.get("parents", [None])[0]
    if parents and not script.is_chain(parents):
        lines = [f"parents = {literal(parents)}  # the draft tree: each node's parent (-1: the root)",
                 f"depth, tree = [0] * {qo}, torch.eye({qo}, dtype=torch.bool, device=dev)  # tree[i, j]: j is i or "
                 f"its ancestor",
                 f"for i in range(1, {qo}):",
                 "    depth[i], tree[i] = depth[parents[i]] + 1, tree[i] | tree[parents[i]]",
                 f"position = {prefix} + torch.tensor(depth, device=dev)[:, None]  # node i sits at {prefix} + its "
                 f"depth",
                 f"key = torch.cat([torch.arange({prefix}, device=dev), position[:, 0]])  # a draft key at its node",
                 f"allowed = torch.cat([torch.ones({qo}, {prefix}, dtype=torch.bool, device=dev), tree], dim=1)"]
        return lines + ["seen = " + " & ".join(["allowed"] + [f"({t})" for t in window])]
    lines = [f"position, key = torch.arange({prefix}, {kv}, device=dev)[:, None], torch.arange({kv}, device=dev)"]
    said = f"  # query i at {prefix} + i"
    lines[0] += said if len(lines[0] + said) <= WIDTH - 4 else ""
    if not alone and c["causal"] and not c["chunk"]:  # a band: query i sees keys p - w .. p (0 .. p: no window)
        band = f"seen = torch.ones({qo}, {kv}, dtype=torch.bool, device=dev).tril({prefix})"
        if w >= 0 and prefix - w + qo - 1 > 0:
            band, said = band + f".triu({prefix - w})", f"  # query i: keys {prefix - w} + i .. {prefix} + i"
        else:
            said = f"  # query i: keys 0 .. {prefix} + i"
        return [band + (said if len(band + said) <= WIDTH - 4 else "")]
    causal = ["key <= position"] if c["causal"] else ["key >= 0"]
    terms = window + ([f"key >= position - position % {c['chunk']}"] if c["chunk"] else [])
    if alone:
        return lines + [f"allowed = {causal[0]}", "seen = " + " & ".join(["allowed"] + [f"({t})" for t in terms])]
    terms = (causal if c["causal"] or not terms else []) + terms
    return lines + ["seen = " + (" & ".join(f"({t})" for t in terms) if len(terms) > 1 else terms[0])]


def _indent(lines: list[str], pad: str = "    ") -> list[str]:
    return [pad + line if line else "" for entry in lines for line in entry.split("\n")]


def part_lines(p: Part, t: ScreenTracer, earlier: list[str], steps: dict) -> tuple[list[str], str]:
    """One path: its output buffer (the call's is made with the reference, and a control writes it), its
    construction (where an earlier part has not made the same) and plan; and its step, a lambda where it is one call, else a function defined here, or an
    earlier part's where it is the same (``steps``: each earlier step's lines, by its name)."""
    lines = [] if p.role == "control" or not p.label else [f"out{p.label} = torch.empty_like(q{t.inputs})"]
    setup, renamed = compact.shared([compact.names(s) for s in t.setup], earlier, p.label) if p.label else \
        ([compact.names(s) for s in t.setup], {})
    step = [compact.names(s) for s in t.step]
    temporaries = {m for line in step for m in re.findall(rf"^(\w+{p.label}) = ", line)} if p.label else set()
    renamed.update({name: name.removesuffix(p.label) for name in temporaries})
    for old, new in renamed.items():
        step = [re.sub(rf"\b{old}\b", new, line) for line in step]
    last_plan = {line.partition(".plan(")[0]: line for line in earlier if ".plan(" in line.split("\n")[0]}
    lines += [line for line in setup if ".plan(" not in line.split("\n")[0] or p.role != "control"
              or last_plan.get(line.partition(".plan(")[0]) != line]
    same = next((name for name, lines_of in steps.items() if lines_of == step), None)
    if same:
        return lines, same
    if len(step) == 1 and "\n" not in step[0]:
        return lines, f"lambda: {step[0]}"
    steps[f"step{p.label}"] = step
    return lines + [f"def step{p.label}():"] + _indent(step), f"step{p.label}"


def render(parts: list[Part], header: script.Header, designed: bool = False) -> str:
    """The script's text: the checked call (after a part run ``first``), its verdict, the control and its
    verdict, the environment.  ``designed``: a docs gap, whose call is held to what the library computes by design
    (the window counted from each query's row, which must be what the path declares it computes), and whose verdict
    says where that differs from the window the caller means (``gap_verdict``)."""
    checked = next(p for p in parts if p.role == "checked")
    c = script.case_literals(checked.case)
    if designed and not torch.equal(designed_mask(c), declared_mask(checked)):
        raise ValueError(f"{checked.impl} declares another rule than the window from each query's row; the docs-gap "
                         f"script writes that one only")
    if designed and not rows_apart(c):
        raise ValueError(f"{checked.case.label}: the window from each row is the window by depth on every row, so the "
                         f"script would have no row to name")
    own = {p.label: script.case_literals(p.case) for p in parts if p.case != checked.case}
    if any(p.role != "first" or not _same_tables(o, c) for p, o in zip((p for p in parts if p.label in own),
                                                                       own.values())):
        raise trace.Unrenderable("one screen writes one request's tables, and these parts read two")
    tracers = [traced(dataclasses.replace(p, label=checked.label) if script.replans(p, parts) else p,
                      p.label if p.label in own else "") for p in parts]
    needs = set().union(*(t.used for t in tracers))
    body, earlier, checked_step, steps = inputs(c, needs, designed), [], "", {}
    for p, t in zip(parts, tracers):
        if script.replans(p, parts):
            body += [compact.names(s) for s in t.setup if ".plan(" in s.split("\n")[0]]
            body += _verdict(p.says, checked_step)
            continue
        lines, step = part_lines(p, t, earlier, steps)
        if p.label in own:  # a part run first on inputs of its own
            body += [f"# first, the same on inputs of head_dim {own[p.label]['head_dim']}, in this process"
                     if own[p.label]["head_dim"] != c["head_dim"] else "# first, on inputs of its own"]
            same_sinks = own[p.label]["num_qo_heads"] == c["num_qo_heads"]  # and the seed: the same logits
            body += [line for line in draws(own[p.label], p.label) if not (same_sinks and line.startswith("sinks"))]
            if same_sinks:
                lines = [re.sub(rf"\bsinks{p.label}\b", "sinks", line) for line in lines]
                step = re.sub(rf"\bsinks{p.label}\b", "sinks", step)
        earlier += [compact.names(s) for s in t.setup]
        body += lines
        if p.role == "first":
            body.append(step.removeprefix("lambda: ") if step.startswith("lambda") else f"{step}()")
        elif p.role == "checked":
            checked_step = step
            body += gap_verdict(step, c, p.label) if designed else \
                [f"wrong, what = outcome({step}, out{p.label}, expected)",
                 'print(("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)']
        else:
            body += _verdict(p.says, step)
    body = compact.grouped(compact.inline_once(body)) + ENVIRONMENT + ["return 1 if wrong else 0"]
    text = "\n".join(body)
    said = script.wrapped([script.call_line(tracers[parts.index(checked)]), script.shape_line(c)], WIDTH)
    out = ["#!/usr/bin/env python3", f'"""{header.title}', "", *said, *header.lines, '"""',
           *(["import inspect"] if "taken_by(" in text else []), "import subprocess", "import sys", "",
           "import flashinfer", "import torch", "", "", 'def main(dev="cuda"):', *_indent(body), "", "",
           outcome_source(checked.case.dtype)]
    if "taken_by(" in text:
        out += ["", "", TAKEN_BY.strip()]
    return "\n".join(out + ["", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""])


def gap_verdict(step: str, c: dict, label: str = "") -> list[str]:
    """A docs gap's verdict: the call held to the window from each query's row (REPRODUCED where it is not, exit 1),
    and the rows whose window from the row and window by depth differ (DOCUMENTATION GAP, exit 0)."""
    return [f"wrong, what = outcome({step}, out{label}, designed)",
            "differ = (seen != row_seen).any(dim=1).nonzero().flatten().tolist()  # the rows whose two windows differ",
            "print(f\"{'REPRODUCED' if wrong else 'DOCUMENTATION GAP'}: row-anchored and depth-anchored windows differ "
            "on rows \"",
            f'      f"{{differ[0]}}-{{differ[-1]}} ({{len(differ)}} of {c["qo_lens"][0]}); the call against the '
            'row-anchored one: {what}")']


def declared_mask(part: Part) -> torch.Tensor:
    """What the part's path declares it computes on its first request (its visibility, a draft tree's by its
    slots or depths)."""
    from swabench.core import trees, workloads

    case = part.case
    qo, kv = (lengths[0] for lengths in workloads.request_lengths(case))
    tree = (trees.of_case(case) or [None])[0]
    return registry.get(part.impl).computes(case, kv - qo).mask(qo, kv, tree=tree).cpu()


def _same_tables(a: dict, b: dict) -> bool:
    """Whether two cases' requests have the same page tables (they differ in heads or head_dim alone)."""
    keys = ("qo_lens", "kv_lens", "storage", "page_size", "page_layout", "seed")
    return all(a[k] == b[k] for k in keys)


def _verdict(says: str, step: str) -> list[str]:
    """The control's verdict, printed under the call's."""
    said = textwrap.wrap(f"CONTROL, {says}: ", WIDTH - 22, drop_whitespace=False)
    return [f"what = outcome({step}, out, expected)[1]",
            "print(" + "\n      ".join(repr(piece) for piece in said) + " + what)"]
