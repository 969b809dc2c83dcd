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
from swabench.repro import kit, script, trace
from swabench.repro.script import Part
from swabench.repro.source import call, literal

WIDTH = 118  # a maintainer's screen
RUN = "python3 with torch and flashinfer on a CUDA GPU; kernels build on first use; exits 1 when reproduced"
EXPECTED = "softmax attention in float32 over each query's window (expected in main): rel-L2 <= {rel:g} overall, " \
           "{row:g} in each row and head"

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
    rel, bad = float(err.norm() / expected.norm()), set((row > row_rel_l2).nonzero().flatten().tolist())
    rows = ", ".join(f"{a}-{z}" if z > a else f"{a}" for a, z in zip(sorted(r for r in bad if r - 1 not in bad),
                                                                      sorted(r for r in bad if r + 1 not in bad)))
    return rel > rel_l2 or bool(bad), (f"rows {rows} of {len(row)} wrong" if bad else "every row right") + \\
        f" (rel-L2 {rel:.3g}, worst row {float(row.max()):.3g}; tolerances {rel_l2:g}, {row_rel_l2:g})"
'''

TAKEN_BY = '''
def taken_by(fn, **keywords):  # the keywords this release's fn takes: 0.6 plans without uniform_q_len
    return {k: v for k, v in keywords.items() if k in inspect.signature(fn).parameters}
'''

# FlashInfer's own report: the GPU and its SM count, driver, CUDA, torch, cubin and JIT-cache packages
ENVIRONMENT = [
    'env = subprocess.run([sys.executable, "-m", "flashinfer.collect_env"], capture_output=True, text=True).stdout',
    'print(env or f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")']


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


def one_request(case):
    """The case with its first request alone, which one screen writes out."""
    return dataclasses.replace(case, batch_size=1)


def traced(part: Part) -> ScreenTracer:
    """The part's path run on the CPU against the stand-in, its calls traced in one request's names (a control
    writes into the call's ``out``)."""
    if part.case.batch_size != 1 or (part.case.page_layout or "scattered") != "scattered" or part.case.block:
        raise trace.Unrenderable(f"one screen writes one request on scattered pages, not {part.case.label}")
    return script.traced(part, "", ScreenTracer, "out" if part.role == "control" else "")


def outcome_source(dtype: str) -> str:
    """``outcome()`` as a script carries it, its tolerances those of ``dtype``."""
    tol = gate.TOLERANCES[dtype]
    return Template(OUTCOME).substitute(rel=tol.rel_l2, row=tol.row_rel_l2).strip()


def inputs(c: dict, needs: set[str]) -> list[str]:
    """main()'s first lines: the request's inputs as the suite draws them, the float32 reference over its mask,
    and the tables the calls read."""
    qo, kv, h, hkv, d = c["qo_lens"][0], c["kv_lens"][0], c["num_qo_heads"], c["num_kv_heads"], c["head_dim"]
    dtype = {"bfloat16": "bf16", "float16": "torch.float16"}[c["dtype"]]
    paged, ps = c["storage"] == "paged", c["page_size"]
    pages = -(-kv // ps)
    lines = ["bf16, i32 = torch.bfloat16, torch.int32"]
    if paged:
        lines.append(f"kv_indices = torch.randperm({pages}, generator=torch.Generator().manual_seed({c['seed'] + 1}))"
                     f".to(i32)  # pages, shuffled")
    cache = f"({pages}, {ps}, {hkv}, {d})" if paged else f"({kv}, {hkv}, {d})"
    lines += [f"g = torch.Generator(dev).manual_seed({c['seed']})",
              f"q, k_cache, v_cache = (torch.randn(shape, generator=g, device=dev).to({dtype})",
              f"                       for shape in (({qo}, {h}, {d}), {cache}, {cache}))"]
    if c["soft_cap"]:
        cap, scale = c["soft_cap"], c["sm_scale"]
        lines += [f"q.mul_({0.1 * cap / scale / (d - 1) ** 0.5!r})  # logits near 0.3 of the cap, where tanh bends",
                  f"q[..., 0], k_cache[..., 0] = {0.3 * cap / scale!r}, 1"]
    if c["sinks"]:
        lines.append(f"sinks = 3.0 + 2.0 * torch.randn({h}, generator=torch.Generator(dev).manual_seed({c['seed'] + 7}),"
                     f" device=dev)")
    if "slots" in needs:
        lines.append(f"slots = (kv_indices.long()[:, None] * {ps} + torch.arange({ps})).flatten()[:{kv}]  # each "
                     f"key's cache slot" if paged else f"slots = torch.arange({kv})")
    gathered = f"c[kv_indices.long()].flatten(0, 1)[:{kv}]" if paged else "c"
    lines.append(f"k, v = ({gathered}.float().repeat_interleave({h // hkv}, dim=1) for c in (k_cache, v_cache))")
    lines += _mask(c, qo, kv, "allowed" in needs)
    scores = f"torch.einsum(\"qhd,khd->hqk\", q.float(), k) * {c['sm_scale']!r}"
    if c["soft_cap"]:
        lines += [f"s = {scores}", f"s = {c['soft_cap']!r} * torch.tanh(s / {c['soft_cap']!r})  # the soft-cap",
                  's = s.masked_fill(~seen, float("-inf"))']
    else:
        lines.append(f's = ({scores}).masked_fill(~seen, float("-inf"))')
    if c["sinks"]:
        lines.append(f"s = torch.cat([s, sinks[:, None, None].expand(-1, {qo}, 1)], dim=-1)  # each head's sink "
                     f"joins the softmax")
    cut = f"[..., :{kv}]" if c["sinks"] else ""
    lines.append(f"expected = torch.einsum(\"hqk,khd->qhd\", s.softmax(dim=-1){cut}, v)  # float32 reference")
    tables = [("qo_indptr", [0, qo])] + ([("kv_indptr", [0, pages]), ("kv_last_page_len", [kv - (pages - 1) * ps])]
                                        if paged else [("kv_indptr", [0, kv])])
    tables = [(n, v) for n, v in tables if n in needs]
    if len(tables) == 1:
        lines.append(f"{tables[0][0]} = torch.tensor({tables[0][1]}, dtype=i32)")
    elif tables:
        names, values = zip(*tables)
        lines.append(f"{', '.join(names)} = (torch.tensor(v, dtype=i32) for v in ({', '.join(map(str, values))}))")
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
                 f"key = torch.cat([torch.arange({prefix}, device=dev), position[:, 0]])  # a draft key at its node's",
                 f"allowed = torch.cat([torch.ones({qo}, {prefix}, dtype=torch.bool, device=dev), tree], dim=1)"]
        return lines + ["seen = " + " & ".join(["allowed"] + [f"({t})" for t in window])]
    lines = [f"position, key = torch.arange({prefix}, {kv}, device=dev)[:, None], torch.arange({kv}, device=dev)"
             f"  # query i at {prefix} + i"]
    causal = ["key <= position"] if c["causal"] else ["key >= 0"]
    terms = window + ([f"key >= position - position % {c['chunk']}"] if c["chunk"] else [])
    if alone:
        return lines + [f"allowed = {causal[0]}", "seen = " + " & ".join(["allowed"] + [f"({t})" for t in terms])]
    terms = (causal if c["causal"] or not terms else []) + terms
    return lines + ["seen = " + (" & ".join(f"({t})" for t in terms) if len(terms) > 1 else terms[0])]


def _indent(lines: list[str], pad: str = "    ") -> list[str]:
    return [pad + line if line else "" for entry in lines for line in entry.split("\n")]


BUFFER = re.compile(r"(\w+)_buf=torch\.empty\((\d+), dtype=(?:torch\.int32|i32|torch\.uint8), device=dev\)")
BUFFERS = '''
def buffers(**sizes):  # what a CUDA-graph wrapper plans into: int32 arrays, the custom mask's bytes
    return {f"{name}_buf": torch.empty(n, dtype=torch.uint8 if name == "custom_mask" else i32, device=dev)
            for name, n in sizes.items()}
'''


def _names(text: str) -> str:
    """A traced line in the script's aliases, its call packed again at the screen's width."""
    return _reflow(text.replace("torch.bfloat16", "bf16").replace("torch.int32", "i32"))


def _buffered(text: str) -> str:
    """A construction with its plan buffers made by ``buffers()``."""
    found = BUFFER.findall(text)
    if not found or " = flashinfer." not in text:
        return text
    text = re.sub(r"(,\s*)+", ", ", BUFFER.sub("", text)).replace(", )", ")")
    return _names(text[:-1] + f", **buffers({', '.join(f'{name}={n}' for name, n in found)}))")


def _reflow(text: str, width: int = WIDTH - 4) -> str:
    """A call written over several lines, packed again at ``width`` (main() indents it four more): the arguments
    split at top-level commas."""
    if "\n" not in text and len(text) <= width:
        return text
    flat = " ".join(line.strip() for line in text.split("\n")).replace("( ", "(")
    head, _, rest = flat.partition("(")
    parts, depth, piece, quote = [], 0, "", ""
    for ch in rest[:-1]:
        quote = ("" if ch == quote else quote) if quote else (ch if ch in "'\"" else "")
        depth += 0 if quote else (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0 and not quote:
            parts.append(piece.strip())
            piece = ""
        else:
            piece += ch
    parts.append(piece.strip())
    return call(head, parts, {}, width)


def _shared(lines: list[str], earlier: list[str], label: str) -> tuple[list[str], dict[str, str]]:
    """A control's lines without the constructions an earlier part already made the same way (the control then
    plans that wrapper again), and the names it takes over."""
    kept, renamed = [], {}
    for line in lines:
        own = _names(line.replace(label, ""))
        name = line.split(" = ", 1)[0]
        if " = " in line.split("\n")[0] and not line.startswith("def ") and own in earlier:
            renamed[name] = own.split(" = ", 1)[0]
            continue
        kept.append(line)
    for old, new in renamed.items():
        kept = [re.sub(rf"\b{old}\b", new, line) for line in kept]
    return kept, renamed


def _inline_workspace(lines: list[str]) -> list[str]:
    """A workspace used by one construction alone, written inside it."""
    out = list(lines)
    for line in lines:
        name, _, value = line.partition(" = ")
        if name.startswith("workspace") and value.startswith("torch.empty(") and \
                sum(len(re.findall(rf"\b{name}\b", other)) for other in lines) == 2:
            out.remove(line)
            out = [_names(re.sub(rf"\b{name}\b", value, other)) if re.search(rf"\b{name}\b", other) else other
                   for other in out]
    return out


def part_lines(p: Part, t: ScreenTracer, said: str, earlier: list[str]) -> tuple[list[str], str]:
    """One path: a comment saying what it is, its output buffer, its construction (where an earlier part has not
    made the same) and plan; and its step, a lambda where it is one call, else a function defined here."""
    lines = textwrap.wrap(said, WIDTH - 6, initial_indent="# ", subsequent_indent="# ") if said else []
    lines += [] if p.role == "control" else [f"out{p.label} = torch.empty_like(q)"]
    setup, renamed = _shared([_names(s) for s in t.setup], earlier, p.label) if p.label else \
        ([_names(s) for s in t.setup], {})
    step = [_names(s) for s in t.step]
    for old, new in renamed.items():
        step = [re.sub(rf"\b{old}\b", new, line) for line in step]
    lines += setup
    if len(step) == 1 and "\n" not in step[0]:
        return lines, f"lambda: {step[0]}"
    return lines + [f"def step{p.label}():"] + _indent(step), f"step{p.label}"


def render(parts: list[Part], header: script.Header) -> str:
    """The script's text: the checked call (after a part run ``first``), its verdict, the control and its
    verdict, the environment."""
    checked = next(p for p in parts if p.role == "checked")
    if any(p.case != checked.case for p in parts):
        raise trace.Unrenderable("one screen writes the inputs of one case, and these parts run two")
    tracers = [traced(dataclasses.replace(p, label=checked.label) if script.replans(p, parts) else p) for p in parts]
    needs = set().union(*(t.used for t in tracers))
    c = script.case_literals(checked.case)
    body, earlier, checked_step = inputs(c, needs), [], ""
    for p, t in zip(parts, tracers):
        if script.replans(p, parts):
            body += [f"# Control: {p.says}"] + [_names(s) for s in t.setup if ".plan(" in s.split("\n")[0]]
            body += _verdict(p.says, checked_step)
            continue
        lines, step = part_lines(p, t, "" if p.role == "checked" else f"Control: {p.says}", earlier)
        earlier += [_names(s) for s in t.setup]
        body += lines
        if p.role == "first":
            body.append(step.removeprefix("lambda: ") if step.startswith("lambda") else f"{step}()")
        elif p.role == "checked":
            checked_step = step
            body += [f"wrong, what = outcome({step}, out{p.label}, expected)",
                     'print(("REPRODUCED: " if wrong else "NOT REPRODUCED: ") + what)']
        else:
            body += _verdict(p.says, step)
    body = _inline_workspace(body) + ENVIRONMENT + ["return 1 if wrong else 0"]
    if sum(" = flashinfer." in line and bool(BUFFER.search(line)) for line in body) > 1:
        body = body[:1] + BUFFERS.strip().splitlines() + [_buffered(line) for line in body[1:]]
    text = "\n".join(body)
    said = script.wrapped([script.call_line(tracers[parts.index(checked)]), script.shape_line(c)], WIDTH)
    out = ["#!/usr/bin/env python3", f'"""{header.title}', "", *said, *header.lines, '"""',
           *(["import inspect"] if "taken_by(" in text else []), "import subprocess", "import sys", "",
           "import flashinfer", "import torch", "", "", 'def main(dev="cuda"):', *_indent(body), "", "",
           outcome_source(checked.case.dtype)]
    if "taken_by(" in text:
        out += ["", "", TAKEN_BY.strip()]
    return "\n".join(out + ["", "", 'if __name__ == "__main__":', "    sys.exit(main())", ""])


def _verdict(says: str, step: str) -> list[str]:
    """The control's verdict, printed under the call's."""
    return [f"what = outcome({step}, out, expected)[1]", f"print({'CONTROL, ' + says + ': '!r} + what)"]
