"""The FlexAttention peers: batched by request through the page table (flex-window), the same batch
with contiguous keys (flex-contiguous) and the flattened form (flex-flat) let through exactly the visible keys
on every shape of the edge scenario, pass the gate on a sample of them, read only the key blocks of the window,
and say how they were laid out."""

import json

import pandas as pd
import pytest
import torch
from conftest import shipped

from swabench.core import gate, semantics, workloads
from swabench.impls import registry
from swabench.impls.flex import key_block_size
from swabench.inputs import axes
from swabench.store import schema

PEERS = ["flex-window", "flex-contiguous", "flex-flat"]
EDGES = shipped("edges").cases


def gated(name, w):
    runner = registry.get(name).make(w, "flex")
    runner.plan()
    return runner, gate.check(runner, w)


def edge_cases(step: int):
    return [pytest.param(c, id=c.label) for c in EDGES[::step]]


def _geometry(c) -> tuple:
    """What a FlexAttention peer computes from: every field but the seed, and but the mode outside decode
    (verify and extend of the same lengths build the same tensors)."""
    return tuple(sorted((k, str(v)) for k, v in vars(c).items() if k != "seed" and (k != "mode" or v == "decode")))


def _edge_groups() -> dict[str, list]:
    """The edge scenario's distinct shapes, by what changes a block mask: step, storage, page size, causal
    or not, chunked or not."""
    groups, seen = {}, set()
    for c in EDGES:
        if _geometry(c) not in seen:
            seen.add(_geometry(c))
            key = (f"{'decode' if c.mode == 'decode' else 'prefill'} {c.storage} ps{c.page_size} "
                   f"{'causal' if c.causal else 'non-causal'}{' chunked' if c.attention_chunk else ''}")
            groups.setdefault(key, []).append(c)
    return groups


def _failures(name: str, cases, step: int = 1) -> list[str]:
    return [f"{c.label}: {result.reason}" for c in cases[::step]
            if not (result := gated(name, workloads.build(c))[1]).passed]


def admitted_keys(runner) -> dict[tuple[int, int], set[int]]:
    """(request, query row) -> the key rows (storage slots, or positions in the contiguous copy) that a peer's
    block mask lets through: every row of its full blocks, the rows of its partial blocks that its mask_mod
    keeps.  The batched peers put a request in each batch entry; flex-flat puts the whole batch in one
    sequence, whose query i is request ``query_request[i]``'s row ``query_position[i] - prefix``."""
    bm, w = runner.block_mask, runner.w
    qb, kvb = bm.BLOCK_SIZE
    if hasattr(runner, "contiguous"):
        entries = [(b, torch.arange(rows), torch.full((rows,), b), torch.arange(rows))
                   for b, rows in enumerate(w.qo_lens)]
    else:
        request = w.query_request.long()
        row = w.query_position.long() - torch.as_tensor(w.prefix_lens)[request]
        entries = [(0, torch.arange(len(request)), request, row)]
    seen = {}
    for b, queries, request, row in entries:
        for j in range(-(-len(queries) // qb)):
            q = queries[j * qb:(j + 1) * qb]
            kinds = (("partial", bm.kv_num_blocks, bm.kv_indices), ("full", bm.full_kv_num_blocks, bm.full_kv_indices))
            blocks = {kind: ix[b, 0, j, :int(num[b, 0, j])] for kind, num, ix in kinds}
            rows_of = {k: (v[:, None] * kvb + torch.arange(kvb)).reshape(-1) for k, v in blocks.items()}
            rows_of = {k: v[v < bm.seq_lengths[1]] for k, v in rows_of.items()}  # a last block past the keys
            kept = bm.mask_mod(torch.tensor(b), torch.tensor(0), q[:, None], rows_of["partial"][None, :])
            for i, at in enumerate(q.tolist()):
                seen[int(request[at]), int(row[at])] = set(rows_of["partial"][kept[i]].tolist()) | \
                    set(rows_of["full"].tolist())
    return seen


def visible_keys(w, contiguous: bool) -> dict[tuple[int, int], set[int]]:
    """(request, query row) -> the key rows its query sees by the definition (core.semantics), evicted entries
    never among them."""
    vis, seen = semantics.of_case(w.case), {}
    live = torch.ones_like(w.key_request, dtype=torch.bool) if w.evicted is None else ~w.evicted
    for b, (rows, kv_len) in enumerate(zip(w.qo_lens, w.kv_lens)):
        mine = (w.key_request == b) & live
        position, slot = w.key_position[mine], w.slots[mine]
        where = {int(p): int(s) for p, s in zip(position, slot)}
        mask = vis.mask(rows, kv_len)
        for row in range(rows):
            keys = mask[row].nonzero().flatten().tolist()
            seen[b, row] = {k if contiguous else where[k] for k in keys if k in where}
    return seen


def mask_mismatches(name: str, cases) -> list[str]:
    """The edge shapes whose block mask lets through other keys than the definition's (the mask built as the
    first plan() builds it, never run)."""
    wrong = []
    for c in cases:
        runner = registry.get(name).make(workloads.build(c), "flex")
        runner._prepare(first=True)
        got, want = admitted_keys(runner), visible_keys(runner.w, getattr(runner, "contiguous", False))
        bad = [key for key in want if got.get(key) != want[key]]
        if bad:
            wrong.append(f"{c.label}: request {bad[0][0]} row {bad[0][1]} admits "
                         f"{sorted(got.get(bad[0], set()) ^ want[bad[0]])[:8]} wrongly ({len(bad)} rows)")
    return wrong


@pytest.mark.parametrize("case", edge_cases(100))
@pytest.mark.parametrize("name", PEERS)
def test_the_peers_pass_the_gate_on_edge_shapes(name, case):
    _, result = gated(name, workloads.build(case))
    assert result.passed, result.reason


@pytest.mark.parametrize("group", list(_edge_groups()))
@pytest.mark.parametrize("name", PEERS)
def test_the_block_masks_let_through_exactly_the_visible_keys_on_every_edge_shape(name, group):
    """The block mask is what changes from shape to shape (the kernel is the same), so every edge shape's is
    held to the definition key by key, for each peer; the gate's numerics run on a sample of each group
    (below)."""
    wrong = mask_mismatches(name, _edge_groups()[group])
    assert not wrong, f"{len(wrong)} shapes:\n" + "\n".join(wrong)


def test_the_mask_check_sees_a_window_one_key_short(monkeypatch):
    from swabench.impls import flex

    cases = _edge_groups()["prefill paged ps16 causal"][:6]
    narrow = flex.Span.narrow
    monkeypatch.setattr(flex.Span, "narrow", lambda self, seen, key, p: narrow(self, seen, key, p) & (p - key != 0))
    assert all(len(mask_mismatches(name, cases)) == len(cases) for name in PEERS)
    monkeypatch.setattr(flex.BatchedFlex, "_blocks", lambda self, b, lo, hi, full_lo, full_hi: ([], []))
    assert "admits" in mask_mismatches("flex-window", cases)[0]


@pytest.mark.slow
@pytest.mark.parametrize("group", list(_edge_groups()))
def test_flex_window_passes_the_gate_on_the_edge_shapes(group):
    failed = _failures("flex-window", _edge_groups()[group], step=6)
    assert not failed, f"{len(failed)} shapes fail:\n" + "\n".join(failed)


@pytest.mark.slow
@pytest.mark.parametrize("group", list(_edge_groups()))
@pytest.mark.parametrize("name", PEERS[1:])
def test_the_other_peers_pass_the_gate_on_edge_shapes(name, group):
    failed = _failures(name, _edge_groups()[group], step=8)
    assert not failed, f"{len(failed)} shapes fail:\n" + "\n".join(failed)


def test_the_edge_groups_hold_every_distinct_shape_once():
    groups = _edge_groups()
    shapes = [_geometry(c) for cases in groups.values() for c in cases]
    assert len(shapes) == len(set(shapes)) == len({_geometry(c) for c in EDGES}) < len(EDGES)
    assert len(groups) >= 10


def case(**kw):
    return axes.make_case({**dict(mode="decode", batch_size=3, prefix_len=200, window_left=63, num_qo_heads=8,
                                  num_kv_heads=2, head_dim=64, dtype="float32", page_size=16), **kw})


@pytest.mark.parametrize("storage,page_size,block", [("paged", 1, 16), ("paged", 8, 16), ("paged", 16, 16),
                                                     ("paged", 64, 64), ("paged", 256, 128), ("paged", 48, 16),
                                                     ("ragged", 0, 128)])
def test_a_key_block_is_a_page_where_a_page_can_be_one(storage, page_size, block):
    c = case(storage=storage, **({"page_size": page_size} if storage == "paged" else {}))
    assert key_block_size(c, contiguous=False) == block and key_block_size(c, contiguous=True) == 128


@pytest.mark.parametrize("qo_len,page_size,options", [(1, 16, {}), (127, 16, {}), (128, 16, {"BLOCK_N": 16}),
                                                     (300, 32, {"BLOCK_N": 32}), (300, 128, {})])
@pytest.mark.slow
def test_the_general_kernel_reads_a_small_page_a_page_at_a_time(qo_len, page_size, options):
    """Under 128 queries a request flex-decoding picks its own tile; from 128 the flex-attention kernel's
    BLOCK_N must divide the key block, and its default does not divide a page of 16 or 32."""
    w = workloads.build(case(mode="extend", extend_len=qo_len, prefix_len=200, batch_size=2, page_size=page_size))
    runner = registry.get("flex-window").make(w, "flex")
    assert runner.kernel_options == options
    stated = ", ".join(f"{k}={v}" for k, v in options.items()) or "default"
    assert f"{stated} kernel_options" in runner.layout
    runner.plan()
    assert gate.check(runner, w).passed


@pytest.mark.parametrize("mode,heads,kernel,options", [("decode", (8, 2), "flex-decoding", {}),
                                                       ("decode", (10, 2), "flex-attention", {"BLOCK_N": 16}),
                                                       ("verify", (40, 8), "flex-attention", {"BLOCK_N": 16})])
@pytest.mark.slow
def test_a_group_that_is_not_a_power_of_two_runs_the_general_kernel_a_page_at_a_time(mode, heads, kernel, options):
    """Inductor runs flex-decoding only for a power-of-two GQA group; Llama 4's 40/8 heads (a group of 5)
    decode and verify on the general kernel, whose BLOCK_N must then be the page (a 128-row query block)."""
    w = workloads.build(case(mode=mode, num_qo_heads=heads[0], num_kv_heads=heads[1],
                             **({"draft_tokens": 4} if mode == "verify" else {})))
    runner = registry.get("flex-window").make(w, "flex")
    assert runner.kernel_options == options and f"Inductor's {kernel} kernel" in runner.layout
    assert runner.q_block == 128
    assert registry.get("flex-window").compile_class(w.case)[0] == kernel
    runner.plan()
    assert gate.check(runner, w).passed


def test_a_kernel_inductor_cannot_build_is_a_resource_skip_with_its_message(monkeypatch):
    """The first call compiles; Inductor's own error (here the flex-decoding template's int32/int64 ternary,
    met on the H200 once K and V hold 2**31 elements) is a skip naming it, not a failed point."""
    from swabench.impls import flex

    class InductorError(Exception):
        pass

    def broken(self):
        raise InductorError("SubprocException: An exception occurred in a subprocess:\n\nName=triton_tem\n"
                            "Traceback (most recent call last):\n  File x\nAssertionError('Ternary expression "
                            "with dynamic condition has inconsistent types int64 and int32')")
    monkeypatch.setattr(flex.BatchedFlex, "_run", broken)
    runner = registry.get("flex-window").make(workloads.build(case()), "flex")
    with pytest.raises(registry.ResourceError, match="could not build the kernel: SubprocException.*"
                                                     "inconsistent types int64 and int32"):
        runner.plan()
    def misfit(self):
        raise InductorError("LoweringException: NoValidChoicesError: No choices to select")
    monkeypatch.setattr(flex.BatchedFlex, "_run", misfit)
    with pytest.raises(InductorError):  # a layout no kernel config fits is the peer's failure
        registry.get("flex-window").make(workloads.build(case()), "flex").plan()
    monkeypatch.setattr(flex.BatchedFlex, "_run", lambda self: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # and so is anything else
        registry.get("flex-window").make(workloads.build(case()), "flex").plan()


def test_flex_window_reads_only_the_pages_of_the_window():
    """A decode query at position 200 with W = 63 sees positions 137..200: pages 8..12 of its request
    (16 rows each), 3 of them wholly inside the window (no mask_mod), 2 at its edges."""
    runner, result = gated("flex-window", workloads.build(case(page_layout="scattered")))
    assert result.passed, result.reason
    bm = runner.block_mask
    assert bm.BLOCK_SIZE == (128, 16)
    assert bm.kv_num_blocks.flatten().tolist() == [2, 2, 2] and bm.full_kv_num_blocks.flatten().tolist() == [3, 3, 3]
    w = runner.w
    for b in range(3):
        pages = w.kv_indices_host[w.kv_indptr_host[b]:w.kv_indptr_host[b + 1]].tolist()
        seen = bm.kv_indices[b, 0, 0, :2].tolist() + bm.full_kv_indices[b, 0, 0, :3].tolist()
        assert sorted(seen) == sorted(pages[8:13])
    assert "batch 3 x 1 queries" in runner.layout and "key block 16 = page" in runner.layout
    assert "flex-decoding" in runner.layout


@pytest.mark.slow
def test_uneven_queries_are_padded_and_padding_is_never_written_back():
    c = axes.make_case(dict(mode="extend", batch_size=3, prefix_len=40, qo_len=(5, 17, 1), window_left=9,
                            num_qo_heads=4, num_kv_heads=2, head_dim=32, dtype="float32", page_size=16))
    for name in ("flex-window", "flex-contiguous"):
        runner, result = gated(name, workloads.build(c))
        assert result.passed and result.unwritten_rows == 0, (name, result.reason)
        assert "batch 3 x 17 queries (padded)" in runner.layout


def test_the_contiguous_copy_is_refreshed_outside_the_timed_call():
    """flex-contiguous reads its own copy of the keys: run() alone would answer for the old keys; the gate
    refreshes the copy after every change of the data, and so passes."""
    w = workloads.build(case())
    runner, result = gated("flex-contiguous", w)
    assert result.passed, result.reason
    runner.refresh_inputs()
    runner.run()
    before = runner.out.clone()
    w.k_store.normal_()  # new keys, the same queries
    runner.run()
    assert (runner.out == before).all()  # stale: the copy was not refreshed
    runner.refresh_inputs()
    runner.run()
    assert not (runner.out == before).all()


@pytest.mark.parametrize("version,name", [(5, "flex-flat"), (6, "flex-window")])
def test_older_flex_window_rows_read_as_the_flattened_peer(tmp_path, version, name):
    """Before result format 6 flex-window was the flattened form: its rows read as flex-flat, in the table
    and in the rows with their samples; a folder of format 6 keeps the name."""
    from swabench.store import run_folder

    (tmp_path / "meta.json").write_text(json.dumps({"format_version": version, "scenario": "s"}))
    pd.DataFrame({"case_id": ["c1", "c1"], "impl": ["flex-window", "paged-window"], "backend": ["flex", "fa2"],
                  "status": ["pass", "pass"], "median_us": [9.0, 1.0]}).to_csv(tmp_path / "results.csv", index=False)
    pd.DataFrame({"case_id": ["c1"], "impl": ["flex-window"], "backend": ["flex"], "kind": ["kernel"],
                  "index": [0], "value_us": [9.0]}).to_csv(tmp_path / "samples.csv", index=False)
    table, _ = run_folder.load(tmp_path)
    assert table["impl"].tolist() == [name, "paged-window"]
    rows = run_folder.read_rows(tmp_path)
    assert [r["impl"] for r in rows] == [name, "paged-window"] and rows[0]["samples"] == {"kernel": [9.0]}
    assert schema.renamed_impls(version) == ({"flex-window": "flex-flat"} if version < 6 else {})


@pytest.mark.parametrize("kw,mask", [(dict(), False),  # decode, every window full: no mask, SDPA may pick flash
                                     (dict(prefix_len=(20, 200, 5)), True),  # windows of different lengths: padded keys
                                     (dict(mode="verify", draft_tokens=4), True),
                                     (dict(mode="extend", qo_len=(5, 17, 1), prefix_len=40), True),
                                     (dict(storage="ragged"), False)])
def test_the_batched_sdpa_peer_is_one_call_over_the_batch(kw, mask):
    kw = {**kw, "page_size": 16} if kw.get("storage") != "ragged" else kw
    runner, result = gated("torch-batch", workloads.build(case(**kw)))
    assert result.passed and result.unwritten_rows == 0, result.reason
    assert (runner.mask is not None) is mask and "one SDPA call" in runner.layout


def test_batched_peers_compile_per_batch_size_and_rows_not_per_length():
    """Batch and rows are static in the batched peers' compile (flex-decoding splits keys by them); key
    lengths are not: cases that differ only in context share a compile, so a sweep compiles a few times."""
    window = registry.get("flex-window").compile_class
    assert window(case(prefix_len=200)) == window(case(prefix_len=9000, window_left=1023))
    assert window(case(batch_size=3)) != window(case(batch_size=4))
    assert window(case(mode="verify", draft_tokens=8)) != window(case())
    assert window(case(page_size=64)) != window(case(page_size=16))  # the key block is the page
    assert window(case())[0] == "flex-decoding" and window(case(mode="extend", extend_len=256))[0] == "flex-attention"
    contiguous = registry.get("flex-contiguous").compile_class
    assert contiguous(case(page_size=64)) == contiguous(case(page_size=16))


def test_the_peers_section_holds_each_peer_to_the_reference_and_says_what_paging_costs():
    from swabench.publish.sections import Run, by_key

    rows = []
    for case_id, mode, batch, prefix, fa2, window, dense in [("d1", "decode", 64, 8192, 10.0, 50.0, 40.0),
                                                           ("d2", "decode", 8, 8192, 10.0, 200.0, 100.0),
                                                           ("v1", "verify", 32, 32768, 20.0, 400.0, 100.0)]:
        common = dict(case_id=case_id, mode=mode, batch_size=batch, prefix_len=prefix, storage="paged",
                      kind="correct", status="pass")
        rows += [dict(common, impl="paged-window", library="flashinfer", backend="fa2", median_us=fa2),
                 dict(common, impl="flex-window", library="flex", backend="flex", median_us=window,
                      layout=f"batch {batch} x 1 queries, keys in place (paged), key block 16 = page"),
                 dict(common, impl="flex-contiguous", library="flex", backend="flex", median_us=dense,
                      layout="contiguous")]
    run = Run("r", pd.DataFrame(rows), {})
    section = by_key("peers")
    table = section.table(run).set_index(["peer", "mode"])
    within = "within 10x at batch >= 32, context >= 8k"
    assert table.loc[("flex-window", "decode"), within] == "1 of 1"  # d2 is batch 8: not held to it
    assert table.loc[("flex-window", "verify"), within] == "0 of 1"  # 20x
    assert table.loc[("flex-window", "decode"), "time / reference (median)"] == "12.5x (5.00-20.0, 2)"
    assert table.loc[("flex-window", "decode"), "layout (one case)"].startswith("batch 64 x 1 queries")
    said = section.said(run)[0]
    assert "`flex-window` / `flex-contiguous`" in said and "decode 1.62x (1.25-2.00, 2), verify 4.00x" in said


def test_a_folder_of_an_older_format_naming_flex_window_is_not_resumed(tmp_path):
    """Its flex-window rows are the flattened peer: resuming would file the batched one beside them."""
    from swabench.store import run_folder

    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 5, "scenario": "s"}))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"case_id": "c1", "impl": "flex-window", "backend": "flex",
                                                     "status": "pass"}) + "\n")
    with pytest.raises(run_folder.RunFolderError, match="format 5, where flex-window named another"):
        run_folder.RunStore.resume(tmp_path, "name = 's'\n")


def test_a_rebuilt_peer_shows_beside_its_old_numbers_on_the_cases_both_runs_hold():
    from swabench.publish.sections import Run, by_key

    def run(name, peer, times, scenario="default"):
        rows = []
        for (case_id, mode), t in zip([("d1", "decode"), ("d2", "decode"), ("v1", "verify"), ("x1", "extend")], times):
            common = dict(case_id=case_id, mode=mode, batch_size=32, prefix_len=8192, storage="paged", kind="correct",
                          status="pass")
            rows += [dict(common, impl="paged-window", library="flashinfer", backend="fa2", median_us=10.0)]
            if t:
                rows += [dict(common, impl=peer, library="flex", backend="flex", median_us=t)]
        return Run(name, pd.DataFrame(rows), {"scenario": scenario})

    old, new = run("old", "flex-flat", [3000.0, 1000.0, 200.0, None]), run("new", "flex-window", [20.0, 40.0, 30.0, 12.0])
    elsewhere = run("other", "flex-flat", [1.0, 1.0, 1.0, 1.0], scenario="peers")
    said = by_key("peers-rebuilt").across([new, elsewhere, old])
    assert said == ["- `flex-flat` (`old`) then `flex-window` (`new`), time / reference on the 3 cases both ran: "
                    "verify 20.0x then 3.00x; decode 200x (100-300, 2) then 3.00x (2.00-4.00, 2)."]
    assert by_key("peers-rebuilt").across([new]) == []


def test_the_compile_section_counts_the_first_calls_that_compiled_and_names_the_longest():
    from swabench.publish.sections import Run, by_key

    rows = [dict(case_id=c, case=f"case {c}", impl=i, backend=b, kind="correct", status="pass", median_us=1.0,
                 compile_s=s)
            for c, i, b, s in [("a", "flex-window", "flex", 12.0), ("b", "flex-window", "flex", 0.01),
                               ("a", "flex-flat", "flex", 0.5), ("b", "flex-flat", "flex", 30.0),
                               ("a", "paged-window", "fa2", None)]]
    run = Run("r", pd.DataFrame(rows), {})
    section = by_key("compiles")
    table = section.table(run).set_index("path")
    assert table.index.tolist() == ["flex-window [flex]", "flex-flat [flex]"]  # registration order, FlashInfer has none
    assert table.loc["flex-window [flex]", "first calls of 1 s or more"] == 1
    assert table.loc["flex-flat [flex]", "their seconds"] == "30.0" and table.loc["flex-flat [flex]", "points"] == 2
    assert table.loc["flex-flat [flex]", "longest at"] == "case b" and table.loc["flex-flat [flex]", "longest s"] == "30.0"
    assert section.said(run) == ["- The longest first call: `flex-flat` [flex], 30.0 s at case b (`r`)."]
    assert section.table(Run("r", pd.DataFrame(rows[-1:]), {})).empty
