"""swabench repro: scripts that make the suite's own calls, tested where there is no GPU.

Every implementation's script is run against the FlashInfer stand-in and must make the suite's calls
argument by argument (a PyTorch path's must give the suite's output bit for bit); the inputs it builds
are the suite's; an embedded path's script runs on its own and says right or wrong as the gate does."""

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from swabench.core import reference, workloads
from swabench.impls import registry, upstream
from swabench.inputs import scenarios
from swabench.repro import bugs, kit, make, ref_of, script, trace, verify
from tests.conftest import invoke

# one small point for every implementation: each group is what its paths model
EVERY_PATH = textwrap.dedent("""
    name = "repro-cpu"
    description = "a small case for every implementation"
    [fixed]
    num_qo_heads = 4
    num_kv_heads = 2
    head_dim = 64
    dtype = "bfloat16"
    batch_size = 2
    backend = "fa2"
    [[sweep]]
    group = "verify"
    implementations = ["paged-window", "paged-trim", "ragged-window", "paged-mask", "ragged-mask",
                       "paged-plan-no-window", "paged-trim-causal", "torch-trim", "torch-mask", "torch-batch",
                       "planted-wide", "planted-narrow", "planted-future", "eagle-verify-untrimmed",
                       "flex-window", "flex-contiguous", "flex-flat"]
    mode = "verify"
    draft_tokens = 4
    prefix_len = [37, 21]
    window_left = 7
    storage = ["paged", "ragged"]
    page_size = 4
    page_layout = "evicted-reused"
    [[sweep]]
    group = "decode"
    implementations = ["decode-window", "decode-trim", "decode-trim-nowindow", "decode-tc-window", "decode-tc-trim"]
    mode = "decode"
    prefix_len = [30, 45]
    window_left = 9
    page_size = 4
    [[sweep]]
    group = "sinks"
    implementations = ["sink-window", "paged-sinks-dropped"]
    mode = "verify"
    draft_tokens = 3
    prefix_len = 20
    window_left = 5
    page_size = 4
    sinks = true
    [[sweep]]
    group = "sinks-decode"
    implementations = ["sink-decode"]
    mode = "decode"
    prefix_len = 20
    window_left = 5
    page_size = 4
    sinks = true
    [[sweep]]
    group = "extend"
    implementations = ["sglang-extend", "sglang-extend-nomask", "sglang-extend-ragged-nowindow"]
    mode = "extend"
    extend_len = 6
    prefix_len = [25, 18]
    window_left = 7
    page_size = 1
    [[sweep]]
    group = "chunked"
    implementations = ["chunk-virtual", "chunk-trim", "chunk-as-window", "planted-chunk-window", "planted-chunk-long"]
    mode = "verify"
    draft_tokens = 2
    prefix_len = [5, 14]
    attention_chunk = 8
    page_size = 4
    [[sweep]]
    group = "tree"
    implementations = ["tree-mask-depth", "tree-trim-depth", "tree-window-slot", "tree-branches", "sglang-verify-tree",
                       "vllm-tree-window", "tree-xqa", "tree-trtllm-gen"]
    mode = "verify"
    tree = "eagle:2:2"
    draft_tokens = 5
    prefix_len = [30, 12]
    window_left = 7
    page_size = 1
    [[sweep]]
    group = "tree-sinks"
    implementations = ["tree-sink-mask", "tree-branches-sink"]
    mode = "verify"
    tree = "eagle:2:2"
    draft_tokens = 5
    prefix_len = 20
    window_left = 5
    page_size = 1
    sinks = true
    [[sweep]]
    group = "xqa"
    implementations = ["xqa-window", "xqa-window-off-by-one"]
    backend = "xqa"
    mode = "verify"
    draft_tokens = 3
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "cudnn"
    implementations = ["cudnn-prefill", "cudnn-decode", "cudnn-graph", "cudnn-graph-band-w"]
    backend = "cudnn"
    mode = "verify"
    draft_tokens = 3
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "fa4"
    implementations = ["fa4-window", "fa4-window-count"]
    backend = "fa4"
    mode = "verify"
    draft_tokens = 3
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "fa3-vllm"
    implementations = ["fa3-window", "fa3-window-count"]
    backend = "vllm-fa3"
    mode = "verify"
    draft_tokens = 3
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "fa3-sgl"
    implementations = ["sglang-fa3"]
    backend = "sgl-fa3"
    mode = "verify"
    draft_tokens = 3
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "fa3-sgl-tree"
    implementations = ["sglang-fa3-tree"]
    backend = "sgl-fa3"
    mode = "verify"
    tree = "eagle:2:2"
    draft_tokens = 5
    prefix_len = [30, 12]
    window_left = 7
    page_size = 1
    [[sweep]]
    group = "fmha-v2"
    implementations = ["fmha-v2-window"]
    backend = "fmha-v2"
    mode = "verify"
    draft_tokens = 4
    prefix_len = [30, 13]
    window_left = 5
    page_size = 16
    [[sweep]]
    group = "fmha-v2-chunked"
    implementations = ["fmha-v2-chunked"]
    backend = "fmha-v2"
    mode = "verify"
    draft_tokens = 4
    prefix_len = [30, 13]
    attention_chunk = 16
    page_size = 16
    [[sweep]]
    group = "holistic"
    implementations = ["batch-attention-trim"]
    mode = "verify"
    draft_tokens = 4
    prefix_len = [30, 13]
    window_left = 5
    page_size = 4
    [[sweep]]
    group = "mixed"
    implementations = ["mixed-two-calls", "pod-window"]
    mode = "mixed"
    batch_size = 4
    prefills = 1
    extend_len = 6
    prefix_len = [30, 13, 20, 9]
    window_left = 5
    page_size = 4
    [[sweep]]
    group = "blocks"
    implementations = ["ranges-window"]
    mode = "verify"
    draft_tokens = 8
    block = 4
    prefix_len = [30, 13]
    window_left = 5
    page_size = 4
    """)
FLEX = ("flex-window", "flex-contiguous", "flex-flat")
NO_SCRIPT_YET = ("xqa-window", "xqa-window-off-by-one", "fmha-v2-window", "fmha-v2-chunked", "batch-attention-trim",
                 "mixed-two-calls", "pod-window", "cudnn-prefill", "cudnn-decode", "cudnn-graph", "cudnn-graph-band-w",
                 "fa4-window", "fa4-window-count", "fa3-window", "fa3-window-count", "sglang-fa3",
                 "sglang-fa3-tree")
PUBLISHED = "tests/fixtures/published/results"  # frozen copies of the published runs (tests/fixtures/make_published.py)


@pytest.fixture(scope="module")
def every_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("repro") / "repro-cpu.toml"
    path.write_text(EVERY_PATH)
    return {p.impl: p for p in scenarios.load(path).points}


def test_every_implementation_has_a_small_point_here(every_path):
    assert set(every_path) == set(registry.names())


@pytest.mark.parametrize("impl", [n for n in registry.names() if n not in FLEX + NO_SCRIPT_YET])
def test_each_script_makes_the_suites_calls(every_path, impl):
    p = every_path[impl]
    if registry.get(impl).skip_reason(p.case, p.backend, None):
        pytest.skip(f"{impl} names why it cannot run: {registry.get(impl).skip_reason(p.case, p.backend, None)}")
    parts = [script.Part(p.case, impl, p.backend)]
    text = script.render(parts, script.Header(impl))
    verify.check(parts, text)
    compile(text, impl, "exec")
    assert not re.search(r"^\s*(import|from) swabench", text, re.M)
    if registry.get(impl).library == "flashinfer":
        assert "import flashinfer" in text and ".plan(" in text and (".run(" in text or ".forward(" in text)


def test_a_script_that_drifts_from_the_suite_is_caught(every_path):
    p = every_path["paged-trim"]
    parts = [script.Part(p.case, "paged-trim", p.backend)]
    text = script.render(parts, script.Header("paged-trim"))
    planned = "causal=True, window_left=7"
    assert planned in text
    with pytest.raises(verify.Drift, match="call 2"):
        verify.check(parts, text.replace(planned, "causal=True, window_left=8"))
    planned_table = next(line for line in text.splitlines() if "table_slice(CASE" in line)
    with pytest.raises(verify.Drift):
        verify.check(parts, text.replace(planned_table, planned_table.replace("starts=[", "starts=[4 + ", 1)))


@pytest.mark.parametrize("impl", FLEX)
def test_flexattention_says_why_it_has_no_script(every_path, impl):
    p = every_path[impl]
    with pytest.raises(trace.Unrenderable, match="block mask"):
        script.render([script.Part(p.case, impl, p.backend)], script.Header(impl))


@pytest.mark.parametrize("impl", NO_SCRIPT_YET)
def test_the_newest_shelf_paths_say_why_they_have_no_script_yet(every_path, impl):
    p = every_path[impl]
    with pytest.raises(trace.Unrenderable, match="no standalone script yet"):
        script.render([script.Part(p.case, impl, p.backend)], script.Header(impl))


FEATURES = ["", "sinks = true", "logits_soft_cap = 30.0", 'kv_dtype = "float8_e4m3"', "attention_chunk = 8",
            "causal = false"]
LAYOUTS = ["scattered", "contiguous", "evicted-null", "evicted-reused"]


@pytest.mark.parametrize("layout, features", [(layout, f) for f in FEATURES for layout in LAYOUTS
                                              if not ("chunk" in f and layout.startswith("evicted"))])
def test_the_script_builds_the_suites_inputs_and_reference(write_scenario, layout, features):
    path = write_scenario(textwrap.dedent(f"""
        name = "inputs"
        description = "inputs"
        implementations = ["torch-trim"]
        [fixed]
        num_qo_heads = 4
        num_kv_heads = 2
        head_dim = 64
        dtype = "bfloat16"
        batch_size = 3
        [[sweep]]
        mode = "verify"
        draft_tokens = 3
        prefix_len = [9, 30, 17]
        {"" if "chunk" in features else "window_left = 6"}
        storage = ["paged", "ragged"]
        page_size = 4
        page_layout = "{layout}"
        {features}
        """))
    for case in scenarios.load(path).cases:
        w, x = workloads.build(case, "cpu"), kit.make_inputs(script.case_literals(case), "cpu")
        for ours, theirs in ((w.q, x["q"]), (w.k_store, x["k_cache"]), (w.v_store, x["v_cache"]), (w.slots, x["slots"])):
            assert ours.dtype == theirs.dtype and torch.equal(ours.float(), theirs.float())
        assert (w.sinks is None) == (x.get("sinks") is None) and (w.sinks is None or torch.equal(w.sinks, x["sinks"]))
        if case.storage == "paged":
            assert torch.equal(w.kv_indices_host.int(), x["kv_indices"])
            assert torch.equal(w.kv_last_page_len, x["kv_last_page_len"])
        ours = reference.attention(w)
        assert (kit.reference(script.case_literals(case), x).double() - ours).abs().max() < 2e-5 * ours.abs().max()


def run_script(path):
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)


def test_an_embedded_script_runs_on_its_own_and_says_right_or_wrong(every_path, tmp_path):
    p = every_path["torch-trim"]
    right = tmp_path / "right.py"
    right.write_text(script.render([script.Part(p.case, "torch-trim", p.backend)], script.Header("torch-trim")))
    ran = run_script(right)
    assert ran.returncode == 0 and ran.stdout.startswith("NOT REPRODUCED: right (") and "torch " in ran.stdout, \
        ran.stdout + ran.stderr
    p = every_path["planted-wide"]
    wrong = tmp_path / "wrong.py"
    wrong.write_text(script.render([script.Part(p.case, "planted-wide", p.backend)], script.Header("planted-wide")))
    ran = run_script(wrong)
    assert ran.returncode == 1 and ran.stdout.startswith("REPRODUCED: requests 0-1: rows "), ran.stdout + ran.stderr
    assert "worst: request " in ran.stdout and "expected [" in ran.stdout  # the worst row's values


def test_every_declared_and_known_bug_has_a_script():
    refs = {b.ref for b in bugs.catalogue()}
    assert {b.ref for b in upstream.declared() if not b.documented} <= refs
    assert not {b.ref for b in upstream.declared() if b.documented} & refs  # the caller's to meet: nothing to file
    known = {i.name for i in registry.all_implementations() if i.expected_to_fail}
    assert {name for name in known if not script.no_script(registry.get(name))} <= refs
    assert known - refs == {"xqa-window-off-by-one", "batch-attention-trim", "cudnn-graph-band-w",
                            "fa4-window-count", "fa3-window-count"}  # no script yet, and they say why
    assert "decode-cliff" in refs


def test_repro_bug_writes_the_smallest_case_where_it_shows(tmp_path):
    out = tmp_path / "bug.py"
    r = invoke("repro", "--bug", "planted-future", "--out", out)
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Made by: swabench repro --bug planted-future" in text and "What is wrong:" in text
    ran = run_script(out)
    assert ran.returncode == 1 and ran.stdout.startswith("REPRODUCED: "), ran.stdout + ran.stderr
    control = next(line for line in ran.stdout.splitlines() if line.startswith("CONTROL"))
    assert control.startswith("CONTROL, the keys each query's window holds, in PyTorch") and ": right (" in control
    assert invoke("repro", "--bug", "planted-future", "--out", out).exit_code == 2  # exists: --force replaces it


def test_the_non_causal_bug_names_its_rows():
    parts, where = bugs.parts(bugs.get("flashinfer#4972"), num_sms=132)
    assert parts[0].case.causal is False and "rows" in where and "132 SMs" in where


@pytest.mark.parametrize("args, says", [
    (["--bug", "flashinfer#9999"], "known: flashinfer#1679"),
    (["edges", "--case", "zzz", "--impl", "paged-window"], "--case: 'zzz' matches none"),
    (["edges", "--case", "0", "--impl", "paged-window"], "matches"),
    (["edges", "--case", "00399bdba598", "--impl", "nope"], "known: paged-window"),
    (["edges", "--case", "00399bdba598", "--impl", "decode-window"], "no point of decode-window"),
    (["edges", "--case", "00399bdba598", "--impl", "paged-window", "--backend", "cudnn"], "--backend"),
    (["--bug", "decode-cliff", "--impl", "paged-window"], "--bug takes no"),
    (["edges"], "give RUN or SCENARIO"),
    (["nope", "--case", "1", "--impl", "paged-window"], "nope"),
])
def test_bad_input_exits_2_naming_what_is_known(args, says):
    r = invoke("repro", *args)
    assert r.exit_code == 2 and says in r.output, r.output


def test_a_failed_points_line_prints_its_repro_command():
    import pandas as pd

    from swabench.publish.markdown import console_summary
    from swabench.publish.sections import Run, correctness

    table = pd.DataFrame([
        {"impl": "paged-window", "backend": "fa2", "status": "fail", "case": "verify b2", "case_id": "abc123",
         "reason": "random: rel-L2 0.5 > 0.01", "median_us": None},
        {"impl": "paged-trim", "backend": "fa2", "status": "pass", "case": "verify b2", "case_id": "abc123",
         "reason": "", "median_us": 3.0}])
    line = "swabench repro results/run --case abc123 --impl paged-window --backend fa2"
    assert f"      reproduce: {line}" in console_summary(table, folder="results/run").splitlines()
    assert "reproduce" not in console_summary(table)
    assert "median of medians (us)" in console_summary(table)
    assert "median of medians" not in console_summary(table.assign(median_us=None))  # a check times nothing
    rows = correctness._failed(Run("results/run", table, {}))  # the report's failed points
    assert list(rows["repro"]) == [f"`{line}`"]


@pytest.mark.gpu
@pytest.mark.parametrize("impl, wrong", [("paged-window", False), ("paged-trim", False), ("decode-tc-trim", False),
                                         ("paged-trim-causal", True), ("eagle-verify-untrimmed", True)])
def test_a_flashinfer_script_on_the_gpu_says_what_the_gate_says(every_path, tmp_path, impl, wrong):
    """The script, run on its own on the GPU, exits 1 exactly where the suite's gate fails the point."""
    pytest.importorskip("flashinfer")
    from swabench.core import gate
    from swabench.core import workloads as wl

    p = every_path[impl]
    path = tmp_path / f"{impl}.py"
    path.write_text(script.render([script.Part(p.case, impl, p.backend)], script.Header(impl)))
    ran = run_script(path)
    w = wl.build(p.case, "cuda")
    runner = registry.get(impl).make(w, p.backend)
    runner.plan()
    assert gate.check(runner, w).passed is not wrong
    assert ran.returncode == int(wrong), ran.stdout + ran.stderr
    assert ran.stdout.startswith("REPRODUCED: " if wrong else "NOT REPRODUCED: ") and "NVIDIA" in ran.stdout


@pytest.mark.slow
def test_each_committed_script_is_the_one_the_suite_writes_now():
    """repro/ holds the scripts the H200 ran, and scripts/repro_verdicts.py judges the parts make.for_bug gives:
    each committed script's code (its top comment aside, which carries what runs printed) must be what the suite
    writes now (the code scripts/repro_verdicts.py holds each run to), so a change to a script needs it written and
    run again."""
    from pathlib import Path

    from swabench.repro import issue

    scripts = sorted((Path(__file__).resolve().parent.parent / "repro").glob("*.py"))
    assert len(scripts) == 15
    for path in scripts:
        text, _ = make.for_bug(ref_of(path.stem))
        assert issue.script_code(path.read_text()) == issue.script_code(text), path.name


def test_a_torch_path_with_sinks_writes_its_infinities_and_runs(every_path, tmp_path):
    p = every_path["sink-window"]  # a sinks case: torch-trim writes the scores out, with -inf masks
    parts = [script.Part(p.case, "torch-trim", "torch")]
    text = script.render(parts, script.Header("torch-trim"))
    verify.check(parts, text)
    assert 'float("-inf")' in text
    path = tmp_path / "sinks.py"
    path.write_text(text)
    ran = run_script(path)
    assert ran.returncode == 0 and ran.stdout.startswith("NOT REPRODUCED: right"), ran.stdout + ran.stderr


@pytest.mark.parametrize("args, says", [
    ([f"{PUBLISHED}/h200-default-0.7.4", "--case", "376e7af4466d", "--impl", "paged-mask", "--backend", "fa3"],
     "the suite skips this point (fa3 has no custom-mask support)"),
    ([f"{PUBLISHED}/h200-ncu-decode-cliff-0.7.4", "--case", "0150d43178fd", "--impl", "ragged-window"],
     f"matches none of run {PUBLISHED}/h200-ncu-decode-cliff-0.7.4's 1 cases"),
])
def test_a_point_the_run_or_the_library_never_ran_has_no_script(args, says):
    r = invoke("repro", *args)
    assert r.exit_code == 2 and says in r.output, r.output


def test_a_runs_point_says_how_the_run_found_it():
    r = invoke("repro", f"{PUBLISHED}/h200-default-0.7.4", "--case", "575adaa4da7b", "--impl", "paged-window")
    head = r.output.split('"""')[1]
    assert r.exit_code == 0 and f"In {PUBLISHED}/h200-default-0.7.4: pass" in head and "What is wrong" not in head
    assert "It prints REPRODUCED or NOT REPRODUCED, the environment;" in " ".join(head.split())  # it has no control


def test_bug_scripts_come_from_the_shipped_scenarios_wherever_it_runs(tmp_path, monkeypatch):
    (tmp_path / "release").mkdir()  # a folder named like a searched scenario
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "edges.toml").write_text("not a scenario")
    monkeypatch.chdir(tmp_path)
    r = invoke("repro", "--bug", "planted-wide")
    assert r.exit_code == 0 and "Made by: swabench repro --bug planted-wide" in r.output, r.output


def test_a_script_never_replaces_the_scenario_it_reads(tmp_path, monkeypatch):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "mine.toml").write_text(textwrap.dedent(EVERY_PATH).replace('name = "repro-cpu"', 'name = "mine"'))
    monkeypatch.chdir(tmp_path)
    case = next(p.case.case_id for p in scenarios.load(folder / "mine.toml").points if p.impl == "torch-trim")
    before = (folder / "mine.toml").read_text()
    r = invoke("repro", "mine", "--case", case, "--impl", "torch-trim", "--out", "scenarios/mine.toml", "--force")
    assert r.exit_code == 2 and "which this command reads" in r.output, r.output
    assert (folder / "mine.toml").read_text() == before


def test_the_search_simulates_a_serving_sized_case_on_one_kv_head(monkeypatch):
    """chunk-as-window first shows at 32 requests of 8193 keys and 40 query heads: its check on random inputs builds
    the same requests on one KV head's group (a few MiB), not all 40 heads (some 2 GB and most of a minute)."""
    from swabench.inputs import axes

    big = axes.make_case(dict(mode="decode", batch_size=32, seq_len=8193, attention_chunk=8192, num_qo_heads=40,
                              num_kv_heads=8, head_dim=128, page_size=16))
    built = []

    class Built(Exception):
        pass

    def build(case, device):
        built.append(case)
        raise Built

    monkeypatch.setattr(workloads, "build", build)
    with pytest.raises(Built):
        bugs._shows_on_random(registry.get("chunk-as-window"), big, "fa2")
    assert (built[0].num_qo_heads, built[0].num_kv_heads) == (5, 1) and bugs._size(built[0]) <= bugs.SIMULATED
    assert workloads.request_lengths(built[0]) == workloads.request_lengths(big)
    small = axes.make_case(dict(mode="decode", batch_size=2, seq_len=65, attention_chunk=64, num_qo_heads=8,
                                num_kv_heads=2, head_dim=64, page_size=16))
    assert bugs.simulated(small) == small  # a small case is simulated as it is
