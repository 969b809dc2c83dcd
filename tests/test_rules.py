"""Skip-rule evaluator: the grammar, the limits, the messages, and agreement with Python."""

import ast
import gc
import random
import time
import tomllib
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swabench.inputs import rules
from swabench.inputs.rules import RuleError, compile_rule

NAMES = ("group", "mode", "impl", "backend", "prefix_len", "seq_len", "qo_len", "kv_len", "window_left", "sinks",
         "attention_chunk")
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
FAST = 0.5  # CPU seconds of this thread (not wall time, nor other threads of the process: neither is the rule's work)


@contextmanager
def rule_time():
    """The CPU seconds this thread spends in the block, the garbage collector held off: a full collection of a long
    test process's heap is not the rule's work.  Yields a function that reads the time so far."""
    start, collecting = time.thread_time(), gc.isenabled()
    gc.disable()
    try:
        yield lambda: time.thread_time() - start
    finally:
        if collecting:
            gc.enable()


def refused(expr, ns=None, names=NAMES):
    """The RuleError message for `expr` (at compile time, or evaluating on `ns`), timed."""
    with rule_time() as took, pytest.raises(RuleError) as info:
        rule = compile_rule(expr, names)
        rule.evaluate(ns or {})
    assert took() < FAST, f"took {took():.2f}s"
    return str(info.value)


def python_eval(expr, ns):
    """What Python says, or the exception type it raises (the reference the evaluator must match)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # `x is None` style SyntaxWarnings
        try:
            code = expr if not isinstance(expr, str) else compile(expr.strip(), "<rule>", "eval")
            return eval(code, {"__builtins__": {}}, dict(ns))
        except Exception as e:  # noqa: BLE001 -- the type is the answer
            return type(e)


NS = {"group": "verify", "mode": "verify", "impl": "paged-window", "backend": "fa2", "prefix_len": 96,
      "seq_len": None, "qo_len": 4, "kv_len": 100, "window_left": 127}


# ---------------------------------------------------------------- the reproduced problems

def test_string_repetition_is_refused_before_it_allocates():
    msg = refused("'a' * 4000000000 == 'b'")
    assert "`*` works on integers only" in msg and "string" in msg
    msg = refused("group * 4000000000 == 'b'", NS)
    assert "`*` needs integers" in msg and "`group` is a string ('verify')" in msg
    assert "string" in refused("mode + 'x' == 'verifyx'", NS)


def test_division_by_zero_names_the_operation():
    assert refused("prefix_len // 0 == 1", NS) == "division by zero in `prefix_len // 0`"
    assert refused("prefix_len % (qo_len - 4) > 1", NS) == "division by zero in `prefix_len % (qo_len - 4)`"
    rule = compile_rule("prefix_len // qo_len == 24 and prefix_len % qo_len == 0", NAMES)
    assert rule.evaluate(NS) is True


@pytest.mark.parametrize("expr", [
    "(" * 100000 + "qo_len" + ")" * 100000 + " > 1",
    "not " * 100000 + "qo_len > 1",
    " * ".join(["prefix_len"] * 500) + " > 0",
])
def test_huge_rules_are_refused_by_length(expr):
    assert "characters long; a rule may have at most 1000" in refused(expr)


def test_deep_nesting_within_the_length_limit():
    assert "too deeply nested" in refused("not " * 240 + "qo_len > 1")
    assert "too deeply nested" in refused("-" * 900 + "1 > 0")
    assert "too deeply nested" in refused(" * ".join(["qo_len"] * 60) + " > 0")
    assert "nested parentheses" in refused("(" * 300 + "qo_len" + ")" * 300 + " > 1")
    # 32 levels is fine
    assert compile_rule("not " * 30 + "qo_len > 1", NAMES).evaluate(NS) is True


def test_too_many_parts():
    wide = " or ".join(["a > 0"] * 80)  # 241 parts, three levels deep
    assert len(wide) < 1000
    assert "more than 200 names, constants and operations" in refused(wide, names=("a",))
    assert compile_rule(" or ".join(["a > 0"] * 60), ("a",)).evaluate({"a": 0}) is False


def test_parser_recursion_or_memory_is_reported_as_nesting(monkeypatch):
    for exc in (RecursionError, MemoryError, ValueError):
        def boom(*args, exc=exc, **kwargs):
            raise exc("deep")
        monkeypatch.setattr(rules.ast, "parse", boom)
        assert "too deeply nested" in refused("qo_len > 1")


def test_large_values_are_refused():
    msg = refused("prefix_len * prefix_len * prefix_len * prefix_len > 0", {**NS, "prefix_len": 2 ** 20})
    assert msg.startswith("value too large in `prefix_len * prefix_len * prefix_len * prefix_len`")
    assert "value too large" in refused("4000000000 * 4000000000 * 4000000000 > 0")
    assert "too large (integers below 2**63)" in refused(f"qo_len > {2 ** 64}")
    assert "value too large" in refused("qo_len + 1 > 0", {**NS, "qo_len": 10 ** 5000})
    assert compile_rule(f"qo_len * {2 ** 60} > 0", NAMES).evaluate(NS) is True


def test_integer_constants_are_below_two_to_the_63():
    assert "too large (integers below 2**63)" in refused(f"qo_len > {2 ** 63}")
    assert "too large (integers below 2**63)" in refused(f"qo_len in (1, -{2 ** 63})")
    assert compile_rule(f"qo_len < {2 ** 63 - 1}", NAMES).evaluate(NS) is True
    assert compile_rule(f"qo_len in (1, -{2 ** 63 - 1})", NAMES).evaluate(NS) is False


@pytest.mark.parametrize("expr", ["prefix_len", "prefix_len + 1", "'verify'", "None", "-qo_len", "7"])
def test_rules_must_be_conditions(expr):
    msg = refused(expr)
    assert "must be a comparison" in msg and "e.g. `prefix_len > 0`" in msg


def test_and_or_not_combine_conditions_only():
    assert "`and` combines comparisons; `kv_len` is a value" in refused("qo_len > 1 and kv_len")
    assert "`not` combines comparisons" in refused("not prefix_len")
    assert "`or` combines" in refused("(qo_len or 1) > 0")
    for expr in ("True", "not False", "qo_len > 1 and (True or kv_len < 0)"):
        assert compile_rule(expr, NAMES).evaluate(NS) is True


# ---------------------------------------------------------------- grammar and messages

def test_unknown_name_suggests_and_lists():
    msg = refused("windw_left > 3")
    assert msg.startswith("unknown name 'windw_left' (did you mean 'window_left'?); allowed: group, mode")


@pytest.mark.parametrize("expr, words", [
    ("__import__('os') == 1", "found a function call `__import__('os')`"),
    ("mode.upper() == 'X'", "found a function call"),
    ("qo_len ** 2 > 1", "only comparisons, and/or/not"),
    ("~qo_len > 1", "only comparisons, and/or/not"),
    ("qo_len > 1.5", "found float `1.5`"),
    ("mode == b'x'", "found bytes"),
    ("mode == '" + "x" * 101 + "'", "101 characters long (at most 100)"),
    ("mode in 'verify'", "need a literal list on their right"),
    ("mode in backend", "need a literal list on their right"),
    ("(1, 2) == qo_len", "may only follow `in`"),
    ("qo_len in (1, qo_len)", "only constants"),
    ("qo_len in tuple(range(65))", "need a literal list on their right"),
    ("qo_len in (" + ", ".join(map(str, range(65))) + ")", "65 elements (at most 64)"),
    ("qo_len in (1, 2) < (3, 4)", "need a literal list"),
    ("qo_len is 3", "`is` only tests for None, True or False"),
    ("(x := 3) > 1", "found an assignment"),
    ("qo_len if mode else 2", "found an if/else"),
    ("qo_len >", "not a valid expression (invalid syntax)"),
    ("qo_len > 1\n and kv_len > 1", "wrap a rule that spans several lines in parentheses"),
    (7, "must be an expression string, got 7"),
    (["qo_len > 1"], "must be an expression string"),
])
def test_refusals_say_why(expr, words):
    assert words in refused(expr)


def test_none_handling():
    ns = {**NS, "prefix_len": None, "seq_len": 200}
    assert refused("prefix_len - window_left > 2", ns) == \
        "cannot compute `prefix_len - window_left`: `-` needs integers, but `prefix_len` is not set in " \
        "this sweep group (None)"
    msg = refused("prefix_len > 0", ns)
    assert msg.startswith("cannot compare `prefix_len > 0`: `>` needs two integers or two strings")
    assert "`prefix_len` is not set in this sweep group (None)" in msg
    for expr, want in [("prefix_len is None", True), ("prefix_len is not None", False),
                       ("prefix_len == None", True), ("prefix_len != 0", True),
                       ("prefix_len in (None, 0)", True), ("prefix_len is None or prefix_len > 0", True),
                       ("seq_len is not None and seq_len > 100", True)]:
        assert compile_rule(expr, NAMES).evaluate(ns) is want, expr


def test_ordering_between_types_is_refused_but_equality_is_not():
    msg = refused("mode > 3", NS)
    assert "`mode` is a string ('verify') and `3` is an integer (3)" in msg
    assert "boolean" in refused("(qo_len > 1) < 2", NS)
    assert "`-` needs an integer, but `mode` is a string" in refused("-mode == 1", NS)
    assert "`+` needs integers" in refused("qo_len + (kv_len > 1) > 0", NS)  # bools are not integers
    for expr in ("mode != 3", "mode == 'verify'", "qo_len != None", "mode < 'z'",
                 "backend not in (1, 'fa3', None)"):
        assert compile_rule(expr, NAMES).evaluate(NS) is True, expr


def test_chains_and_short_circuits_behave_like_python():
    rule = compile_rule("0 < qo_len < kv_len <= 100 != window_left", NAMES)
    assert rule.evaluate(NS) is True and rule.evaluate({**NS, "kv_len": 3}) is False
    # the part that would fail is never reached, as in Python
    ns = {**NS, "prefix_len": None}
    assert compile_rule("prefix_len is None or prefix_len > 5", NAMES).evaluate(ns) is True
    assert compile_rule("prefix_len is not None and prefix_len // 0 > 5", NAMES).evaluate(ns) is False
    assert compile_rule("qo_len > 100 > prefix_len", NAMES).evaluate(ns) is False
    assert compile_rule("window_left in (-1, 0)", NAMES).evaluate({**NS, "window_left": -1}) is True


def test_rule_keeps_its_text_and_where():
    rule = compile_rule("  qo_len > 1 ", NAMES, where="skip[2].when")
    assert rule.text == "  qo_len > 1 " and rule.where == "skip[2].when" and "qo_len > 1" in repr(rule)


def test_missing_name_at_evaluation():
    assert refused("qo_len > 1", {"mode": "x"}) == "`qo_len` has no value for this point"


# ---------------------------------------------------------------- the shipped rules

def shipped_rules():
    out = []
    for path in sorted(SCENARIOS.glob("*.toml")):
        out += [r["when"] for r in tomllib.loads(path.read_text()).get("skip", [])]
    return sorted(set(out))


def test_shipped_rules_agree_with_python_eval():
    texts = shipped_rules()
    assert len(texts) >= 5
    compiled = [compile_rule(t, NAMES) for t in texts]
    python = [compile(t, "<rule>", "eval") for t in texts]
    rng = random.Random(0)
    values = {"group": ["backends", "prefix", "around-kv", "decode", "verify", "draft_extend", "sweep[0]", "chunked",
                        "chunked-decode"],
              "mode": ["extend", "verify", "draft_extend", "decode"],
              "impl": ["flex-window", "torch-trim", "torch-mask", "paged-plan-no-window", "paged-trim-causal",
                       "paged-window"],
              "backend": ["fa2", "fa3", "auto"], "prefix_len": [None, 0, 1, 17, 18, 130],
              "seq_len": [None, 16, 130], "qo_len": [1, 16, 512, None], "kv_len": [None, 0, 16, 17, 18, 130],
              "window_left": [-1, 0, 15, 16, 128], "sinks": [False, True], "attention_chunk": [0, 4, 16]}
    checked = 0
    for _ in range(3000):
        ns = {k: rng.choice(v) for k, v in values.items()}
        for text, rule, code in zip(texts, compiled, python):
            want = python_eval(code, ns)
            if isinstance(want, bool):
                assert rule.evaluate(ns) is want, (text, ns)
                checked += 1
            else:
                assert want is TypeError, (text, ns, want)
                with pytest.raises(RuleError):
                    rule.evaluate(ns)
    assert checked > 10000


def test_typical_rule_is_fast():
    rule = compile_rule("group == 'verify' and window_left >= kv_len", NAMES)
    with rule_time() as took:
        for _ in range(50_000):
            rule.evaluate(NS)
        assert took() < 0.5


# ---------------------------------------------------------------- anything else: RuleError, quickly

JUNK = ["__import__('os')", "'a' * 4000000000", "1.5", "[1]", "x.y", "lambda: 1", "f'{1}'", "{}", "...",
        "(", ")", "**", ",", "'", "\\", "\x00", "\n", "if", "qo_len[0]", "not", "is", "in", " ", "@", "b'x'"]
CLEAN_ATOMS = st.one_of(st.sampled_from(NAMES), st.integers(-3, 3).map(str), st.sampled_from(["None", "'fa2'"]))
DIRTY_ATOMS = st.one_of(CLEAN_ATOMS, st.sampled_from(("nope", "__class__", "True", "1.5", "'verify'")),
                        st.integers(-2 ** 70, 2 ** 70).map(str), st.text("abz'\" ", max_size=5).map(repr))


def grammar(atoms, arith, compare):
    """Condition strings: comparisons (chains, `in` lists) of arithmetic on `atoms`, and/or/not."""
    values = st.recursive(atoms, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(arith), inner).map(" ".join),
        inner.map(lambda v: f"-{v}"), inner.map(lambda v: f"({v})")), max_leaves=6)
    lists = st.lists(atoms, max_size=4).map(lambda xs: "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")")
    comparisons = st.one_of(
        st.lists(st.tuples(st.sampled_from(compare), values), min_size=1, max_size=3).flatmap(
            lambda ops: values.map(lambda first: first + "".join(f" {op} {v}" for op, v in ops))),
        st.tuples(values, st.sampled_from(["in", "not in"]), st.one_of(lists, values)).map(" ".join))
    conditions = st.recursive(comparisons, lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(" ".join),
        inner.map(lambda c: f"not {c}"), inner.map(lambda c: f"({c})")), max_leaves=5)
    return values, conditions


def with_junk(text_and_junk):
    text, at, junk = text_and_junk
    at %= len(text) + 1
    return text[:at] + junk + text[at:]


clean = grammar(CLEAN_ATOMS, ["+", "-", "*", "//", "%"], ["==", "!=", "<", "<=", ">", ">=", "is", "is not"])[1]
dirty_values, dirty = grammar(DIRTY_ATOMS, ["+", "-", "*", "//", "%", "**", "/", "@"],
                              ["==", "!=", "<", "<=", ">", ">=", "is", "is not", "<>"])
expressions = st.one_of(  # conditions, broken ones, bare values and noise
    clean, dirty, st.tuples(dirty, st.integers(0, 999), st.sampled_from(JUNK)).map(with_junk),
    dirty_values, st.text(max_size=40))
namespaces = st.fixed_dictionaries({n: st.one_of(st.none(), st.integers(-5, 5), st.integers(-2 ** 66, 2 ** 66),
                                                 st.sampled_from(["verify", "fa2", ""])) for n in NAMES})
small_namespaces = st.fixed_dictionaries({n: st.one_of(st.integers(-3, 3), st.just("fa2"), st.none())
                                          for n in NAMES})


def check(expr, ns):
    """RuleError or the same bool as Python, in little CPU time. Returns the result or the error,
    and whether the error came from evaluating (compiling succeeded)."""
    rule = None
    with rule_time() as took:
        try:
            rule = compile_rule(expr, NAMES)
            result = rule.evaluate(ns)
        except RuleError as e:
            assert str(e)
            result = e
        assert took() < FAST, expr
    if isinstance(result, bool):  # when it answers, it answers like Python
        assert result is python_eval(expr, ns), (expr, ns)
    return result, rule is not None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(clean, small_namespaces)
def test_well_formed_rules_agree_with_python(expr, ns):
    result, compiled = check(expr, ns)
    if compiled and isinstance(result, RuleError):  # a point the rule cannot judge: Python fails too,
        want = python_eval(expr, ns)                # or it would repeat / concatenate a string
        assert want in (TypeError, ZeroDivisionError) or "is a string" in str(result), (expr, ns, want)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(expressions, namespaces)
def test_anything_gives_a_bool_or_rule_error_quickly(expr, ns):
    check(expr, ns)


def test_no_eval_or_compile_in_the_module():
    source = Path(rules.__file__).read_text()
    calls = {n.func.id for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not calls & {"eval", "exec", "compile"}


# ---------------------------------------------------------------- wired into scenario files

BASE = """
implementations = ["torch-trim"]
[[sweep]]
group = "g"
mode = "verify"
draft_tokens = 4
window_left = 16
"""


def load(tmp_path, text):
    from swabench.inputs import scenarios
    path = tmp_path / "s.toml"
    path.write_text(text)
    return scenarios.load(path)


def test_scenario_rule_errors_name_the_rule(tmp_path):
    from swabench.inputs.axes import ScenarioError
    with pytest.raises(ScenarioError, match=r"s.toml: skip\[0\].when: must be a comparison"):
        load(tmp_path, BASE + 'prefix_len = 8\n[[skip]]\nwhen = "prefix_len"\nreason = "x"\n')
    rules_text = ('[[skip]]\nwhen = "mode == \'decode\'"\nreason = "a"\n'
                  '[[skip]]\nwhen = "prefix_len > 3"\nreason = "b"\n')
    with pytest.raises(ScenarioError, match=r"skip\[1\].when: cannot be evaluated for g: cannot compare "
                                            r"`prefix_len > 3`.*`prefix_len` is not set in this sweep group"):
        load(tmp_path, BASE + "seq_len = 100\n" + rules_text)
    s = load(tmp_path, BASE + "prefix_len = [2, 8]\n" + rules_text)
    assert [c.prefix_len for c in s.cases] == [2] and s.skipped == ["b"]

