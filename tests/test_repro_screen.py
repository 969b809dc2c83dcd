"""Every reproducer a maintainer reads fits one screen and speaks FlashInfer's terms, not the suite's."""

import re

import pytest

from swabench.impls import registry
from swabench.repro import make

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
    text, _ = make.for_bug(ref)
    lines = text.splitlines()
    assert len(lines) <= 80 and max(map(len, lines)) <= 118, f"{ref}: {len(lines)} lines"
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
    assert "3.0" not in text and "3x" not in text


def test_a_top_comment_never_breaks_a_hyphenated_word():
    """An issue body joins a wrapped field with a space: 'tensor-' + 'core' would read 'tensor- core'."""
    from swabench.repro import script

    assert script.wrapped(["Fault: " + "x" * 95 + " the tensor-core path starts at the window"], 110) == [
        "Fault: " + "x" * 95 + " the", "    tensor-core path starts at the window"]
