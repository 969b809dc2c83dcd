"""What a run folder's files must hold to be read: checks on a table read from results.csv or
samples.csv (a published folder may have been edited by hand), on each journal row and on meta.json
(every field of the kind ``schema`` declares), and on a scenario file a resume brings.  Each says
what is wrong as a ValueError; ``tables`` and ``run_folder`` name the file."""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from swabench.impls.registry import KINDS as IMPL_KINDS
from swabench.store import reading
from swabench.store.schema import KEY, ROW_FIELDS, STATES, STATUSES

if TYPE_CHECKING:
    import pandas as pd

# Columns that hold a time, a size or a count: a number >= 0 where present (empty where not measured).
NON_NEGATIVE = (*(k for k, kind in ROW_FIELDS.items() if kind.startswith("number >")), "index")
# A single timing sample is a difference (a replay less the empty graph's): a number, of either sign.
FINITE = ("value_us",)


def table(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` itself, or ValueError naming the line, the column and what it may hold: every row names
    its point (and, in samples, its kind); a status is one of schema.STATUSES; a results table holds
    each point once; times and counts are numbers >= 0 or empty, a median > 0; a timed row (repeats > 0) has
    its median.  An untimed row's empty median is fine."""
    import pandas as pd

    def refuse(index, column: str, value, allowed: str):
        return ValueError(f"line {df.index.get_loc(index) + 2}, column {column}: {value!r} is not allowed ({allowed})")

    results = "status" in df.columns
    for column in [c for c in (*KEY, "status" if results else "kind") if c in df.columns]:
        empty = df[column].isna()
        if empty.any():
            raise refuse(empty.idxmax(), column, "", f"every row names its {column}")
    if results:
        unknown = ~df["status"].isin(STATUSES)
        if unknown.any():
            raise refuse(unknown.idxmax(), "status", _plain(df.at[unknown.idxmax(), "status"]),
                         "one of " + ", ".join(STATUSES))
        twice = df.duplicated(list(KEY))
        if twice.any():
            point = tuple(_plain(df.at[twice.idxmax(), k]) for k in KEY)
            raise refuse(twice.idxmax(), ", ".join(KEY), point, "each point once: this one is on an earlier line too")
    for column in [c for c in (*NON_NEGATIVE, *FINITE) if c in df.columns]:
        values = pd.to_numeric(df[column], errors="coerce")
        bad = (values.isna() if column in FINITE else df[column].notna() & values.isna()) \
            | values.isin([math.inf, -math.inf])
        bad |= (values < 0) if column in NON_NEGATIVE else False
        if bad.any():
            allowed = "a finite number >= 0, or empty" if column in NON_NEGATIVE else "a finite number"
            raise refuse(bad.idxmax(), column, _plain(df.at[bad.idxmax(), column]), allowed)
    if "median_us" in df.columns:
        zero = pd.to_numeric(df["median_us"], errors="coerce") == 0
        if zero.any():
            raise refuse(zero.idxmax(), "median_us", 0, "a number > 0 where timed (a call takes time), or empty")
    if {"median_us", "repeats"} <= set(df.columns):
        untimed = df["median_us"].isna() & (pd.to_numeric(df["repeats"], errors="coerce") > 0)
        if untimed.any():
            raise refuse(untimed.idxmax(), "median_us", "",
                         f"a number: the row was timed, {_plain(df.at[untimed.idxmax(), 'repeats']):g} repeats")
    return df


def samples(rows: list[dict]) -> None:
    """ValueError naming the point when a row's timing sample is not a finite number, or is negative
    where it is no difference: only a kernel sample of the CUDA-graph timer with a cold L2 (a replay
    less the flush's replay) may fall below zero."""
    for row in rows:
        for kind, values in (row.get("samples") or {}).items():
            difference = kind == "kernel" and row.get("timer") == "cuda-graph" and row.get("l2") == "cold"
            for i, v in enumerate(values):
                number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                if not number or (v < 0 and not difference):
                    allowed = "a finite number" if not number or difference else \
                        "a number >= 0: only a cold-L2 CUDA-graph kernel sample is a difference that may be negative"
                    point = ", ".join(f"{k} {row.get(k)}" for k in KEY)
                    raise ValueError(f"point {point}: {kind} sample {i}: {_plain(v)!r} is not allowed ({allowed})")


def _number(v) -> bool:
    """A number a float holds (NaN and the infinities too; an integer past the largest float is none)."""
    return isinstance(v, float) or isinstance(v, int) and not isinstance(v, bool) and abs(v) <= sys.float_info.max


def _finite(v) -> bool:
    return _number(v) and (v != v or -math.inf < v < math.inf)


def _integers(low: int, high: int):
    """The test of a whole number from ``low`` to ``high`` (NaN for none)."""
    return lambda v: _number(v) and (v != v or (isinstance(v, int) or v.is_integer()) and low <= v <= high)


KINDS = {"text": lambda v: isinstance(v, str), "name": lambda v: isinstance(v, str) and v.strip() != "",
         "number": _number, "finite number": _finite, "number >= 0": lambda v: _finite(v) and not v < 0,
         "number > 0": lambda v: _finite(v) and not v <= 0,
         "integer >= 0": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
         "true": lambda v: v is True, "false": lambda v: v is False, "null": lambda v: v is None,
         "object": lambda v: isinstance(v, dict), "list": lambda v: isinstance(v, list),
         "status": lambda v: v in STATUSES, "state": lambda v: v in STATES, "impl kind": lambda v: v in IMPL_KINDS}
NAMED = {"status": "one of " + ", ".join(STATUSES), "state": "one of " + ", ".join(STATES), "name": "text, not empty",
         "impl kind": "one of " + ", ".join(IMPL_KINDS)}


@functools.cache
def holds(kind: str):
    """The test of whether a value (as JSON gave it) is of ``kind`` (a kind of schema.ROW_FIELDS and META_FIELDS)."""
    container, of, element = kind.partition(" of ")
    if of:
        each = holds(element)
        if container == "list":
            return lambda v: isinstance(v, list) and all(map(each, v))
        return lambda v: isinstance(v, dict) and all(map(each, v.values()))
    first, _, rest = kind.partition(" or ")
    low, to, high = first.removeprefix("integer from ").partition(" to ")
    this = _integers(int(low), int(high)) if to else KINDS[first]
    if not rest:
        return this
    other = holds(rest)
    return lambda v: this(v) or other(v)


def fields(record: dict, kinds: dict, what: str = "field", within: str = "") -> None:
    """ValueError naming the first field of ``record`` that holds a value of another kind than ``kinds`` gives it
    (field: kind; "a.b" is the field b of the object a); fields it does not name are not checked."""
    for name, value in record.items():
        name = within + name if within else name
        kind = kinds.get(name)
        if kind is not None and not holds(kind)(value):
            shown = json.dumps(value)  # as the file spells it
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            allowed = " or ".join(NAMED.get(k, k) for k in kind.split(" or "))
            raise ValueError(f"{what} {name}: {shown} is not allowed ({allowed})")
        if isinstance(value, dict) and not within:
            fields(value, kinds, what, name + ".")


def row(record: dict) -> None:
    """ValueError naming the field where a journal row breaks the rules ``table`` holds a table's rows to: each
    field of its kind (schema.ROW_FIELDS), a timed row's median there, its samples numbers (``samples``)."""
    fields(record, ROW_FIELDS)
    median, repeats = record.get("median_us"), record.get("repeats")
    if (median is None or median != median) and _number(repeats) and repeats > 0:
        raise ValueError(f"field median_us: {json.dumps(median)} is not allowed (a number: the row was timed, "
                         f"{repeats:g} repeats)")
    samples([record])


INTEGER = re.compile(r"[-+]?\d+")
NUMERAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?inf")  # as pandas writes a float


def _cell(text, kind: str):
    """A results table's cell as its journal row would hold it: the text where the field takes text, else the flag
    or number it spells, None where it is empty; the text itself where that is not of ``kind`` either."""
    if not isinstance(text, str):
        return None
    if holds(kind)(text):
        return text
    value = {"True": True, "False": False}.get(text, text)
    if NUMERAL.fullmatch(text):
        try:
            value = int(text) if INTEGER.fullmatch(text) else float(text)
        except ValueError:  # more digits than Python reads: no number
            pass
    return value if holds(kind)(value) else text


def cells(text: pd.DataFrame) -> None:
    """ValueError naming the line and the field where a results table, each cell as its CSV spells it, holds what a
    journal row may not (``fields``, schema.ROW_FIELDS): a folder published without its journal is read as strictly
    as one with it.  Each distinct value of a column is judged once."""
    import pandas as pd

    kinds = {c: ROW_FIELDS[c] for c in text.columns if c in ROW_FIELDS}
    wrong = pd.Series(False, index=text.index)
    for column, kind in kinds.items():
        test = holds(kind)
        wrong |= text[column].isin([v for v in text[column].unique() if not test(_cell(v, kind))])
    if wrong.any():
        line = wrong.idxmax()
        try:
            fields({c: _cell(text.at[line, c], kind) for c, kind in kinds.items()}, ROW_FIELDS)
        except ValueError as e:
            raise ValueError(f"line {text.index.get_loc(line) + 2}: {e}") from None


def _plain(value):
    """A cell as the file spells it (numpy scalars as Python numbers)."""
    return value.item() if hasattr(value, "item") else value


def implementations_apart(recorded: Path, scenario_text: str) -> tuple[list, list] | None:
    """(recorded, asked) implementations when the scenario file recorded in a folder and the one a
    resume brings differ in their implementations alone (a replay's generated scenario lists the
    --impl choice); None when they differ otherwise or cannot be read."""

    def split(text: str):
        doc = reading.toml_document(text, reading.ReadError)
        groups = doc.pop("sweep", [])
        impls = [doc.pop("implementations", None)] + [g.pop("implementations", None) for g in groups]
        return (doc, groups), [i for i in impls if i is not None]

    try:
        (old_rest, old_impls), (new_rest, new_impls) = split(reading.read_text(recorded, reading.SCENARIO)), \
            split(scenario_text)
    except (reading.ReadError, AttributeError):
        return None
    if old_rest != new_rest or old_impls == new_impls:
        return None
    names = lambda lists: list(dict.fromkeys(i for group in lists for i in group))  # noqa: E731
    return names(old_impls), names(new_impls)
