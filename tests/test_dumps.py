"""FlashInfer's own API log read back as a trace: the dumps FlashInfer 0.7.2.post1 and 0.7.4 wrote on the
H200 while scripts/play_dump.py played an engine's steps (tests/fixtures/flashinfer-dump-*: the log, the
steps the script knows it played, and its summary), and the dumps that are no dump, truncated, corrupt or
without a window."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import invoke

from swabench.inputs import dumps, plan_calls, traces

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RELEASES = ["0.7.2.post1", "0.7.4"]


def lines(path_or_lines) -> Counter:
    """Trace lines as a multiset of (line without count) -> count."""
    items = path_or_lines if isinstance(path_or_lines, list) else \
        [json.loads(t) for t in Path(path_or_lines).read_text().splitlines() if t.strip()]
    return Counter({json.dumps({k: v for k, v in line.items() if k != "count"}, sort_keys=True): line["count"]
                    for line in items})


@pytest.mark.parametrize("release", RELEASES)
def test_the_import_reproduces_the_steps_played(release):
    fixture = FIXTURES / f"flashinfer-dump-{release}"
    imported = dumps.read(fixture / "dump")
    assert lines(imported.lines) == lines(fixture / "expected.jsonl")
    assert imported.releases == {release} and imported.plans == 23 and not imported.runs_logged
    assert imported.left_out == Counter({"no window (window_left = -1): a global layer, or a window the caller "
                                         "applies itself": 9})
    modes = Counter(line["mode"] for line in imported.lines)
    assert modes == Counter({"decode": 6, "verify": 4, "extend": 3})  # the sink wrapper's decode among them
    assert any(line.get("sinks") for line in imported.lines)
    assert any(line.get("storage") == "ragged" for line in imported.lines)
    assert max(line["count"] for line in imported.lines) == 2  # the decode step played twice is one line


def test_import_writes_a_trace_replay_reads(tmp_path):
    out = tmp_path / "t.jsonl"
    r = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", out)
    assert r.exit_code == 0, r.output
    assert "23 plan calls of FlashInfer 0.7.4: 13 trace lines, 14 steps" in r.output
    assert "9 not imported: no window" in r.output and "counts are plan calls" in r.output
    steps = traces.read(out)
    assert len(steps) == 13 and sum(steps.values()) == 14
    again = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", out)
    assert again.exit_code == 2 and "exists (--force to overwrite it)" in again.output


def test_a_bucket_merges_steps_a_few_tokens_apart(tmp_path):
    exact = dumps.read(FIXTURES / "flashinfer-dump-0.7.4" / "dump")
    bucketed = dumps.read(FIXTURES / "flashinfer-dump-0.7.4" / "dump", bucket=1024)
    assert len(bucketed.lines) < len(exact.lines)
    assert sum(line["count"] for line in bucketed.lines) == sum(line["count"] for line in exact.lines)
    assert all(p % 1024 == 0 for line in bucketed.lines for p, _ in line["requests"])


def copy_dump(tmp_path) -> Path:
    dump = tmp_path / "dump"
    shutil.copytree(FIXTURES / "flashinfer-dump-0.7.4" / "dump", dump)
    return dump


def import_error(dump, tmp_path) -> str:
    r = invoke("import", dump, "--out", tmp_path / "t.jsonl")
    assert r.exit_code == 2 and not (tmp_path / "t.jsonl").exists(), r.output
    return r.output


def test_a_folder_that_is_no_dump_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "not a FlashInfer API log: no call folders" in import_error(tmp_path / "empty", tmp_path)


def test_a_truncated_call_exits_2_and_names_it(tmp_path):
    dump = copy_dump(tmp_path)
    call = sorted(p for p in dump.iterdir() if p.is_dir())[3]
    (call / "metadata.jsonl").unlink()
    assert f"{call.name}: no metadata.jsonl: a truncated dump" in import_error(dump, tmp_path)


def test_a_corrupt_log_exits_2_and_names_the_line(tmp_path):
    dump = copy_dump(tmp_path)
    session = dump / "session.jsonl"
    text = session.read_text().splitlines(keepends=True)
    session.write_text("".join(text[:2] + [text[2][:-40] + "\n"] + text[3:]))  # a line cut short, not the last
    assert "session.jsonl: line 3 is not JSON" in import_error(dump, tmp_path)


def last_call(dump: Path) -> Path:
    return dump / Path(json.loads((dump / "session.jsonl").read_text().splitlines()[-1])["dump_dir"]).name


def cut_last_line(path: Path, keep: int = 40) -> None:
    text = path.read_text()
    path.write_text(text[:text.rstrip("\n").rfind("\n") + 1 + keep])  # as a killed process leaves it


def test_a_log_cut_short_by_a_killed_server_keeps_its_intact_calls(tmp_path):
    """The last record of session.jsonl and of the last call's metadata.jsonl cut mid-line: every other
    call is imported, and the summary names what was cut."""
    dump = copy_dump(tmp_path)
    last = last_call(dump)
    cut_last_line(dump / "session.jsonl")
    r = invoke("import", dump, "--out", tmp_path / "t.jsonl")
    assert r.exit_code == 0, r.output
    assert lines(tmp_path / "t.jsonl") == lines(FIXTURES / "flashinfer-dump-0.7.4" / "expected.jsonl")
    assert "cut short (a stopped process; the intact calls were imported): session.jsonl line 46" in r.output
    cut_last_line(last / "metadata.jsonl")
    imported = dumps.read(dump)
    expected = lines(FIXTURES / "flashinfer-dump-0.7.4" / "expected.jsonl")
    del expected[next(k for k in expected if '"sinks": true' in k and '"decode"' in k)]
    assert lines(imported.lines) == expected and imported.left_out[dumps.CUT] == 1
    assert imported.cut == [last.name, "session.jsonl line 46"] and last.name in imported.summary()


def test_only_a_processs_last_call_may_be_cut(tmp_path):
    """A cut record in any other call is a corrupt log, not a stop: its wrapper's later runs would be counted
    for the plan before it."""
    dump = copy_dump(tmp_path)
    earlier = sorted(p for p in dump.iterdir() if p.is_dir() and p != last_call(dump))[5]
    cut_last_line(earlier / "metadata.jsonl")
    said = import_error(dump, tmp_path)
    assert f"{earlier.name}/metadata.jsonl: line" in said and "is not its last" in said


def test_a_call_without_its_tensors_is_dropped_with_a_plain_reason(tmp_path):
    dump = copy_dump(tmp_path)
    (last_call(dump) / "inputs.pt").unlink()
    imported = dumps.read(dump)
    assert imported.left_out["inputs.pt missing (the call's tensors were not saved)"] == 1
    assert len(imported.lines) == 12


def windowed_calls(dump: Path) -> list[Path]:
    return sorted(p for p in dump.iterdir() if p.is_dir() and json.loads(
        (p / "metadata.jsonl").read_text().splitlines()[-1])["input_metadata"].get("kwarg_window_left", -1) >= 0)


def rewrite(call: Path, change) -> None:
    """Rewrite every record of a call's metadata.jsonl through ``change``."""
    meta = call / "metadata.jsonl"
    records = [json.loads(t) for t in meta.read_text().splitlines()]
    meta.write_text("".join(json.dumps(change(r)) + "\n" for r in records))


@pytest.mark.parametrize("change,reason", [
    (lambda r: {**r, "input_metadata": {**r["input_metadata"], "kwarg_window_left": "abc"}},
     "its arguments do not read as a plan (ValueError: window_left: 'abc' is not an integer)"),
    (lambda r: {**r, "input_metadata": {**r["input_metadata"], "kwarg_window_left": float("inf")}},
     "its arguments do not read as a plan (ValueError: window_left: inf is not an integer)"),
    (lambda r: {**r, "input_metadata": {**r["input_metadata"], "arg_x": 3}},
     "its arguments do not read as a plan (ValueError: arg_x: not an argument position (arg_<i>))"),
    (lambda r: {**r, "versions": "0.7.4"}, "its metadata's versions is a str, not a JSON object"),
    (lambda r: {**r, "input_metadata": [1, 2]}, "its metadata's input_metadata is a list, not a JSON object"),
    (lambda r: {**r, "function_signature": 7}, "its metadata's function_signature is a int, not a JSON string"),
    (lambda r: {**r, "input_metadata": {**r["input_metadata"], "kwarg_causal": "yes"}},
     "its arguments do not read as a plan (ValueError: causal: 'yes' is not true or false)"),
])
def test_metadata_of_other_types_drops_the_call_with_its_reason(tmp_path, change, reason):
    dump = copy_dump(tmp_path)
    rewrite(windowed_calls(dump)[0], change)
    r = invoke("import", dump, "--out", tmp_path / "t.jsonl")
    assert r.exit_code == 0, r.output
    assert f"1 not imported: {reason}" in r.output and "12 trace lines" in r.output


@pytest.mark.parametrize("values,dtype", [([0.0, 700.0, 1900.0], "float32"), ([0.0, 700.5, 1900.0], "float64"),
                                          ([False, True, True], "bool")])
def test_an_index_array_of_other_than_integers_drops_the_call_naming_it(tmp_path, values, dtype):
    """A qo_indptr of floats (whole or not) or bools is no index array: the call is left out, its reason naming
    the field and its dtype, rather than read as the integers it rounds to."""
    import torch

    dump = copy_dump(tmp_path)
    call = next(c for c in windowed_calls(dump) if "PrefillWithPaged" in c.name)
    tensors = torch.load(call / "inputs.pt", weights_only=True)
    torch.save({**tensors, "arg_1": torch.tensor(values, dtype=getattr(torch, dtype))}, call / "inputs.pt")
    imported = dumps.read(dump)
    reason = f"its arguments do not read as a plan (ValueError: qo_indptr: a tensor of {dtype}, not of integers " \
             f"(an index array is int32 or int64))"
    assert imported.left_out[reason] == 1 and len(imported.lines) == 12


def test_chunked_prefill_is_extend_and_a_verify_block_is_short():
    """Equal query counts after a prefix are verify only up to --verify-max queries a request."""
    import torch

    def mode(requests, verify_max=plan_calls.VERIFY_MAX):
        kv = [p + q for p, q in requests]
        args = {"qo_indptr": torch.tensor([0, *torch.tensor([q for _, q in requests]).cumsum(0).tolist()]),
                "paged_kv_indptr": torch.tensor([0, *torch.tensor([-(-k // 16) for k in kv]).cumsum(0).tolist()]),
                "paged_kv_last_page_len": torch.tensor([k - (-(-k // 16) - 1) * 16 for k in kv]),
                "page_size": 16, "num_qo_heads": 8, "num_kv_heads": 2, "head_dim_qk": 128, "window_left": 127,
                "causal": True}
        line, why = plan_calls._line(plan_calls.PREFILL_PAGED, args, 1, verify_max)
        assert line["requests"] == [list(r) for r in requests], why
        return line["mode"]

    assert mode([(8192, 2048)]) == "extend"
    assert mode([(3000, 4), (1600, 4)]) == mode([(3000, 64)]) == "verify"
    assert mode([(3000, 65)]) == "extend" and mode([(8192, 2048)], verify_max=2048) == "verify"


def test_verify_max_is_an_option_of_import(tmp_path):
    r = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", tmp_path / "t.jsonl",
               "--verify-max", 4)
    assert r.exit_code == 0, r.output
    modes = Counter(line["mode"] for line in traces_lines(tmp_path / "t.jsonl"))
    assert modes == Counter({"decode": 6, "verify": 3, "extend": 4})  # the 8-token block is extend now
    bad = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", tmp_path / "u.jsonl",
                 "--verify-max", 1)
    assert bad.exit_code == 2 and "--verify-max" in bad.output


def traces_lines(path: Path) -> list[dict]:
    return [json.loads(t) for t in path.read_text().splitlines()]


def test_a_non_causal_plan_is_imported_as_such_and_replays_so(tmp_path):
    dump = copy_dump(tmp_path)
    prefill = next(c for c in windowed_calls(dump) if "PrefillWithPaged" in c.name)
    rewrite(prefill, lambda r: {**r, "input_metadata": {**r["input_metadata"], "kwarg_causal": False}})
    imported = dumps.read(dump)
    assert len(imported.lines) == 13 and not any("causal" in why for why in imported.left_out)
    (line,) = [line for line in imported.lines if "causal" in line]
    assert line["causal"] is False and line["mode"] == "extend"
    out = tmp_path / "t.jsonl"
    out.write_text(dumps.to_jsonl(imported))
    cases = traces.scenario(out, traces.read(out), ["torch-trim"]).cases
    assert sorted(c.causal for c in cases) == [False] + [True] * 12


def test_out_is_checked_before_the_dump_is_read(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{}")
    (tmp_path / "empty").mkdir()  # no dump: reading it first would say so instead
    r = invoke("import", tmp_path / "empty", "--out", tmp_path / "run" / "t.jsonl")
    assert r.exit_code == 2 and "is inside the run folder" in r.output
    (tmp_path / "file").write_text("")
    r = invoke("import", tmp_path / "empty", "--out", tmp_path / "file" / "t.jsonl")
    assert r.exit_code == 2 and "cannot write to" in r.output


def test_the_replay_hint_is_shell_quoted(tmp_path):
    out = tmp_path / "my trace.jsonl"
    r = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", out)
    assert r.exit_code == 0 and f"swabench replay '{out}'" in r.output


def test_a_bucket_is_bounded_and_a_refused_step_names_no_line():
    r = invoke("import", FIXTURES / "flashinfer-dump-0.7.4" / "dump", "--out", "t.jsonl", "--bucket", 10 ** 12)
    assert r.exit_code == 2 and "--bucket" in r.output and "65536" in r.output
    why = dumps._refused({"mode": "decode", "num_qo_heads": 8, "num_kv_heads": 3, "head_dim": 128, "window_left": 7,
                          "requests": [[4, 1]]})
    assert why == "a step swabench does not take (num_kv_heads: 3 must divide num_qo_heads 8 (GQA groups))"


def test_the_session_log_is_read_line_by_line(tmp_path):
    """A server's session.jsonl runs to gigabytes: the import holds one line of it at a time."""
    import tracemalloc

    dump = copy_dump(tmp_path)
    session = dump / "session.jsonl"
    padded = [{**json.loads(t), "pad": "x" * (2 << 20)} for t in session.read_text().splitlines()[:10]]
    session.write_text("".join(json.dumps(r) + "\n" for r in padded) + session.read_text())
    tracemalloc.start()
    try:
        imported = dumps.read(dump)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(imported.lines) == 13 and peak < 12 << 20  # the session is 20 MiB
def test_a_truncated_tensor_file_exits_2(tmp_path):
    dump = copy_dump(tmp_path)
    inputs = sorted(dump.glob("*plan_call0001/inputs.pt"))[0]
    inputs.write_bytes(inputs.read_bytes()[:100])
    assert "inputs.pt: cannot be loaded" in import_error(dump, tmp_path)


def test_a_dump_without_a_window_says_how_many_plans_it_read(tmp_path):
    dump = copy_dump(tmp_path)
    windowed = []
    for call in (p for p in dump.iterdir() if p.is_dir()):
        record = json.loads((call / "metadata.jsonl").read_text().splitlines()[-1])
        if record["input_metadata"].get("kwarg_window_left", -1) >= 0:
            shutil.rmtree(call)
            windowed.append(call.name)
    session = dump / "session.jsonl"
    session.write_text("".join(line + "\n" for line in session.read_text().splitlines()
                               if Path(json.loads(line)["dump_dir"]).name not in windowed))
    assert "9 plans, none with a window (9 no window (window_left = -1)" in import_error(dump, tmp_path)


def test_a_session_that_names_a_missing_call_exits_2(tmp_path):
    dump = copy_dump(tmp_path)
    shutil.rmtree(sorted(p for p in dump.iterdir() if p.is_dir())[0])
    assert "names a call folder that is not here" in import_error(dump, tmp_path)


def test_the_signature_reader_keeps_defaults_and_skips_annotations():
    sig = ("(self, qo_indptr: torch.Tensor, num_qo_heads: int, causal: bool = False, "
           "q_data_type: Union[str, torch.dtype] = 'float16', window_left: int = -1, "
           "sm_scale: Optional[float] = None, *args, out: Optional[Tuple[int, int]] = None, **kwargs) -> None")
    assert plan_calls._signature(sig) == [("self", None), ("qo_indptr", None), ("num_qo_heads", None), ("causal", False),
                                     ("q_data_type", "float16"), ("window_left", -1), ("sm_scale", None),
                                     ("*args", None), ("out", None), ("**kwargs", None)]


def test_logged_runs_count_the_layers_that_share_a_plan(tmp_path):
    """run() records of the same process and wrapper object after a plan weigh its line; a plan no run
    followed is left out and said.  The run records are written here as FlashInfer names and orders them."""
    dump = copy_dump(tmp_path)
    session = dump / "session.jsonl"
    records = [json.loads(line) for line in session.read_text().splitlines()]
    plans = [r for r in records if r["execution_status"] == "completed"]
    first = next(r for r in plans if r["input_metadata"].get("kwarg_window_left", -1) >= 0)
    out = []
    for r in records:
        out.append(r)
        if r is first:  # two layers run the first windowed plan
            for n in (1, 2):
                name = f"20261201_111859_999_pid{r['process_id']}_{r['function_name'].split('.')[0]}.run_call{n:04d}"
                run = {"function_name": name.split("_", 4)[4].rsplit("_call", 1)[0], "process_id": r["process_id"],
                       "self_id": r["self_id"], "execution_status": "completed", "dump_dir": str(dump / name)}
                (dump / name).mkdir()
                (dump / name / "metadata.jsonl").write_text(json.dumps(run) + "\n")
                out.append(run)
    session.write_text("".join(json.dumps(r) + "\n" for r in out))
    imported = dumps.read(dump)
    assert imported.runs_logged and [line["count"] for line in imported.lines] == [2]
    assert imported.left_out["planned and never run (no run() call of its wrapper logged after it)"] == 13
