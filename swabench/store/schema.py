"""The run folder's format, in one place: its files, every key of ``meta.json`` with what it means,
the table's key and leading columns, and how folders written by older versions read.

Every writer goes through ``check_meta`` (an unknown key is a bug here, not a new field) and every
reader through ``migrate``, so a folder written before ``format_version`` existed reads like a new one.
"""

from __future__ import annotations

from swabench.core.cases import WRAPPER_MODES
from swabench.core.footprint import LIMITS
from swabench.inputs.axes import PAGE_SIZE_MAX, SEED_MAX, WINDOW_MAX
from swabench.measure import ceiling

FORMAT_VERSION = 12

ROWS = "rows.jsonl"  # every finished point, appended and fsynced as it finishes (the source of truth)
TABLE = "results.csv"  # the tidy table: one row per case x implementation x backend
SAMPLES = "samples.csv.gz"  # every timing sample, long format, gzipped (folders before it: samples.csv)
META = "meta.json"
SCENARIO = "scenario.toml"  # the scenario file exactly as run
REPLAY = "replay.csv"  # a replay's steps x paths, each with its count and weighted time (analysis.replay.steps)
PRICE = "price.csv"  # a price run's milliseconds per 1000 model steps per mode (analysis.price.per_mode)
KERNELS = "nsys_stats.csv"  # a run made under Nsight Systems: the kernels of every timed point (run.profiling)
COUNTERS = "ncu.csv"  # a run made under Nsight Compute: every counted kernel's DRAM and L2 bytes (measure.counters)
TORCH_STATS = "torch_stats.txt"  # a run made under torch.profiler: its kernel table (run.profiling)
PROFILER_TABLES = (KERNELS, TORCH_STATS, COUNTERS)
LOCK = ".swabench.lock"  # held (flock) by the one process writing the folder

KEY = ("case_id", "impl", "backend")
STARTED = "started.jsonl"  # a line {KEY...: , "pid": N} as each point begins, before its work (not fsynced)
# crash: the point's process died (a signal, an abort, an exit), hung past its limit, or left the GPU unusable
STATUSES = ("pass", "fail", "xfail", "xpass", "skip", "crash")
STATES = ("running", "complete", "skipped", "interrupted", "crashed", "incomplete")

# The table's leading columns, in order; every table has them all (empty where a run has no value),
# so readers never meet a missing column.  Others may follow.
COLUMNS = [
    "case_id", "case", "impl", "kind", "library", "wrapper", "backend", "resolved_backend", "wrapper_mode", "layout",
    "status",
    "reason", "must_fail", "keys_lost", "rows_losing", "upstream", "mode", "storage", "batch_size", "prefix_len", "seq_len", "qo_len", "accept", "length_dist",
    "total_qo", "total_kv", "window_left", "sliding_window", "page_size", "page_layout", "cache_fill",
    "num_qo_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype", "sm_scale", "logits_soft_cap", "sinks",
    "causal", "attention_chunk", "tree", "block", "prefills", "seed", "device", "gpu_id",
    "rel_l2", "max_abs", "row_rel_l2", "probe_rel_l2", "unwritten_rows", "wrong_rows", "rows_as_predicted",
    "reads_evicted",
    "plan_us", "compile_s", "workspace_mib", "timer", "l2", "graph_calls", "repeats", "median_us", "iqr_us",
    "noise", "eager_us", "sm_clock_mhz_before", "sm_clock_mhz_after", "clock_reasons_before", "clock_reasons_after",
    "throttled", "pairs", "flops", "min_bytes", "min_read_bytes", "tflops", "tbps", "speedup_vs_mask",
    "pct_peak_tflops", "pct_peak_tbps", "floor_us", "pct_of_floor", "dram_read_bytes", "dram_write_bytes",
    "l2_bytes", "kernels_counted", "read_amplification", "point_s", "workload_s",
]

META_KEYS = {
    "format_version": "version of this folder's format (schema.FORMAT_VERSION when written)",
    # what ran, and how
    "what": "run, check, merge of N shards, or host benchmarks",
    "scenario": "the scenario's name", "scenario_path": "the file it was read from",
    "scenario_sha256": "hash of scenario.toml (resume and merge check it)",
    "implementations": "the implementations the scenario runs",
    "points": "points this folder was asked to measure (its shard's, for a shard)",
    "selection": "what a resume must match: device, L2 mode, and a hash of the points' keys",
    "method": "how every number was measured: kernel and plan timers, gate, tolerances",
    "sharding": "this folder's shard (index, count, cases, the whole sweep's points, how costs were known), or null",
    "trace": "a replay's trace: its file, its sha256, its steps, and each case's weight (steps it stands for)",
    "price": "a price run's model: its layers, windowed layers, model steps, each case's layer kind, KV bytes per step",
    "patch": "a run of a patched release (swabench run --patch): the patch's name, file, sha256, the files it "
             "changes, the release it was applied to (base), the library, and the patched copy that ran",
    "embedded_backend": "true when the run used the pure-PyTorch CPU backend",
    "state": "running, complete, skipped (finished, but every point skipped), interrupted, crashed, or incomplete "
             "(a merge missing shards)",
    "rows": "rows in results.csv", "status_counts": "rows per status",
    "statuses_recomputed": "each time statuses were recomputed from the stored gate outcomes after a prediction "
                           "was corrected (scripts/restatus.py): commit, why, the changes, the method",
    "peaks": "the GPU's ceiling: its peak at maximum clocks (NVML's clocks and memory bus width), which floors "
             "divide by, and "
             "the node's measured bf16 matmul rate, copy and read bandwidth beside it",
    "counters": "a run under Nsight Compute: its version, options, metrics, L2 state, the calibration copy's "
                "bytes against its counter, kernels and points counted, wall time and seconds a point; or why skipped",
    "jit_warmups": "one JIT warm-up per start of the folder: seconds per module signature, modules built",
    "isolation": "where the points ran: a supervised worker (its limits, the workers replaced) or this process",
    "jit_warmup_total_s": "their wall time, summed",
    "setup_s": "imports, environment, peaks and JIT warm-up before the sweep",
    "wall_s": "the sweep's wall time (summed over resumes)",
    "total_s": "from importing swabench to the written table",
    # merges and launches
    "shards": "each shard's own meta", "merged_from": "the shard folders",
    "launch_spawned_s": "launcher start to its workers spawned",
    "launch_worker_end_s": "workers' start to each one's exit",
    "launch_merge_s": "seconds the merge took", "launch_wall_s": "workers' start to the merged folder",
    # the environment (environment.collect)
    "swabench": "version", "git_commit": "the code's commit", "git_dirty": "uncommitted changes to tracked files",
    "git_commit_from": "where the commit came from when not from git", "time_utc": "when the folder was made",
    "host": "host name", "platform": "OS", "cpu": "CPU model", "cpu_count": "cores",
    "torch_threads": "torch CPU threads", "python": "version", "torch": "version",
    "libraries": "each registered library's installed version (null where it is not installed)",
    "nvtx": "version", "nsys": "Nsight Systems version", "device": "torch device", "command": "the command line",
    "cuda_visible_devices": "as this process saw it", "gpu": "GPU name", "gpu_count": "GPUs visible",
    "gpu_memory_gib": "GPU memory", "gpu_sms": "multiprocessors", "compute_capability": "of the GPU",
    "cuda": "CUDA version torch was built with", "gpu_uuid": "the GPU's UUID",
}
META_PREFIXES = ("nvidia_smi.",)  # nvidia-smi's fields as it names them

# What each field holds, checked on every read (``checks.fields``): a journal row's (keys it does not name are the
# row's own: a row keeps its host and model preset too) and meta.json's ("trace.steps": the key steps of the
# object trace).  A kind is "text", "name" (text, not empty or blank), "number" (NaN for none), "finite number",
# "number >= 0", "number > 0", "integer >= 0", "integer from LO to HI" (16.0 too: a table's column with empty cells
# reads as floats), "true or false", "object", "list", "status" (one of STATUSES), "state" (one of STATES) or
# "impl kind" (one of registry.KINDS); "list of K", "object of K" (its values), "K or null" ("of" binds first:
# "object of text or null" is an object whose values are text or null).  Each row of results.csv is held to
# ROW_FIELDS too, each cell as the file spells it (``checks.cells``).
TEXT, NUMBER, FLAG, FINITE = "text or null", "number or null", "true or false or null", "finite number or null"
INDEX_MAX = LIMITS.int32_index  # no case holds a count past it: batch x keys past FlashInfer's int32 never runs
AXIS_RANGES = {"batch_size": (1, INDEX_MAX), "prefix_len": (0, INDEX_MAX), "seq_len": (1, INDEX_MAX),
               "qo_len": (1, INDEX_MAX), "total_qo": (0, INDEX_MAX), "total_kv": (0, INDEX_MAX),
               "window_left": (-1, WINDOW_MAX), "sliding_window": (-1, WINDOW_MAX + 1), "page_size": (1, PAGE_SIZE_MAX),
               "num_qo_heads": (1, INDEX_MAX), "num_kv_heads": (1, INDEX_MAX), "head_dim": (8, INDEX_MAX),
               "attention_chunk": (0, INDEX_MAX), "block": (0, INDEX_MAX), "prefills": (0, INDEX_MAX),
               "seed": (0, SEED_MAX)}
ROW_FIELDS = {
    **dict.fromkeys(KEY, "name"), "status": "status", "samples": "object of list", "kind": "impl kind or null",
    **dict.fromkeys(("case", "library", "wrapper", "resolved_backend", "wrapper_mode", "layout", "reason",
                     "upstream", "mode", "storage", "accept", "length_dist", "page_layout", "cache_fill", "dtype",
                     "kv_dtype", "tree", "device", "timer", "l2", "clock_reasons_before", "clock_reasons_after",
                     "model", "host"), TEXT),
    "gpu_id": "text or number or null",
    **dict.fromkeys(("must_fail", "sinks", "causal", "throttled", "rows_as_predicted", "reads_evicted"), FLAG),
    **{name: f"integer from {low} to {high} or null" for name, (low, high) in AXIS_RANGES.items()},
    # the gate's errors: a row the kernel left unwritten (NaN) is infinitely wrong
    **dict.fromkeys(("rel_l2", "max_abs", "row_rel_l2", "probe_rel_l2"), NUMBER),
    **dict.fromkeys(("sm_scale", "logits_soft_cap", "unwritten_rows", "wrong_rows", "keys_lost", "rows_losing",
                     "sm_clock_mhz_before", "sm_clock_mhz_after", "pairs", "flops", "min_bytes", "min_read_bytes",
                     "tflops", "tbps", "speedup_vs_mask", "pct_peak_tflops", "pct_peak_tbps", "floor_us",
                     "pct_of_floor", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "kernels_counted",
                     "read_amplification"), FINITE),
    # a time, a size or a count: never negative; a median > 0 (a call takes time)
    **dict.fromkeys(("plan_us", "compile_s", "workspace_mib", "repeats", "graph_calls", "iqr_us", "noise", "eager_us",
                     "point_s", "workload_s"), "number >= 0 or null"),
    "median_us": "number > 0 or null",
}
SECONDS, OBJECT = "number >= 0 or null", "object or null"
MEASURED_PEAKS = ("copy_tbps", "bf16_matmul_tflops")  # what every run's peaks hold (the ceiling is worked from them)
META_FIELDS = {
    "what": TEXT, "scenario": TEXT, "scenario_path": TEXT, "scenario_sha256": TEXT,
    "implementations": "list of text", "points": "integer >= 0 or null", "selection": "object", "method": "object",
    "sharding": OBJECT, "trace": OBJECT, "trace.file": TEXT, "trace.steps": "integer >= 0",
    "trace.distinct": "integer >= 0", "trace.weights": "object of number >= 0", "trace.modes": "object of text",
    "patch": OBJECT, "patch.name": TEXT, "patch.sha256": TEXT, "patch.base": TEXT, "patch.files": "list of text",
    "price": OBJECT, "price.layers": "object of text", "price.model_steps": "number >= 0", "price.kv": "list of object",
    "embedded_backend": FLAG, "state": "state", "rows": "integer >= 0", "status_counts": "object of integer >= 0",
    "peaks": OBJECT, "peaks.bf16_matmul_tflops": "number > 0", "peaks.copy_tbps": "number > 0",
    **dict.fromkeys(("peaks.read_tbps", "peaks.datasheet_tbps", "peaks.datasheet_tflops"), "number > 0 or null"),
    "peaks.ceiling": TEXT, "statuses_recomputed": "list of object", "counters": OBJECT,
    "isolation": OBJECT, "jit_warmups": "list of object", "shards": "list of object", "merged_from": "list of text",
    "launch_worker_end_s": "list", "libraries": "object of text or null", "git_dirty": FLAG,
    **dict.fromkeys(("jit_warmup_total_s", "setup_s", "wall_s", "total_s", "launch_spawned_s", "launch_merge_s",
                     "launch_wall_s", "gpu_memory_gib"), SECONDS),
    **dict.fromkeys(("cpu_count", "torch_threads", "gpu_count", "gpu_sms"), "integer >= 0 or null"),
    **dict.fromkeys(("swabench", "git_commit", "git_commit_from", "time_utc", "host", "platform", "cpu", "python",
                     "torch", "nvtx", "nsys", "device", "command", "cuda_visible_devices", "gpu", "compute_capability",
                     "cuda", "gpu_uuid"), TEXT),
}


def check_meta(meta: dict) -> dict:
    """``meta`` itself, when swabench defines every key in it (a writer adding an undefined key is a
    bug here, not a new field: ValueError)."""
    unknown = [k for k in meta if k not in META_KEYS and not k.startswith(META_PREFIXES)]
    if unknown:
        raise ValueError(f"meta.json keys not defined in swabench.store.schema: {', '.join(sorted(unknown))}")
    return meta


def migrate_table(df):
    """A results table of any known version, read as the current one.

    How the runner laid out its call ("cuda-graph, uniform_q_len=4", a FlexAttention kernel's blocks) is
    ``layout``; before version 8 it was ``wrapper_mode``, and before version 3 ``wrapper`` (now the
    wrapper family).  ``wrapper_mode`` is the case's axis since version 8: every earlier run built its
    wrappers in CUDA-graph mode.  Row by row, since a folder resumed across the change holds both kinds.  Tables from before the serving axes get
    their values where every case had them: no sinks, no soft-cap, the queries' dtype in the cache,
    and head_dim ** -0.5.  Names an implementation had before a later format renamed it are the
    folder's business (``renamed_impls``): a table alone does not say its version."""
    df = df.copy()
    if "wrapper_mode" not in df.columns and "wrapper" in df.columns and "layout" not in df.columns:
        df = df.rename(columns={"wrapper": "wrapper_mode"})  # before version 3
    if "layout" not in df.columns:
        df["layout"] = None
    if "wrapper_mode" not in df.columns:
        df["wrapper_mode"] = None
    described = df["wrapper_mode"].notna() & ~df["wrapper_mode"].isin(WRAPPER_MODES)  # a row from before version 8
    if described.any():
        df["layout"] = df["layout"].astype(object).where(~described, df["wrapper_mode"])
    df["wrapper_mode"] = df["wrapper_mode"].where(df["wrapper_mode"].isin(WRAPPER_MODES), "cuda-graph")
    if df.empty:
        return df
    fill = {"sinks": False, "logits_soft_cap": 0.0, "causal": True, "attention_chunk": 0, "block": 0, "prefills": 0,
            "cache_fill": "random"}
    if "dtype" in df.columns:
        fill["kv_dtype"] = df["dtype"]
    if "head_dim" in df.columns:
        fill["sm_scale"] = df["head_dim"].astype(float) ** -0.5
    for name, value in fill.items():
        if name not in df.columns:
            df[name] = value
    return df


IMPL_RENAMES = {6: {"flex-window": "flex-flat"}}  # format version: {the name before it: the name since}


def renamed_impls(version: int) -> dict[str, str]:
    """The implementations a folder of format ``version`` names by an older name, and their names now.
    Version 6: ``flex-window`` became FlexAttention batched by request; the flattened form it named
    before is ``flex-flat``."""
    names = {}
    for since, renames in sorted(IMPL_RENAMES.items()):
        if version < since:
            names.update(renames)
    return names


def migrate(meta: dict) -> dict:
    """A meta.json of any known version, read as the current one (the file itself is not rewritten).

    Version 1 (no format_version): one JIT warm-up as ``jit_warmup_s`` (seconds per signature)
    instead of the list ``jit_warmups``.  Version 2 differs in the table only (``migrate_table``).  Up to
    version 3 the one library's version had its own key; version 4 keeps every library's in ``libraries``.
    Before version 7, ``min_bytes`` counted a paged request's K/V rows from its first visible key; since, from
    the start of the page that holds it (a page table starts on a page boundary), and ``min_read_bytes``, the
    clock columns and the counters' columns exist.  Version 8 differs in the table only: ``wrapper_mode`` is
    an axis and the runner's description ``layout`` (``migrate_table``); version 9 too: the ``tree`` axis, the
    ``keys_lost`` and ``rows_losing`` columns, and the gate's ``wrong_rows`` and ``rows_as_predicted``, empty in
    older tables (every earlier verify was a chain); version 10 too: the ``block`` and ``prefills`` axes (the
    ``mixed`` mode), 0 in older tables (no earlier case had bidirectional blocks or mixed steps).  Before
    version 11, ``peaks`` held the measured rates only: the ceiling is filled from the meta's clocks,
    SMs and GPU (``measure.ceiling.from_meta``).  Version 12 differs in the table only: the ``cache_fill`` axis,
    ``random`` in older tables (every earlier cache held random data everywhere)."""
    meta = dict(meta)
    version = meta.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"format_version must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"format_version {version} is newer than this swabench reads ({FORMAT_VERSION}); "
                         f"upgrade swabench")
    if version <= 3 and "libraries" not in meta:  # formats 1-3 knew one library and kept its version under its name
        meta["libraries"] = {"flashinfer": meta.pop("flashinfer", None)}
    if version == 1 and "jit_warmup_s" in meta:
        meta["jit_warmups"] = [{"jit_warmup_s": meta.pop("jit_warmup_s"),
                                "jit_warmup_wall_s": meta.get("jit_warmup_total_s")}]
    peaks = meta.get("peaks")
    if isinstance(peaks, dict) and "ceiling" not in peaks and {"copy_tbps", "bf16_matmul_tflops"} <= set(peaks):
        meta["peaks"] = ceiling.from_meta(meta)
    meta["format_version"] = FORMAT_VERSION
    return meta
