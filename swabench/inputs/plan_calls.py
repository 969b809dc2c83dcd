"""One logged ``plan()`` call of FlashInfer's API log read as a trace line (``inputs.dumps`` walks the log).

The call's arguments are bound by name through the signature it was called with, so the reader does not
depend on one release's argument order.  Anything in a call that does not read as a plan of that wrapper
(a value of another type, a tensor file that is not there) is the call's reason to be left out, never an
exception: one odd call must not cost the import of a whole server's log.
"""

from __future__ import annotations

import ast
from pathlib import Path

from swabench.errors import UserError

PREFILL_PAGED, PREFILL_RAGGED = "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"
DECODE, SINK, DECODE_SINK = ("BatchDecodeWithPagedKVCacheWrapper", "BatchAttentionWithAttentionSinkWrapper",
                             "BatchDecodeWithAttentionSinkWrapper")
WRAPPERS = (PREFILL_PAGED, PREFILL_RAGGED, DECODE, SINK, DECODE_SINK)
# The decode wrapper's plan takes its options as keywords; older callers passed them positionally after
# page_size, in this order (flashinfer/decode.py, _BATCH_DECODE_PLAN_LEGACY_POS_ARGS), with these defaults.
DECODE_LEGACY = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type", "o_data_type",
                 "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking", "block_tables", "seq_lens",
                 "fixed_split_size", "disable_split_kv", "q_len_per_req")
DECODE_DEFAULTS = {"window_left": -1, "logits_soft_cap": None, "q_data_type": "float16", "kv_data_type": None,
                   "data_type": None, "sm_scale": None}
VERIFY_MAX = 64  # queries per request a verify block may have: speculative decoding drafts a few dozen at most
RECORD_FIELDS = {"input_metadata": dict, "versions": dict, "function_signature": str}


class TensorFileError(UserError):
    def __init__(self, path, message: str):
        super().__init__(f"{path}: {message}")


def record_problem(record: dict) -> str | None:
    """Why a metadata record is not one FlashInfer writes (a field of another type), or None."""
    for name, kind in RECORD_FIELDS.items():
        if name in record and not isinstance(record[name], kind):
            return f"its metadata's {name} is a {type(record[name]).__name__}, not a JSON " \
                   f"{'object' if kind is dict else 'string'}"
    return None


def step(folder: Path, wrapper: str, record: dict, bucket: int = 1,
         verify_max: int = VERIFY_MAX) -> tuple[dict | None, str | None]:
    """A plan's trace line (without its count), or why it is not imported; TensorFileError for an
    inputs.pt that does not load (a corrupt log)."""
    why = record_problem(record)
    if why:
        return None, why
    tensors = folder / "inputs.pt"
    if not tensors.is_file():
        return None, ("inputs.pt is not a regular file" if tensors.exists() or tensors.is_symlink() else
                      "inputs.pt missing (the call's tensors were not saved)")
    try:
        return _line(wrapper, _arguments(folder, wrapper, record), bucket, verify_max)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        return None, f"its arguments do not read as a plan ({type(e).__name__}: {e})"


def _arguments(folder: Path, wrapper: str, record: dict) -> dict:
    """The plan's arguments by name: positional ones bound through the signature it was called with,
    keywords as given, and the defaults of the ones not passed; tensors loaded from inputs.pt."""
    import torch

    try:
        tensors = torch.load(folder / "inputs.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated zip, a pickle torch will not load
        raise TensorFileError(folder / "inputs.pt", f"cannot be loaded ({type(e).__name__}: {e}): a truncated or "
                                                    f"corrupt dump") from None
    if not isinstance(tensors, dict):
        raise TypeError(f"inputs.pt holds a {type(tensors).__name__}, not the call's tensors by name")
    params = _signature(record.get("function_signature", ""))
    names = [p for p, _ in params if not p.startswith("*")]
    star = next((i for i, (p, _) in enumerate(params) if p.startswith("*") and not p.startswith("**")), None)
    args = {k: v for k, v in params if not k.startswith("*")}
    if wrapper in (DECODE, DECODE_SINK):
        args.update(DECODE_DEFAULTS)
    values = {**{k: _value(v) for k, v in (record.get("input_metadata") or {}).items()}, **tensors}
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"{key!r}: not an argument name")
        if key.startswith("kwarg_"):
            args[key.removeprefix("kwarg_")] = value
        elif key.startswith("arg_") and "__" not in key:
            if not key.removeprefix("arg_").isdigit():
                raise ValueError(f"{key}: not an argument position (arg_<i>)")
            i = int(key.removeprefix("arg_"))
            if star is not None and i >= star:  # the decode plan's legacy positional options
                legacy = i - star
                if legacy < len(DECODE_LEGACY):
                    args[DECODE_LEGACY[legacy]] = value
            elif i < len(names):
                args[names[i]] = value
    return args


def _signature(text: str) -> list[tuple[str, object]]:
    """(name, default) of each parameter of ``str(inspect.signature(f))`` (annotations dropped; a default
    that is no Python literal reads as None)."""
    inner = text.strip()[1:text.strip().rfind(")")] if text.strip().startswith("(") else ""
    parts, depth, current = [], 0, ""
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    out = []
    for part in (p.strip() for p in parts if p.strip()):
        if part == "/" or part == "*":
            continue
        name, _, default = part.partition("=")
        name = name.split(":")[0].strip()
        try:
            value = ast.literal_eval(default.strip()) if default else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        out.append((name, value))
    return out


def _value(v):
    """A scalar of the log as Python: a dtype record as its name ('bfloat16')."""
    if isinstance(v, dict) and v.get("type") == "torch.dtype":
        return str(v.get("value", "")).removeprefix("torch.")
    return v


def _dtype(v) -> str | None:
    return None if v is None else str(v).removeprefix("torch.")


def _ints(a: dict, name: str) -> list[int]:
    """An index array's values: a tensor of integers (one of floats or bools, whole or not, is no index array,
    as an argument is no integer unless it is one: ``_int``)."""
    import torch

    v = a.get(name)
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name}: {type(v).__name__}, not a tensor")
    if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
        raise ValueError(f"{name}: a tensor of {str(v.dtype).removeprefix('torch.')}, not of integers (an index "
                         f"array is int32 or int64)")
    return [int(x) for x in v.tolist()]


def _int(a: dict, name: str, default=None) -> int:
    """An integer argument (a bool, a string or a float with a fraction is no integer)."""
    v = a.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{name}: {v!r} is not an integer")
    return int(v)


def _number(a: dict, name: str) -> float | None:
    v = a.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name}: {v!r} is not a number")
    return float(v)


def _flag(a: dict, name: str, default: bool) -> bool:
    v = a.get(name, default)
    if not isinstance(v, bool):
        raise ValueError(f"{name}: {v!r} is not true or false")
    return v


def _line(wrapper: str, a: dict, bucket: int, verify_max: int) -> tuple[dict | None, str | None]:
    window = -1 if a.get("window_left") is None else _int(a, "window_left")
    if window < -1:
        raise ValueError(f"window_left: {window} is no window (-1 for none, or W >= 0)")
    if a.get("custom_mask") is not None or a.get("packed_custom_mask") is not None:
        return None, "planned with a custom mask (any window is in the mask)"
    if window < 0:
        return None, "no window (window_left = -1): a global layer, or a window the caller applies itself"
    decode = wrapper in (DECODE, DECODE_SINK)
    causal = True if decode else _flag(a, "causal", False)
    if wrapper == PREFILL_RAGGED:
        qo, kv = _ints(a, "qo_indptr"), _ints(a, "kv_indptr")
        kv_lens = [kv[i + 1] - kv[i] for i in range(len(kv) - 1)]
        page = {"storage": "ragged"}
    else:
        indptr = _ints(a, "indptr" if decode else "paged_kv_indptr")
        name = "last_page_len" if decode else "paged_kv_last_page_len"
        last = _ints(a, name)
        size = _int(a, "page_size")
        if size < 1:
            raise ValueError(f"page_size: {size} is not a page size (1 or more)")
        wrong = next(((i, n) for i, n in enumerate(last) if i + 1 < len(indptr) and indptr[i + 1] > indptr[i]
                      and not 1 <= n <= size), None)
        if wrong:
            raise ValueError(f"{name}: request {wrong[0]}'s last page holds {wrong[1]} keys; a page of page_size "
                             f"{size} holds 1 to {size}")
        kv_lens = [(indptr[i + 1] - indptr[i] - 1) * size + last[i] if indptr[i + 1] > indptr[i] else 0
                   for i in range(len(indptr) - 1)]
        qo = list(range(len(kv_lens) + 1)) if decode else _ints(a, "qo_indptr")
        page = {"page_size": size}
    head_dim = _int(a, "head_dim" if decode else "head_dim_qk")
    layer = {"num_qo_heads": _int(a, "num_qo_heads"), "num_kv_heads": _int(a, "num_kv_heads"), "head_dim": head_dim,
             "window_left": window, **page}
    q_lens = [qo[i + 1] - qo[i] for i in range(len(qo) - 1)]
    if len(q_lens) != len(kv_lens) or any(q < 1 or k < q for q, k in zip(q_lens, kv_lens)):
        return None, "requests with no query or fewer keys than queries"
    prefixes = [k - q for q, k in zip(q_lens, kv_lens)]
    if bucket > 1:
        prefixes = [-(-p // bucket) * bucket for p in prefixes]
    mode = "decode" if decode or all(q == 1 for q in q_lens) else \
        "verify" if len(set(q_lens)) == 1 and q_lens[0] <= verify_max and all(p > 0 for p in prefixes) else "extend"
    if not causal and mode != "decode":  # one query at the end of its request has no future key to see
        layer["causal"] = False
    dtype = _dtype(a.get("q_data_type")) or "float16"
    kv_dtype = _dtype(a.get("kv_data_type") or a.get("data_type"))
    layer["dtype"] = dtype
    if kv_dtype and kv_dtype != dtype:
        layer["kv_dtype"] = kv_dtype
    cap = _number(a, "logits_soft_cap")
    if cap:
        layer["logits_soft_cap"] = cap
    scale = _number(a, "sm_scale")
    if scale is not None and abs(scale - head_dim ** -0.5) > 1e-6 * head_dim ** -0.5:
        layer["sm_scale"] = scale
    if wrapper in (SINK, DECODE_SINK):
        layer["sinks"] = True
    return {"mode": mode, **layer, "requests": [[p, q] for p, q in zip(prefixes, q_lens)]}, None
