"""Traced lines written compactly for one screen: in the script's aliases (``bf16``, ``i32``), buffers made on
q's device, calls packed at the screen's width, a control's constructions and plans that repeat an earlier part's
left out, single-use temporaries written where they are read, and buffers made alike made on one line."""

from __future__ import annotations

import re

from swabench.repro.source import call

WIDTH = 118  # a maintainer's screen, in columns


BUFFER = re.compile(r"torch\.(empty|zeros)\(((?:\([^()]*\)|[^(),])+), dtype=([\w.]+), device=dev\)")


def names(text: str) -> str:
    """A traced line in the script's aliases, a buffer made on q's device, its call packed again at the screen's
    width."""
    text = BUFFER.sub(lambda m: f"q.new_{m[1]}({m[2]}, dtype={m[3]})", text)
    return reflow(text.replace("torch.bfloat16", "bf16").replace("torch.int32", "i32"))


def reflow(text: str, width: int = WIDTH - 4) -> str:
    """A call written over several lines, packed again at ``width`` (main() indents it four more): the arguments
    split at top-level commas."""
    if "\n" not in text and len(text) <= width or not text.rstrip().endswith(")") or "(" not in text:
        return text  # fits, or is not one call: left as traced
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


def shared(lines: list[str], earlier: list[str], label: str) -> tuple[list[str], dict[str, str]]:
    """A control's lines without the constructions an earlier part already made the same way (the control then
    plans that wrapper again), and the names it takes over."""
    kept, renamed = [], {}
    for line in lines:
        own = names(line.replace(label, ""))
        name = line.split(" = ", 1)[0]
        if " = " in line.split("\n")[0] and not line.startswith("def ") and own in earlier:
            renamed[name] = own.split(" = ", 1)[0]
            continue
        kept.append(line)
    for old, new in renamed.items():
        kept = [re.sub(rf"\b{old}\b", new, line) for line in kept]
    return kept, renamed


def inline_once(lines: list[str]) -> list[str]:
    """A workspace or a step's temporary (``t1``), a whole statement on its line, that one line alone reads: written
    inside that line where it still fits the screen."""
    out = list(lines)
    for line in lines:
        name, _, value = line.strip().partition(" = ")
        if not re.fullmatch(r"workspace\w*|t\d+\w*", name) or any(value.count(a) != value.count(b) for a, b in
                                                                      ("()", "[]")):
            continue
        readers = [i for i, other in enumerate(out) if other is not line and re.search(rf"\b{name}\b", other)]
        if len(readers) != 1 or len(re.findall(rf"\b{name}\b", out[readers[0]])) != 1:
            continue
        written = re.sub(rf"\b{name}\b", lambda _: value, out[readers[0]])
        if "\n" in written or len(written) > WIDTH - 4:
            written = names(written) if not written.startswith(" ") else ""
        if written and max(map(len, written.split("\n"))) <= WIDTH - 4:
            out[readers[0]] = written
            out.remove(line)
    return out


def grouped(lines: list[str]) -> list[str]:
    """Buffers made alike, made on one line: ``a, b = (q.new_zeros(...) for _ in range(2))``."""
    made: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"(\w+) = (q\.new_(?:zeros|empty)\(.*\))", line)
        if m:
            made.setdefault(m[2], []).append(i)
    out = list(lines)
    for value, at in made.items():
        if len(at) > 1:
            names = ", ".join(lines[i].partition(" = ")[0] for i in at)
            out[at[0]] = f"{names} = ({value} for _ in range({len(at)}))"
            for i in at[1:]:
                out[i] = None
    return [line for line in out if line is not None]
