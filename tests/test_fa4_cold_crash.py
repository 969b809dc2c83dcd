"""scripts/fa4_cold_crash.py and its child, on the CPU: the arguments it refuses, how it reads a child's end (a signal,
a traceback, a crash row of the suite), its table, the suite's scenario it writes, and the child's call and reference
against swabench's own definition.  The GPU runs themselves are the script's (they need a node)."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from swabench.core import reference, workloads
from swabench.inputs import axes, scenarios
from swabench.run.sweep import module_signature, tiny_case
from tests.test_backends import flash_attn_varlen_func

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


crash, child = load("fa4_cold_crash"), load("fa4_cold_child")
FAULT = """[fa4cold]    31.2s [warm-up_0] cute.compile FlashAttentionForwardSm90 ...
Fatal Python error: Segmentation fault

Thread 0x00007f0a5e7fc640 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait

Current thread 0x00007f0b2d3ff640 (most recent call first):
  File "/tmp/site/flash_attn/cute/interface.py", line 1845 in _flash_attn_fwd
  File "/tmp/site/flash_attn/cute/interface.py", line 3964 in forward
"""


@pytest.mark.parametrize("argv, says", [
    (["--only", "bare,nope"], "--only: unknown variant nope; allowed: bare, suite"),
    (["--add", "mine=flashinfer+bogus"], "unknown condition bogus; allowed: flashinfer"),
    (["--add", "bare=flashinfer"], "a NAME none of the variants has"),
    (["--add", "mine=suite+flashinfer"], "suite takes only faulthandler and no-disk-cache"),
    (["--jobs", "0"], "--jobs must be at least 1, not 0"),
    (["--suite-root", "/nonexistent"], "--suite-root /nonexistent: no swabench package there"),
])
def test_a_bad_argument_exits_2_naming_it_before_any_run(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(crash, "run_variant", lambda *a: pytest.fail("ran a variant"))
    assert crash.main(argv) == 2
    assert says in capsys.readouterr().err


def test_list_names_every_variant_and_condition_without_a_gpu(capsys):
    assert crash.main(["--list", "--add", "mine=flashinfer+real-thread"]) == 0
    said = capsys.readouterr().out
    assert all(f"{name}: " in said for name in [*crash.VARIANTS, *crash.CONDITIONS, "mine"])
    assert "mine: flashinfer+real-thread" in said and "bare: (nothing beside torch and FA4)" in said


@pytest.mark.parametrize("rc, text, timed_out, rows, verdict", [
    (-11, FAULT, False, None, "CRASH SIGSEGV"),
    (139, "", False, None, "CRASH SIGSEGV"),
    (-6, "", False, None, "CRASH SIGABRT"),
    (None, "", True, None, "HUNG (killed)"),
    (0, "[fa4cold]    20.1s [MainThread] RESULT ok\n", False, None, "ok"),
    (0, "[fa4cold]    20.1s [MainThread] point: first call done\n", False, None, "ended without a result"),
    (4, "[fa4cold]    20.1s [MainThread] RESULT wrong {'point': nan}\n", False, None, "WRONG OUTPUT"),
    (1, "Traceback (most recent call last):\n  File \"x\"\nRuntimeError: CUDA error: boom\n", False, None,
     "error rc 1: RuntimeError: CUDA error: boom"),
    (0, "", False, [{"status": "crash", "reason": "crash: the worker killed by SIGSEGV"}], "CRASH row: crash: the"),
    (0, "", False, [{"status": "pass"}, {"started": "a journal's start"}], "ok"),
    (1, "", False, [{"status": "fail", "reason": "max error 0.5"}], "fail: max error 0.5"),
    (1, "", False, [{"status": "fail", "reason": "DSLUserCodeError: \n\x1b[91m\x1b[1merror:\x1b[0m NameError"}],
     "fail: DSLUserCodeError: error: NameError"),
])
def test_each_way_a_child_ends_reads_as_its_verdict(rc, text, timed_out, rows, verdict):
    assert crash.verdict(rc, text, timed_out, rows).startswith(verdict)


def test_where_a_child_died_is_faulthandlers_innermost_frame_else_its_last_mark():
    assert crash.where(FAULT) == "interface.py:1845 _flash_attn_fwd"
    marks = "[fa4cold]     2.0s [MainThread] conditions: none\n[fa4cold]     9.5s [MainThread] point: first call ...\n"
    assert crash.where(marks) == "point: first call ..."


def test_the_table_has_a_row_per_variant_and_the_reading_names_the_condition_every_crash_shares():
    def result(name, conds, verdict):
        return dict(name=name, conds=conds, rc=0 if verdict == "ok" else -11, signal="" if verdict == "ok" else
                    "SIGSEGV", verdict=verdict, where="", seconds=12.0, objects=1, text="")
    results = [result("bare", (), "ok"), result("flashinfer-first", ("flashinfer",), "ok"),
               result("concurrent", ("concurrent",), "CRASH SIGSEGV"),
               result("mine", ("concurrent", "flashinfer"), "CRASH SIGSEGV"),
               result("suite", ("suite",), "CRASH SIGSEGV")]
    table = crash.table(results).splitlines()
    assert table[0].startswith("| hypothesis | rc | signal | verdict |") and len(table) == 2 + len(results)
    assert "| concurrent | -11 | SIGSEGV | CRASH SIGSEGV |" in table[4]
    said = crash.reading(results)
    assert "conditions in every failed variant and in no passed one: concurrent" in said
    assert "failed: concurrent, mine, suite" in said and "the control" not in said
    assert "the control" in crash.reading([result("bare", (), "CRASH SIGSEGV")])


def test_the_suites_scenario_holds_the_concurrent_kernels_and_its_warm_up_case_is_the_childs_tiny_one(tmp_path):
    """The suite runs the kernels the concurrent condition compiles at once, one signature each, and the warm-up's case
    of the first (REAL) is the child's TINY: the child's steps are the suite's."""
    (tmp_path / "s.toml").write_text(crash.scenario_text())
    s = scenarios.load(tmp_path / "s.toml")
    assert {(p.impl, p.backend) for p in s.points} == {("fa4-window", "fa4")} and len(s.points) == 4
    assert len({module_signature(p) for p in s.points}) == 4
    for spec, c in [*zip(child.CONCURRENT, s.cases), (child.TINY, tiny_case(s.cases[0]))]:
        qo_lens, kv_lens = workloads.request_lengths(c)
        assert (c.mode, c.storage, c.dtype, c.causal) == ("extend", "ragged", "bfloat16", True)
        assert qo_lens == [spec["q_len"]] * spec["batch"]
        assert kv_lens == [spec["prefix"] + spec["q_len"]] * spec["batch"]
        assert (c.num_qo_heads, c.num_kv_heads, c.head_dim, c.window_left, c.sinks, c.logits_soft_cap) == \
            (spec["heads"], spec["kv_heads"], spec["head_dim"], -1 if spec["window"] is None else spec["window"],
             spec["sinks"], spec["softcap"])


@pytest.mark.parametrize("features", [dict(), dict(sinks=True), dict(logits_soft_cap=30.0), dict(window_left=-1)])
def test_the_childs_reference_is_swabenchs_definition(features):
    """The child checks FA4 against a reference of its own: on the suite's data it must give the suite's answer."""
    base = dict(mode="extend", extend_len=8, prefix_len=40, window_left=5, num_qo_heads=8, num_kv_heads=2,
                head_dim=64, dtype="float32", batch_size=2, storage="ragged")
    c = axes.make_case({**base, **features})
    w = workloads.build(c)
    spec = dict(child.REAL, batch=2, q_len=8, prefix=40, heads=8, kv_heads=2, head_dim=64,
                window=None if c.window_left < 0 else c.window_left, sinks=c.sinks, softcap=c.logits_soft_cap)
    ours = child.reference(spec, w.q, w.k_store, w.v_store, w.sinks)
    torch.testing.assert_close(ours.double(), reference.attention(w).double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_the_childs_call_binds_to_fa4s_signature_and_holds_each_requests_keys(storage):
    spec = dict(child.REAL, storage=storage, batch=3, q_len=5, prefix=30, sinks=True)
    args, (q, k, v, sinks) = child.inputs(spec, "cpu")
    inspect.signature(flash_attn_varlen_func).bind(**args)
    assert args["window_size"] == (127, None) and args["num_splits"] == 1 and args["causal"] is True
    assert args["cu_seqlens_q"].tolist() == [0, 5, 10, 15] and args["learnable_sink"] is sinks
    if storage == "ragged":
        assert args["k"] is k and args["cu_seqlens_k"].tolist() == [0, 35, 70, 105] and args["max_seqlen_k"] == 35
    else:
        table = args["page_table"].long()
        assert args["page_table"].dtype == torch.int32 and args["seqused_k"].tolist() == [35] * 3
        for store, flat in ((args["k"], k), (args["v"], v)):
            gathered = store[table].flatten(1, 2)[:, :35]
            assert torch.equal(gathered, flat.view(3, 35, *flat.shape[1:]))
        assert sorted(table.flatten().tolist()) == list(range(table.numel())) and table.flatten().tolist() != \
            list(range(table.numel()))  # every page once, not in order


def test_the_child_imports_nothing_of_swabench_and_neither_does_the_script():
    for name in ("fa4_cold_crash", "fa4_cold_child"):
        text = (SCRIPTS / f"{name}.py").read_text()
        assert "import swabench" not in text and "from swabench" not in text
