"""Fuzzing the front door: generated scenario files and command lines end in exit 0 or 2, never in
a traceback (a traceback is what a user must never see, whatever they type)."""

import json
import string

import pytest

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swabench import cli
from swabench.errors import UserError
from swabench.inputs import axes, traces

AXES = list(axes.AXES)
JUNK = st.text(alphabet=string.printable, max_size=12)
SMALL = st.integers(min_value=-2, max_value=40)
HUGE = st.sampled_from([10**9, 10**12, 2**31, 2**63, -(2**63)])
CHOICES = st.sampled_from(["verify", "extend", "draft_extend", "decode", "paged", "ragged", "bfloat16", "float32",
                           "fa2", "fa3", "auto", "uniform", "full", "fixed:2", "geometric:0.5", "scattered",
                           "contiguous", "geometric:2", "fixed:0"])
SCALAR = st.one_of(SMALL, SMALL, HUGE, CHOICES, JUNK, st.booleans(), st.floats(allow_nan=True, width=32))
TABLE_VALUE = st.dictionaries(st.one_of(CHOICES, JUNK), SCALAR, max_size=2)
NESTED = st.one_of(TABLE_VALUE, st.lists(st.one_of(st.lists(SCALAR, max_size=2), TABLE_VALUE), min_size=1, max_size=2))
VALUE = st.one_of(SCALAR, st.lists(SCALAR, max_size=3), NESTED)  # NESTED: tables and lists where a value belongs
NAMES = st.sampled_from(AXES + ["kv_len", "impl", "backend", "group", "nope", "__import__"])
ATOM = st.one_of(NAMES, SMALL.map(str), HUGE.map(str), CHOICES.map(json.dumps), JUNK.map(json.dumps))
RULE = st.one_of(
    st.tuples(ATOM, st.sampled_from(["==", "<", ">=", "!=", " in ", " * ", " // ", " % ", " and ", " or "]), ATOM)
    .map("".join),
    st.recursive(ATOM, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from([" == ", " > ", " and ", " or ", " * ", " + "]), inner).map("".join),
        inner.map(lambda e: f"not ({e})"), inner.map(lambda e: f"({e})")), max_leaves=6),
    JUNK)
TABLE = st.dictionaries(st.one_of(st.sampled_from(AXES), JUNK), VALUE, max_size=6)
IMPLS = st.lists(st.one_of(st.sampled_from(["torch-trim", "torch-mask", "planted-wide", "paged-window",
                                            "flex-window"]), JUNK), max_size=3)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, int):
        return str(v) if -(2**63) <= v < 2**63 else json.dumps(str(v))
    return json.dumps(v)


def toml_table(header: str, table: dict) -> str:
    return f"{header}\n" + "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in table.items())


VALID_IMPLS = st.lists(st.sampled_from(["torch-trim", "torch-mask", "planted-wide", "planted-future",
                                        "paged-window", "flex-window"]), min_size=1, max_size=3)
NUDGE = st.dictionaries(st.one_of(st.sampled_from(AXES), JUNK), VALUE, max_size=2)
ODD_AXIS = st.dictionaries(st.sampled_from(AXES), NESTED, min_size=1, max_size=1)  # a table or nested list on an axis


@st.composite
def scenario_text(draw) -> str:
    """Mostly near-valid files (a small valid base nudged on one or two axes, to plausible or absurd
    values), sometimes plain junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    odd = draw(st.integers(0, 4)) == 0
    name = draw(st.one_of(JUNK, st.sampled_from(["../../x", "/abs", "a" * 101]))) if odd else "fuzz"
    impls = draw(IMPLS) if draw(st.integers(0, 4)) == 0 else draw(VALID_IMPLS)
    lines = [f"name = {json.dumps(name)}", f"implementations = {toml_value(impls)}"]
    base = {"mode": "verify", "draft_tokens": 2, "prefix_len": 8, "window_left": 3, "num_qo_heads": 2,
            "num_kv_heads": 1, "head_dim": 16, "dtype": "float32"}
    odd_axis = draw(ODD_AXIS) if draw(st.integers(0, 2)) == 0 else {}
    in_fixed = draw(st.booleans())
    text = "\n".join(lines) + "\n" + toml_table("[fixed]", {**base, **draw(NUDGE), **(odd_axis if in_fixed else {})})
    for _ in range(draw(st.integers(0, 2))):
        text += toml_table("[[sweep]]", draw(NUDGE))
    if odd_axis and not in_fixed:
        text += toml_table("[[sweep]]", odd_axis)
    for _ in range(draw(st.integers(0, 2))):
        text += toml_table("[[skip]]", {"when": draw(RULE), "reason": "fuzz"})
    if draw(st.integers(0, 5)) == 0:
        text += toml_table(f"[{json.dumps(draw(JUNK))}]", draw(TABLE))
    return text


def no_traceback(result) -> None:
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback for {result.output!r}") from result.exception
    assert result.exit_code in (0, 2), result.output


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.slow
@fuzz(300)
@given(text=scenario_text(), extra=st.lists(st.sampled_from(["--impl", "torch-trim", "torch-mask", "x"]), max_size=2))
def test_show_never_tracebacks(tmp_path_factory, text, extra):
    path = tmp_path_factory.mktemp("s") / "s.toml"
    path.write_text(text)
    no_traceback(CliRunner().invoke(cli.main, ["show", str(path), *extra]))


@fuzz(60)
@given(text=scenario_text(), command=st.sampled_from(["run", "check"]),
       extra=st.lists(st.sampled_from(["--strict", "--l2", "warm", "--shard", "1/2", "0/0", "--case", "verify",
                                       "--resume", "--impl", "planted-wide"]), max_size=3))
@pytest.mark.slow
def test_runs_on_the_cpu_never_traceback(tmp_path_factory, text, command, extra):
    """The same files through a real sweep on the embedded backend (sizes here stay tiny, or absurd
    enough to be refused or skipped before anything is allocated)."""
    folder = tmp_path_factory.mktemp("r")
    path = folder / "s.toml"
    path.write_text(text)
    args = [command, str(path), "--device", "cpu", "--out", str(folder / "out"), *extra]
    no_traceback(CliRunner().invoke(cli.main, args))


FIRST = st.sampled_from(["show", "list", "merge", "compare", "summary", "plot", "report", "findings", "warmup",
                         "profile", "env", "--help", "--version", "nope"])  # run and check: the scenario fuzz above
TOKENS = st.sampled_from(["run", "check", "show", "list", "merge", "compare", "summary", "plot", "report",
                          "findings", "warmup", "profile", "env", "submit", "--out", "--threshold", "--alpha",
                          "-1", "nan", "5", "0.05", "--gpus", "all", "--shard", "1/1", "--device", "cuda",
                          "--format", "json", "--partial", "--costs-from", "--shards", "0", "cpu", "quick",
                          "/nonexistent", ".", "tests", "--tool", "torch", "--jobs", "--peaks", "--case"])


@pytest.mark.slow
@fuzz(150)
@given(first=FIRST, rest=st.lists(st.one_of(TOKENS, JUNK), max_size=5))
def test_command_lines_never_traceback(tmp_path_factory, monkeypatch, first, rest):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    no_traceback(CliRunner().invoke(cli.main, [first, *rest]))



LINE_KEYS = st.sampled_from(list(traces.KEYS) + ["nope"])
REQUESTS = st.lists(st.tuples(st.integers(0, 40), st.just(1)).map(list), min_size=1, max_size=3)  # decode steps


@st.composite
def trace_text(draw) -> str:
    """Near-valid trace lines (a small valid step nudged on one or two keys, tables and nested lists
    among the values), sometimes plain junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        line = {"mode": "decode", "num_qo_heads": 2, "num_kv_heads": 1, "head_dim": 16, "window_left": 3,
                "dtype": "float32", "requests": draw(REQUESTS)}
        line.update(draw(st.dictionaries(LINE_KEYS, VALUE, max_size=2)))
        if draw(st.integers(0, 2)) == 0:  # a table where a layer value belongs
            line[draw(st.sampled_from(traces.LAYER))] = draw(TABLE_VALUE)
        lines.append(json.dumps(line, default=str, allow_nan=True))
    return "\n".join(lines) + "\n"


@fuzz(200)
@given(text=trace_text())
def test_trace_lines_are_read_or_refused(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("t") / "t.jsonl"
    path.write_text(text)
    try:
        traces.read(path)
    except UserError:
        pass


@fuzz(30)
@given(text=trace_text())
def test_replays_on_the_cpu_never_traceback(tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("r")
    path = folder / "t.jsonl"
    path.write_text(text)
    args = ["replay", str(path), "--impl", "torch-trim", "--device", "cpu", "--out", str(folder / "out")]
    no_traceback(CliRunner().invoke(cli.main, args))
