"""Mixed steps (mode ``mixed``): a chunked-prefill scheduler's batch of prefill chunks and decodes in one step.  The
first ``prefills`` requests run a chunk of ``extend_len``, the others decode one token; every request keeps its
window, so the reference and the PyTorch paths need nothing new; the decode-only paths make no point of it; the
values a mixed step cannot take are refused, naming the field."""

import pytest
import torch
from conftest import invoke

from swabench.core import gate, workloads
from swabench.impls import registry
from swabench.inputs import axes
from swabench.inputs.axes import ScenarioError
from swabench.run import sweep


def case(**kw):
    base = dict(mode="mixed", extend_len=12, prefills=2, batch_size=5, prefix_len=(40, 9, 30, 70, 3), window_left=7,
                page_size=4, num_qo_heads=4, num_kv_heads=2, head_dim=64, dtype="float32")
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def test_the_first_requests_prefill_and_the_rest_decode():
    c = case()
    assert workloads.request_lengths(c) == ([12, 12, 1, 1, 1], [52, 21, 31, 71, 4])
    assert "q12 x2 + q1 x3" in c.label and "decode" not in c.label and not c.uniform_lengths
    assert axes.make_case(dict(mode="verify", draft_tokens=4, prefix_len=100, window_left=31)).prefills == 0
    tiny = sweep.tiny_case(c)
    assert tiny.mode == "mixed" and workloads.request_lengths(tiny)[0] == [4, 1]


@pytest.mark.parametrize("name", ["torch-trim", "torch-mask", "torch-batch", "flex-window", "flex-flat"])
def test_the_cpu_paths_pass_a_mixed_step(name):
    w = workloads.build(case())
    impl = registry.get(name)
    runner = impl.make(w, impl.library)
    runner.plan()
    result = gate.check(runner, w)
    assert result.passed, result.reason


def test_a_mistake_is_caught_in_the_prefill_chunk_and_the_decodes():
    w = workloads.build(case())
    impl = registry.get("planted-narrow")
    assert impl.must_fail(w.case, w.qo_lens, w.kv_lens)
    runner = impl.make(w, "torch")
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed and result.wrong_rows > 2  # rows of the chunks and of the decodes


def test_the_decode_only_paths_make_no_point_of_it():
    c = case(dtype="bfloat16")
    for name in ("decode-window", "decode-tc-trim", "xqa-window", "fmha-v2-window", "sink-decode"):
        assert not registry.get(name).models(c.storage, c.mode, c.features, c.wrapper_mode), name
    assert registry.get("paged-trim").models(c.storage, c.mode, c.features, c.wrapper_mode)


@pytest.mark.parametrize("fields, field, says", [
    (dict(mode="verify", extend_len=None, draft_tokens=4), "prefills", "applies to mode 'mixed'"),
    (dict(prefills=0), "prefills", "needs 1 to batch_size - 1 = 4 prefill requests"),
    (dict(prefills=5), "prefills", "needs 1 to batch_size - 1 = 4"),
    (dict(extend_len=(12, 12, 3, 3, 3)), "extend_len", "prefill chunks are one size"),
])
def test_a_mixed_step_it_cannot_be_is_refused_naming_the_field(fields, field, says):
    with pytest.raises(ScenarioError) as e:
        case(**fields)
    assert e.value.field.endswith("." + field) and says in str(e.value)


def test_a_mixed_scenario_runs_end_to_end_on_the_cpu(tmp_path):
    from swabench.analysis import derived

    (tmp_path / "mixed.toml").write_text(
        'name = "mixed"\nimplementations = ["torch-trim", "torch-batch", "planted-wide"]\n'
        '[fixed]\nmode = "mixed"\nnum_qo_heads = 4\nnum_kv_heads = 2\nhead_dim = 64\ndtype = "float32"\n'
        'batch_size = 6\nprefix_len = 60\nwindow_left = 15\n'
        '[[sweep]]\ngroup = "mixed"\nextend_len = [8, 32]\nprefills = [1, 2]\n')
    r = invoke("run", tmp_path / "mixed.toml", "--device", "cpu", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    table, _ = derived.load(tmp_path / "run")
    assert set(table["mode"]) == {"mixed"} and set(table["prefills"]) == {1, 2}
    assert set(table.loc[table["kind"] == "correct", "status"]) == {"pass"}
    assert set(table.loc[table["impl"] == "planted-wide", "status"]) == {"xfail"}
    assert (table["total_qo"] == table["prefills"] * table["qo_len"] + 6 - table["prefills"]).all()
