"""Every reproducer a maintainer reads fits one screen and speaks FlashInfer's terms, not the suite's."""

import re

import pytest

from swabench.impls import registry
from swabench.repro import make, script_stem

# the bugs with a script under repro/
FILED = ["flashinfer#4972", "holistic-offset", "flashinfer#1679", "decode-cliff", "paged-plan-no-window",
         "paged-trim-causal", "decode-trim-nowindow", "paged-sinks-dropped", "sglang-extend-nomask",
         "sglang-extend-ragged-nowindow", "eagle-verify-untrimmed", "chunk-as-window", "tree-window-slot",
         "tree-sink-mask", "sglang-verify-tree"]
SUITE_WORDS = [r"\bswabench\b", r"\bgate\b", r"\bCASE\b", r"\bxfail\b", r"\b[bpq]\d+\b", r"\bps\d+\b", r"\bW\d+\b",
               r"\bh\d+/\d+\b", r"\bs\d\b", r"\[[a-z0-9.]+-[a-z0-9.-]+\]"]


def suite_words(text: str) -> list[str]:
    """The suite's own words in a script: its name, its case labels, its implementations' names."""
    said = [m.group(0) for pattern in SUITE_WORDS for m in re.finditer(pattern, text)]
    names = [n for n in registry.names() if "-" in n]
    return said + [n for n in names if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)]


def test_the_word_check_finds_the_suites_words():
    assert suite_words("made by swabench from verify b4 p300 q8 W127 ps16 h64/8 [gpt-oss-20b], paged-trim") == [
        "swabench", "b4", "p300", "q8", "ps16", "W127", "h64/8", "[gpt-oss-20b]", "paged-trim"]
    assert suite_words("BatchPrefillWithPagedKVCacheWrapper.plan(window_left=127, page_size=16)") == []


@pytest.mark.slow
@pytest.mark.parametrize("ref", FILED)
def test_a_filed_script_fits_one_screen_in_flashinfers_terms(ref):
    from swabench.repro import bugs

    text, _ = make.for_bug(ref)
    lines = text.splitlines()
    most = 85 if bugs.get(ref).filing.kind == "FlashInfer docs gap" else 80  # a docs gap's second, designed reference
    assert len(lines) <= most and max(map(len, lines)) <= 118, f"{ref}: {len(lines)} lines"
    assert suite_words(text) == [], suite_words(text)


def test_a_long_call_is_packed_at_the_width_and_anything_else_left_as_traced():
    from swabench.repro import compact

    args = ", ".join(f"argument_{i}={i}" for i in range(12))
    packed = compact.reflow(f"wrapper.plan({args}, note='a, b (c)')")
    assert all(len(line) <= compact.WIDTH - 4 for line in packed.splitlines()) and len(packed.splitlines()) > 1
    assert " ".join(line.strip() for line in packed.splitlines()).replace("( ", "(") == \
        f"wrapper.plan({args}, note='a, b (c)')"  # the quoted comma and parenthesis stay inside their argument
    sum_ = "total = wrapper.plan(a) + " + " + ".join(["x"] * 60)
    assert compact.reflow(sum_) == sum_


def test_the_cliff_says_the_bandwidth_a_call_would_take_in_tb_per_second():
    """0.5 GB in 100 us is 5 TB/s: the script's own expression, evaluated."""
    from swabench.repro import make

    text, _ = make.for_bug("decode-cliff")
    expression = re.search(r"\{(table_gb[^}]*):\.2f\} TB/s", text).group(1)
    assert eval(expression, {"table_gb": 0.5, "times": {"arm": 100.0}, "name": "arm"}) == pytest.approx(5.0)


def test_the_cliff_shows_where_the_full_table_takes_nearer_a_read_of_every_page_than_the_trimmed_table():
    """The line between reading the window and reading every page is drawn by the two times, not by a factor: at
    the H200's 147.5 us full and 11.7 us trimmed, a 110 us read of every page calls it; a call as fast as the
    trimmed one, or one as slow as a read of every page, is on its side of the line."""
    from swabench.repro import cliff

    text, _ = make.for_bug("decode-cliff")
    verdict = re.search(r"\n    slow = ([^#\n]*)", text).group(1)

    def slow(full_cuda, trimmed_cuda, every_page):  # the script's verdict is the suite's (scripts/repro_verdicts.py)
        said = eval(verdict, {"full_cuda": full_cuda, "trimmed_cuda": trimmed_cuda, "every_page": every_page})
        assert said == cliff.reads_every_page(full_cuda, trimmed_cuda, every_page)
        return said

    assert slow(147.5, 11.7, 110.0) and slow(110.0, 11.7, 110.0)
    assert not slow(12.0, 11.7, 110.0) and not slow(35.0, 11.7, 110.0)  # 35 us: nearer 11.7 than 110, in ratio
    assert not slow(12.0, 11.7, 11.0) and not slow(400.0, 11.7, 11.7)  # a read no slower than the trimmed call
    assert "THRESHOLD" not in text and not re.search(r"\d \* trimmed_cuda", text)  # no chosen factor


def test_a_top_comment_never_breaks_a_hyphenated_word():
    """An issue body joins a wrapped field with a space: 'tensor-' + 'core' would read 'tensor- core'."""
    from swabench.repro import script

    assert script.wrapped(["Fault: " + "x" * 95 + " the tensor-core path starts at the window"], 110) == [
        "Fault: " + "x" * 95 + " the", "    tensor-core path starts at the window"]


def library_calls(text: str) -> list[tuple[int, str, int, bool, list[str]]]:
    """(line, 'flashinfer.X' or 'flashinfer.X.method', positional arguments, whether some are splatted, keywords) of
    each call a script makes on the library or on a wrapper it built (a keyword splatted from taken_by is
    feature-tested, so not listed)."""
    import ast

    def dotted(node):
        parts = []
        while isinstance(node, ast.Attribute):
            parts, node = [node.attr, *parts], node.value
        return ".".join([node.id, *parts]) if isinstance(node, ast.Name) else None

    tree, built = ast.parse(text), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                (made := dotted(node.value.func) or "").startswith("flashinfer."):
            built.update({t.id: made for t in node.targets if isinstance(t, ast.Name)})
    calls = []
    for node in ast.walk(tree):
        name = dotted(node.func) if isinstance(node, ast.Call) else None
        head, _, method = (name or "").partition(".")
        target = name if head == "flashinfer" else f"{built[head]}.{method}" if head in built and "." not in method \
            else None
        if target:
            plain = [a for a in node.args if not isinstance(a, ast.Starred)]
            calls.append((node.lineno, target, len(plain), len(plain) < len(node.args),
                          [k.arg for k in node.keywords if k.arg]))
    return calls


@pytest.mark.parametrize("ref", FILED)
def test_a_committed_script_calls_only_what_the_installed_flashinfer_takes(ref):
    """Run where FlashInfer is installed (a GPU node, or a release unpacked on PYTHONPATH): every class, function and
    method a script calls exists there and takes its keywords and positional count; a script whose classes a
    release lacks skips, naming them."""
    import inspect
    from pathlib import Path

    flashinfer = pytest.importorskip("flashinfer")
    text = (Path(__file__).resolve().parent.parent / "repro" / f"{script_stem(ref)}.py").read_text()

    def found(dotted):
        obj = flashinfer
        for part in dotted.split(".")[1:]:
            obj = getattr(obj, part, None)
        return obj

    def keywords_of(dotted):
        """The signature a call's keywords land in: a method's own, or where it takes **kwargs, the one it hands them
        to (decode's plan() to _plan_impl, the sink wrapper's run() to its base class's run()); None where none is
        found."""
        owner, _, method = dotted.rpartition(".")
        cls, signature = found(owner), inspect.signature(found(dotted))
        if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            return signature
        if not inspect.isclass(cls):
            return None
        candidates = [getattr(cls, f"_{method}_impl", None)] + [base.__dict__.get(method) for base in cls.__mro__[1:]]
        signatures = [inspect.signature(c) for c in candidates if c is not None]
        return next((s for s in signatures if not any(p.kind == p.VAR_KEYWORD for p in s.parameters.values())), None)

    calls = library_calls(text)
    missing = sorted({target for _, target, *_ in calls if found(target) is None})
    if missing:
        pytest.skip(f"flashinfer {flashinfer.__version__} lacks {', '.join(missing)}")
    for line, target, positional, splatted, keywords in calls:
        signature, landing = inspect.signature(found(target)), keywords_of(target)
        assert landing is not None, f"{ref}:{line}: {target} takes **kwargs and hands them nowhere this test can read"
        first = [None] if "self" in signature.parameters else []
        try:
            if landing == signature:
                bind = signature.bind_partial if splatted else signature.bind  # a splat's length is known at run time
                bind(*first, *[None] * positional, **dict.fromkeys(keywords))
            else:  # the positionals against the method, the keywords against where it hands them
                signature.bind_partial(*first, *[None] * positional)
                unknown = [k for k in keywords if k not in landing.parameters]
                assert not unknown, f"{ref}:{line}: {target} hands on keywords {unknown} that nothing takes"
        except TypeError as e:
            pytest.fail(f"{ref}:{line}: {target} on flashinfer {flashinfer.__version__}: {e}")
