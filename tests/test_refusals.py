"""Inputs a hostile user gives the newer commands: each is refused with exit 2 and a message naming what is wrong
(or, where the input is fine, handled), and nothing the command reads is lost.  One test a class of bug: a file
that is no findings page, an export-fib input inside its output or an output through a link, deep JSON in every
file a command reads, a folder or FIFO where import-fib reads a file, a zero median, a last page past its page
size, a trace's or a blob's mode that does not fit its steps, import-fib's paths, repeats, keys and page ids, price
with a wrong path or cut short, a sweep that skips everything, the messages, repro's progress, and scenario lists."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from conftest import invoke

from swabench.inputs import fib, traces

safetensors = pytest.importorskip("safetensors")
import safetensors.torch  # noqa: E402

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "h200-run"
GEMMA = {"model": "gemma-3-4b"}
STEPS = [{"mode": "decode", **GEMMA, "requests": [[1500, 1], [3, 1]], "count": 3},
         {"mode": "extend", **GEMMA, "requests": [[1100, 30], [200, 90]], "count": 7}]
DECODE = "gqa_paged_decode_swa_w1023_h8_kv4_d256_ps16"
PREFILL = "gqa_paged_prefill_swa_w1023_h8_kv4_d256_ps16"
PRICE_TRACE = ('{"mode": "decode", "model": "gemma-3-1b", "requests": [[700, 1], [900, 1]]}\n'
               '{"mode": "verify", "model": "gemma-3-1b", "requests": [[600, 4]]}\n')
DEEP = "[" * 100_000 + "]" * 100_000


def trace(path: Path, lines=STEPS) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def exported(tmp_path) -> Path:
    fib.export(trace(tmp_path / "t.jsonl"), tmp_path / "fib")
    return tmp_path / "fib"


def workload_file(root: Path, name: str) -> Path:
    return next((root / "workloads").rglob(f"{name}.jsonl"))


def import_fib(root, name, tmp_path):
    return invoke("import-fib", root, "--definition", name, "--model", "gemma-3-4b", "--out", tmp_path / "back.jsonl")


# ---------------------------------------------------------------- 1, 2, 4: what a command writes over

def test_findings_replaces_only_a_findings_page_unless_forced(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    refused = invoke("findings", FIXTURE_RUN, "--out", readme)
    assert refused.exit_code == 2 and "is not a findings page" in refused.output and "--force" in refused.output
    assert readme.read_text() == "# my notes\n"
    page = tmp_path / "FINDINGS.md"
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    again = invoke("findings", FIXTURE_RUN, "--out", page)  # its own page: replaced without --force
    assert again.exit_code == 0 and page.read_text().startswith("# Findings")
    assert invoke("findings", FIXTURE_RUN, "--out", readme, "--force").exit_code == 0


def test_export_fib_refuses_an_input_inside_its_output(tmp_path):
    out = exported(tmp_path)
    inside = out / "definitions" / "trace.jsonl"
    shutil.copy(tmp_path / "t.jsonl", inside)
    r = invoke("export-fib", inside, "--out", out, "--force")
    assert r.exit_code == 2 and "lies inside --out" in r.output and inside.exists(), r.output


def test_export_fib_writes_through_a_link_to_a_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    r = invoke("export-fib", trace(tmp_path / "t.jsonl"), "--out", tmp_path / "link")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "link").is_symlink() and (real / "definitions").is_dir()
    again = invoke("export-fib", tmp_path / "t.jsonl", "--out", tmp_path / "link", "--force")
    assert again.exit_code == 0 and (tmp_path / "link").is_symlink() and (real / "definitions").is_dir(), again.output


# ---------------------------------------------------------------- 3: deep JSON

@pytest.fixture
def deep_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    meta = (run / "meta.json").read_text()
    (run / "meta.json").write_text(meta.rstrip().rstrip("}") + f', "x": {DEEP}}}')
    return run


@pytest.mark.parametrize("args", [("compare", "{run}", str(FIXTURE_RUN)), ("findings", "{run}"), ("summary", "{run}"),
                                  ("report", "{run}", "--out", "{tmp}/report"), ("plot", "{run}", "--out", "{tmp}/p"),
                                  ("export-fib", "{run}", "--out", "{tmp}/fib"),
                                  ("repro", "{run}", "--case", "x", "--impl", "paged-window")])
def test_a_deeply_nested_meta_json_is_exit_2(tmp_path, deep_run, args):
    r = invoke(*[a.format(run=deep_run, tmp=tmp_path) for a in args])
    assert r.exit_code == 2 and "nested too deeply" in r.output, r.output


def test_a_deeply_nested_journal_line_is_exit_2_on_resume(tmp_path, write_scenario):
    from conftest import TINY

    path = write_scenario(TINY)
    out = tmp_path / "run"
    assert invoke("run", path, "--out", out, "--impl", "torch-trim").exit_code == 0
    with open(out / "rows.jsonl", "a") as f:
        f.write(DEEP + "\n{}\n")
    r = invoke("run", path, "--out", out, "--impl", "torch-trim", "--resume")
    assert r.exit_code == 2 and "nested too deeply" in r.output, r.output


@pytest.mark.parametrize("where", ["definition", "workload"])
def test_deeply_nested_fib_files_are_exit_2(tmp_path, where):
    root = exported(tmp_path)
    if where == "definition":
        next((root / "definitions").rglob(f"{DECODE}.json")).write_text(DEEP)
    else:
        workload_file(root, DECODE).write_text(DEEP + "\n")
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and "nested too deeply" in r.output, r.output


# ---------------------------------------------------------------- 5, 9, 12: import-fib's files

@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("which", ["definition", "workload"])
def test_import_fib_refuses_a_folder_or_fifo_where_a_file_should_be(tmp_path, kind, which):
    root = exported(tmp_path)
    path = next((root / "definitions").rglob(f"{DECODE}.json")) if which == "definition" else \
        workload_file(root, DECODE)
    path.unlink()
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    r = import_fib(root, DECODE, tmp_path)
    said = {"folder": "a folder", "fifo": "a FIFO"}[kind]
    assert r.exit_code == 2 and f"not a regular file but {said}" in r.output, r.output


def _edit_record(root: Path, name: str, change) -> None:
    path = workload_file(root, name)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_import_fib_refuses_a_blob_outside_its_folder(tmp_path):
    root = exported(tmp_path)
    outside = tmp_path / "outside.safetensors"
    first = json.loads(workload_file(root, DECODE).read_text().splitlines()[0])
    shutil.copy(root / first["workload"]["inputs"]["kv_indptr"]["path"], outside)
    for path in ("../outside.safetensors", str(outside)):
        _edit_record(root, DECODE, lambda rs: rs[0]["workload"]["inputs"]["kv_indptr"].update(path=path))
        r = import_fib(root, DECODE, tmp_path)
        assert r.exit_code == 2 and "lies outside" in r.output, r.output


def test_import_fib_refuses_a_workload_given_twice_and_a_key_given_twice(tmp_path):
    root = exported(tmp_path)
    _edit_record(root, DECODE, lambda rs: rs.append(rs[0]))
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and "was given at" in r.output and "count twice" in r.output, r.output
    _edit_record(root, DECODE, lambda rs: rs.pop())
    path = workload_file(root, DECODE)
    text = path.read_text().splitlines()
    path.write_text(text[0].replace('{"definition"', '{"definition": "x", "definition"', 1) + "\n")
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and "'definition' is given twice" in r.output, r.output


def _edit_tensor(root: Path, name: str, key: str, value) -> None:
    record = json.loads(workload_file(root, name).read_text().splitlines()[0])
    spec = record["workload"]["inputs"][key]
    blob = root / spec["path"]
    with safetensors.safe_open(blob, framework="pt") as f:
        metadata = f.metadata()
    tensors = safetensors.torch.load_file(blob)
    tensors[spec["tensor_key"]] = value(tensors[spec["tensor_key"]])
    safetensors.torch.save_file(tensors, blob, metadata=metadata)


@pytest.mark.parametrize("key,value,message", [
    ("kv_indices", lambda t: t - 10_000, "each >= 0"),
    ("kv_indices", lambda t: t[:-1], "wants as many page ids as it ends at"),
    ("kv_indptr", lambda t: t.float(), "not integers"),
])
def test_import_fib_refuses_page_ids_and_tables_that_are_no_table(tmp_path, key, value, message):
    root = exported(tmp_path)
    _edit_tensor(root, DECODE, key, value)
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and message in r.output, r.output


def test_import_fib_refuses_a_missing_kv_indices(tmp_path):
    root = exported(tmp_path)
    _edit_record(root, DECODE, lambda rs: rs[0]["workload"]["inputs"].pop("kv_indices"))
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and "workload.inputs.kv_indices: missing" in r.output, r.output


@pytest.mark.parametrize("value", ["abc", 1023.5])
def test_import_fib_names_a_window_of_the_wrong_type(tmp_path, value):
    root = exported(tmp_path)
    path = next((root / "definitions").rglob(f"{DECODE}.json"))
    doc = json.loads(path.read_text())
    doc["axes"]["window_left"]["value"] = value
    path.write_text(json.dumps(doc))
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and "axes.window_left" in r.output and "is not an integer" in r.output, r.output


@pytest.mark.parametrize("axis, value, said", [("window_left", [1], "axes.window_left: [1] is not an axis"),
                                               ("page_size", {"type": "const", "value": True},
                                                "axes.page_size: missing, or not a const integer axis")])
def test_import_fib_names_an_axis_that_is_no_axis(tmp_path, axis, value, said):
    """An axis given as a list would be passed over, and the preset's window taken in its place; a boolean page size
    would be read as 1."""
    root = exported(tmp_path)
    path = next((root / "definitions").rglob(f"{DECODE}.json"))
    doc = json.loads(path.read_text())
    doc["axes"][axis] = value
    path.write_text(json.dumps(doc))
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output


# ---------------------------------------------------------------- 8: a mode that does not fit its steps

def test_a_trace_line_said_verify_must_be_a_verify_step(tmp_path):
    bad = trace(tmp_path / "v.jsonl", [{"mode": "verify", "num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 128,
                                        "sliding_window": 4096, "requests": [[0, 2048], [6144, 512]]}])
    with pytest.raises(traces.TraceError, match="same size, at most 64 tokens; these have 512, 2048; give mode extend"):
        traces.read(bad)


@pytest.mark.parametrize("name,mode,message", [(DECODE, "extend", "but the definition is a decode definition"),
                                               (PREFILL, "verify", "metadata says mode verify, but a verify step")])
def test_import_fib_refuses_a_blob_mode_its_step_does_not_fit(tmp_path, name, mode, message):
    root = exported(tmp_path)
    for line in workload_file(root, name).read_text().splitlines():  # a step exported as extend or decode
        blob = root / json.loads(line)["workload"]["inputs"]["kv_indptr"]["path"]
        with safetensors.safe_open(blob, framework="pt") as f:
            meta = json.loads(f.metadata()[fib.META])
        if meta.get("mode", "extend") != "verify":
            break
    tensors = safetensors.torch.load_file(blob)
    safetensors.torch.save_file(tensors, blob, metadata={fib.META: json.dumps({**meta, "mode": mode})})
    r = import_fib(root, name, tmp_path)
    assert r.exit_code == 2 and message in r.output, r.output


# ---------------------------------------------------------------- 6: a zero median

def test_compare_cannot_judge_a_zero_median(tmp_path):
    from swabench.analysis import compare

    base = tmp_path / "base"
    shutil.copytree(FIXTURE_RUN, base)
    table = pd.read_csv(next(base.glob("results.csv*")))
    timed = table["median_us"].notna()
    assert timed.any()
    row = {"case_base": "c", "status_base": "pass", "status_new": "pass", "base_us": 0.0, "new_us": 14.5,
           "ratio": float("nan"), "noise_base": float("nan"), "noise_new": 0.0, "p": float("nan")}
    assert compare._verdict(row, 0.05, 0.01, "both") == "cannot judge"
    assert compare._verdict({**row, "new_us": float("nan")}, 0.05, 0.01, "both") == "same"  # untimed: by status


def test_a_table_with_a_zero_median_is_refused(tmp_path):
    from swabench.store import checks

    df = pd.DataFrame([{"case_id": "c", "impl": "torch-trim", "backend": "torch", "status": "pass", "median_us": 0.0}])
    with pytest.raises(ValueError, match=r"column median_us: 0 is not allowed \(a number > 0 where timed"):
        checks.table(df)


# ---------------------------------------------------------------- 7, 12: a plan's arguments

@pytest.mark.parametrize("change,message", [
    (dict(paged_kv_last_page_len=[99]), "last page holds 99 keys; a page of page_size 16 holds 1 to 16"),
    (dict(page_size=0), "page_size: 0 is not a page size"),
    (dict(window_left=-2), "window_left: -2 is no window"),
])
def test_a_plan_whose_table_or_window_is_no_such_thing_is_left_out_naming_it(change, message):
    import torch

    from swabench.inputs import plan_calls

    args = dict(qo_indptr=torch.tensor([0, 4]), paged_kv_indptr=torch.tensor([0, 44]),
                paged_kv_indices=torch.arange(44), paged_kv_last_page_len=torch.tensor([12]), num_qo_heads=8,
                num_kv_heads=2, head_dim_qk=128, page_size=16, causal=True, window_left=127,
                q_data_type=torch.bfloat16)
    line, why = plan_calls._line(plan_calls.PREFILL_PAGED, args, 1, plan_calls.VERIFY_MAX)
    assert line and why is None
    args.update({k: torch.tensor(v) if isinstance(v, list) else v for k, v in change.items()})
    with pytest.raises(ValueError, match=message):
        plan_calls._line(plan_calls.PREFILL_PAGED, args, 1, plan_calls.VERIFY_MAX)


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_an_inputs_pt_that_is_no_file_is_named_so(tmp_path, kind):
    from swabench.inputs import plan_calls

    (tmp_path / "inputs.pt").mkdir() if kind == "folder" else os.mkfifo(tmp_path / "inputs.pt")
    record = {"function": "BatchPrefillWithPagedKVCacheWrapper.plan", "arguments": {}, "metadata": {}}
    line, why = plan_calls.step(tmp_path, plan_calls.PREFILL_PAGED, record)
    assert line is None and why == "inputs.pt is not a regular file", why


# ---------------------------------------------------------------- 10, 11: price and an all-skip sweep

@pytest.mark.parametrize("impl", ["planted-wide", "paged-trim-causal"])
def test_price_refuses_a_path_that_is_not_correct(impl):
    r = invoke("price", "--model", "gemma-3-27b", "--impl", impl)
    assert r.exit_code == 2 and f"--impl {impl}" in r.output and "price weighs correct paths only" in r.output


def test_an_interrupted_price_writes_no_price_table(tmp_path, monkeypatch):
    from swabench.run import lifecycle

    real = lifecycle.execute

    def cut_short(request, progress):
        outcome = real(request, progress)
        return lifecycle.Outcome(outcome.folder, "interrupted", outcome.table.iloc[:1], 0.0, 0.0)

    monkeypatch.setattr(lifecycle, "execute", cut_short)
    trace = tmp_path / "t.jsonl"
    trace.write_text(PRICE_TRACE)
    r = invoke("price", "--model", "gemma-3-1b", trace, "--impl", "torch-trim", "--device", "cpu",
               "--out", tmp_path / "p")
    assert r.exit_code == 130 and "no price.csv until every step is weighed" in r.output, r.output
    assert not (tmp_path / "p" / "price.csv").exists()


def test_a_sweep_that_skips_every_point_says_why(tmp_path):
    r = invoke("check", "chunked", "--impl", "chunk-trim", "--out", tmp_path / "c")
    assert r.exit_code == 2 and "every one of 54 points skips here: flashinfer needs CUDA" in r.output, r.output
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- 12, 13, 14: messages, progress, scenario lists

def test_compare_names_a_device_its_meta_does_not_record(tmp_path):
    new = tmp_path / "new"
    shutil.copytree(FIXTURE_RUN, new)
    (new / "meta.json").write_text("{}")
    r = invoke("compare", FIXTURE_RUN, new)
    assert "a device its meta.json does not name" in r.output and "NEW on a CPU" not in r.output, r.output


def test_repro_shortens_a_long_case_and_says_when_the_folder_disagrees(tmp_path):
    r = invoke("repro", FIXTURE_RUN, "--case", "x" * 100_000, "--impl", "paged-window")
    assert r.exit_code == 2 and "(100000 characters)" in r.output and len(r.output) < 3000
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    (run / "scenario.toml").write_text('name = "other"\nimplementations = ["torch-trim"]\n[[sweep]]\nmode = "decode"\n'
                                       'prefix_len = 7\nwindow_left = 3\n')
    r = invoke("repro", run, "--case", "a", "--impl", "torch-trim")
    assert r.exit_code == 2 and "scenario and table disagree" in r.output, r.output


def test_repro_says_what_it_is_doing():
    r = invoke("repro", "--bug", "planted-wide")
    assert r.exit_code == 0 and "repro [" in r.output and "tracing planted-wide, torch-trim on the CPU" in r.output
    assert "checking the script against the suite" in r.output


def test_warmup_takes_a_case_some_of_its_scenarios_hold_and_a_run_folder():
    r = invoke("warmup", "quick", "cpu", "--case", "verify", "--list")
    assert r.exit_code == 0 and "module signatures" in r.output, r.output
    assert invoke("warmup", "quick", "cpu", "--case", "no-such-case", "--list").exit_code == 2
    shown = invoke("show", FIXTURE_RUN)
    assert shown.exit_code == 0 and "points (case x implementation x backend)" in shown.output, shown.output


def test_show_says_why_a_path_makes_no_point(tmp_path, write_scenario):
    path = write_scenario('name = "p"\ndescription = "x"\nimplementations = ["torch-trim", "paged-window"]\n'
                          '[fixed]\nmode = "verify"\ndraft_tokens = 4\nprefix_len = 40\nwindow_left = 7\n'
                          'wrapper_mode = "plain"\n')
    r = invoke("show", path)
    assert r.exit_code == 0 and "torch-trim" in r.output and "has no wrapper to build plain" in r.output, r.output


# ---- outputs: what a command may replace (issue classes 1-4, and repro's own body)

TINY_TORCH = """
name = "tiny-torch"
description = "two cases, one CPU path"
implementations = ["torch-trim"]
[fixed]
num_qo_heads = 4
num_kv_heads = 2
head_dim = 64
batch_size = 1
[[sweep]]
mode = ["verify", "draft_extend"]
draft_tokens = 4
prefix_len = 40
window_left = 3
"""


def _tree(folder: Path) -> dict:
    """Every file below ``folder`` and its bytes, and every folder, by relative path."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def test_findings_beside_another_findings_page_replaces_and_deletes_none_of_its_pages(tmp_path):
    page = tmp_path / "FINDINGS.md"
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    from swabench.publish import outputs

    theirs = tmp_path / "findings" / "gone-topic.md"  # a topic page of FINDINGS.md this run no longer fills
    made = page.read_text().split("\n## How this page was made\n")[1]  # how the page says it was made, at its end
    outputs.keep(theirs, "# Gone\n\nPart of [the findings](../FINDINGS.md): every number names the run folder it "
                 "comes from.\n\n## How this page was made\n" + made)
    before = _tree(tmp_path)
    refused = invoke("findings", FIXTURE_RUN, "--out", tmp_path / "MINE.md")
    assert refused.exit_code == 2 and "is a topic page of the findings page FINDINGS.md" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and _tree(tmp_path) == before
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0  # its own stale topic page goes
    assert not theirs.exists()


def test_a_findings_page_removes_only_its_own_stale_topic_pages(tmp_path):
    page = tmp_path / "FINDINGS.md"
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    other = tmp_path / "findings" / "other-topic.md"  # another page's topic, and a user's file
    other.write_text(page.read_text().split("\n", 1)[0] + "\n\n# Other\n\nPart of [the findings](../OTHER.md): x.\n")
    mine = tmp_path / "findings" / "notes.md"
    mine.write_text("# my notes\n")
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    assert other.exists() and mine.read_text() == "# my notes\n"


@pytest.mark.parametrize("command,name", [("report", "REPORT.md"), ("plot", "runs.png")])
def test_report_and_plot_replace_only_what_swabench_wrote(tmp_path, command, name, one_figure):
    from swabench.publish import plots

    out = tmp_path / "out"
    out.mkdir()
    name = name if name.endswith(".md") else plots.figure_files()[0]
    theirs = out / name
    theirs.write_bytes(b"# my own notes\n")
    refused = invoke(command, FIXTURE_RUN, "--out", out)
    assert refused.exit_code == 2 and "swabench did not write it" in refused.output and "--force" in refused.output
    assert theirs.read_bytes() == b"# my own notes\n" and sorted(p.name for p in out.iterdir()) == [name]
    assert invoke(command, FIXTURE_RUN, "--out", out, "--force").exit_code == 0
    assert theirs.read_bytes() != b"# my own notes\n"
    assert invoke(command, FIXTURE_RUN, "--out", out).exit_code == 0  # now its own: replaced without --force


def test_matrix_replaces_only_a_matrix_swabench_wrote(tmp_path):
    from test_matrix import three_releases

    runs, out = three_releases(tmp_path), tmp_path / "m"
    out.mkdir()
    (out / "matrix.csv").write_text("my,own\n1,2\n")
    refused = invoke("matrix", *runs, "--out", out)
    assert refused.exit_code == 2 and "matrix.csv exists and swabench did not write it" in refused.output
    assert (out / "matrix.csv").read_text() == "my,own\n1,2\n" and len(list(out.iterdir())) == 1
    assert invoke("matrix", *runs, "--out", out, "--force").exit_code == 0
    assert invoke("matrix", *runs, "--out", out).exit_code == 0


@pytest.mark.parametrize("args", [("run", "cpu"), ("check", "cpu"), ("report", FIXTURE_RUN), ("plot", FIXTURE_RUN),
                                  ("findings", FIXTURE_RUN), ("matrix", FIXTURE_RUN, FIXTURE_RUN),
                                  ("export-fib", "t.jsonl", "--force"), ("import-fib", "fib", "--definition", "d",
                                                                         "--model", "gemma-3-4b"),
                                  ("import", "dumps"), ("merge", "a", "b"), ("repro", "--bug", "decode-cliff")])
def test_an_empty_out_is_refused_not_taken_as_the_default_or_the_working_folder(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    trace(tmp_path / "t.jsonl")
    for folder in ("definitions", "dumps", "fib"):
        (tmp_path / folder).mkdir()
    (tmp_path / "definitions" / "mine.json").write_text("{}")
    before = _tree(tmp_path)
    r = invoke(*args, "--out", "") if args[0] != "merge" else invoke("merge", "", tmp_path)
    assert r.exit_code == 2 and "the path is empty" in r.output, r.output
    assert _tree(tmp_path) == before


def test_export_fib_never_replaces_a_folder_holding_a_file_it_did_not_write(tmp_path, monkeypatch):
    root = exported(tmp_path)
    mine = root / "definitions" / "mine.json"
    mine.write_text("{}")
    r = invoke("export-fib", tmp_path / "t.jsonl", "--out", root, "--force")
    assert r.exit_code == 2 and "holds definitions/mine.json, which export-fib did not write" in r.output
    assert mine.read_text() == "{}"
    mine.unlink()
    monkeypatch.chdir(root / "workloads")
    r = invoke("export-fib", tmp_path / "t.jsonl", "--out", root, "--force")
    assert r.exit_code == 2 and "holds the working folder" in r.output
    monkeypatch.chdir(tmp_path)
    assert invoke("export-fib", tmp_path / "t.jsonl", "--out", root, "--force").exit_code == 0


@pytest.mark.parametrize("name", ["rows.jsonl", "results.csv", "meta.json", ".swabench.lock"])
def test_resume_refuses_a_run_folder_file_that_is_a_link_before_any_point(tmp_path, write_scenario, name):
    scenario = write_scenario(TINY_TORCH)
    out = tmp_path / "run"
    assert invoke("run", scenario, "--out", out, "--device", "cpu", "--case", "verify").exit_code == 0
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    os.replace(out / name, tmp_path / "moved") if (out / name).exists() else None
    (out / name).symlink_to(precious)
    r = invoke("run", scenario, "--out", out, "--device", "cpu", "--resume")
    assert r.exit_code == 2 and f"{name} is a symbolic link" in r.output, r.output
    assert precious.read_text() == "precious\n"


def test_repro_never_writes_its_issue_body_over_the_log_it_reads(tmp_path):
    log = tmp_path / "s.md"
    log.write_text(REPRODUCER_LOG)
    r = invoke("repro", "--bug", "paged-plan-no-window", "--out", tmp_path / "s.py", "--issue", "--observed", log,
               "--force")
    assert r.exit_code == 2 and "which this command reads" in r.output and log.read_text() == REPRODUCER_LOG


@pytest.mark.parametrize("args", [("run",), ("show",), ("check",), ("warmup",), ("export-fib",), ("import-fib",),
                                  ("repro",), ("replay",)])
def test_an_empty_scenario_trace_or_folder_argument_is_refused(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    r = invoke(*args, "")
    assert r.exit_code == 2 and "the path is empty" in r.output and not any(tmp_path.iterdir()), r.output


@pytest.mark.parametrize("change,said", [({"gpu": ["a"]}, 'key gpu: ["a"] is not allowed'),
                                         ({"peaks": {"copy_tbps": [1], "bf16_matmul_tflops": 5}},
                                          "key peaks.copy_tbps: [1] is not allowed"),
                                         ({"peaks": {"copy_tbps": 4.1}}, "key peaks: holds no bf16_matmul_tflops")])
def test_a_meta_json_the_migration_would_trip_on_is_refused_naming_the_key(tmp_path, change, said):
    run = shutil.copytree(FIXTURE_RUN, tmp_path / "run")
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, **change}))
    r = invoke("summary", run)
    assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_repro_refuses_an_issue_body_on_its_own_script(tmp_path):
    r = invoke("repro", "--bug", "paged-plan-no-window", "--out", tmp_path / "same.md", "--issue")
    assert r.exit_code == 2 and "the script's own path" in r.output and not (tmp_path / "same.md").exists()


# ---- 12, 13: a run's end said truly (nothing can run, every ending signal), the issue body a reproducer writes

def test_a_run_where_nothing_can_run_is_refused_before_a_folder_is_made(tmp_path, monkeypatch, write_scenario):
    from swabench.inputs import scenarios

    monkeypatch.chdir(tmp_path)  # the default run folder would go to ./runs
    shelf = len(scenarios.load(scenarios.find("shelf")).points)
    r = invoke("run", "shelf", "--device", "cpu")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"every one of {shelf} points skips here: flashinfer needs CUDA (device is cpu) ({shelf}); run on a GPU " \
           f"node" in r.output and not (tmp_path / "runs").exists()
    rules = write_scenario(TINY_DECODE + '[[skip]]\nwhen = "mode == \'decode\'"\nreason = "none left"\n', "zero.toml")
    r = invoke("run", rules, "--device", "cpu")
    assert r.exit_code == 2 and "the scenario expands to 0 points (its [[skip]] rules removed all 2)" in r.output
    assert not (tmp_path / "runs").exists()
    r = invoke("replay", trace(tmp_path / "t.jsonl"), "--impl", "paged-window", "--device", "cpu", "--out", "rp")
    assert r.exit_code == 2 and "points skips here: flashinfer needs CUDA" in r.output and not Path("rp").exists()


def test_no_point_to_run_says_why_for_a_trace_a_price_and_a_scenario(tmp_path, monkeypatch, write_scenario):
    """What makes no point is said in the refusal itself, which works for a trace and a price as for a scenario
    file: `swabench show` takes a scenario, not a trace; and `show` says it too."""
    monkeypatch.chdir(tmp_path)
    decode_only = "tree-xqa models verify steps, not decode"
    r = invoke("replay", trace(tmp_path / "t.jsonl", [STEPS[0]]), "--impl", "tree-xqa", "--device", "cpu")
    assert r.exit_code == 2 and decode_only in r.output and "swabench show" not in r.output, r.output
    r = invoke("replay", tmp_path / "t.jsonl", "--impl", "paged-window", "--backend", "fa4", "--device", "cpu")
    assert r.exit_code == 2 and "paged-window has kernels on fa2 and fa3 and auto only, not fa4" in r.output
    r = invoke("price", "--model", "gemma-3-1b", "--impl", "tree-xqa", "--device", "cpu")
    assert r.exit_code == 2 and "tree-xqa models verify steps, not" in r.output and "show" not in r.output
    scenario = write_scenario(TINY_DECODE.replace('"torch-trim", "torch-mask"', '"tree-xqa"'), "zero.toml")
    assert decode_only in invoke("run", scenario, "--device", "cpu").output
    assert "0 points  backends: -  (models verify steps, not decode)" in invoke("show", scenario).output
    assert not (tmp_path / "runs").exists()


def test_the_gpus_launcher_refuses_a_scenario_of_no_points_and_keeps_nothing(tmp_path, monkeypatch, write_scenario):
    from swabench.run import launch

    monkeypatch.setattr(launch, "visible_gpus", lambda: ["0", "1"])
    rules = write_scenario(TINY_DECODE + '[[skip]]\nwhen = "impl != \'\'"\nreason = "none left"\n', "zero.toml")
    r = invoke("run", rules, "--gpus", "all", "--out", tmp_path / "run")
    assert r.exit_code == 2 and "the scenario expands to 0 points" in r.output, r.output
    assert not (tmp_path / "run").exists() and not launch.work_dir(tmp_path / "run").exists()


TINY_DECODE = ('name = "d"\nimplementations = ["torch-trim", "torch-mask"]\n[[sweep]]\nmode = "decode"\n'
               'prefix_len = 40\nwindow_left = 7\n')


def test_a_run_whose_every_point_skips_on_its_way_keeps_its_folder_as_skipped(tmp_path, monkeypatch, write_scenario):
    from swabench.core import workloads

    monkeypatch.setattr(workloads, "free_bytes", lambda device: 1 << 10)  # every case too big: known only then
    out = tmp_path / "run"
    r = invoke("run", write_scenario(TINY_DECODE), "--device", "cpu", "--out", out)
    assert r.exit_code == 2 and "every one of 2 points skips here: resource: the case needs about" in r.output
    assert f"nothing ran: the rows are kept in {out}, its state skipped" in r.output, r.output
    meta = json.loads((out / "meta.json").read_text())
    table = pd.read_csv(out / "results.csv")
    assert meta["state"] == "skipped" and len(table) == 2 and (table["status"] == "skip").all()
    again = invoke("run", write_scenario(TINY_DECODE), "--device", "cpu", "--out", out, "--resume")
    assert again.exit_code == 2 and json.loads((out / "meta.json").read_text())["state"] == "skipped"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGHUP", "SIGQUIT", "SIGUSR1"])
def test_every_signal_that_ends_a_run_records_it_as_interrupted(tmp_path, name):
    """A closed terminal's SIGHUP, SIGQUIT, SIGUSR1 end a run as Ctrl-C does, sent twice (the second while the
    folder is written down): rows kept, the state interrupted, exit 130, resumable."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import TINY

    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    out, rows = tmp_path / "run", tmp_path / "run" / "rows.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    number = getattr(signal, name)  # at its default in the run, under nohup too (a run that starts with SIGHUP
    # ignored keeps ignoring it, as nohup asks)
    proc = subprocess.Popen([sys.executable, "-m", "swabench", "run", str(scenario), "--device", "cpu", "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=lambda: signal.signal(number, signal.SIG_DFL))
    deadline = time.time() + 60
    while time.time() < deadline and not (rows.exists() and rows.stat().st_size):
        time.sleep(0.05)
    proc.send_signal(getattr(signal, name))
    proc.send_signal(getattr(signal, name))
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130 and f"interrupted by {name}: the finished rows are kept in {out}" in output, output
    kept = pd.read_csv(out / "results.csv")
    assert json.loads((out / "meta.json").read_text())["state"] == "interrupted" and len(kept) >= 1
    assert len(kept) == len(rows.read_text().splitlines())


def test_a_signal_while_the_folder_is_made_is_recorded_once_it_is(tmp_path, monkeypatch, write_scenario):
    import signal
    import threading

    from swabench.store import run_folder

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set on the main thread only")
    made = run_folder.RunStore.create

    def create_and_signal(folder, meta, text):
        store = made(folder, meta, text)
        os.kill(os.getpid(), signal.SIGUSR1)  # before the run holds its store: noted, raised once it does
        return store

    monkeypatch.setattr(run_folder.RunStore, "create", create_and_signal)
    r = invoke("run", write_scenario(TINY_DECODE), "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 130 and "interrupted by SIGUSR1" in r.output, r.output
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["state"] == "interrupted" and meta["rows"] == 0
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # given back after the run


REPRODUCER_LOG = ("REPRODUCED: request 0: rows 0-3 wrong (rel-L2 0.5)\nworst: request 0 row 1\n"
                  "CONTROL, the same call trimmed: right\npython 3.12.3, torch 2.11.0 (CUDA 13.0)\n"
                  "NVIDIA H200: compute capability 9.0, 132 SMs, driver 580.159.04\nflashinfer-python 0.7.4\n")


def test_repro_issue_quotes_a_long_log_bounded(tmp_path):
    from swabench.repro import issue

    noise = [f"building module {i} " + "x" * 60 for i in range(150_000)]  # 12 MB: under the 16 MiB read bound
    lines = REPRODUCER_LOG.splitlines()
    log = tmp_path / "long.log"
    log.write_text("\n".join(noise[:1000] + lines[:3] + noise[1000:] + ["y" * 5000] + lines[3:]) + "\n")
    out = tmp_path / "bug.py"
    r = invoke("repro", "--bug", "planted-wide", "--out", out, "--observed", log, "--issue")
    assert r.exit_code == 0, r.output
    body = out.with_suffix(".md").read_text()
    script = out.read_text()
    quoted = body[body.index("<summary>its other output and its environment"):]
    assert len(body) - len(script) < 10_000 and "building module" not in body, len(body)
    other = lines[1:2]  # the line under the verdict; the verdict and CONTROL lines are quoted above, the rest below
    assert f"{len(other)} of its {len(noise) + len(other) + 1:,} other lines, {len(noise) + 1:,} left out" in body
    assert all(line in quoted for line in other + lines[3:]) and all(line in body for line in lines)
    assert issue.excerpt(REPRODUCER_LOG) == (lines, 0)  # a script's own output is quoted whole
    built = "2026-12-05 04:08:06,000 - INFO - core.py:635 - flashinfer.jit: Building JIT module cascade; this can"
    assert issue.excerpt(REPRODUCER_LOG + built + "\n") == (lines, 0)  # without FlashInfer's log of its builds
    required = "NVIDIA_REQUIRE_CUDA        : cuda>=13.0" + " brand=tesla,driver>=535,driver<536" * 60
    quoted, left_out = issue.excerpt(REPRODUCER_LOG + required + "\n")  # short, but one line of 2 KB
    assert left_out == 0 and quoted[:-1] == lines and len(quoted[-1]) < 450 and "more characters]" in quoted[-1]


def test_repro_issue_fences_a_log_longer_than_its_backticks(tmp_path):
    log = tmp_path / "ticks.log"
    log.write_text(REPRODUCER_LOG.replace("worst: request 0 row 1", "``````\nworst: `row` 1 ```"))
    log.write_text(log.read_text().replace("rows 0-3 wrong", "rows `0-3` wrong"))
    out = tmp_path / "bug.py"
    assert invoke("repro", "--bug", "planted-wide", "--out", out, "--observed", log, "--issue").exit_code == 0
    body = out.with_suffix(".md").read_text()
    quoted = body[body.index("<summary>its other output and its environment"):body.rindex("</details>")].splitlines()
    fences = [line for line in quoted if line.startswith("```")]
    assert fences == ["`" * 7, "``````", "`" * 7], fences  # the log's own line of six stays inside
    assert "Observed on flashinfer 0.7.4, NVIDIA H200 (132 SMs): ``REPRODUCED: request 0: rows `0-3` wrong" in body


def test_repro_writes_a_script_that_parses_from_a_log_with_backslashes_and_triple_quotes(tmp_path):
    import ast

    log = tmp_path / "quotes.log"
    verdict = 'REPRODUCED: request 0: rows 0-3 wrong in C:\\N\\x """ done'
    log.write_text(REPRODUCER_LOG.replace("REPRODUCED: request 0: rows 0-3 wrong (rel-L2 0.5)", verdict))
    out = tmp_path / "bug.py"
    r = invoke("repro", "--bug", "planted-wide", "--out", out, "--observed", log)
    assert r.exit_code == 0, r.output
    assert verdict in ast.get_docstring(ast.parse(out.read_text())).replace("\n    ", " ")


# ---- 5, 7, 9, 10, 13: what the suite reads (store/reading.py) and a run folder's kinds (schema, checks)

BIG = "9" * 5000  # past Python's int-string limit of 4300 digits
TOO_LONG = "an integer of 5000 digits; a number here has at most 4300"


@pytest.fixture
def no_hang():
    """A command that blocks on a read fails the test after a minute instead of hanging the suite."""
    import signal

    def blocked(signum, frame):
        raise TimeoutError("the command blocked on a read")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory):
    """A CPU run of TINY's 8 torch-trim points cut to its first 3 rows and finalized as interrupted, beside its
    scenario file (tiny.toml)."""
    from conftest import TINY

    from swabench.analysis import derived
    from swabench.store import run_folder

    root = tmp_path_factory.mktemp("reads")
    (root / "tiny.toml").write_text(TINY)
    r = invoke("run", root / "tiny.toml", "--out", root / "run", "--impl", "torch-trim", "--device", "cpu")
    assert r.exit_code == 0, r.output
    lines = (root / "run" / "rows.jsonl").read_text().splitlines(keepends=True)
    (root / "run" / "rows.jsonl").write_text("".join(lines[:3]))
    run_folder.RunStore(root / "run").finalize(derived.add_derived, state="interrupted")
    return root / "run"


def copied(run: Path, tmp_path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def contents(folder: Path) -> dict:
    """Each file of ``folder`` with its bytes (a FIFO by its kind): what a refused command leaves as it was."""
    return {p.name: p.read_bytes() if p.is_file() else "not a file" for p in sorted(folder.iterdir())}


def resume(run: Path, cut_run: Path):
    return invoke("run", cut_run.parent / "tiny.toml", "--out", run, "--impl", "torch-trim", "--device", "cpu",
                  "--resume")


@pytest.mark.parametrize("args", [("show", "{f}"), ("run", "{f}", "--device", "cpu", "--out", "{tmp}/out"),
                                  ("warmup", "--list", "{f}"), ("repro", "{f}", "--case", "x", "--impl", "torch-trim")])
def test_a_fifo_where_a_scenario_is_read_is_refused(tmp_path, no_hang, args):
    os.mkfifo(tmp_path / "s.toml")
    r = invoke(*[a.format(f=tmp_path / "s.toml", tmp=tmp_path) for a in args])
    assert r.exit_code == 2 and f"{tmp_path / 's.toml'}: file: not a regular file but a FIFO" in r.output, r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [("replay", "{f}", "--device", "cpu", "--out", "{tmp}/out"),
                                  ("export-fib", "{f}", "--out", "{tmp}/out"),
                                  ("price", "--model", "gemma-3-1b", "{f}", "--device", "cpu", "--out", "{tmp}/out"),
                                  ("repro", "--bug", "planted-wide", "--observed", "{f}", "--out", "{tmp}/out")])
def test_a_fifo_where_a_trace_or_a_log_is_read_is_refused(tmp_path, no_hang, args):
    os.mkfifo(tmp_path / "t.jsonl")
    r = invoke(*[a.format(f=tmp_path / "t.jsonl", tmp=tmp_path) for a in args])
    assert r.exit_code == 2 and f"{tmp_path / 't.jsonl'}: not a regular file but a FIFO" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_an_endless_observed_log_is_refused_unread(no_hang):
    r = invoke("repro", "--bug", "planted-wide", "--observed", "/dev/zero")
    assert r.exit_code == 2 and "--observed /dev/zero: not a regular file but a character device" in r.output


@pytest.mark.parametrize("command", ["resume", "summary", "report", "compare"])
def test_a_fifo_where_a_journal_is_read_is_refused(tmp_path, cut_run, no_hang, command):
    run = copied(cut_run, tmp_path)
    (run / "rows.jsonl").unlink()
    os.mkfifo(run / "rows.jsonl")
    before = contents(run)
    r = resume(run, cut_run) if command == "resume" else invoke("compare", FIXTURE_RUN, run) \
        if command == "compare" else invoke(command, run, *(["--out", tmp_path / "rep"] if command == "report" else []))
    assert r.exit_code == 2 and f"{run / 'rows.jsonl'}: not a regular file but a FIFO" in r.output, r.output
    assert contents(run) == before and not (tmp_path / "rep").exists()


def test_a_journal_over_its_bound_is_refused_naming_the_limit(tmp_path, cut_run, monkeypatch):
    from swabench.store import reading

    run = copied(cut_run, tmp_path)
    monkeypatch.setattr(reading, "TABLE", (run / "rows.jsonl").stat().st_size - 1)
    r = invoke("summary", run)
    assert r.exit_code == 2 and f"{run / 'rows.jsonl'}: larger than {reading.TABLE} bytes" in r.output, r.output


def test_a_run_is_finalized_under_a_memory_limit_the_sweep_fit_in(tmp_path, cut_run):
    """A table is written under an address-space limit (``ulimit -v``) 2 GiB above what the process already holds:
    reading the journal asks for its own size, not the 4 GiB a journal may reach (else a sweep that fits its limit
    dies at finalize with no table)."""
    run = copied(cut_run, tmp_path)
    (run / "results.csv").unlink()
    finalize = textwrap.dedent(f"""
        import re, resource
        import torch, pandas
        from swabench.analysis import derived
        from swabench.store import run_folder
        held = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (held + (2 << 30), resource.RLIM_INFINITY))
        table = run_folder.RunStore({str(run)!r}).finalize(derived.add_derived, state="interrupted")
        print(len(table))
        """)
    done = subprocess.run([sys.executable, "-c", finalize], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)  # this checkout's swabench
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr[-2000:]
    assert len(pd.read_csv(run / "results.csv")) == 3


def test_a_file_that_grows_while_read_is_read_to_its_end_or_refused(tmp_path, monkeypatch):
    """The read asks for the size the file had when opened, then reads on where it grew, to the bound."""
    from swabench.store import reading

    path = tmp_path / "f"
    path.write_bytes(b"x" * 3000)
    real = os.fstat
    monkeypatch.setattr(reading.os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], 10, *real(fd)[7:])))
    assert reading.read_bytes(path, 5000) == b"x" * 3000
    with pytest.raises(reading.ReadError, match="larger than 2999 bytes"):
        reading.read_bytes(path, 2999)


def _long_integer(tmp_path, cut_run, where: str) -> tuple[list, Path, str]:
    """(the command, the file holding an integer of 5000 digits, where in it) for each kind of file read."""
    if where in ("meta.json", "rows.jsonl", "resume"):
        run = copied(cut_run, tmp_path)
        name = "meta.json" if where == "meta.json" else "rows.jsonl"
        text = (run / name).read_text()
        line = text[:text.find('"state": "interrupted"')].count("\n") + 1 if name == "meta.json" else 1
        (run / name).write_text(text.replace('"state": "interrupted"', f'"state": "interrupted", "x": {BIG}')
                                if name == "meta.json" else text.replace('"seed": 0', f'"seed": {BIG}', 1))
        args = ["summary", run] if where != "resume" else \
            ["run", cut_run.parent / "tiny.toml", "--out", run, "--impl", "torch-trim", "--device", "cpu", "--resume"]
        return args, run / name, f"line {line}"
    if where in ("trace", "scenario"):
        path = tmp_path / ("t.jsonl" if where == "trace" else "s.toml")
        path.write_text(json.dumps(STEPS[0]).replace('"count": 3', f'"count": {BIG}') + "\n" if where == "trace" else
                        f'name = "s"\nimplementations = ["torch-trim"]\n[fixed]\nseed = {BIG}\n')
        return (["replay", path, "--device", "cpu"] if where == "trace" else ["show", path]), path, \
            "line 1" if where == "trace" else "line 4"
    if where == "dump":
        dump = Path(shutil.copytree(Path(__file__).parent / "fixtures" / "flashinfer-dump-0.7.4" / "dump",
                                    tmp_path / "dump"))
        call = sorted(p for p in dump.iterdir() if p.is_dir())[0]
        text = (call / "metadata.jsonl").read_text()
        (call / "metadata.jsonl").write_text(text.replace('"arg_5": 32', f'"arg_5": {BIG}', 1))
        return ["import", dump, "--out", tmp_path / "t.jsonl"], call / "metadata.jsonl", "line 1"
    root = exported(tmp_path)
    path = next((root / "definitions").rglob(f"{DECODE}.json")) if where == "definition" else \
        workload_file(root, DECODE)
    text = path.read_text()
    path.write_text(text.replace('"type": "var"', f'"type": "var", "big": {BIG}', 1) if where == "definition" else
                    text.replace('"uuid"', f'"big": {BIG}, "uuid"', 1))
    line = text[:text.index('"type": "var"')].count("\n") + 1 if where == "definition" else 1
    return ["import-fib", root, "--definition", DECODE, "--model", "gemma-3-4b", "--out", tmp_path / "back.jsonl"], \
        path, f"line {line}"


@pytest.mark.parametrize("where", ["meta.json", "rows.jsonl", "resume", "trace", "scenario", "dump", "definition",
                                   "workload"])
def test_an_integer_past_pythons_limit_is_exit_2_naming_file_and_line(tmp_path, cut_run, where):
    args, path, line = _long_integer(tmp_path, cut_run, where)
    before = contents(path.parent)
    r = invoke(*args)
    assert r.exit_code == 2 and str(path) in r.output and f"{line}: {TOO_LONG}" in r.output, r.output
    assert contents(path.parent) == before and not (tmp_path / "back.jsonl").exists()


@pytest.mark.parametrize("name,field,value", [
    ("rows.jsonl", "status", 5), ("rows.jsonl", "status", "maybe"), ("rows.jsonl", "median_us", "fast"),
    ("rows.jsonl", "median_us", 0), ("rows.jsonl", "samples", "abc"), ("rows.jsonl", "backend", True),
    ("rows.jsonl", "window_left", 1.5), ("rows.jsonl", "prefix_len", 2 ** 40), ("rows.jsonl", "kind", "weird"),
    ("rows.jsonl", "impl", " "), ("meta.json", "merged_from", 5), ("meta.json", "wall_s", "long"),
    ("meta.json", "state", 5)])
def test_a_field_of_the_wrong_kind_is_refused_before_any_point(tmp_path, cut_run, one_figure, name, field, value):
    run = copied(cut_run, tmp_path)
    if name == "rows.jsonl":
        lines = (run / name).read_text().splitlines(keepends=True)
        lines[0] = json.dumps({**json.loads(lines[0]), field: value}) + "\n"
        (run / name).write_text("".join(lines))
        said = f"{run / name}: line 1: field {field}: {json.dumps(value)} is not allowed ("
    else:
        (run / name).write_text(json.dumps({**json.loads((run / name).read_text()), field: value}))
        said = f"{run / name}: key {field}: {json.dumps(value)} is not allowed ("
    before = contents(run)
    for r in [resume(run, cut_run), invoke("summary", run), invoke("compare", run, FIXTURE_RUN),
              invoke("report", run, "--out", tmp_path / "rep"), invoke("plot", run, "--out", tmp_path / "rep")]:
        assert r.exit_code == 2 and said in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert contents(run) == before and not (tmp_path / "rep").exists()  # the resume ran no point: nothing appended


def test_a_resume_that_cannot_append_refuses_before_any_point(tmp_path, cut_run, monkeypatch):
    from swabench.store import run_folder

    run = copied(cut_run, tmp_path)
    journal = run / "rows.jsonl"

    def read_only(file, mode="r", *args, **kwargs):
        if Path(file) == journal and mode[0] != "r" or "+" in mode:
            raise PermissionError(13, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(run_folder, "open", read_only, raising=False)
    before = contents(run)
    r = resume(run, cut_run)
    assert r.exit_code == 2 and f"{journal} cannot be appended to (Permission denied)" in r.output, r.output
    assert contents(run) == before


def test_export_fib_into_a_folder_it_cannot_write_is_exit_2(tmp_path, monkeypatch):
    import tempfile

    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.mkdtemp

    def refused(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == locked.resolve():
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", refused)
    r = invoke("export-fib", trace(tmp_path / "t.jsonl"), "--out", locked / "fib")
    assert r.exit_code == 2 and f"cannot write to {locked}: Permission denied" in r.output, r.output
    assert list(locked.iterdir()) == []


def test_import_fib_names_axes_that_are_no_object(tmp_path):
    root = exported(tmp_path)
    path = next((root / "definitions").rglob(f"{DECODE}.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "axes": [1]}))
    r = import_fib(root, DECODE, tmp_path)
    assert r.exit_code == 2 and f"{path}: axes: list, not an object of named axes" in r.output, r.output
    assert not (tmp_path / "back.jsonl").exists()


def test_an_interrupted_run_says_so_wherever_it_is_summarised(tmp_path, cut_run, one_figure):
    held = "3 of 8 points over 3 cases; the run is interrupted"
    r = invoke("summary", cut_run)
    assert r.exit_code == 0 and f"**tiny**: {held}." in r.stdout, r.output
    r = invoke("report", cut_run, "--out", tmp_path / "rep")
    text = (tmp_path / "rep" / "REPORT.md").read_text()
    assert r.exit_code == 0 and f"Run folder `{cut_run}`; {held}." in text and f"**tiny**: {held}." in text
    whole = invoke("summary", FIXTURE_RUN)
    assert whole.exit_code == 0 and re.search(r"\*\*\w+\*\*: \d+ points over \d+ cases\. ", whole.stdout), whole.output


@pytest.mark.parametrize("again", ["same", "another path", "a link"])
def test_compare_refuses_one_run_twice_as_findings_does(tmp_path, cut_run, again):
    other = {"same": cut_run, "another path": cut_run.parent / "." / cut_run.name, "a link": tmp_path / "link"}[again]
    if again == "a link":
        other.symlink_to(cut_run)
    r = invoke("compare", cut_run, other)
    assert r.exit_code == 2 and f"{cut_run} and {other} are the same run folder: give each run folder once" in r.output
    assert invoke("findings", cut_run, other).output == r.output


# ---- numbers bounded where they enter (issue 52: 6, 8, 11, 13 and 14)

SMALL = ('implementations = ["torch-trim"]\n[fixed]\nnum_qo_heads = 4\nnum_kv_heads = 2\nhead_dim = 32\n'
         'dtype = "{dtype}"\n[[sweep]]\nmode = "verify"\ndraft_tokens = 4\nprefix_len = 60\nwindow_left = 15\n')


def small(tmp_path, extra: str = "", dtype: str = "bfloat16") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(SMALL.format(dtype=dtype) + extra)
    return path


def refused(r, *words) -> None:
    """Exit 2 with one error line that says ``words``, and no traceback."""
    errors = [line for line in r.output.splitlines() if line.startswith("Error: ")]
    assert r.exit_code == 2 and len(errors) == 1 and "Traceback" not in r.output, r.output
    assert all(w in errors[0] for w in words), r.output


def _rows(folder: Path) -> pd.DataFrame:
    return pd.read_json(folder / "rows.jsonl", lines=True)


def test_a_sweep_past_the_point_limit_is_refused_before_anything_expands(tmp_path, monkeypatch):
    from swabench.inputs import scenarios

    monkeypatch.setattr(scenarios, "make_case", lambda *a: pytest.fail("a case was made"))
    values = list(range(1, 1001))
    path = small(tmp_path, f"seed = {values}\n[[sweep]]\ngroup = 'wide'\nmode = 'decode'\nprefix_len = {values}\n"
                           f"window_left = {values}\n")
    limit = f"more than the {scenarios.MAX_POINTS} a scenario may sweep"
    r = invoke("show", path)
    refused(r, "sweep[1] (wide): expands to 1000000 points (1000 prefix_len x 1000 window_left x 1 implementations x "
               "1 backends, 1001000 with the groups before it)", limit, "give fewer values (or --impl)")
    refused(invoke("run", path, "--device", "cpu", "--out", tmp_path / "run"), limit)
    assert not (tmp_path / "run").exists()
    half = list(range(1, 501))
    small(tmp_path, f"seed = {half}\n[[sweep]]\nmode = 'decode'\nprefix_len = 60\nwindow_left = {half}\n"
                    f"seed = {half}\n")
    refused(invoke("warmup", path, "--list"), "sweep[1]: expands to 250000 points", "250500 with the groups before it")


def test_every_shipped_scenario_is_well_under_the_point_limit(monkeypatch):
    from swabench.inputs import scenarios

    counted, real = {}, scenarios.check_size

    def count(path, *args):
        counted[Path(path).stem] = real(path, *args)
        return counted[Path(path).stem]

    monkeypatch.setattr(scenarios, "check_size", count)
    for path in scenarios.shipped_dir().glob("*.toml"):
        scenarios.load(path)
    assert counted["edges"] > 50_000 and max(counted.values()) < scenarios.MAX_POINTS / 2, counted


def _seeded_blob(root: Path, name: str, seed: int) -> None:
    record = json.loads(workload_file(root, name).read_text().splitlines()[0])
    blob = root / record["workload"]["inputs"]["kv_indptr"]["path"]
    with safetensors.safe_open(blob, framework="pt") as f:
        metadata = f.metadata()
    meta = json.loads(metadata[fib.META])
    metadata[fib.META] = json.dumps({**meta, "seed": seed})
    safetensors.torch.save_file(safetensors.torch.load_file(blob), blob, metadata=metadata)


def test_a_seed_past_63_bits_is_refused_wherever_it_enters(tmp_path):
    words = ("seed: must be an integer from 0 to 2**63 - 1", "got 18446744073709551616")
    refused(invoke("show", small(tmp_path, "seed = 18446744073709551616\n")), "sweep[0].seed", *words)
    refused(invoke("run", tmp_path / "s.toml", "--device", "cpu", "--out", tmp_path / "run"), *words)
    assert not (tmp_path / "run").exists()
    line = trace(tmp_path / "t.jsonl", [{**STEPS[0], "seed": 2 ** 64}])
    refused(invoke("replay", line, "--device", "cpu", "--out", tmp_path / "replay"), "line 1.seed", *words)
    refused(invoke("export-fib", line, "--out", tmp_path / "fib"), "line 1.seed", *words)
    assert not (tmp_path / "replay").exists() and not (tmp_path / "fib").exists()
    (tmp_path / "x").mkdir()
    root = exported(tmp_path / "x")
    _seeded_blob(root, DECODE, 2 ** 64)
    refused(import_fib(root, DECODE, tmp_path), "seed", *words)
    assert not (tmp_path / "back.jsonl").exists()
    largest = invoke("check", small(tmp_path, f"seed = {2 ** 63 - 1}\n"), "--device", "cpu", "--out", tmp_path / "c")
    assert largest.exit_code == 0 and set(_rows(tmp_path / "c")["status"]) == {"pass"}, largest.output  # seed + 1000


def with_prefix(tmp_path, value: str) -> Path:
    path = small(tmp_path)
    path.write_text(path.read_text().replace("prefix_len = 60", f"prefix_len = {json.dumps(value)}"))
    return path


@pytest.mark.parametrize("value", ["lognormal:1" + "0" * 400 + ":1", "lognormal:1000:3.9", "uniform:0:2147483648"])
def test_a_length_whose_draws_cannot_be_lengths_is_refused(tmp_path, value):
    path = with_prefix(tmp_path, value)
    words = ("sweep[0].prefix_len", "at most 2147483647: FlashInfer's int32")
    refused(invoke("show", path), *words)
    refused(invoke("warmup", path, "--list"), *words)
    refused(invoke("repro", path, "--case", "x", "--impl", "torch-trim"), *words)
    assert invoke("show", with_prefix(tmp_path, "lognormal:100:1.0")).exit_code == 0


def test_numbers_past_a_float_or_past_the_digits_python_reads_are_refused(tmp_path):
    huge = "1" + "0" * 400
    path = small(tmp_path, f'accept = "fixed:{huge}"\n')
    path.write_text(path.read_text().replace('mode = "verify"', 'mode = "draft_extend"'))
    refused(invoke("show", path), "sweep[0].accept", "'fixed:N' (1 <= N <= 2**31 - 1)")
    line = tmp_path / "t.jsonl"
    line.write_text('{"mode": "decode", "window_left": 31, "sm_scale": ' + huge + ', "requests": [[100, 1]]}\n')
    refused(invoke("replay", line, "--device", "cpu", "--out", tmp_path / "r"), "line 1.sm_scale: must be a number > 0")
    digits = "line 1: an integer of 50"  # 5001 digits in the trace, 5000 in the workload file
    most = "digits; a number here has at most 4300"
    line.write_text('{"mode": "decode", "window_left": 31, "requests": [[1' + "0" * 5000 + ', 1]]}\n')
    refused(invoke("replay", line, "--device", "cpu", "--out", tmp_path / "r"), digits, most)
    root = exported(tmp_path)
    records = workload_file(root, DECODE)
    records.write_text(records.read_text().replace('{"definition"', '{"n": ' + "9" * 5000 + ', "definition"', 1))
    refused(import_fib(root, DECODE, tmp_path), digits, most)
    assert not (tmp_path / "r").exists() and not (tmp_path / "back.jsonl").exists()
    from swabench.inputs import dumps

    log = tmp_path / "session.jsonl"
    log.write_text('{"n": ' + "9" * 5000 + '}\n{"n": 1}\n')
    with pytest.raises(dumps.DumpError, match=r"session.jsonl: line 1: an integer of 5000 digits; a number here has at most 4300"):
        list(dumps._jsonl(log, [], may_be_cut=False))


@pytest.mark.parametrize("field,value,words", [
    ("sm_scale", 1e300, "the float32 logits overflow"), ("sm_scale", 5e-324, "8 nats / sm_scale a feature"),
    ("logits_soft_cap", 1e-300, "0.3 cap / sm_scale"), ("logits_soft_cap", 1e308, "float32 cap and logits")])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_scale_or_soft_cap_no_dtype_holds_is_refused_with_its_range(tmp_path, field, value, words, dtype):
    from swabench.core import numerics
    from swabench.inputs import scenarios

    path = small(tmp_path, f"{field} = {value!r}\n", dtype)
    r = invoke("check", path, "--device", "cpu", "--out", tmp_path / "c")
    refused(r, f"sweep[0].{field}: {value:g} is outside", f"for {dtype} queries", words)
    assert not (tmp_path / "c").exists()
    case = scenarios.load(small(tmp_path, "", dtype)).cases[0]
    low, high = (numerics.sm_scale_range if field == "sm_scale" else numerics.soft_cap_range)(case)
    assert f"outside {low:.3g} to {high:.3g}" in r.output


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_correct_paths_pass_the_gate_at_both_ends_of_those_ranges(tmp_path, dtype):
    from swabench.core import numerics
    from swabench.inputs import scenarios

    case = scenarios.load(small(tmp_path, "", dtype)).cases[0]
    (lo, hi), (cap_lo, cap_hi) = numerics.sm_scale_range(case), numerics.soft_cap_range(case)
    for field, value in (("sm_scale", lo * 1.001), ("sm_scale", hi * 0.999), ("logits_soft_cap", cap_lo * 1.001),
                         ("logits_soft_cap", cap_hi * 0.999)):
        path = small(tmp_path, f"{field} = {value!r}\n", dtype).read_text().replace(
            '["torch-trim"]', '["torch-trim", "torch-mask"]')
        (tmp_path / "s.toml").write_text(path)
        r = invoke("check", tmp_path / "s.toml", "--device", "cpu", "--out", tmp_path / f"{field}{value:g}")
        folder = tmp_path / f"{field}{value:g}"
        assert r.exit_code == 0 and list(_rows(folder)["status"]) == ["pass"] * 2, (field, value, r.output)
    refused(invoke("show", small(tmp_path, f"sm_scale = {lo * 0.99!r}\n", dtype)), "sweep[0].sm_scale")


def test_a_page_size_no_engine_uses_is_refused_at_the_field(tmp_path):
    words = ("page_size: must be an integer from 1 to 65536", "got 1099511627776")
    r = invoke("show", small(tmp_path, "page_size = 1099511627776\n"))
    refused(r, "sweep[0].page_size", *words)
    assert "PiB" not in r.output and "batch_size" not in r.output
    line = trace(tmp_path / "t.jsonl", [{**STEPS[0], "page_size": 2 ** 40}])
    refused(invoke("replay", line, "--device", "cpu", "--out", tmp_path / "r"), "line 1.page_size", *words)
    assert invoke("show", small(tmp_path, "page_size = 65536\n")).exit_code == 0


def _raises(error: Exception):
    def call(*args):
        raise error
    return call


def test_cpu_memory_exhaustion_is_a_resource_skip_not_a_failure(tmp_path, monkeypatch):
    import torch

    from swabench.core import workloads
    from swabench.impls import embedded

    monkeypatch.setattr(embedded.GatherRunner, "run", lambda self: torch.empty(1 << 62, dtype=torch.uint8))
    r = invoke("check", small(tmp_path), "--device", "cpu", "--out", tmp_path / "a")
    row = _rows(tmp_path / "a").iloc[0]
    assert r.exit_code == 2 and row["status"] == "skip" and "its state skipped" in r.output, r.output  # nothing ran
    assert row["reason"].startswith("resource: out of memory (") and "DefaultCPUAllocator" in row["reason"]
    monkeypatch.setattr(embedded.GatherRunner, "run", _raises(RuntimeError("not memory")))
    r = invoke("check", small(tmp_path), "--device", "cpu", "--out", tmp_path / "b")
    assert r.exit_code == 1 and _rows(tmp_path / "b").iloc[0]["status"] == "fail", r.output  # other errors still fail
    monkeypatch.setattr(workloads, "build", _raises(MemoryError()))
    r = invoke("check", small(tmp_path), "--device", "cpu", "--out", tmp_path / "c")
    row = _rows(tmp_path / "c").iloc[0]
    assert r.exit_code == 2 and row["reason"] == "resource: out of memory building the workload (MemoryError)"


PEAK = """
import json, sys
import torch
from swabench.core import footprint, workloads
from swabench.core.cases import Point
from swabench.impls import registry
from swabench.inputs.axes import make_case
from swabench.run import sweep

def resident(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field + ":"))

spec, impls = json.loads(sys.argv[1]), sys.argv[2].split(",")
case, tiny = make_case(spec), make_case({**spec, "batch_size": 1, "prefix_len": 8})
options = sweep.SweepOptions(device=torch.device("cpu"))
warm = workloads.build(tiny, "cpu")
for impl in impls:  # the code each path loads, loaded before the baseline
    sweep.measure_point(Point(tiny, impl, "torch"), warm, options, None)
del warm
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak so far (the imports') set back to what is resident now
before = resident("VmRSS")
w = workloads.build(case, "cpu")
statuses = [sweep.measure_point(Point(case, impl, "torch"), w, options, None)["status"] for impl in impls]
fp = footprint.footprint(case, "cpu")
need = max(fp.device_bytes + fp.host_bytes + (fp.mask_bytes if registry.get(i).baseline else 0)
           + footprint.call_bytes(case, registry.get(i).library, "cpu") for i in impls)
print(json.dumps({"peak": resident("VmHWM") - before, "estimate": need, "statuses": statuses}))
"""


@pytest.mark.parametrize("spec,impls", [
    ({"mode": "verify", "batch_size": 4, "prefix_len": 2048, "draft_tokens": 16, "window_left": 511,
      "num_qo_heads": 16, "num_kv_heads": 4, "head_dim": 64, "page_size": 1}, "torch-mask"),
    ({"mode": "decode", "batch_size": 8, "prefix_len": 2048, "window_left": 1023, "num_qo_heads": 8,
      "num_kv_heads": 2, "head_dim": 128, "logits_soft_cap": 30.0}, "torch-trim,torch-mask"),
    ({"mode": "verify", "batch_size": 4, "prefix_len": 512, "draft_tokens": 64, "window_left": 127,
      "num_qo_heads": 8, "num_kv_heads": 2, "head_dim": 64}, "flex-window,flex-contiguous")])
def test_the_cpu_memory_estimate_holds_a_points_measured_peak(spec, impls):
    """A fresh process's peak resident memory over one case, its workload built and each path gated and timed as a
    sweep does, from just before the build: the estimate that decides a too-big skip is above it, and not so far
    above that a case which fits would be skipped."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PEAK, json.dumps(spec), impls], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout=300)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert set(said["statuses"]) == {"pass"}, said
    assert said["peak"] > 16 << 20 and said["peak"] <= said["estimate"] <= 5 * said["peak"], said


def test_work_on_the_cpu_is_estimated_before_it_starts(tmp_path, monkeypatch):
    import torch

    from swabench.inputs import scenarios
    from swabench.run import cpu_cost

    path = small(tmp_path).read_text().replace('["torch-trim"]', '["torch-trim", "torch-mask", "paged-window"]')
    (tmp_path / "s.toml").write_text(path)
    r = invoke("check", tmp_path / "s.toml", "--device", "cpu", "--out", tmp_path / "c")
    s = scenarios.load(tmp_path / "s.toml")
    said = cpu_cost.estimate(s.points, torch.device("cpu"), timed=False).describe(len(s.points))
    lines = r.output.splitlines()
    first = next(i for i, line in enumerate(lines) if "3 points, 3 to check" in line)
    assert r.exit_code == 0 and lines[first + 1] == said and said.startswith("2 of 3 points run on the CPU"), r.output
    timed = cpu_cost.estimate(s.points, torch.device("cpu"))
    assert timed.seconds > cpu_cost.estimate(s.points, torch.device("cpu"), timed=False).seconds
    replay = invoke("replay", trace(tmp_path / "t.jsonl"), "--impl", "torch-trim", "--out", tmp_path / "r")
    assert replay.exit_code == 0 and "points run on the CPU" in replay.output, replay.output
    monkeypatch.setattr(cpu_cost.torch, "get_num_threads", lambda: 4)
    assert cpu_cost.estimate(s.points, torch.device("cpu")).seconds < timed.seconds  # more threads, less time


def test_vllm_tree_window_gathers_from_its_first_nodes_window_and_computes_the_same():
    import torch

    from swabench.core import workloads
    from swabench.impls import registry, tree_verify
    from swabench.impls.embedded import GatherRunner
    from swabench.impls.implementation import computed
    from swabench.inputs.axes import make_case

    case = make_case(dict(mode="verify", tree="eagle:2:3", draft_tokens=8, prefix_len=200, window_left=31,
                          num_qo_heads=4, num_kv_heads=2, head_dim=64, batch_size=2, page_size=1))
    w = workloads.build(case, "cpu")
    trimmed = registry.get("vllm-tree-window").make(w, "torch")
    whole = GatherRunner(w, lambda c, prefix: computed(c, prefix, tree_verify._slot_rule), trim=False)
    for runner in (trimmed, whole):
        runner.plan()
        runner.run()
    assert [len(p[2]) for p in trimmed.parts] == [31 + 8] * 2 and [len(p[2]) for p in whole.parts] == [208] * 2
    assert torch.allclose(trimmed.out.float(), whole.out.float(), atol=1e-2)


# --- files the system will not let be written, and a reader that goes away ---------------------------------------

def unwritable(monkeypatch, module, *names):
    """The files or folders ``names`` (by name) read as read-only or immutable to ``module``'s os.access, as a
    chattr +i file is even to root."""
    real = os.access
    monkeypatch.setattr(module.os, "access", lambda path, mode, **kw: not (Path(path).name in names and mode & os.W_OK)
                        and real(path, mode, **kw))


@pytest.mark.parametrize("name", ["results.csv", "meta.json", "samples.csv.gz", "run"])
def test_resume_refuses_a_file_it_cannot_rewrite_before_any_point(tmp_path, cut_run, monkeypatch, name):
    """A resume whose tables could not be renamed over their old selves would fail after its points, leaving the
    folder running; it is refused first, the folder as it was."""
    from swabench.store import run_folder

    run = copied(cut_run, tmp_path)
    before = contents(run)
    unwritable(monkeypatch, run_folder, name)
    r = resume(run, cut_run)
    assert r.exit_code == 2 and "cannot be written" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert contents(run) == before


def test_a_table_the_system_will_not_replace_is_exit_2_naming_it(tmp_path, monkeypatch):
    """What os.replace refuses (an immutable file, a read-only folder) is a message, not a traceback."""
    from swabench.store import run_folder

    def refused(src, dst):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(run_folder.os, "replace", refused)
    r = invoke("import", Path(__file__).parent / "fixtures" / "flashinfer-dump-0.7.4" / "dump", "--out", tmp_path / "t.jsonl")
    assert r.exit_code == 2 and f"cannot write {tmp_path / 't.jsonl'}: Operation not permitted" in r.output, r.output
    assert list(tmp_path.iterdir()) == []  # its temporary file removed


def test_export_fib_removes_nothing_of_an_export_it_cannot_remove_whole(tmp_path, monkeypatch):
    from swabench.inputs import fib

    root = exported(tmp_path)
    before = _tree(root)
    unwritable(monkeypatch, fib, "gqa_paged")
    r = invoke("export-fib", tmp_path / "t.jsonl", "--out", root, "--force")
    assert r.exit_code == 2 and "cannot be removed (read-only or immutable)" in r.output, r.output
    assert _tree(root) == before  # every blob still beside the workloads that point into it
    empty = tmp_path / "empty"
    empty.mkdir()
    unwritable(monkeypatch, fib, "empty")
    r = invoke("export-fib", tmp_path / "t.jsonl", "--out", empty)
    assert r.exit_code == 2 and f"{empty} cannot be removed" in r.output and empty.is_dir(), r.output


@pytest.mark.parametrize("both", [True, False])
def test_a_reader_that_closes_the_pipe_ends_the_output_not_the_run(tmp_path, write_scenario, both):
    """``swabench run ... | head -1``: the run goes on to the end, its folder complete, and exits as its gate says."""
    import subprocess
    import sys

    scenario = write_scenario(TINY_TORCH)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = [sys.executable, "-m", "swabench", "run", str(scenario), "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if both else subprocess.DEVNULL,
                            env=env)
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert json.loads((out / "meta.json").read_text())["state"] == "complete"
    assert len(pd.read_csv(out / "results.csv")) == len((out / "rows.jsonl").read_text().splitlines()) > 1

# ---- a topic page is no findings page, a published table is held to the journal's rules, a journal with other names,
# a scenario.toml that is no file, a blob's metadata past Python's digits

def test_findings_never_replaces_a_topic_page_as_its_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a copy of the repository root: FINDINGS.md owns the topic pages in findings/
    assert invoke("findings", FIXTURE_RUN, "--out", "FINDINGS.md").exit_code == 0
    (tmp_path / "other").mkdir()
    assert invoke("findings", FIXTURE_RUN, "--out", tmp_path / "other" / "A.md").exit_code == 0
    before = _tree(tmp_path)
    for out, owner in ((Path("findings") / "speed.md", "FINDINGS.md"), (tmp_path / "other/findings/speed.md", "A.md")):
        r = invoke("findings", FIXTURE_RUN, "--out", out)
        refused(r, f"{out} is a topic page of the findings page {owner}", "--force")
        assert _tree(tmp_path) == before
    assert invoke("findings", FIXTURE_RUN, "--out", "findings/speed.md", "--force").exit_code == 0
    assert (tmp_path / "findings" / "findings").is_dir()


def test_findings_never_deletes_a_link_among_its_topic_pages(tmp_path):
    page = tmp_path / "FINDINGS.md"
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    kept = tmp_path / "kept.md"  # a topic page of FINDINGS.md this run no longer fills, linked from findings/
    kept.write_text(page.read_text().split("\n", 1)[0] + "\n\n# Gone\n\nPart of [the findings](../FINDINGS.md): x.\n")
    link = tmp_path / "findings" / "gone-topic.md"
    link.symlink_to(kept)
    before = kept.read_text()
    assert invoke("findings", FIXTURE_RUN, "--out", page).exit_code == 0
    assert link.is_symlink() and kept.read_text() == before


def _published_cell(run: Path, column: str, value: str, line: int = 3) -> Path:
    """``run``'s results.csv with the cell of ``column`` on ``line`` (the header is line 1) spelled ``value``."""
    import csv
    import io

    path = run / "results.csv"
    rows = list(csv.reader(io.StringIO(path.read_text())))
    rows[line - 1][rows[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    path.write_text(out.getvalue())
    return path


@pytest.mark.parametrize("column,value,allowed", [
    ("case_id", " ", "text, not empty"), ("impl", " ", "text, not empty"),
    ("batch_size", "1e400", "integer from 1 to 2147483647"), ("prefix_len", "9" * 5000, "integer from 0 to"),
    ("window_left", "1.5", "integer from -1 to 2147483647"), ("kind", "weird", "one of correct, known-bug, planted"),
    ("tflops", "inf", "finite number")])
def test_a_published_table_is_held_to_the_journals_field_rules(tmp_path, one_figure, column, value, allowed):
    run = Path(shutil.copytree(FIXTURE_RUN, tmp_path / "run"))
    path = _published_cell(run, column, value)
    shown = json.dumps(value) if len(json.dumps(value)) <= 60 else json.dumps(value)[:57] + "..."
    before = contents(run)
    for r in [invoke("summary", run), invoke("compare", FIXTURE_RUN, run),
              invoke("report", run, "--out", tmp_path / "rep"), invoke("plot", run, "--out", tmp_path / "rep")]:
        refused(r, f"{path}: line 3: field {column}: {shown} is not allowed ({allowed}")
    assert contents(run) == before and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("name", ["rows.jsonl", ".swabench.lock"])
def test_resume_refuses_a_run_folder_file_with_other_names(tmp_path, cut_run, name):
    run = copied(cut_run, tmp_path)
    theirs = tmp_path / "user.jsonl"
    os.replace(run / name, theirs) if (run / name).exists() else theirs.write_text("precious\n")
    os.link(theirs, run / name)
    before, theirs_before = contents(run), theirs.read_bytes()
    refused(resume(run, cut_run), f"{run / name} has 1 other name(s) (a hard link)")
    assert contents(run) == before and theirs.read_bytes() == theirs_before


def test_repro_names_a_scenario_toml_that_is_no_file(tmp_path, cut_run, no_hang):
    run = copied(cut_run, tmp_path)
    (run / "scenario.toml").unlink()
    os.mkfifo(run / "scenario.toml")
    r = invoke("repro", run, "--case", "x", "--impl", "torch-trim")
    refused(r, f"{run / 'scenario.toml'}", "not a regular file but a FIFO")
    assert "a folder without" not in r.output


def test_import_fib_names_a_blob_whose_metadata_holds_an_integer_past_pythons_limit(tmp_path):
    root = exported(tmp_path)
    record = json.loads(workload_file(root, DECODE).read_text().splitlines()[0])
    blob = root / record["workload"]["inputs"]["kv_indptr"]["path"]
    with safetensors.safe_open(blob, framework="pt") as f:
        metadata = f.metadata()
    metadata[fib.META] = metadata[fib.META].rstrip("}") + f', "n": {BIG}}}'
    safetensors.torch.save_file(safetensors.torch.load_file(blob), blob, metadata=metadata)
    refused(import_fib(root, DECODE, tmp_path), str(blob), TOO_LONG)
    assert not (tmp_path / "back.jsonl").exists()


def test_report_refuses_a_folder_where_a_figure_goes_before_writing_anything(tmp_path):
    out = tmp_path / "rep"
    (out / "decode.png").mkdir(parents=True)
    r = invoke("report", Path(__file__).parent / "fixtures" / "h200-run", "--out", out, "--force")
    assert r.exit_code == 2 and "decode.png exists and is a folder" in r.output, r.output
    assert [p.name for p in out.iterdir()] == ["decode.png"]


@pytest.mark.parametrize("value", ["uniform:1_0:20", "uniform:\uff11:\uff15", "lognormal:4_096:0.5"])
def test_a_distribution_is_spelled_in_ascii_digits_one_way(value):
    """int() reads '1_0' and full-width digits as 10 and 1: the same lengths would carry two case ids."""
    from swabench.core.cases import parse_accept, parse_length

    with pytest.raises(ValueError, match="must be an integer, 'uniform:LO:HI'"):
        parse_length(value, 1)
    with pytest.raises(ValueError, match="in ASCII digits"):
        parse_accept("fixed:1_0")
