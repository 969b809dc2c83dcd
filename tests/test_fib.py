"""FlashInfer-Bench's format both ways: a trace exported and imported back is the same trace, step for step and
count for count; what is written loads with flashinfer-bench's own loaders; each definition's reference is the
attention swabench's reference computes (window, sinks, soft-cap, page table); bad folders are exit 2."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import invoke

from swabench.core import reference, semantics, workloads
from swabench.inputs import axes, fib, fib_definition, fib_import, fib_reference, models, traces

safetensors = pytest.importorskip("safetensors")  # the test and fib extras install it
import safetensors.torch  # noqa: E402

GPT = {"model": "gpt-oss-20b"}  # sinks, window_left 127, 64/8 heads, head_dim 64
GEMMA = {"model": "gemma-3-4b"}  # plain window, window_left 1023, 8/4 heads, head_dim 256
STEPS = [{"mode": "decode", **GPT, "requests": [[200, 1], [17, 1]], "count": 5},
         {"mode": "extend", **GPT, "requests": [[0, 40], [150, 9]]},
         {"mode": "verify", **GPT, "requests": [[300, 4], [129, 4]], "count": 2},
         {"mode": "decode", **GPT, "model_features": False, "requests": [[130, 1]], "count": 4},
         {"mode": "decode", **GEMMA, "requests": [[1500, 1], [3, 1]], "count": 3},
         {"mode": "decode", **GEMMA, "wrapper_mode": "plain", "requests": [[1500, 1], [3, 1]], "count": 2},
         {"mode": "extend", **GEMMA, "requests": [[1100, 30]], "count": 7},
         {"mode": "extend", **GEMMA, "page_layout": "contiguous", "seed": 3, "requests": [[20, 5]], "count": 11}]


def write(path: Path, lines) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def exported(tmp_path):
    trace = write(tmp_path / "t.jsonl", STEPS)
    return trace, fib.export(trace, tmp_path / "fib")


def preset_of(name: str) -> str:
    """The preset (gpt-oss-20b or gemma-3-4b) whose heads the definition has."""
    return "gpt-oss-20b" if "_h64_" in name else "gemma-3-4b"


def test_export_then_import_gives_the_trace_back(tmp_path, exported):
    trace, result = exported
    text = ""
    for d in result.definitions:
        out = tmp_path / f"{d.name}.jsonl"
        imported = fib_import.import_(tmp_path / "fib", d.name, preset_of(d.name), out)
        assert imported.window_from == "definition" and imported.steps == d.steps
        text += out.read_text()
    back = traces.parse(text.encode())
    assert back == traces.read(trace)  # the same steps, the same counts
    assert traces.weights(back) == traces.weights(traces.read(trace))  # the same cases
    assert sum(back.values()) == sum(s.get("count", 1) for s in STEPS)


def test_definitions_carry_the_window_and_features_in_their_names(exported):
    _, result = exported
    gpt, gemma = models.get("gpt-oss-20b"), models.get("gemma-3-4b")
    assert sorted(d.name for d in result.definitions) == sorted([
        f"gqa_paged_decode_swa_w{gpt.window_left}_h64_kv8_d64_ps16_sinks",
        f"gqa_paged_decode_swa_w{gpt.window_left}_h64_kv8_d64_ps16",
        f"gqa_paged_prefill_swa_w{gpt.window_left}_h64_kv8_d64_ps16_sinks",
        f"gqa_paged_decode_swa_w{gemma.window_left}_h8_kv4_d256_ps16",
        f"gqa_paged_prefill_swa_w{gemma.window_left}_h8_kv4_d256_ps16"])
    for d in result.definitions:
        doc = json.loads(d.definition.read_text())
        assert doc["name"] == d.name and "causal" not in d.name
        window = gpt.window_left if "_h64_" in d.name else gemma.window_left
        assert doc["axes"]["window_left"] == {**doc["axes"]["window_left"], "type": "const", "value": window}
        assert ("sinks" in doc["inputs"]) == d.name.endswith("_sinks")
    case = axes.make_case({"mode": "decode", "model": "gemma-2-2b", "prefix_len": 10})
    assert fib_definition.name(case).endswith("_cap50") and fib_reference.reference(case).count("LOGITS_SOFT_CAP = 50.0") == 1


def test_the_written_files_load_with_flashinfer_benchs_loaders(exported):
    fib_data = pytest.importorskip("flashinfer_bench.data")
    from flashinfer_bench.bench.utils import load_safetensors

    trace, result = exported
    assert result.checked  # export read them back itself
    root = result.out
    for d in result.definitions:
        definition = fib_data.load_json_file(fib_data.Definition, d.definition)
        assert definition.op_type == "gqa_paged" and d.definition.parent.name == "gqa_paged"
        assert set(definition.var_axes) == {"batch_size", "num_pages", "len_indptr", "num_kv_indices"} | (
            {"total_q"} if "prefill" in d.name else set())
        records = fib_data.load_jsonl_file(fib_data.Trace, d.workloads)
        assert len(records) == d.count and all(r.is_workload_trace() and r.definition == d.name for r in records)
    trace_set = fib_data.TraceSet.from_path(str(root))
    assert set(trace_set.definitions) == {d.name for d in result.definitions}
    assert sum(len(w) for w in trace_set.workloads.values()) == len(traces.read(trace))
    for name, records in trace_set.workloads.items():
        for r in records:
            stored = load_safetensors(trace_set.definitions[name], r.workload, root)  # shapes and dtypes checked
            assert set(stored) == {"kv_indptr", "kv_indices", "kv_last_page_len"} | (
                {"qo_indptr"} if "prefill" in name else set())


LAYERS = {  # small layers whose window the steps below reach past, in float32 so the comparison is tight
    "sinks+cap": {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "window_left": 15, "sinks": True,
                  "logits_soft_cap": 30.0, "dtype": "float32"},
    "plain": {"num_qo_heads": 4, "num_kv_heads": 1, "head_dim": 64, "window_left": 9, "page_size": 4,
              "dtype": "float32"},
    "gpt-oss-20b": {"model": "gpt-oss-20b", "dtype": "float32", "page_layout": "evicted-reused"},
}


def run_reference(source: str, tensors: dict, w, decode: bool):
    scope = {}
    exec(compile(source, "<reference>", "exec"), scope)
    args = [w.q, w.k_store, w.v_store, *([] if decode else [tensors["qo_indptr"]]), tensors["kv_indptr"],
            tensors["kv_indices"], tensors["kv_last_page_len"], w.sm_scale, *([w.sinks] if w.sinks is not None else [])]
    return scope["run"](*args)


def expected_lse(w) -> torch.Tensor:
    """Base-2 log-sum-exp of each query's visible (scaled, capped) logits and its sink, written out here."""
    c, rows = w.case, []
    for b, (qo, kv) in enumerate(zip(w.qo_lens, w.kv_lens)):
        keys = w.keys(b).double().repeat_interleave(c.gqa_group, dim=1)
        logits = torch.einsum("qhd,khd->hqk", w.queries(b).double(), keys) * w.sm_scale
        if c.logits_soft_cap:
            logits = c.logits_soft_cap * torch.tanh(logits / c.logits_soft_cap)
        logits = logits.masked_fill(~semantics.Visibility(c.window_left).mask(qo, kv), -math.inf)
        if w.sinks is not None:
            logits = torch.cat([logits, w.sinks.double()[:, None, None].expand(-1, qo, 1)], dim=-1)
        rows.append((torch.logsumexp(logits, dim=-1) / math.log(2)).T)
    return torch.cat(rows)


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("mode,requests", [("decode", [[40, 1], [7, 1], [300, 1]]),
                                           ("extend", [[0, 30], [237, 12]]), ("verify", [[260, 4], [25, 4]])])
def test_the_definitions_reference_is_swabenchs_attention(tmp_path, layer, mode, requests):
    trace = write(tmp_path / "t.jsonl", [{"mode": mode, **LAYERS[layer], "requests": requests}])
    (written,) = fib.export(trace, tmp_path / "fib").definitions
    doc = json.loads(written.definition.read_text())
    (record,) = [json.loads(line) for line in written.workloads.read_text().splitlines()]
    tensors = safetensors.torch.load_file(tmp_path / "fib" / record["workload"]["inputs"]["kv_indptr"]["path"])
    w = workloads.build(axes.make_case(next(iter(traces.read(trace))).axes()))
    for key in ("kv_indptr", "kv_indices", "kv_last_page_len"):  # the page table swabench's gate reads
        assert torch.equal(tensors[key], getattr(w, key)), key
    output, lse = run_reference(doc["reference"], tensors, w, mode == "decode")
    assert output.dtype == w.q.dtype and lse.dtype == torch.float32 and lse.shape == w.q.shape[:2]
    assert torch.allclose(output.double(), reference.attention(w), atol=2e-5, rtol=1e-5)
    assert torch.allclose(lse.double(), expected_lse(w), atol=2e-5, rtol=1e-5)
    window = f"WINDOW_LEFT = {w.case.window_left}\n"
    wider, _ = run_reference(doc["reference"].replace(window, f"WINDOW_LEFT = {w.case.window_left + 1}\n"), tensors,
                             w, mode == "decode")
    assert (wider.double() - reference.attention(w)).abs().max() > 1e-3  # these steps reach past the window


def test_a_replays_run_folder_exports_its_steps_and_counts(tmp_path):
    run = Path(__file__).resolve().parent / "fixtures" / "published" / "results" / "h200-replay-example"
    meta = json.loads((run / "meta.json").read_text())["trace"]
    result = fib.export(run, tmp_path / "fib")
    assert sum(d.steps for d in result.definitions) == meta["steps"]
    assert sum(d.count for d in result.definitions) == meta["distinct"]
    assert {d.name for d in result.definitions} == {"gqa_paged_decode_swa_w1023_h32_kv16_d128_ps16",
                                                    "gqa_paged_prefill_swa_w1023_h32_kv16_d128_ps16"}
    text = "".join(fib_import.import_(tmp_path / "fib", d.name, "gemma-3-27b", tmp_path / f"{d.name}.jsonl").out.read_text()
                   for d in result.definitions)
    assert traces.weights(traces.parse(text.encode())) == meta["weights"]


def test_the_commands_say_what_they_wrote_and_refuse_to_overwrite(tmp_path):
    trace = write(tmp_path / "t.jsonl", STEPS)
    out = tmp_path / "fib"
    first = invoke("export-fib", trace, "--out", out)
    assert first.exit_code == 0, first.output
    assert "5 definitions, 8 workloads, 35 steps" in first.output and "gqa_paged_decode_swa_w127_h64" in first.output
    again = invoke("export-fib", trace, "--out", out)
    assert again.exit_code == 2 and "exists and is not empty (--force" in again.output
    assert invoke("export-fib", trace, "--out", out, "--force").exit_code == 0
    (out / "solutions").mkdir()  # a FlashInfer-Bench evaluation's: --force never removes what it did not write
    kept = invoke("export-fib", trace, "--out", out, "--force")
    assert kept.exit_code == 2 and "holds solutions, which export-fib does not write" in kept.output
    assert (out / "solutions").is_dir()
    name = f"gqa_paged_prefill_swa_w{models.get('gemma-3-4b').window_left}_h8_kv4_d256_ps16"
    target = tmp_path / "back.jsonl"
    done = invoke("import-fib", out, "--definition", name, "--model", "gemma-3-4b", "--out", target)
    assert done.exit_code == 0 and "2 lines, 18 steps" in done.output and "window from the definition" in done.output
    refused = invoke("import-fib", out, "--definition", name, "--model", "gemma-3-4b", "--out", target)
    assert refused.exit_code == 2 and "exists (--force" in refused.output


def mutate(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


DECODE = "gqa_paged_decode_swa_w1023_h8_kv4_d256_ps16"


@pytest.mark.parametrize("setup,args,message", [
    (None, ("nowhere", DECODE, "gemma-3-4b"), "nowhere: no such folder"),
    (lambda root: [p.unlink() for p in (root / "definitions").rglob("*.json")], (None, DECODE, "gemma-3-4b"),
     "no definitions (definitions/**/*.json)"),
    (None, (None, "gqa_paged_decode_h8_kv4_d256_ps16", "gemma-3-4b"), f"no such definition in {{root}} (did you "
     f"mean '{DECODE}'?); available: gqa_paged_decode_swa_w1023_h8_kv4_d256_ps16, "),
    (lambda root: [p.unlink() for p in (root / "blob").rglob("*.safetensors") if DECODE in str(p)],
     (None, DECODE, "gemma-3-4b"), f"{DECODE}.jsonl: line 1: workload.inputs.kv_indptr.path: the blob "
     f"blob/workloads/gqa_paged/{DECODE}/"),
    (lambda root: mutate(root / "definitions" / "gqa_paged" / f"{DECODE}.json", lambda d: d.update(op_type="gemm")),
     (None, DECODE, "gemma-3-4b"), "op_type 'gemm', name gqa_paged_decode_swa_w1023_h8_kv4_d256_ps16: not a GQA "
     "paged prefill or decode definition"),
    (None, (None, DECODE, "mistral-7b-v0.1"), f"{DECODE}.json: axes.num_qo_heads is 8, but mistral-7b-v0.1 has "
     f"num_qo_heads 32"),
    (None, (None, DECODE, "gemma-2-2b"), f"{DECODE}.json: axes.window_left is 1023, but gemma-2-2b has window_left "
     f"4095 (sliding_window 4096)"),
    (None, (None, DECODE, "no-such-model"), "--model: unknown model 'no-such-model'"),
    (lambda root: mutate(root / "definitions" / "gqa_paged" / f"{DECODE}.json", lambda d: d["inputs"].pop("kv_indptr")),
     (None, DECODE, "gemma-3-4b"), f"{DECODE}.json: inputs.kv_indptr: missing"),
])
def test_bad_folders_are_exit_2_naming_the_problem(tmp_path, exported, setup, args, message):
    root = tmp_path / "fib"
    if setup:
        setup(root)
    folder, name, model = args
    target = tmp_path / "back.jsonl"
    result = invoke("import-fib", folder or root, "--definition", name, "--model", model, "--out", target)
    assert result.exit_code == 2, result.output
    assert message.format(root=root) in " ".join(result.output.split()), result.output
    assert not target.exists()


@pytest.mark.parametrize("line,message", [
    ({"mode": "decode", "num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, "window_left": -1, "requests": [[9, 1]]},
     "no window (window_left -1)"),
    ({"mode": "decode", "model": "llama-4-scout", "requests": [[9, 1]]}, "chunked attention (attention_chunk 8192)"),
    ({"mode": "extend", **GEMMA, "storage": "ragged", "requests": [[9, 3]]}, "ragged storage"),
])
def test_layers_without_a_paged_window_are_left_out_and_named(tmp_path, line, message):
    trace = write(tmp_path / "t.jsonl", [STEPS[0], line])
    result = invoke("export-fib", trace, "--out", tmp_path / "fib")
    assert result.exit_code == 0 and f"left out {line['mode']} b1" in result.output and message in result.output
    assert "1 definition, 1 workload" in result.output
    alone = write(tmp_path / "alone.jsonl", [line])  # nothing left to export: a plain error, nothing written
    result = invoke("export-fib", alone, "--out", tmp_path / "none")
    assert result.exit_code == 2 and "no step to export" in result.output and message in result.output, result.output
    assert not (tmp_path / "none").exists()


SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fib_evaluate.py"


@pytest.fixture(scope="module")
def evaluate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fib_evaluate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMALL = [{"mode": "decode", **LAYERS["sinks+cap"], "dtype": "bfloat16", "requests": [[40, 1], [300, 1]], "count": 3},
         {"mode": "extend", **LAYERS["plain"], "dtype": "bfloat16", "requests": [[0, 30], [237, 12]]},
         {"mode": "verify", **LAYERS["plain"], "dtype": "bfloat16", "requests": [[260, 4]], "count": 2}]


def test_the_evaluation_scripts_agreement_rows_on_the_cpu(tmp_path, evaluate):
    trace = write(tmp_path / "t.jsonl", SMALL)
    folder = tmp_path / "fib"
    fib.export(trace, folder)
    rows = evaluate.swabench_rows(folder, trace, 5, "torch", "cpu")
    assert len(rows) == 3 and {r["check"] for r in rows} == {"swabench torch-trim [torch]"}
    assert all(r["pass"] and r["max_abs_diff"] < 1e-2 for r in rows), rows
    assert sorted(r["steps"] for r in rows) == [1, 2, 3]
    wrong = evaluate.swabench_rows(folder, trace, 5, "torch", "cpu", impl_name="planted-wide")  # one key too many
    assert not any(r["pass"] for r in wrong) and all(r["max_abs_diff"] > 1e-2 for r in wrong), wrong
    out = tmp_path / "agreement.csv"
    evaluate.write_csv(rows + wrong, out)
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(evaluate.COLUMNS) and len(lines) == 7


def test_the_evaluation_script_runs_whole_on_the_cpu(tmp_path, evaluate):
    trace, out = write(tmp_path / "t.jsonl", SMALL), tmp_path / "agreement.csv"
    assert evaluate.main([str(trace), str(out), "--library", "torch", "--no-evaluator", "--per-definition", "5"]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == ",".join(evaluate.COLUMNS) and len(lines) == 4 and all(",True," in line for line in lines[1:])


@pytest.mark.parametrize("wrong, named", [("missing source", "missing.jsonl"), ("OUT a folder", "OUT.csv"),
                                          ("--per-definition 0", "--per-definition"), ("OUT a link", "OUT.csv"),
                                          ("--library nope", "--library")])
def test_the_evaluation_script_refuses_a_wrong_argument_before_it_writes(tmp_path, evaluate, capsys, wrong, named):
    trace, out = write(tmp_path / "t.jsonl", SMALL), tmp_path / "agreement.csv"
    options = ["--folder", str(tmp_path / "fib"), "--no-evaluator", "--library", "torch"]
    if wrong == "missing source":
        trace = tmp_path / "missing.jsonl"
    elif wrong == "OUT a folder":
        out.mkdir()
    elif wrong == "OUT a link":
        out.symlink_to(tmp_path / "elsewhere.csv")
    else:
        options += wrong.split()
    with pytest.raises(SystemExit) as exit_:
        evaluate.main([str(trace), str(out), *options])
    assert exit_.value.code == 2 and named in capsys.readouterr().err
    assert not (tmp_path / "fib").exists() and not (tmp_path / "elsewhere.csv").exists()


def test_the_evaluation_scripts_rows_from_flashinfer_benchs_benchmark(tmp_path, evaluate, monkeypatch):
    """FlashInfer-Bench's Benchmark over an exported folder, its CUDA runner replaced by the same steps on the CPU
    (its own builder, input generator, blob loader and error statistics): the reference, built as a solution,
    runs on every workload kept and agrees with itself."""
    pytest.importorskip("flashinfer_bench")
    from flashinfer_bench.bench import benchmark
    from flashinfer_bench.bench.utils import compute_error_stats, gen_inputs, load_safetensors
    from flashinfer_bench.compile import BuilderRegistry
    from flashinfer_bench.data import Correctness, Environment, Evaluation, Performance

    class CpuRunner:
        def __init__(self, log_dir):
            pass

        def run_workload(self, definition, workload, solutions, config, root):
            builders = BuilderRegistry.get_instance()
            inputs = gen_inputs(definition, workload, "cpu", load_safetensors(definition, workload, root))
            want = builders.build_reference(definition)(*inputs)
            results = {}
            for solution in solutions:
                stats = [compute_error_stats(g, w, config) for g, w in zip(builders.build(definition, solution)(*inputs),
                                                                           want)]
                ok = not any(exceeds for _, _, exceeds, _ in stats)
                results[solution.name] = Evaluation(
                    status="PASSED" if ok else "INCORRECT_NUMERICAL", environment=Environment(hardware="cpu"),
                    timestamp="now", correctness=Correctness(max_absolute_error=max(a for a, *_ in stats),
                                                             max_relative_error=max(r for _, r, *_ in stats)),
                    performance=Performance() if ok else None)
            return results

        def close(self):
            pass

    monkeypatch.setattr(benchmark, "PersistentRunner", CpuRunner)
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "cache"))
    trace = write(tmp_path / "t.jsonl", SMALL)
    fib.export(trace, tmp_path / "fib")
    # the first workload of each of the 2 definitions; FlashInfer's solution needs CUDA (tested for its source below)
    rows = evaluate.fib_rows(tmp_path / "fib", trace, 1, makers=[evaluate.reference_solution])
    assert len(rows) == 2 and all(r["pass"] and r["note"] == "PASSED" and r["max_abs_diff"] == 0 for r in rows), rows
    assert {r["definition"] for r in rows} == {"gqa_paged_decode_swa_w15_h4_kv2_d64_ps16_sinks_cap30",
                                               "gqa_paged_prefill_swa_w9_h4_kv1_d64_ps4"}
    assert all(r["case_id"] and r["steps"] for r in rows)


def test_the_flashinfer_solution_plans_the_definitions_window_and_hands_over_its_sinks(tmp_path, evaluate):
    pytest.importorskip("flashinfer_bench")
    import ast

    from flashinfer_bench.data import Definition, load_json_file

    fib.export(write(tmp_path / "t.jsonl", SMALL), tmp_path / "fib")
    for path in sorted((tmp_path / "fib" / "definitions").rglob("*.json")):
        d = load_json_file(Definition, path)
        source = evaluate.flashinfer_solution(d).sources[0].content
        ast.parse(source)
        call = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                    and getattr(n.func, "attr", "") == "plan")
        keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if isinstance(k.value, ast.Constant)}
        assert keywords["window_left"] == d.axes["window_left"].value and keywords["causal"] is True
        assert ("BatchAttentionWithAttentionSinkWrapper" in source) == ("sinks" in d.inputs)
        assert ("logits_soft_cap=30.0" in source) == ("_cap30" in d.name)
        assert f"def run({', '.join(d.inputs)}):" in source


def test_flashinfer_benchs_own_definitions_take_the_window_from_the_preset(tmp_path):
    """A definition as FlashInfer-Bench collects it (its causal name, no window axis, page size 1 without
    kv_last_page_len, a blob without swabench's metadata): the preset gives the window, sinks and soft-cap."""
    name = "gqa_paged_prefill_causal_h64_kv8_d64_ps1"
    root = tmp_path / "fib"
    const = {k: {"type": "const", "value": v} for k, v in
             {"num_qo_heads": 64, "num_kv_heads": 8, "head_dim": 64, "page_size": 1}.items()}
    spec = {"shape": ["len_indptr"], "dtype": "int32"}
    doc = {"name": name, "op_type": "gqa_paged", "reference": "def run():\n    pass\n",
           "axes": {**const, **{k: {"type": "var"} for k in ("len_indptr", "total_q", "num_kv_indices", "num_pages")}},
           "inputs": {"q": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "bfloat16"},
                      "k_cache": {"shape": ["num_pages", "page_size", "num_kv_heads", "head_dim"], "dtype": "bfloat16"},
                      "qo_indptr": spec, "kv_indptr": spec, "kv_indices": {**spec, "shape": ["num_kv_indices"]},
                      "sm_scale": {"shape": None, "dtype": "float32"}}}
    (root / "definitions" / "gqa_paged").mkdir(parents=True)
    (root / "definitions" / "gqa_paged" / f"{name}.json").write_text(json.dumps(doc))
    records = []
    for i, (qo, kv) in enumerate([([0, 5, 9], [0, 300, 304]), ([0, 1], [0, 77])]):
        blob = f"blob/workloads/gqa_paged/{name}/w{i}.safetensors"
        (root / blob).parent.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file({"qo_indptr": torch.tensor(qo, dtype=torch.int32),
                                     "kv_indptr": torch.tensor(kv, dtype=torch.int32),
                                     "kv_indices": torch.arange(kv[-1], dtype=torch.int32)}, root / blob)
        inputs = {k: {"type": "safetensors", "path": blob, "tensor_key": k} for k in ("qo_indptr", "kv_indptr",
                                                                                     "kv_indices")}
        records.append({"definition": name, "workload": {"axes": {}, "uuid": f"w{i}", "inputs": {
            "q": {"type": "random"}, **inputs, "sm_scale": {"type": "scalar", "value": 0.0884}}}})
    (root / "workloads" / "gqa_paged").mkdir(parents=True)
    write(root / "workloads" / "gqa_paged" / f"{name}.jsonl", records)
    result = fib_import.import_(root, name, "gpt-oss-20b", tmp_path / "back.jsonl")
    assert result.window_from == "preset" and (result.lines, result.steps) == (2, 2)
    lines = [json.loads(line) for line in (tmp_path / "back.jsonl").read_text().splitlines()]
    assert lines == [{"mode": "extend", "model": "gpt-oss-20b", "page_size": 1, "requests": [[295, 5], [0, 4]]},
                     {"mode": "extend", "model": "gpt-oss-20b", "page_size": 1, "requests": [[76, 1]]}]
    (case,) = {axes.make_case(s.axes()) for s in list(traces.read(tmp_path / "back.jsonl"))[:1]}
    assert case.window_left == models.get("gpt-oss-20b").window_left and case.sinks  # the preset, as served


def test_a_blob_whose_metadata_is_not_a_step_is_exit_2_naming_the_blob(tmp_path, exported):
    trace, result = exported
    d = result.definitions[0]
    record = json.loads(d.workloads.read_text().splitlines()[0])
    blob = tmp_path / "fib" / record["workload"]["inputs"]["kv_indptr"]["path"]
    tensors = safetensors.torch.load_file(blob)
    safetensors.torch.save_file(tensors, blob, metadata={fib.META: json.dumps({"count": "three", "mode": "decode"})})
    out = invoke("import-fib", tmp_path / "fib", "--definition", d.name, "--model", preset_of(d.name),
                 "--out", tmp_path / "back.jsonl")
    assert out.exit_code == 2 and "count 'three'" in out.output and ".jsonl: line 1:" in out.output, out.output
    assert not (tmp_path / "back.jsonl").exists()
