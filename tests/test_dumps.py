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

from swabench.spec import dumps, traces

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
    text = session.read_text()
    session.write_text(text[:-40])  # the last record cut short, as a killed process leaves it
    n = len(text.splitlines())
    assert f"session.jsonl: line {n} is not JSON" in import_error(dump, tmp_path)


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
    assert dumps._signature(sig) == [("self", None), ("qo_indptr", None), ("num_qo_heads", None), ("causal", False),
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
