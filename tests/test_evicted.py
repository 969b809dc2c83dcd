"""Evicted pages (docs/serving-paths.md): the pages before each request's window handed to other requests or
pointed at one shared page; correct paths pass, leaks are caught, and the NaN diagnostic tells the
kernels that read before the window from those that do not."""

import pytest
import torch

from swabench.publish.sections import Run, serving
from swabench.analysis import versus
from swabench.core import gate, workloads
from swabench.inputs import axes, scenarios
from swabench.impls import registry


def build(layout, **kw):
    return workloads.build(axes.make_case({**dict(mode="verify", draft_tokens=4, prefix_len=100, window_left=15,
                                                        page_size=16, page_layout=layout, num_qo_heads=4,
                                                        num_kv_heads=2, head_dim=64, batch_size=3), **kw}))


def test_pages_wholly_before_the_window_are_evicted():
    w = build("evicted-null")
    # prefix 100, W 15: the first query sees keys from 85, so pages 0..4 (keys 0..79) go, page 5 stays
    assert workloads.evicted_before(w.case, w.kv_lens, w.qo_lens) == [5, 5, 5]
    table = w.kv_indices_host.view(3, 7)
    null = int(w.evicted_pages[0])
    assert (table[:, :5] == null).all() and (table[:, 5:] != null).all() and null == 21
    assert int(w.evicted.sum()) == 3 * 5 * 16


def test_reused_pages_are_pages_other_requests_still_hold():
    w = build("evicted-reused")
    table, gone = w.kv_indices_host.view(3, 7), 5
    for b in range(3):
        others = {int(p) for o in range(3) if o != b for p in table[o, gone:]}
        assert {int(p) for p in table[b, :gone]} <= others
    assert len(w.evicted_pages) == 0  # nothing of their own to fill


@pytest.mark.parametrize("layout", ["evicted-null", "evicted-reused"])
@pytest.mark.parametrize("name,passes,reads", [("torch-trim", True, False), ("torch-mask", True, True),
                                               ("flex-window", True, True),  # eager flex scores every row
                                               ("planted-wide", False, None)])
@pytest.mark.slow
def test_correct_paths_pass_and_the_diagnostic_sees_who_reads(layout, name, passes, reads):
    w = build(layout)
    runner = registry.get(name).make(w, "torch")
    runner.plan()
    result = gate.check(runner, w)
    assert result.passed is passes, result.reason
    if passes:
        seen = gate.reads_evicted(runner, w)
        assert seen is (reads if layout == "evicted-null" else None)
        assert not torch.isnan(w.k_store).any()  # the diagnostic leaves random data behind


def test_the_report_counts_reads_per_path():
    import pandas as pd
    t = pd.DataFrame({"impl": ["a", "a", "b"], "backend": ["fa2"] * 3, "reads_evicted": [True, False, None]})
    assert serving.evicted_reads(Run("x", t, {})).values.tolist() == [["a", "fa2", "1/2"]]


def test_the_evicted_scenario_loads():
    s = scenarios.load(scenarios.find("evicted"))
    assert {c.page_layout for c in s.cases} == {"scattered", "evicted-reused", "evicted-null"}


def test_probe_writes_leave_other_requests_pages_their_own():
    from swabench.core import probes
    w = build("evicted-reused")
    probes.fill(w, 0, seed=0)
    n_freq = probes.frequencies_needed(max(w.kv_lens), w.case.window_left)
    want = probes.features(w.key_position, n_freq, w.case.head_dim)
    want[:, probes.SHIFT] = 1.0
    live = ~w.evicted
    got = w.k_store.view(-1, 2, 64)[w.slots[live], 0].double()
    torch.testing.assert_close(got, want[live].to(torch.bfloat16).double())


def test_a_leak_into_an_evicted_page_is_an_order_one_error():
    from swabench.core import semantics
    from swabench.impls import embedded
    errors = {}
    for layout in ("scattered", "evicted-null"):
        w = build(layout)
        runner = embedded.GatherRunner(w, lambda case, prefix: semantics.Visibility(semantics.NO_WINDOW), trim=False)
        runner.plan()
        errors[layout] = gate.check(runner, w).rel_l2
    assert errors["evicted-null"] > 10 * errors["scattered"] and errors["evicted-null"] > 1


def test_evicted_layouts_are_not_plain():
    import pandas as pd
    t = pd.DataFrame({"impl": ["a"] * 3, "page_layout": ["scattered", "evicted-null", None], "sinks": False,
                      "logits_soft_cap": 0.0, "kv_dtype": "bfloat16", "dtype": "bfloat16"})
    assert versus.plain(t).index.tolist() == [0, 2]  # ragged storage has no page layout: plain
