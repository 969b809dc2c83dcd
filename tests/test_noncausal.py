"""Non-causal sliding windows (the `causal` axis): FlashInfer's plan(causal=False, window_left=W) lets a
query at position p see every key of its request at position >= p - W.  The reference and every path that
takes the axis agree with that on the CPU; a path that stays causal is caught; the paths that do not take
it skip and say so; a causal case keeps the id it always had."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swabench.core import gate, workloads
from swabench.impls import registry
from swabench.inputs import axes

CPU_PATHS = ["torch-trim", "torch-mask", "torch-batch", "flex-window", "flex-contiguous", "flex-flat"]


def case(**kw):
    base = dict(mode="verify", qo_len=6, prefix_len=40, window_left=9, num_qo_heads=4, num_kv_heads=2,
                head_dim=64, dtype="float32", batch_size=3, page_size=16, causal=False)
    return axes.make_case({k: v for k, v in {**base, **kw}.items() if v is not None})


def gated(name, w):
    runner = registry.get(name).make(w, "flex" if name.startswith("flex") else "torch")
    runner.plan()
    return gate.check(runner, w)


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 40), st.integers(0, 60), st.integers(-1, 50), st.sampled_from(["paged", "ragged"]),
       st.sampled_from(CPU_PATHS))
@pytest.mark.slow
def test_every_cpu_path_passes_non_causal_windows_on_random_shapes(qo, prefix, window, storage, name):
    c = case(qo_len=qo, prefix_len=prefix, window_left=window, storage=storage)
    result = gated(name, workloads.build(c))
    assert result.passed, result.reason


@pytest.mark.parametrize("window_left", [3, 9, 63])
def test_a_path_that_stays_causal_is_caught_by_random_data_and_by_the_probes(window_left):
    w = workloads.build(case(window_left=window_left))
    causal_twin = dataclasses.replace(w, case=dataclasses.replace(w.case, causal=True))  # the same buffers
    runner = registry.get("torch-trim").make(causal_twin, "torch")
    runner.plan()
    result = gate.check(runner, w)
    assert not result.passed and "probe (" in result.reason
    assert result.probe_rel_l2 > 10 * gate.TOLERANCES["float32"].row_rel_l2


def test_paths_that_take_causal_windows_only_skip_and_say_so():
    c = case()
    for impl in registry.all_implementations():
        if impl.models(c.storage, c.mode, c.features) and not impl.noncausal:
            assert impl.skip_reason(c, (impl.backends or ("x",))[0], workloads.build(c).device) \
                in ("takes causal windows only", f"{impl.library} needs CUDA (device is cpu)"), impl.name
    assert not registry.get("paged-plan-no-window").noncausal and registry.get("paged-window").noncausal


def test_the_axis_keeps_causal_case_ids_and_names_the_other():
    causal, non = case(causal=True), case()
    assert causal.case_id == dataclasses.replace(causal, causal=True).case_id != non.case_id
    assert "non-causal" in non.label and "non-causal" not in causal.label
    assert non.axes()["causal"] is False


@pytest.mark.parametrize("qo,kv,sms,rows", [(300, 4096, 132, 128),  # flashinfer#4972's own shape: rows 0..127
                                            (1024, 1024, 84, 896),  # its fix's report, on an 84-SM A40: 0..895
                                            (1024, 1024, 132, 864),  # the same on the H200's 132 SMs
                                            (8, 4096, 132, 0)])  # 8 queries: one tile whose chunks reach the end
@pytest.mark.parametrize("page_size", [16, 1])  # paged, and ragged (the scheduler counts tokens)
def test_fa2_split_kv_schedule_says_which_rows_flashinfer_4972_gets_wrong(qo, kv, sms, rows, page_size):
    from swabench.impls import fa2_split
    got = fa2_split.wrong_rows([qo], [kv], 333, page_size, group=4, num_kv_heads=2, head_dim=128, num_sms=sms)
    assert got == [range(rows)]
    assert fa2_split.wrong_rows([qo], [kv], -1, page_size, 4, 2, 128, sms) == [range(0)]  # no window: no bug


def test_flashinfer_4972_is_declared_for_fa2_non_causal_windows_only():
    from swabench.impls import upstream
    bug = upstream.get("flashinfer#4972")
    assert bug.impls == {"paged-window", "paged-trim", "ragged-window"}
    assert not bug.shows("paged-window", case(causal=True), "fa2") and not bug.shows("paged-window", case(), "fa3")


@pytest.mark.parametrize("qo,kv,rows", [(300, 4096, 128), (1024, 1024, 864), (300, 400, 0)])
def test_paged_trim_meets_flashinfer_4972_on_the_lengths_of_its_trimmed_table(qo, kv, rows):
    """paged-trim plans each request from its window's first page: 4096 keys under 300 queries and W=333 become
    640, which fa2 still splits on 132 SMs, so rows 0..127 are wrong there as on the whole table."""
    from swabench.core import semantics
    from swabench.impls import upstream
    c = axes.make_case(dict(mode="extend", extend_len=qo, seq_len=kv, window_left=333, num_qo_heads=8, num_kv_heads=2,
                            head_dim=128, dtype="bfloat16", batch_size=1, page_size=16, causal=False))
    assert kv - semantics.trim_start(kv, qo, 333, 16) == (640 if kv == 4096 else kv)
    assert upstream.fa2_noncausal_wrong_rows("paged-trim", c, 132) == [range(rows)]
