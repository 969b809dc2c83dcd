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
    assert impl.must_fail(w.case, w.qo_lens, w.kv_lens, "fa2")
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


def test_two_calls_cut_the_step_into_its_prefill_and_its_decodes():
    from conftest import standin_calls

    w = workloads.build(case(dtype="bfloat16"))
    calls = standin_calls("mixed-two-calls", w, "fa2")
    plans = {cls: (args, kwargs) for cls, method, args, kwargs in calls if method == "plan"}
    runs = {cls: (args, kwargs) for cls, method, args, kwargs in calls if method == "run"}
    (qo_p, indptr_p, indices_p, last_p, *_), prefill = plans["BatchPrefillWithPagedKVCacheWrapper"]
    (indptr_d, indices_d, last_d, *_), decode = plans["BatchDecodeWithPagedKVCacheWrapper"]
    cut = int(w.kv_indptr_host[2])
    assert qo_p.tolist() == [0, 12, 24] and indptr_p.tolist() == w.kv_indptr_host[:3].tolist()
    assert indices_p.tolist() == w.kv_indices_host[:cut].tolist() and indices_d.tolist() == w.kv_indices_host[cut:].tolist()
    assert indptr_d.tolist() == (w.kv_indptr_host[2:] - cut).tolist() and len(last_d) == 3
    assert prefill["causal"] and prefill["window_left"] == decode["window_left"] == 7
    (q_p, _), run_p = runs["BatchPrefillWithPagedKVCacheWrapper"]
    (q_d, _), run_d = runs["BatchDecodeWithPagedKVCacheWrapper"]
    assert q_p.shape[0] == 24 and q_d.shape[0] == 3 and run_p["out"].shape[0] == 24 and run_d["out"].shape[0] == 3
    row_bytes = w.q[0].numel() * w.q.element_size()
    assert run_d["out"].data_ptr() - run_p["out"].data_ptr() == 24 * row_bytes  # the two halves of one buffer


def test_pod_plans_both_halves_with_one_window():
    from conftest import standin_calls

    w = workloads.build(case(dtype="bfloat16"))
    calls = standin_calls("pod-window", w, "fa2")
    [(planned, shape)] = [(args, kwargs) for _, method, args, kwargs in calls if method == "plan"]
    [(ran, ran_kw)] = [(args, kwargs) for _, method, args, kwargs in calls if method == "run"]
    assert planned[0].tolist() == [0, 12, 24] and planned[4].tolist() == [0, 1, 2, 3]  # 2 chunks; 3 decodes
    assert planned[8:12] == (4, 2, 64, 4) and shape["window_left"] == 7
    assert ran[0].shape[0] == 24 and ran[2].shape[0] == 3 and ran_kw["causal_p"]


def test_the_mixed_paths_say_where_they_cannot_run():
    c = case(dtype="bfloat16", sinks=True)
    assert "no sink term" in registry.get("mixed-two-calls").skip_reason(c, "fa2", None)
    assert registry.get("pod-window").skip_reason(case(dtype="bfloat16"), "fa3", None) == "has kernels on fa2 only, not fa3"
    assert not registry.get("pod-window").models("paged", "verify", frozenset(), "cuda-graph")
