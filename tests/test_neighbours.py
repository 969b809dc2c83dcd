"""The findings sections of the attention beside a causal window: non-causal windows (flashinfer#4972 where
it is declared, and any failure outside it named) and chunked attention (the mistake's count, the paths'
time against the window of the chunk's keys)."""

from pathlib import Path

import pandas as pd

from swabench.publish.sections import Run, by_key, neighbours

META = {"libraries": {"flashinfer": "0.7.4"}}


def noncausal_run(extra=()):
    rows = [dict(impl="paged-window", backend="fa2", status=s, upstream=u, causal=c)
            for s, u, c in [("pass", None, False), ("xfail", "flashinfer#4972", False), ("pass", None, True)]]
    rows += [dict(impl="paged-window", backend="fa3", status="pass", upstream=None, causal=False), *extra]
    return Run("r", pd.DataFrame(rows), META)


def test_non_causal_points_are_counted_where_the_bug_is_declared_and_outside_it():
    t = neighbours.noncausal_table(noncausal_run()).set_index("path")
    assert t.loc["paged-window [fa2]", ["points", "pass", "wrong where declared", "fail"]].tolist() == [2, 1, 1, 0]
    assert t.loc["paged-window [fa3]", "pass"] == 1  # the causal twin is not counted
    said = neighbours.noncausal_said(noncausal_run())[0]
    assert "every correct path passes its non-causal points, except where flashinfer#4972 is declared, each is " \
           "wrong: `paged-window [fa2]` on 1 of 2; no point fails outside it" in said
    assert said.startswith("flashinfer 0.7.4")
    said = neighbours.noncausal_said(noncausal_run([dict(impl="ragged-window", backend="fa3", status="fail",
                                                         upstream=None, causal=False)]))[0]
    assert "1 point of correct paths fails outside any declared bug (`ragged-window [fa3]`); where " \
           "flashinfer#4972 is declared, each is wrong" in said and "every correct path passes" not in said


def test_a_run_without_non_causal_or_chunked_points_has_neither_section():
    run = Run("r", pd.DataFrame([dict(impl="paged-window", backend="fa2", status="pass", causal=True, median_us=1.0)]),
              META)
    assert by_key("noncausal").for_runs([run]) == [] and by_key("chunked").for_runs([run]) == []


def chunked_run():
    shape = dict(mode="decode", batch_size=32, prefix_len=None, num_qo_heads=40, num_kv_heads=8, head_dim=128)
    rows = []
    for seq, us in [(4096, 100.0), (8192, 10.0)]:
        rows.append(dict(shape, seq_len=seq, impl="paged-window", backend="fa2", kind="correct", status="pass",
                         attention_chunk=0, window_left=8191, median_us=200.0, must_fail=False))
        rows.append(dict(shape, seq_len=seq, impl="chunk-virtual", backend="fa2", kind="correct", status="pass",
                         attention_chunk=8192, window_left=-1, median_us=us, must_fail=False))
        rows.append(dict(shape, seq_len=seq, impl="chunk-as-window", backend="fa2", kind="known-bug",
                         status="xfail" if seq == 8192 else "pass", attention_chunk=8192, window_left=-1,
                         median_us=None, must_fail=seq == 8192))
    return Run("r", pd.DataFrame(rows), META)


def test_chunked_paths_are_held_against_the_window_of_the_chunks_keys():
    t = neighbours.chunked_table(chunked_run()).set_index("path")
    column = "time / paged-window [fa2] on the window of C keys"
    assert t.loc["chunk-virtual [fa2]", column] == "0.28 (0.05-0.50, 2)"  # 100/200 and 10/200
    assert t.loc["chunk-as-window [fa2]", ["pass", "xfail"]].tolist() == [1, 1]
    said = neighbours.chunked_said(chunked_run())
    assert said[0] == "Chunk 8192, flashinfer 0.7.4 (`r`)."
    assert "`chunk-as-window` is wrong on its one point where a query sees keys before its chunk start, and exact " \
           "on the 1 where none does (0 not caught)" in said[1]
    assert "Every correct chunked path passes" in said[2]


def test_the_answers_say_what_the_window_s_neighbours_and_a_whole_model_show(tmp_path):
    """The first screen says where flashinfer#4972 shows on each release (older ones too), what the chunk
    mistake does, and each priced model's windowed share, one line a model."""
    from swabench.publish import findings
    from swabench.publish.sections import answers
    root = Path(__file__).resolve().parent / "fixtures" / "published" / "results"
    runs = findings.load([root / "h200-noncausal-0.7.4", root / "h200-noncausal-0.7.2.post1",
                          root / "h200-chunked-0.7.4"])
    text = "\n".join(answers.answers(runs))
    beside = text[text.index("**Beside the causal window**"):]
    declared = [line for line in beside.splitlines() if "flashinfer#4972 is declared, each is wrong: `paged-window [fa2]` "
                "on 3 of 6" in line]
    assert len(declared) == 1 and all(f"`{root / name}`" in declared[0]  # said once, of both releases
                                      for name in ("h200-noncausal-0.7.4", "h200-noncausal-0.7.2.post1"))
    assert "`chunk-as-window` is wrong on all 32 points" in beside
    price = {"model": "m", "windowed_layers": 5, "num_layers": 6, "model_steps": 1,
             "kv": [{"kv_mib_all_pages": 100.0, "kv_mib_evicted": 25.0}, {"kv_mib_all_pages": 10.0,
                                                                           "kv_mib_evicted": 5.0}]}
    (tmp_path / "price.csv").write_text("mode,windowed layers (ms),global layers (ms),whole model (ms),windowed share\n"
                                        "decode,1,3,4,0.25\nall modes,1,3,4,0.25\n")
    priced = Run(str(tmp_path), pd.DataFrame(), {**META, "price": price})
    traced = Run(str(tmp_path / "t"), pd.DataFrame(), {**META, "price": {**price, "model_steps": 200},
                                                        "trace": {"file": "price-m-example"}})
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "price.csv").write_text("mode,whole model (ms),windowed share,one path per layer type (ms)\n"
                                              "all modes,8,0.5,9\n")
    said = answers.whole_models([priced, traced])
    assert said == [f"- `m`, 5 of 6 layers windowed: over models.toml steps, 25% windowed, 4 ms (`{tmp_path}`); "
                    f"over the trace `example` (200 steps), 50% windowed, 8 / 9 ms (`{tmp_path / 't'}`)."]
    here = Run(str(tmp_path), pd.DataFrame(), {**priced.meta, "gpu": "NVIDIA H200"})
    elsewhere = Run(str(tmp_path / "t"), pd.DataFrame(), {**traced.meta, "gpu": "NVIDIA H100 80GB HBM3"})
    said = answers.whole_models([here, elsewhere])[0]  # runs on two cards: each names its own
    assert f"4 ms (H200, `{tmp_path}`)" in said
    assert f"8 / 9 ms (H100 80GB HBM3, `{tmp_path / 't'}`)" in said


def test_a_sentence_of_many_runs_names_the_first_and_counts_the_rest():
    from swabench.publish.sections.base import merged

    runs = [Run(name, pd.DataFrame(), META) for name in "abcd"]
    said = [("X", r) for r in runs] + [("Y", runs[0]), ("Y", runs[1]), ("X", runs[0])]
    assert merged(said) == ["X (`a`, `b`, `c`, `d`).", "Y (`a`, `b`)."]
    assert merged(said, most=2) == ["X (`a` and 3 more runs, each named in the detail).", "Y (`a`, `b`)."]
