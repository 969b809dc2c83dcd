"""Python source for what a traced call takes: literals, buffers, subscripts and calls written as a reader of the
script would write them (``trace`` names the values, this module writes them down)."""

from __future__ import annotations

import torch

DTYPES = {getattr(torch, n): f"torch.{n}" for n in ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn",
                                                     "int32", "int64", "uint8", "bool")}


def literal(v) -> str:
    """A Python literal, with a list of one repeated number written ``[n] * count``."""
    if isinstance(v, list) and len(v) > 3 and all(isinstance(e, (int, float)) for e in v) and len(set(v)) == 1:
        return f"[{v[0]!r}] * {len(v)}"
    return repr(v)


def index(rendered: list[str], raw) -> str:
    """A subscript: a tuple index written without its parentheses."""
    text = rendered[0]
    return text[1:-1].rstrip(",") if isinstance(raw, tuple) else text


def shape(t: torch.Tensor) -> str:
    """``t``'s shape as torch.empty takes it: a length alone, or a tuple."""
    return str(t.shape[0] if t.dim() == 1 else tuple(t.shape))


def empty(t: torch.Tensor) -> str:
    """A buffer of ``t``'s shape and dtype on the script's device."""
    return f"torch.empty({shape(t)}, dtype={DTYPES[t.dtype]}, device=dev)"


def call(fn: str, args: list[str], kwargs: dict[str, str], width: int = 110) -> str:
    """``fn(args, kwargs)``, wrapped at ``width`` columns with the arguments packed four spaces in."""
    parts = args + [f"**taken_by({v})" if k == "**taken_by" else f"{k}={v}" for k, v in kwargs.items()]
    one = f"{fn}({', '.join(parts)})"
    if len(one) <= width:
        return one
    lines = [f"{fn}("]
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else ")")
        if len(lines) > 1 and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append("    " + piece)
    return "\n".join(lines)
