"""Reproducers a maintainer can file as they are: the call and shape in the library's terms at the top, whose fault
it is, a control beside the call, helpers cut to the case, the verdict first, and the issue body written from a
run's output."""

import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import invoke

from swabench.core import workloads
from swabench.errors import UserError
from swabench.inputs import scenarios
from swabench.repro import bugs, cliff, filings, issue, kit, make, script

ROOT = Path(__file__).resolve().parent.parent

QUICK = [b.ref for b in bugs.catalogue() if b.ref not in ("chunk-as-window", "vllm-tree-window", "decode-cliff")]
LOG = """REPRODUCED: request 0: rows 0-863 wrong (rel-L2 0.67, worst row 1.2; tolerances 0.01, 0.05)
worst: request 0 row 5, head 0, first values expected [0.1], got [0.9]
CONTROL, the same plan with disable_split_kv=True: right (rel-L2 0.002, worst row 0.004; tolerances 0.01, 0.05)
python 3.12.3, torch 2.11.0+cu130 (CUDA 13.0)
NVIDIA H200: compute capability 9.0, 132 SMs, driver 580.159.04
flashinfer-python 0.7.4
"""


def header(text: str) -> dict[str, str]:
    return issue._fields(text.split('"""')[1].splitlines()[2:])


@pytest.fixture(scope="module")
def written():
    return {ref: make.for_bug(ref) for ref in QUICK}


@pytest.mark.parametrize("ref", QUICK)
def test_each_script_says_its_call_shape_fault_and_control_first(written, ref):
    text, parts = written[ref]
    said = header(text)
    assert {"Call", "Shape", "Fault", "Control"} <= set(said), said
    assert said["Fault"].split(": ")[0] in filings.KINDS, said["Fault"]
    assert said["Call"].startswith(("flashinfer.", "torch")) or "Batch" in said["Call"] or ref.startswith("planted")
    lines = text.splitlines()
    first_call = next(i for i, line in enumerate(lines) if "def step(" in line or "wrapper.run(" in line)
    assert first_call < 100, f"{ref}: the call starts at line {first_call}"
    controls = [p for p in parts if p.role == "control"]
    bug = bugs.get(ref)
    if bug.filing.control or bug.filing.keywords:
        assert len(controls) == 1 and "CONTROL, " in text and said["Control"].startswith(controls[0].says)
    kit = [i for i, line in enumerate(lines) if line.startswith(("def make_inputs", "def reference", "def outcome"))]
    main = next(i for i, line in enumerate(lines) if line.startswith("def main("))
    assert not kit or main < min(kit)  # the call first, the kit below it


def test_the_non_causal_bug_is_controlled_by_the_same_plan_without_split_kv(written):
    text, parts = written["flashinfer#4972"]
    control = next(p for p in parts if p.role == "control")
    assert control.impl == parts[0].impl and control.plan_keywords == (("disable_split_kv", True),)
    assert "disable_split_kv=True" in header(text)["Control"]
    assert header(text)["Fault"].startswith("FlashInfer bug: ") and "flashinfer#4972" in header(text)["Fault"]
    main = text.split("def main(")[1].split("\ndef ")[0]
    assert main.count("flashinfer.BatchPrefillWithPagedKVCacheWrapper(") == 1  # the same wrapper, planned again
    assert 'for control in ({}, {"disable_split_kv": True}):' in main  # the bug's call and verdict first
    assert "**taken_by(wrapper.plan, uniform_q_len=" in main  # 0.6's plan() has no uniform_q_len


def test_a_recipe_is_controlled_by_the_correct_call_on_the_same_inputs(written):
    text, parts = written["sglang-extend-nomask"]
    control = next(p for p in parts if p.role == "control")
    assert control.impl == "sglang-extend" and control.case == parts[0].case
    assert text.count("torch.randn(") == 1  # one set of inputs, read by both calls
    assert header(text)["Fault"].startswith("SGLang bug: ")
    main = text.split("def main(")[1].split("\ndef ")[0]
    assert main.count("flashinfer.BatchPrefillWithRaggedKVCacheWrapper(") == 1  # the control plans it again


def test_one_screen_holds_only_what_the_case_runs(written):
    text, parts = written["paged-trim-causal"]
    assert len(parts[0].case.drawn("qo_len")) == 1  # one request
    body = text.split('"""', 2)[2]
    for gone in ("sinks", "tanh", "parents", "chunk", "slots", "CASE", "make_inputs"):
        assert gone not in body, gone
    ragged = scenarios.load(scenarios.shipped_dir() / "default.toml").cases
    case = script.case_literals(next(c for c in ragged if c.storage == "ragged"))
    cut = script.specialize(kit.make_inputs, case)
    assert "kv_indices" not in cut and "randperm" not in cut and "slots" in cut


@pytest.mark.parametrize("features", ["", "sinks = true", "logits_soft_cap = 30.0", 'page_layout = "evicted-reused"',
                                      "attention_chunk = 8", 'tree = "eagle:2:2"', "causal = false"])
def test_helpers_cut_to_a_case_compute_what_the_whole_ones_do(write_scenario, features):
    """Every kit function cut to a case gives the same tensors as the whole function on that case."""
    path = write_scenario(textwrap.dedent(f"""
        name = "cut"
        description = "cut"
        implementations = ["torch-trim"]
        [fixed]
        num_qo_heads = 4
        num_kv_heads = 2
        head_dim = 64
        dtype = "bfloat16"
        batch_size = 2
        [[sweep]]
        mode = "verify"
        draft_tokens = 5
        prefix_len = [9, 30]
        {"" if "chunk" in features else "window_left = 6"}
        page_size = 4
        {features}
        """))
    for c in scenarios.load(path).cases:
        case = script.case_literals(c)
        names = {"torch": torch}
        for f in (kit.evict_pages, kit.make_inputs, kit.seen, kit.reference):
            exec(script.specialize(f, case), names)
        whole, cut = kit.make_inputs(case, "cpu"), names["make_inputs"](case, "cpu")
        assert all(torch.equal(whole[k].float(), cut[k].float()) for k in ("q", "k_cache", "v_cache", "slots"))
        assert torch.equal(kit.reference(case, whole), names["reference"](case, cut))
        assert torch.equal(workloads.build(c, "cpu").q.float(), cut["q"].float())


def test_wrong_rows_says_each_request_and_groups_neighbours():
    case = {"qo_lens": [4, 4, 4, 3]}
    bad = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    assert kit.wrong_rows(case, bad) == "requests 0-1: rows 0-1 wrong; request 3: rows 1-2 wrong"
    assert kit.wrong_rows(case, torch.zeros(15, dtype=torch.bool)) == "no row past the row tolerance"


def test_a_call_that_crashes_is_reproduced_as_a_crash():
    case = {"qo_lens": [2]}

    def crash():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    wrong, what, _ = kit.outcome(case, {}, crash, torch.zeros(2, 1, 1), {"rel_l2": 0.01, "row_rel_l2": 0.05})
    assert wrong and what == "crash: CUDA error: an illegal memory access was encountered"


def test_an_observed_run_goes_into_the_header_and_the_issue_body(tmp_path):
    log = tmp_path / "0.7.4.log"
    log.write_text(LOG)
    out = tmp_path / "flashinfer-4972.py"
    r = invoke("repro", "--bug", "flashinfer#4972", "--out", out, "--observed", log, "--issue")
    assert r.exit_code == 0, r.output
    said = header(out.read_text())
    assert said["Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs)"].startswith("REPRODUCED: request 0: rows 0-863")
    body = out.with_suffix(".md").read_text()
    first, facts = body.split("\n\n")[:2]  # a comment on flashinfer#4972: the title, where it shows, the facts
    assert first.startswith("BatchPrefillWithPagedKVCacheWrapper (fa2), causal=False, window_left: split-KV tiles")
    assert "Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): `REPRODUCED: request 0: rows 0-863 wrong" in first
    assert "`CONTROL, the same plan with disable_split_kv=True: right" in first
    assert facts.splitlines() == [
        "- **First appears in:** FlashInfer 0.4.0: flashinfer#1661 sized fa2's split-KV chunks by the window (the "
        "effective KV length of PrefillSplitQOKVIndptr in scheduler.cuh).",
        "- **What to do today:** plan(disable_split_kv=True), which keeps each request in one KV chunk, is right on "
        "the same inputs (the control).",
        "- **What would close it:** flashinfer#4992 (open), which covers each tile's whole KV span under split-KV: "
        "this script is its check."]
    # the script's code whole, its Observed line said once above; the run's other lines and its environment below
    assert body.count("<details>") == 2 and issue.script_code(out.read_text()) in body
    assert body.count("REPRODUCED: request 0: rows 0-863") == 1
    assert "```\n" + "\n".join(LOG.splitlines()[1:2] + LOG.splitlines()[3:]) + "\n```" in body


def test_an_issue_says_whose_fault_and_what_it_asks_and_quotes_the_suites_rows(tmp_path):
    published_run = Path(__file__).parent / "fixtures" / "published" / "measured" / "h200-tree-0.7.4"
    out = tmp_path / "tree-sink-mask.py"
    assert invoke("repro", "--bug", "tree-sink-mask", "--out", out, "--issue").exit_code == 0
    body = out.with_suffix(".md").read_text()
    assert body.startswith("# BatchAttentionWithAttentionSinkWrapper.plan(custom_mask=...) ignores the mask\n\nThe "
                           "sink wrapper's __init__ takes custom_mask_buf")  # the party goes without saying
    assert "- **What would close it:** Support custom_mask in the sink variant, or raise in plan() when it is given." \
        in body
    assert "Not yet run on a GPU." in body
    script = (tmp_path / "tree-sink-mask.py").read_text()  # a chain inside the window: the window plays no part
    assert "window_left=-1" in script and "window_left=127" not in script and "; sinks; bfloat16" in script
    out = tmp_path / "sglang-verify-tree.py"
    r = invoke("repro", "--bug", "sglang-verify-tree", "--out", out, "--issue", "--measured", published_run)
    assert r.exit_code == 0, r.output
    body = out.with_suffix(".md").read_text()
    assert body.startswith("SGLang's EAGLE target verify on an SWA layer") and "sglang#39287: the table" in body
    lead = next(line for line in body.splitlines() if line.startswith("The same call measured at other shapes"))
    assert "backend fa2; model gemma-3-27b; batch 8;" in lead and "heads (query/KV) 32/16; head_dim 128" in lead
    rows = [line for line in body.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8  # SGLang serves it on Gemma alone, whose model the sentence names once
    contexts = [int(line.split(" | ")[0].lstrip("| ")) for line in rows]
    assert contexts == sorted(contexts) and "| chain of 7; tree of 7 nodes, depth 2 |" in rows[0]  # inside first
    assert "| 8208 | chain of 16; tree of 16 nodes, depth 3 | 128 of 128 | 1.41 |" in body  # past the window
    assert "| 80 | chain of 16; tree of 16 nodes, depth 3 | 0 of 128 |" in body  # inside it


def test_a_performance_request_quotes_the_bytes_each_call_read_against_the_window():
    """At the run's own case: each call's bytes against the window's; the cliff's body quotes only the case its script
    times, so a run counted at another shape is refused, naming the script's case."""
    from swabench.inputs import scenarios
    from swabench.repro import measured

    run = Path(__file__).parent / "fixtures" / "published" / "results" / "h200-ncu-decode-cliff-0.7.4"
    paths = {impl: said for impl, _, said in cliff.CALLS}
    case = measured.rows([run], paths)[0]["case"]  # the one case the run counted
    lead, _, head, _, *lines = measured.table(measured.rows([run], paths, case), one_case=True)
    assert head == "| call | backend | DRAM bytes read | of the window's |"
    rows = {" ".join(line.split(" | ")[:2]).lstrip("| "): line for line in lines}
    assert set(rows) == {"full table, CUDA cores fa2", "trimmed table, CUDA cores fa2",
                         "full table, tensor cores fa2", "full table, tensor cores fa3"}
    times = {name: float(line.split(" | ")[-1].rstrip("x |")) for name, line in rows.items()}  # of the window's bytes
    assert times["full table, CUDA cores fa2"] > 100 > 2 > times["full table, tensor cores fa2"]
    assert lead.startswith("The same calls counted by Nsight Compute at this shape (on every line: batch 32; kv_len "
                           "32769; queries 1 token; window_left 127; page_size 16;")
    script_case = bugs.parts(bugs.get("decode-cliff"))[0][0].case
    with pytest.raises(UserError, match=f"on the script's case {re.escape(script_case.label)} \\(ff3e53fd367d\\)"):
        make.measured_table("decode-cliff", [run])


def test_measured_rows_come_from_a_run_that_holds_the_bugs_path(tmp_path):
    empty = Path(__file__).parent / "fixtures" / "published" / "results" / "h200-noncausal-0.7.4"
    r = invoke("repro", "--bug", "sglang-verify-tree", "--out", tmp_path / "s.py", "--issue", "--measured", empty)
    assert r.exit_code == 2 and "no gated point of the call" not in r.output and not (tmp_path / "s.py").exists()
    assert "no gated point of sglang-verify-tree that it serves now" in r.output
    r = invoke("repro", "--bug", "sglang-verify-tree", "--out", tmp_path / "s.py", "--measured", empty)
    assert r.exit_code == 2 and "--measured goes with --issue" in r.output


def test_flashinfer_s_own_report_names_the_release_and_the_gpu(tmp_path):
    log = tmp_path / "collect_env.log"
    log.write_text("REPRODUCED: request 0: rows 0-863 wrong\nCONTROL, disable_split_kv=True: right\n"
                   "flashinfer                   : 0.7.2.post1\n"
                   "GPU 0 (CUDA order)   : NVIDIA H200 | SM90 | 132 SMs | 139.8 GiB\n")
    seen = issue.read(log)
    assert seen.where == "flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs)"
    assert seen.control == "CONTROL, disable_split_kv=True: right"


@pytest.mark.parametrize("args, says", [
    (["--bug", "flashinfer#4972", "--observed", "{log}"], "no line starts with REPRODUCED"),
    (["--bug", "flashinfer#4972", "--issue"], "--issue writes FILE.md beside the script: give --out FILE"),
    (["repro-cpu", "--case", "x", "--impl", "paged-window", "--issue"], "--observed and --issue go with --bug"),
])
def test_bad_filing_input_exits_2(tmp_path, args, says):
    log = tmp_path / "empty.log"
    log.write_text("torch 2.11\n")
    r = invoke("repro", *[a.format(log=log) for a in args])
    assert r.exit_code == 2 and says in r.output, r.output


def test_the_non_causal_script_is_one_request_written_out_on_one_screen(written):
    """#4972's script is a comment on its upstream issue: one screen, its numbers in main() with a one-request
    reference, the verdict and FlashInfer's own environment report; no CASE, no general helper."""
    text, _ = written["flashinfer#4972"]
    lines = text.splitlines()
    assert len(lines) <= 80 and max(map(len, lines)) <= 118
    assert next(i for i, line in enumerate(lines) if "wrapper.plan(" in line) < 50
    assert "CASE" not in text and "def make_inputs" not in text and "flashinfer.collect_env" in text
    assert [name for name in re.findall(r"^def (\w+)", text, re.M)] == ["main", "outcome", "taken_by"]


def test_the_non_causal_script_s_reference_and_verdict_are_the_suite_s(written, monkeypatch):
    from swabench.repro import bugs as bugs_mod

    from swabench.repro import standin

    text, parts = written["flashinfer#4972"]
    ns = {"__name__": "t"}
    with standin.installed(lambda *call: None):
        exec(compile(text, "<brief>", "exec"), ns)
    literals = script.case_literals(parts[0].case)
    x = kit.make_inputs(literals, torch.device("cpu"))
    outcome, handed = ns["outcome"], []
    ns.update(outcome=lambda step, out, expected: handed.append(expected) or (False, ""),
              subprocess=type("Stub", (), {"run": staticmethod(lambda *a, **k: type("R", (), {"stdout": ""}))}))
    with standin.installed(lambda *call: None):
        assert ns["main"]("cpu") == 0
    assert len(handed) == 2 and torch.equal(handed[0], handed[1])  # the call and its control, one reference
    expected = handed[0]
    assert torch.allclose(expected, kit.reference(literals, x), atol=1e-6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    out = expected.to(torch.bfloat16)
    right = outcome(lambda: out.copy_(expected), out, expected)
    assert not right[0] and right[1].startswith("every row right (rel-L2 ")
    wrong = expected.clone()
    wrong[[3, 4, 5, 9]] += 1.0
    said = outcome(lambda: out.copy_(wrong), out, expected)
    assert said[0] and said[1].startswith(f"4 of {len(expected)} rows wrong, 3-9 (rel-L2 ")
    defaults = {k: v.default for k, v in inspect.signature(outcome).parameters.items() if v.default is not v.empty}
    for given in (expected, wrong, expected * 1.03):  # right, rows wrong, wrong overall but in no one row
        wrong_, what, _ = kit.outcome(literals, x, lambda: out.copy_(given), out, defaults)
        assert outcome(lambda: out.copy_(given), out, expected)[0] == wrong_, what

    def crash():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
    assert outcome(crash, out, expected) == (True, "crash: CUDA error: an illegal memory access was encountered")
    assert bugs_mod.get("flashinfer#4972").impl == parts[0].impl


@pytest.mark.parametrize("kernel, says, exits", [
    (lambda reference: reference, "DOCUMENTATION GAP: row-anchored and depth-anchored windows differ on rows 2-15 "
                                  "(14 of 16); the call against the row-anchored one: every row right (", 0),
    (lambda reference: reference + (torch.arange(len(reference)) < 2)[:, None, None],
     "REPRODUCED: row-anchored and depth-anchored windows differ on rows 2-15 (14 of 16); the call against the "
     "row-anchored one: 2 of 16 rows wrong, 0-1 (", 1)])
def test_the_docs_gap_script_exits_0_where_the_call_is_the_window_by_design(written, monkeypatch, capsys, kernel, says,
                                                                            exits):
    """tree-window-slot is no kernel bug: its script holds the call to the window counted from each query's row (what
    the kernel computes by design, variants.cuh:89) and names the rows where that window and the window by depth
    differ, exiting 0; a call that is not the designed window either (rows 0-1 wrong, where the two agree) exits 1.
    Run on the stand-in, the kernel's output written as ``kernel`` makes it from the reference the call is held to."""
    from swabench.repro import standin

    text, _ = written["tree-window-slot"]
    assert header(text)["Fault"].startswith("FlashInfer docs gap: ")
    assert "as designed, which differs from the window by depth on rows 2-15 (14 of 16)" in header(text)["Expected"]
    ns = {"__name__": "t"}
    with standin.installed(lambda *call: None):
        exec(compile(text, "<gap>", "exec"), ns)
    real, held = ns["outcome"], []

    def outcome(step, out, reference):  # the call, then the control: each writes what the kernel would
        held.append(reference)
        answer = kernel(reference) if len(held) == 1 else reference
        return real(lambda: (step(), out.copy_(answer)), out, reference)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    ns.update(outcome=outcome, subprocess=type("Stub", (), {"run": staticmethod(lambda *a, **k: type("R", (), {
        "stdout": ""}))}))
    with standin.installed(lambda *call: None):
        assert ns["main"]("cpu") == exits
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(says) and printed[1].startswith("CONTROL, the window by tree depth"), printed
    assert len(held) == 2 and not torch.allclose(held[0], held[1], atol=0.05)  # by row, then by depth: not the same


def test_the_suite_passes_a_docs_gap_s_call_where_its_wrong_rows_are_the_ones_its_rule_predicts(written):
    """scripts/repro_verdicts.py's side of the docs gap: the call computing the window from each row (what its path
    declares) is as designed, though the gate finds its rows wrong against the window by depth; a call computing the
    window by depth is not (no row differs where 14 should); and the control is gated as any other part."""
    import importlib.util

    from swabench.core import workloads
    from swabench.impls import registry
    from swabench.impls.embedded import as_predicted

    spec = importlib.util.spec_from_file_location("repro_verdicts", ROOT / "scripts" / "repro_verdicts.py")
    verdicts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verdicts)
    _, parts = written["tree-window-slot"]
    call, control = parts
    w = workloads.build(call.case, "cpu")
    by_row, by_depth = (as_predicted(registry.get(p.impl), w, p.backend) for p in (call, control))
    assert verdicts.gated(by_row, w, call, designed=True) == \
        (True, "14 rows differ from the window by depth, as its declared rule predicts")
    assert verdicts.gated(by_depth, w, call, designed=True) == \
        (False, "0 rows differ from the window by depth, not as its declared rule predicts")
    assert verdicts.gated(by_depth, w, control) == (True, "") and not verdicts.gated(by_row, w, call)[0]


@pytest.mark.parametrize("old,new", [("window_left=$w,", "window_left=$w - 1,"),
                                     ('{"disable_split_kv": True}', "{}"),
                                     ("$drawn", "$drawn\n    q.neg_()")])
def test_the_non_causal_script_that_drifts_from_the_suite_is_caught(written, monkeypatch, old, new):
    from string import Template

    from swabench.repro import brief, verify

    _, parts = written["flashinfer#4972"]
    assert old in brief.MAIN.template
    monkeypatch.setattr(brief, "MAIN", Template(brief.MAIN.template.replace(old, new, 1)))
    with pytest.raises(verify.Drift):
        brief.check(parts, script.Header("t"))


def test_releases_that_printed_the_same_verdict_on_one_gpu_are_said_once():
    seen = [issue.Observed("flashinfer 0.7.4, NVIDIA H200 (132 SMs)", "REPRODUCED: rows 0-3", "", ""),
            issue.Observed("flashinfer 0.7.2.post1, NVIDIA H200 (132 SMs)", "REPRODUCED: rows 0-3", "", ""),
            issue.Observed("flashinfer 0.7.0.post1, NVIDIA H200 (132 SMs)", "NOT REPRODUCED: right", "", "")]
    assert make.observed_lines(seen) == [
        "Observed on flashinfer 0.7.4 and 0.7.2.post1, NVIDIA H200 (132 SMs): REPRODUCED: rows 0-3",
        "Observed on flashinfer 0.7.0.post1, NVIDIA H200 (132 SMs): NOT REPRODUCED: right"]
    unnamed = [issue.Observed(where, "REPRODUCED: x", "", "") for where in
               ("NVIDIA H200 (132 SMs)", "an unnamed machine", "flashinfer 0.7.4")]
    assert make.observed_lines(unnamed) == ["Observed on NVIDIA H200 (132 SMs): REPRODUCED: x",
                                            "Observed on an unnamed machine: REPRODUCED: x",
                                            "Observed on flashinfer 0.7.4: REPRODUCED: x"]


# what each line a filing cites holds in the release's wheel, a range by both its ends: a line that moves no longer
# holds it
CITED = {"include/flashinfer/attention/persistent.cuh:66": "indices[page_iter]",
         "include/flashinfer/page.cuh:199": "get_elem_offset",
         "include/flashinfer/attention/decode.cuh:438": "kv_len = paged_kv.get_length",
         "include/flashinfer/attention/decode.cuh:442": "kv_len) : kv_len",
         "include/flashinfer/attention/decode.cuh:539": "iter < ceil_div(chunk_size",
         "include/flashinfer/attention/decode.cuh:97": "variant.LogitsMask",
         "include/flashinfer/attention/decode.cuh:99": "&& mask) ? s[j] : -math::inf",
         "include/flashinfer/attention/prefill.cuh:4379": "kv_start_idx = sub_if_greater_or_zero",
         "flashinfer/prefill.py:4744": "sinks : Optional",
         "flashinfer/prefill.py:4748": "[num_qo_heads]",
         "flashinfer/prefill.py:867": "sinks=sinks",
         "flashinfer/prefill.py:878": 'elif backend == "fa2"',
         "flashinfer/prefill.py:918": ")",
         "flashinfer/prefill.py:919": "else:",
         "flashinfer/prefill.py:975": ")",
         "flashinfer/prefill.py:5244": 'if self._backend != "trtllm-gen"',
         "flashinfer/prefill.py:3690": "window_left : int",
         "flashinfer/prefill.py:4263": "window_left >= 0,  # use_sliding_window",
         "include/flashinfer/attention/variants.cuh:89": "kv_idx + qo_len + window_left >= kv_len + qo_idx",
         "flashinfer/prefill.py:5112": "_custom_mask_buf",
         "flashinfer/jit/attention/variants.py:34": "REGISTER_LOGITS_MASK",
         "flashinfer/jit/attention/variants.py:36": "})",
         "include/flashinfer/attention/variants.cuh:80": "use_custom_mask",
         "include/flashinfer/attention/variants.cuh:85": "custom_mask_ptr",
         "flashinfer/attention/_core.py:418": "custom_mask_buf: Optional",
         "flashinfer/attention/_core.py:419": "mask_indptr_buf: Optional",
         "flashinfer/attention/_core.py:478": "custom_mask_buf is not None",
         "flashinfer/attention/_core.py:517": "use_custom_mask,",
         "flashinfer/decode.py:1426": "use_tensor_cores: bool = False",
         "include/flashinfer/attention/scheduler.cuh:512": "inline cudaError_t DecodePlan(",
         "include/flashinfer/attention/scheduler.cuh:517": "WorkEstimationFunc work_estimation_func) {",
         "flashinfer/prefill.py:4603": "self._window_left = window_left",
         "flashinfer/prefill.py:4987": "assert window_left == self._window_left",
         "include/flashinfer/attention/pod.cuh:354": "uint32_t max_num_kv_chunks =",
         "include/flashinfer/attention/pod.cuh:376": "prefill_params.partition_kv = num_chunks;"}


def test_every_file_and_line_a_filing_cites_is_written_in_full_and_listed_with_what_it_holds():
    import re

    from swabench.repro import filings

    texts = [text for f in filings.FILINGS.values()
             for text in (f.fault, f.ask, f.workaround, f.origin, f.affected, f.note)]
    cited = {f"{path}:{line}" for text in texts for path, *lines in filings.CITES.findall(text) for line in lines
             if line}
    assert cited == set(CITED), cited ^ set(CITED)
    rest = [filings.CITES.sub("", text) for text in texts]  # what no full citation covers
    assert not [m for text in rest for m in re.findall(r"\w\.(?:cuh|cu|py|h):\d+|\(\d+(?:-\d+)?\)", text)]


def test_each_cited_line_holds_what_the_filing_says_in_the_release_it_was_read_in():
    """Where FlashInfer imports (a GPU node, or a wheel unpacked on PYTHONPATH) at the release the faults were read
    in: each cited line holds its token, in the package (flashinfer/...) or its data (include/, csrc/)."""
    from pathlib import Path

    from swabench.repro import filings

    flashinfer = pytest.importorskip("flashinfer")
    if flashinfer.__version__ != filings.SOURCE_RELEASE:
        pytest.skip(f"the faults cite flashinfer {filings.SOURCE_RELEASE}'s lines; {flashinfer.__version__} is here")
    package = Path(flashinfer.__file__).parent
    for cite, token in CITED.items():
        path, line = cite.rsplit(":", 1)
        file = package.parent / path if path.startswith("flashinfer/") else package / "data" / path
        assert token in file.read_text().splitlines()[int(line) - 1], f"{cite} no longer holds {token!r}"


BODY_BYTES = 8 * 1024  # a body to file, read whole: one script, its facts and one environment


def test_each_committed_body_holds_its_own_script_as_committed():
    """Its code whole, and its top comment's title, call and shape (the rest the body says itself)."""
    bodies = sorted((ROOT / "repro").glob("*.md"))
    assert len(bodies) == 7
    for body in bodies:
        text, script = body.read_text(), body.with_suffix(".py").read_text()
        title, _, *fields = script.split('"""')[1].splitlines()
        shown = [title] + [line for line in fields if line.startswith(("Call: ", "Shape: "))]
        assert f"<summary>{body.stem}.py: " in text and issue.script_code(script) in text, body.name
        assert len(shown) == 3 and all(line in text for line in shown), body.name


def environment_dumps(body: str) -> int:
    """How many environments a body quotes: each names its GPU once (FlashInfer's report, or a script's own line)."""
    return sum(bool(issue.GPU_LINE.match(line)) for line in body.splitlines())


@pytest.mark.parametrize("body", sorted((ROOT / "repro").glob("*.md")), ids=lambda p: p.stem)
def test_each_committed_body_fits_8_kib_with_one_environment_a_workaround_and_the_first_release(body):
    text = body.read_text()
    facts = [line for line in text.splitlines() if line.startswith("- **")]
    assert len(text.encode()) <= BODY_BYTES, f"{body.name}: {len(text.encode())} bytes"
    assert environment_dumps(text) == (0 if "Not yet run on a GPU." in text else 1), body.name
    assert sum(line.startswith("- **What to do today:** ") for line in facts) == 1, body.name
    assert sum(line.startswith("- **What would close it:** ") for line in facts) == 1, body.name
    first = [line for line in facts if line.startswith("- **First appears in:** ")]
    assert len(first) == 1 and re.search(r"FlashInfer \d+\.\d+\.\d+: flashinfer#\d+|[Nn]ot confirmed", first[0]), first


def current_folders() -> list[Path]:
    """The node's folders that hold a run of some committed script as it is now: the GPU and releases of its last
    runs."""
    from swabench.repro import committed

    digests = {ref: issue.script_digest(path.read_text()) for ref, path in committed(ROOT / "repro").items()}
    return [v.parent for v in sorted((ROOT / "repro").glob("*/verdicts.json"))
            if any(r.get("script_digest") == digests.get(r["ref"]) for r in json.loads(v.read_text()))]


@pytest.mark.parametrize("body", sorted((ROOT / "repro").glob("*.md")), ids=lambda p: p.stem)
def test_a_body_quoting_every_run_of_its_script_still_fits_and_quotes_one_environment(body):
    """The committed script with every log the node's last folders hold of it (of this form or, for a script changed
    since, the one before: the sizes are alike): one environment, the other runs a sentence each, within 8 KiB."""
    from swabench.repro import ref_of

    logs = [folder / f"{body.stem}.log" for folder in current_folders() if (folder / f"{body.stem}.log").exists()]
    seen, ref = [issue.read(log) for log in logs], ref_of(body.stem)
    table = make.measured_table(ref, [str(ROOT / run) for run in publish_script().MEASURED.get(body.stem, [])])
    text = make.issue_body(ref, body.with_suffix(".py").read_text(), f"{body.stem}.py", seen, table)
    assert len(logs) >= 2 and len(text.encode()) <= BODY_BYTES, f"{body.name}: {len(text.encode())} bytes"
    assert environment_dumps(text) == 1
    others = [line for line in text.splitlines() if line.startswith("On flashinfer ")]
    comment = bool(bugs.get(ref).filing.comment_on or "/issues/" in bugs.get(ref).url)
    assert len(others) == (0 if comment else len(logs) - 1), others  # a comment quotes one run
    assert all("; the environment the same but for `flashinfer : " in line for line in others), others


def test_the_other_runs_are_said_once_each_with_what_differs():
    env = ("### FlashInfer environment report\nflashinfer                   : {v}\nflashinfer commit            : {c}\n"
           "flashinfer file              : /tmp/site/flashinfer/__init__.py\n"
           "GPU 0 (CUDA order)   : NVIDIA H100 80GB HBM3 | SM90 | 132 SMs | 79.2 GiB\n"
           "torch                          : 2.11.0+cu130\nnumpy                  : 2.5.2\n")
    printed = "REPRODUCED: 3 of 8 rows wrong, 0-2 (rel-L2 0.3)\nfull: {t} us a call\n"
    seen = [issue.Observed(f"flashinfer {v}, NVIDIA H100 80GB HBM3 (132 SMs)", "REPRODUCED: 3 of 8 rows wrong, 0-2 "
                           "(rel-L2 0.3)", "", printed.format(t=t) + env.format(v=v, c=c))
            for v, c, t in (("0.7.2.post1", "beabf50", "12.5"), ("0.7.4", "7703905", "12.5"),
                            ("0.6.18", "8bc3b57", "9"))]
    lines = issue.outputs(seen)
    quoted = lines[lines.index("```") + 1].splitlines()
    assert quoted == ["full: 12.5 us a call", "flashinfer                   : 0.7.4",
                      "flashinfer commit            : 7703905",
                      "GPU 0 (CUDA order)   : NVIDIA H100 80GB HBM3 | SM90 | 132 SMs | 79.2 GiB",
                      "torch                          : 2.11.0+cu130"]  # 0.7.4's, the faults' release; no verdict
    assert lines[0] == ("<details><summary>its other output and its environment on flashinfer 0.7.4, NVIDIA H100 80GB "
                        "HBM3 (132 SMs): the environment in 4 of its 7 lines</summary>")
    assert "On flashinfer 0.7.2.post1 (the same GPU): the same lines; the environment the same but for `flashinfer : " \
           "0.7.2.post1`, `flashinfer commit : beabf50`." in lines
    assert "On flashinfer 0.6.18 (the same GPU): the same lines with their own numbers; the environment the same but " \
           "for `flashinfer : 0.6.18`, `flashinfer commit : 8bc3b57`." in lines
    assert issue.outputs(seen, one=True).count("```") == 2 and not any(line.startswith("On ") for line in
                                                                        issue.outputs(seen, one=True))


def publish_script():
    """scripts/repro_publish.py, loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("repro_publish", ROOT / "scripts" / "repro_publish.py")
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    return publish


def test_a_body_is_written_again_with_the_runs_of_its_own_script_only(tmp_path):
    """scripts/repro_publish.py: a release folder's log counts where its verdicts row recorded the digest of the
    script's code as the command writes it now; a row of an older form, a row that recorded none, or a row of another
    bug, does not."""
    publish = publish_script()
    script = tmp_path / "repro" / "flashinfer-4972.py"
    script.parent.mkdir()
    script.write_text((ROOT / "repro" / "flashinfer-4972.py").read_text())
    (tmp_path / "repro" / "flashinfer-4972.md").write_text("a body")
    digest = issue.script_digest(script.read_text())
    rows = {"h200-a": {"script_digest": digest}, "h200-b": {"script_digest": "0" * 16}, "h200-c": {},
            "h200-d": {"script_digest": digest, "ref": "tree-sink-mask"}}
    for folder, row in rows.items():
        (tmp_path / "repro" / folder).mkdir()
        (tmp_path / "repro" / folder / "verdicts.json").write_text(json.dumps([{"ref": "flashinfer#4972", **row}]))
        (tmp_path / "repro" / folder / "flashinfer-4972.log").write_text("REPRODUCED: x\n")
    assert publish.runs_of(script) == [tmp_path / "repro" / "h200-a" / "flashinfer-4972.log"]
    call = publish.command(script)
    assert call[call.index("--bug") + 1] == "flashinfer#4972" and call.count("--observed") == 1 and "--issue" in call
    script.write_text(script.read_text().replace("def main(", "def main_of_an_older_form("))  # code about to change
    assert publish.runs_of(script) == [] and publish.written(script) == digest  # the code it writes, not the file's
    assert publish.command(script, publish.written(script)).count("--observed") == 1
    script.with_suffix(".md").unlink()
    assert "--issue" not in publish.command(script) and "--measured" not in publish.command(script)
    for name, runs in publish.MEASURED.items():  # the runs a committed body quotes
        assert (ROOT / "repro" / f"{name}.md").exists() and all((ROOT / run / "meta.json").exists() for run in runs)
