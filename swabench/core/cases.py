"""Cases and points: what the sweep measures, apart from how scenario files describe them.

A Case is one shape a server step presents (per-request lengths are drawn from it by ``workloads``);
a Point is a case through one implementation on one backend: one row of results.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import asdict, dataclass, field

from swabench.core import semantics, trees

MODES = ("extend", "verify", "draft_extend", "decode", "mixed")
STORAGES = ("paged", "ragged")
WRAPPER_MODES = ("cuda-graph", "plain")  # how a library's wrappers are built: fixed buffers for capture, or not
CACHE_FILLS = ("random", "nan", "inf", "large")  # what the cache holds where no query may read (core.stale)
ACCEPT_FORMS = "'uniform', 'full', 'fixed:N' (1 <= N <= 2**31 - 1) or 'geometric:P' (0 < P < 1)"
QO_FIELD = {"extend": "extend_len", "verify": "draft_tokens", "draft_extend": "draft_tokens",
            "mixed": "extend_len"}  # its query count (a mixed step's prefill chunk)
# Axes added after results were published: a case leaves them out of its id while they hold these
# defaults, so every earlier case keeps its id (and compare still joins old runs with new ones).
SERVING_DEFAULTS = {"sinks": False, "logits_soft_cap": 0.0, "sm_scale": None, "kv_dtype": None, "model": None,
                    "causal": True, "attention_chunk": 0, "wrapper_mode": "cuda-graph", "tree": None, "block": 0,
                    "prefills": 0, "cache_fill": "random"}


LENGTH_FORMS = "an integer, 'uniform:LO:HI', 'lognormal:MEDIAN:SIGMA' or a list of integers (one per request)"
LENGTH_SALT = {"prefix_len": 1, "seq_len": 2, "qo_len": 3}  # each length field draws from its own stream
LOGNORMAL_TAIL = 4.0  # lognormal draws stop at MEDIAN * e^(4 SIGMA): a bound the memory estimate can use
DRAW_MAX = 2 ** 31 - 1  # a drawn length past FlashInfer's int32 index could never run (nor become a float)


# A distribution as one spelling of ASCII digits: Python's int() and float() also read '1_0' and full-width digits,
# which would give one value two case ids
SPELLED = re.compile(r"(uniform:[0-9]+:[0-9]+|lognormal:[0-9]+:[0-9]*\.?[0-9]+|fixed:[0-9]+|geometric:0?\.[0-9]+)")


def parse_length(value, lo: int):
    """A length axis value: an integer >= lo (every request), a distribution drawn per request with
    the case seed ('uniform:LO:HI', 'lognormal:MEDIAN:SIGMA', its draws at most DRAW_MAX), or an explicit
    per-request list (a tuple).  ValueError naming the forms otherwise."""
    def whole(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= lo
    if whole(value):
        return value
    if isinstance(value, (list, tuple)) and value and all(whole(x) for x in value):
        return tuple(value)
    if isinstance(value, str) and SPELLED.fullmatch(value):
        kind, _, args = value.partition(":")
        parts = args.split(":")
        try:
            if kind == "uniform" and len(parts) == 2 and lo <= int(parts[0]) <= int(parts[1]) <= DRAW_MAX:
                return value
            if kind == "lognormal" and len(parts) == 2 and max(lo, 1) <= int(parts[0]) <= DRAW_MAX \
                    and 0 < float(parts[1]) < 4 and length_bound(value) <= DRAW_MAX:
                return value
        except ValueError:
            pass
    raise ValueError(f"must be {LENGTH_FORMS} (integers >= {lo}; LO <= HI; 0 < SIGMA < 4; a distribution's "
                     f"draws, HI or MEDIAN * e^(4 SIGMA), at most {DRAW_MAX}: FlashInfer's int32); got {value!r}")


def draw_lengths(value, batch: int, seed: int, salt: int) -> list[int]:
    """One length per request from a parse_length value, deterministic in (seed, salt)."""
    if isinstance(value, int):
        return [value] * batch
    if isinstance(value, tuple):
        return list(value)
    kind, lo_or_median, spread = value.split(":")
    rng = random.Random(seed * 1009 + salt)
    if kind == "uniform":
        return [rng.randint(int(lo_or_median), int(spread)) for _ in range(batch)]
    median, sigma = int(lo_or_median), float(spread)
    return [max(1, round(median * math.exp(max(-LOGNORMAL_TAIL, min(LOGNORMAL_TAIL, rng.gauss(0.0, 1.0))) * sigma)))
            for _ in range(batch)]


def length_bound(value) -> int:
    """The largest length a parse_length value can give, without drawing (safe for any batch size)."""
    if isinstance(value, int):
        return value
    if isinstance(value, tuple):
        return max(value)
    kind, first, second = value.split(":")
    return int(second) if kind == "uniform" else round(int(first) * math.exp(LOGNORMAL_TAIL * float(second)))


LABEL_LIST = 8  # a longer per-request list shows as its count and range


def length_label(value) -> str:
    """How a label shows a length: 17, ~uniform:1:64, [3,4,5], or [32 of 1687..16068 sum 301212] (the
    sum, so that two long lists with the same range still read apart)."""
    if isinstance(value, tuple):
        if len(value) > LABEL_LIST:
            return f"[{len(value)} of {min(value)}..{max(value)} sum {sum(value)}]"
        return "[" + ",".join(map(str, value)) + "]"
    return f"~{value}" if isinstance(value, str) else str(value)


def parse_accept(value) -> tuple[str, float]:
    """'uniform' | 'full' | 'fixed:N' | 'geometric:P' -> (kind, parameter)."""
    if not isinstance(value, str):
        raise ValueError(f"must be {ACCEPT_FORMS}; got {value!r}")
    kind, _, arg = value.partition(":")
    if arg and not SPELLED.fullmatch(value):
        raise ValueError(f"must be {ACCEPT_FORMS}, in ASCII digits; got {value!r}")
    try:
        if kind in ("uniform", "full") and not arg:
            return kind, 0.0
        if kind == "fixed" and 1 <= int(arg) <= DRAW_MAX:
            return kind, float(int(arg))
        if kind == "geometric" and 0.0 < float(arg) < 1.0:
            return kind, float(arg)
    except ValueError:
        pass
    raise ValueError(f"must be {ACCEPT_FORMS}; got {value!r}")


def features_of(sinks: bool, logits_soft_cap: float, cache_dtype: str, attention_chunk: int = 0,
                tree: str | None = None, block: int = 0) -> frozenset[str]:
    """The serving features these axis values ask for (Case.features)."""
    asked = {"sinks": sinks, "soft_cap": bool(logits_soft_cap), "fp8_kv": str(cache_dtype).startswith("float8"),
             "chunk": bool(attention_chunk), "tree": tree is not None, "block": bool(block)}
    return frozenset(name for name, on in asked.items() if on)


@dataclass(frozen=True)
class Case:
    """One shape a server step presents; per-request lengths are drawn from it (workloads)."""

    mode: str
    storage: str
    batch_size: int
    prefix_len: int | None  # keys before the first query (None when seq_len fixes the total)
    seq_len: int | None  # total keys per request (draft_extend: prefix = seq_len - accepted)
    qo_len: int  # extend length, draft-token block, or 1 for decode
    accept: str | None  # draft_extend's acceptance-length distribution
    window_left: int
    page_size: int | None  # None for ragged storage
    page_layout: str | None
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    seed: int
    sinks: bool = False  # one learned logit per query head joins every softmax denominator (GPT-OSS)
    logits_soft_cap: float = 0.0  # l = cap * tanh(l / cap) when > 0 (Gemma 2)
    sm_scale: float | None = None  # None: head_dim ** -0.5
    kv_dtype: str | None = None  # None: the same as dtype
    model: str | None = None  # the preset (swabench.inputs.models) that set the head shape, window and features
    causal: bool = True  # False: a query sees every key of its request from p - W on, future ones too
    attention_chunk: int = 0  # C > 0: chunked local attention, a query sees its own chunk up to itself (no window)
    wrapper_mode: str = "cuda-graph"  # "plain": the wrapper built as a server's uncaptured prefill builds it
    tree: str | None = None  # a verify block laid out as a draft tree (core.trees): 'chain', 'eagle:K:D', choices
    block: int = 0  # B > 0: the step's queries in blocks of B that see each other both ways (DFlash's draft block)
    prefills: int = 0  # a mixed step: its first P requests run a prefill chunk of qo_len, the others decode one token
    cache_fill: str = "random"  # what the slots no query may read hold: random data, or nan, inf, large (core.stale)

    @property
    def scale(self) -> float:
        """The softmax scale applied to q.k."""
        return self.head_dim ** -0.5 if self.sm_scale is None else self.sm_scale

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (the axes hold num_kv_heads >= 1 and dividing num_qo_heads)."""
        return self.num_qo_heads // self.num_kv_heads

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def features(self) -> frozenset[str]:
        """What the case asks of an implementation beyond the window: 'sinks', 'soft_cap', 'fp8_kv', 'chunk',
        'tree', 'block'."""
        return features_of(self.sinks, self.logits_soft_cap, self.cache_dtype, self.attention_chunk, self.tree,
                           self.block)

    @property
    def sliding_window(self) -> int:
        return semantics.sliding_window_of(self.window_left)

    @property
    def case_id(self) -> str:
        """Stable across runs and machines: the same shape gets the same id (compare joins on it)."""
        fields = {k: v for k, v in asdict(self).items() if k not in SERVING_DEFAULTS or v != SERVING_DEFAULTS[k]}
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]

    def drawn(self, field: str) -> list[int]:
        """Each request's value of the length axis ``field`` (prefix_len, seq_len or qo_len); a mixed step's query
        counts are its prefill chunks, then one per decode."""
        if field == "qo_len" and self.mode == "mixed":
            return [self.qo_len] * self.prefills + [1] * (self.batch_size - self.prefills)
        return draw_lengths(getattr(self, field), self.batch_size, self.seed, LENGTH_SALT[field])

    @property
    def uniform_lengths(self) -> bool:
        return self.mode != "mixed" and all(isinstance(getattr(self, f), int) or getattr(self, f) is None
                                            for f in LENGTH_SALT)

    def largest(self) -> tuple[int, int]:
        """(qo_len, kv_len) bounds of the largest request, by arithmetic alone (draft_extend draws at
        most the whole block)."""
        qo = length_bound(self.qo_len)
        kv = length_bound(self.seq_len) if self.seq_len is not None else length_bound(self.prefix_len) + qo
        return qo, kv

    @property
    def label(self) -> str:
        ctx = f"p{length_label(self.prefix_len)}" if self.prefix_len is not None else f"s{length_label(self.seq_len)}"
        q = f"q{length_label(self.qo_len)}" + (f"~{self.accept}" if self.accept else "") \
            + (f" tree {trees.label(self.tree)}" if self.tree else "") + (f" block{self.block}" if self.block else "") \
            + (f" x{self.prefills} + q1 x{self.batch_size - self.prefills}" if self.mode == "mixed" else "")
        store = f"ps{self.page_size}{'c' if self.page_layout == 'contiguous' else ''}" \
            + (f" {self.page_layout}" if str(self.page_layout).startswith("evicted") else "") \
            if self.storage == "paged" else "ragged"
        store += f" fill-{self.cache_fill}" if self.cache_fill != SERVING_DEFAULTS["cache_fill"] else ""
        serving = (" sinks" * self.sinks + (f" cap{self.logits_soft_cap:g}" if self.logits_soft_cap else "")
                   + (f" scale{self.sm_scale:.4g}" if self.sm_scale is not None else "")
                   + (f" kv-{self.kv_dtype}" if self.kv_dtype else "")
                   + (f" {self.wrapper_mode}" if self.wrapper_mode != SERVING_DEFAULTS["wrapper_mode"] else ""))
        span = f"C{self.attention_chunk}" if self.attention_chunk else f"W{self.window_left}"
        return (f"{self.mode} b{self.batch_size} {ctx} {q} {span}{'' if self.causal else ' non-causal'} "
                f"{store} "
                f"h{self.num_qo_heads}/{self.num_kv_heads} d{self.head_dim} {self.dtype}{serving} s{self.seed}"
                + (f" [{self.model}]" if self.model else ""))

    def axes(self) -> dict:
        """The case's columns for the results table."""
        row = asdict(self)
        row.update(sliding_window=self.sliding_window, sm_scale=self.scale, kv_dtype=self.cache_dtype)
        drawn = {f: v for f in LENGTH_SALT if not isinstance(v := getattr(self, f), int) and v is not None}
        row["length_dist"] = "; ".join(f"{f}={length_label(v).lstrip('~')}" for f, v in drawn.items()) or None
        row.update(dict.fromkeys(drawn))  # the numeric columns hold one length; totals are in total_qo/total_kv
        return row


@dataclass(frozen=True)
class Point:
    """One row of results: a case through one implementation on one backend."""

    case: Case
    impl: str
    backend: str  # FlashInfer backend, or the implementation's library for the others
    group: str = field(default="", compare=False)  # the scenario's [[sweep]] group that made it (the first, if several)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.case.case_id, self.impl, self.backend)
