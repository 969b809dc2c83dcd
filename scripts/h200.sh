#!/usr/bin/env bash
# How the committed H200 runs are made: run from the checkout's root on the GPU node, after
# `source .gpu/setup.sh` (the offline bundle: scripts/gpu-bundle.sh).  Usage: scripts/h200.sh OUTDIR [STEP...]
# Steps (default: all but the last three): tests peaks quick default reference wrappers profile check peers
#   (tests: `pytest -m gpu` within $TESTS_S seconds, default 300: enough on the .gpu bundle's prebuilt modules,
#   not on a release whose modules build on first use)
#   gpus     default.toml with --gpus all (on a node with several GPUs; `default` is its one-GPU twin):
#            the shards are balanced by the per-point times of $COSTS_FROM, else of `default` if it ran first
#   gpus-again  the same once more (h200x2-default-run-again), to see how much the end-to-end time varies
#   default-half  `default` with OMP_NUM_THREADS at half the cores, the share each of two --gpus
#            workers gets: the one-GPU time with the CPU threads held equal (h200-default-run-half)
#   compare  the one-GPU run against the all-GPU run, point by point
#   warm     import swabench, torch and flashinfer once, so the first timed command on a fresh node
#            does not pay its cold file cache (run it before `default` and `gpus`)
#   coldjit  `swabench warmup default` on an empty JIT cache, 8 modules at once, then one by one
#   quick-compare  `quick` against the committed quick run (results/h200-quick-run1), point by point
#   workspace  workspace.toml: GPT-OSS and Gemma-2-9B extend shapes that need more than 256 MiB of workspace
#   decode-tests  the decode-wrapper GPU tests alone; serving-check  `swabench check serving`
#   serving-warmup, models-warmup  build every module serving.toml (models.toml) needs (12 at once), then
#            pack the JIT cache into OUTDIR/jitcache.tar.xz.part-* (15 MB each; joined, they replace
#            .gpu/jitcache.tar.xz, so the next node does not build again)
#   serving-tests  the serving-path GPU tests alone; serving  `swabench run serving`
#   models   models.toml (every preset through extend, verify, draft extend, decode); gpt-oss  `run --model gpt-oss-120b`
#   replay   `swabench replay traces/example.jsonl`; evicted  evicted.toml (reads_evicted per kernel)
#   replay-imported  `swabench import` of the installed release's committed FlashInfer dump
#            (tests/fixtures/flashinfer-dump-VERSION), then `swabench replay` of that trace
#   modes    serving.toml's modes-* groups: GPT-OSS-20B's layers with every wrapper built in CUDA-graph mode and
#            plain (OUTDIR/h200-modes-VERSION: what graph mode costs)
#   fib      scripts/fib_evaluate.py on the trace `replay-imported` makes (made here if it has not run): its steps
#            exported as FlashInfer-Bench definitions (OUTDIR/fib-VERSION), FlashInfer-Bench's evaluator holding
#            swabench's FlashInfer path and the reference to each definition's reference, and the reference against
#            swabench's correct path on swabench's own tensors (OUTDIR/fib-eval-VERSION.csv); needs FIB=1's bundle
#   edges-check  `swabench check edges` alone (the SGLang regression batches among them)
#   decode-profile  default.toml's decode group under Nsight Systems (graph time against nsys, per point)
#   peers-profile  peers.toml's decode steps (GPT-OSS-20B's 48-request step among them) under Nsight Systems:
#            which kernel each FlexAttention peer ran and for how long
#   recipe-profile  serving.toml's SGLang extend recipes and the window path under Nsight Systems, held
#            against the committed serving run (results/h200-serving-0.7.4): where the recipe's time goes
#   default-compare  `default` against the committed one-GPU default run (results/h200x2-default-1gpu)
#   warmup-all  build every module default, serving and peers need (or $WARMUP_SCENARIOS), 16 at once, within $WARMUP_S seconds
#            (default 540; a build cut short resumes where it stopped on the next call to a warm node)
#   noncausal  `swabench run noncausal`: non-causal windows at flashinfer#4972's shape (fa2's wrong rows are
#            declared where its split-KV schedule predicts them; any other failure exits 1)
#   chunked  `swabench run chunked`: Llama 4's chunked attention across chunk starts (chunk-virtual, chunk-trim,
#            the custom mask; chunk-as-window gated), beside a window of the same keys; then its report (sawtooth)
#   chunked-tests  the chunked-attention and non-causal GPU tests alone
#   price    `swabench price` of GPT-OSS-120B, Gemma-3-27B and Llama-4-Scout over their models.toml steps
#   release  release.toml on the installed FlashInfer release (every module built first, 16 at once):
#            OUTDIR/h200-release-VERSION, one folder per release for `swabench matrix`
#   counters-tests  the Nsight Compute and clock GPU tests alone (a copy of N bytes reads N bytes; the decode cliff)
#   ncu      `swabench profile --tool ncu` over default's and serving's decode, verify and extend steps named in
#            NCU_DEFAULT and NCU_SERVING (case filters), every path but the per-request PyTorch loops of NCU_LOOPS,
#            kernel by kernel: OUTDIR/h200-ncu-SCENARIO-VERSION; then those loops (hundreds of kernels a call) on
#            the same cases, each call counted as one workload (--ncu-unit call): OUTDIR/h200-ncu-SCENARIO-loops-VERSION
#            (NCU_SCENARIOS=default runs one of the two; NCU_PARTS=loops the loops alone)
#   tree     tree.toml (draft trees on sliding-window layers, chains beside them), its modules built first, then its
#            report; tree-tests  the draft-tree GPU tests alone; tree-ncu  the tree paths and the chain's paged-trim
#            under Nsight Compute on the steps NCU_TREE names (case filters); release-tree  release.toml's tree group
#            on the installed release (OUTDIR/h200-release-tree-VERSION, one folder per release for `swabench matrix`)
#   backends-tests  the cuDNN and FlashAttention-4 GPU tests alone; backends  `swabench run backends`
#            (OUTDIR/h200-backends-VERSION; needs CUDNN=1 FA4=1's bundle, docs/backends.md)
#   coverage  `swabench run coverage`: every declared path never run on a GPU, once (OUTDIR/h200-coverage-VERSION;
#            the cuDNN and FA4 paths need CUDNN=1 FA4=1's bundle), then `swabench coverage --gaps` of results/ and it
#   dumps    scripts/play_dump.py: FlashInfer's API log of the plan calls (checked against the steps played,
#            OUTDIR/dump-VERSION), with DUMP_RUNS=1 of the plan and run calls too (dump-runs-VERSION, whose
#            1 GB log is removed once checked), and with no log (dump-no-log-VERSION: the plan times to hold
#            the logged ones against)
#   shelf-warmup  build every module shelf.toml needs (XQA, fmha v2, POD, BatchAttention, the ranges wrapper), $WARMUP_JOBS (16) at
#            once, within $WARMUP_S seconds (default 540), then pack the JIT cache into OUTDIR/jitcache.tar.xz.part-*
#   shelf-tests  the shelf's GPU tests alone (XQA, fmha v2, blocks, BatchAttention, mixed steps)
#   shelf    `swabench run shelf` (resumed where a folder of an earlier call is in OUTDIR), then its report
#   shelf-ncu  `swabench profile shelf --tool ncu` on the steps NCU_SHELF names (case filters): each family's bytes
#            beside the existing wrappers' (OUTDIR/h200-ncu-shelf-VERSION)
#   release-shelf  release.toml's shelf groups on the installed release (every module built first, 16 at once):
#            OUTDIR/h200-release-shelf-VERSION, one folder per release for `swabench matrix`
#   verdicts  each script's calls held to the installed release's signatures, and the lines the faults cite to its
#            source where it is the release they were read in (api.log),
#            then scripts/repro_verdicts.py on $REPRO_REFS (default: every script under repro/), $VERDICT_JOBS (6) at
#            once, into OUTDIR/repro-VERSION, starting from the committed repro/GPU-VERSION/verdicts.json of this card
#            (h200, h100; rows of the bugs run again are replaced, the others kept), its table in
#            OUTDIR/repro-VERSION/this-call.log (for the committed call.log; COMMIT=REV names the checkout in its first
#            line); the folder is committed as repro/GPU-VERSION/
#   crash    scenarios/crash.toml (paths planted to abort, segfault, exit, hang and poison the GPU) with a 20 s point
#            limit, then resumed: every planted point crash, every other point as usual, nothing run again
#            (OUTDIR/GPU-crash, GPU the card's h100/h200)
#   isolation-cost  scripts/isolation_cost.py on $ISOLATION_SCENARIOS (default quick): each swept supervised and
#            --in-process, alternating, $ISOLATION_ROUNDS (2) times, into OUTDIR/isolation (isolation-cost.csv)
# Each sweep starts from an empty Inductor/Triton cache, so FlexAttention compiles the same in every run.
set -uo pipefail
STEPS=(tests peaks quick default reference wrappers profile check peers gpus gpus-again default-half compare warm coldjit
       quick-compare workspace decode-tests serving-check serving-warmup models-warmup serving-tests serving models
       gpt-oss replay evicted replay-imported modes fib edges-check decode-profile peers-profile recipe-profile
       default-compare warmup-all noncausal chunked chunked-tests price release counters-tests ncu tree tree-tests
       tree-ncu release-tree backends-tests backends dumps shelf-warmup shelf-tests shelf shelf-ncu release-shelf verdicts
       crash isolation-cost coverage)
usage() { echo "h200.sh: $1" >&2; exit 2; }
[ $# -ge 1 ] || usage "usage: scripts/h200.sh OUTDIR [STEP...]"
out="$1"; shift
case "$out" in
  ''|-*) usage "OUTDIR '$out': give the folder to write into (usage: scripts/h200.sh OUTDIR [STEP...])" ;;
esac
[ ! -e "$out" ] || [ -d "$out" ] || usage "OUTDIR $out: exists and is not a folder"
for step in "$@"; do  # every step known before any runs
  [[ " ${STEPS[*]} " == *" $step "* ]] || usage "unknown step '$step'; the steps: ${STEPS[*]}"
done
# the published ncu steps: each scenario's decode, verify and extend steps at the shapes its findings quote
: "${NCU_DEFAULT=decode;verify b32 p8192 q16;extend b32 p8192 q512;extend b4 p8192 q2048}"
: "${NCU_SERVING=decode b32 p32768 q1 W127;extend b4;verify b32 p8192}"
: "${NCU_LOOPS=torch-trim torch-mask}"
: "${NCU_SHELF=decode b32 p16384 q1 W1023 ps16;decode b32 p16384 q1 W127 ps16;decode b32 p16256 q1 W127 ps16;decode b32 p16510 q1 W127 ps16;verify b32 p16384 q8 W1023 ps16;extend b1 p16384 q2048 W1023 ps16;C8192 ps16;mixed b65 p16384 q1984}"
: "${NCU_TREE=p8192 q16 tree eagle:4:3 W1023 ps16;p8192 q16 tree chain W1023 ps16;p8192 q16 tree eagle:4:3 W4095 ps16;p8192 q16 tree chain W4095 ps16}"
steps="${*:-tests peaks quick default reference wrappers profile check peers}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
sb() { python3 -m swabench "$@"; }
fresh_compile_cache() { export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)"; }
for step in $steps; do
  echo "=== $step $(date -u +%T)"
  case "$step" in
    backends-tests) timeout "${TESTS_S:-500}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py \
                   -k "cudnn_and_fa4" 2>&1 | tail -25 ;;
    backends)  v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb run backends --out "$out/h200-backends-$v" ) 2>&1 | tail -30 ;;
    coverage)  v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb run coverage --out "$out/h200-coverage-$v" ) 2>&1 | tail -40
               sb coverage results "$out/h200-coverage-$v" --gaps | head -40 ;;
    tests)     timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 \
                 | tee "$out/gpu-tests.log" | tail -5 ;;
    warm)      ( time python3 -c "import swabench.cli, flashinfer, torch; torch.cuda.init()" ) 2>&1 | tail -3
               echo "import swabench.cli alone, warm:"; ( time python3 -c "import swabench.cli" ) 2>&1 | tail -3 ;;
    peaks)     sb env --peaks | grep -E '^(gpu|peak|nvidia_smi.clocks)' ;;
    quick)     ( time sb run quick --out "$out/h200-quick-run" ) 2>&1 | tail -18 ;;
    quick-compare)
               sb compare results/h200-quick-run1 "$out/h200-quick-run" > "$out/h200-quick-compare.md"
               echo "compare exit $?"; head -12 "$out/h200-quick-compare.md" ;;
    workspace) ( time sb run workspace --out "$out/h200-workspace-run" ) 2>&1 | tail -14 ;;
    decode-tests) timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k decode 2>&1 \
                 | tee "$out/gpu-decode-tests.log" | tail -4 ;;
    serving-check) ( time sb check serving --out "$out/h200-serving-check" ) 2>&1 | tail -16 ;;
    serving-warmup|models-warmup)
               ( time sb warmup "${step%-warmup}" --jobs 12 ) 2>&1 | tail -40
               tar cJf - -C /tmp/fiws .cache | split -b 15M - "$out/jitcache.tar.xz.part-" && ls -la "$out" ;;
    serving-tests) timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k serving 2>&1 \
                 | tee "$out/gpu-serving-tests.log" | tail -30 ;;
    decode-profile)
               sb profile default --case decode --impl decode-window --impl decode-trim --impl decode-tc-window \
                 --impl decode-tc-trim --impl paged-window --out "$out/h200-decode-profile" 2>&1 | tail -3 ;;
    models)    fresh_compile_cache
               ( time sb run models --out "$out/h200-models-run" ) 2>&1 | tail -30 ;;
    gpt-oss)   ( time sb run --model gpt-oss-120b --out "$out/h200-gpt-oss-120b-run" ) 2>&1 | tail -20 ;;
    replay)    ( time sb replay traces/example.jsonl --out "$out/h200-replay-example" ) 2>&1 | tail -30 ;;
    replay-imported)
               v=$(python3 -c "import flashinfer; print(flashinfer.__version__)")
               sb import "tests/fixtures/flashinfer-dump-$v/dump" --out "$out/imported-$v.jsonl" 2>&1 | tail -8
               fresh_compile_cache
               ( time sb replay "$out/imported-$v.jsonl" --out "$out/h200-replay-imported-$v" ) 2>&1 | tail -40 ;;
    fib)       v=$(python3 -c "import flashinfer; print(flashinfer.__version__)")
               [ -f "$out/imported-$v.jsonl" ] || sb import "tests/fixtures/flashinfer-dump-$v/dump" \
                   --out "$out/imported-$v.jsonl" 2>&1 | tail -3
               ( time FIB_CACHE_PATH="$(mktemp -d)" python3 scripts/fib_evaluate.py "$out/imported-$v.jsonl" \
                   "$out/fib-eval-$v.csv" --folder "$out/fib-$v" --per-definition 3 ) 2>&1 | tail -40
               column -s, -t < "$out/fib-eval-$v.csv" | cut -c1-220 ;;
    evicted)   fresh_compile_cache
               ( time sb run evicted --out "$out/h200-evicted-run" ) 2>&1 | tail -25 ;;
    peers-profile)
               fresh_compile_cache
               sb profile peers --case decode --impl paged-window --impl flex-window --impl flex-contiguous \
                 --impl flex-flat --impl torch-batch --out "$out/h200-peers-profile" 2>&1 | tail -30 ;;
    recipe-profile)
               sb profile serving --case "extend b4" --impl sglang-extend --impl paged-window \
                 --against results/h200-serving-0.7.4 --out "$out/h200-recipe-profile" 2>&1 | tail -3 ;;
    modes)     v=$(python3 -c "import flashinfer; print(flashinfer.__version__)")
               ( time sb run serving --case modes-decode --case modes-verify --case modes-extend \
                   --out "$out/h200-modes-$v" ) 2>&1 | tail -30 ;;
    serving)   fresh_compile_cache
               ( time sb run serving --out "$out/h200-serving-run" ) 2>&1 | tail -40 ;;
    default-compare)
               sb compare results/h200x2-default-1gpu "$out/h200-default-run" > "$out/h200-default-compare.md"
               echo "compare exit $?"; head -8 "$out/h200-default-compare.md" ;;
    default)   fresh_compile_cache
               ( time CUDA_VISIBLE_DEVICES=0 sb run default --out "$out/h200-default-run" ) 2>&1 | tail -40 ;;
    default-half)
               fresh_compile_cache
               ( time OMP_NUM_THREADS=$(( $(nproc) / 2 )) CUDA_VISIBLE_DEVICES=0 sb run default \
                   --out "$out/h200-default-run-half" ) 2>&1 | tail -3 ;;
    gpus|gpus-again)
               fresh_compile_cache
               run="$out/h200x2-default-run${step#gpus}"
               src="${COSTS_FROM:-$out/h200-default-run}"
               costs=(); ls "$src"/results.csv* >/dev/null 2>&1 && costs=(--costs-from "$src")
               ( time sb run default --gpus all "${costs[@]}" --out "$run" ) 2>&1 | tail -40
               tail -n 3 "$run"-shards/gpu*.log ;;
    compare)   sb compare "$out/h200-default-run" "$out/h200x2-default-run" > "$out/h200x2-vs-1gpu-compare.md"
               head -5 "$out/h200x2-vs-1gpu-compare.md" ;;
    coldjit)   for jobs in 8 1; do
                 FLASHINFER_WORKSPACE_BASE="$(mktemp -d)" sb warmup default --jobs "$jobs" 2>&1 \
                   | tee "$out/h200-warmup-cold-jobs$jobs.txt"
               done ;;
    reference) sb run default --case "verify b32 p8192 q16 W1023 ps16 h8/2" --impl paged-window --impl paged-mask \
                 --l2 warm --out "$out/h200-reference-warm" 2>&1 | tail -6 ;;
    wrappers)  python3 scripts/wrapper_modes.py "$out/wrapper_modes.csv" ;;
    profile)   sb profile quick --out "$out/h200-quick-profile" 2>&1 | tail -30 ;;
    peers)     fresh_compile_cache
               ( time sb run peers --out "$out/h200-peers-run" ) 2>&1 | tail -30 ;;
    edges-check) ( time sb check edges --out "$out/h200-edges-check" ) 2>&1 | tail -12 ;;
    check)     sb check edges --out "$out/h200-edges-check" 2>&1 | tail -3
               sb check default --out "$out/h200-default-check" 2>&1 | tail -3 ;;
    warmup-all) ( time timeout "${WARMUP_S:-540}" python3 -m swabench warmup ${WARMUP_SCENARIOS:-default serving peers} \
                   --jobs 16 ) 2>&1 \
                 | tail -60 ;;
    counters-tests) timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_counters.py \
                 2>&1 | tee "$out/gpu-counters-tests.log" | tail -8 ;;
    ncu)       v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               for s in ${NCU_SCENARIOS:-default serving}; do
                 for part in ${NCU_PARTS:-main loops}; do
                   filters="NCU_${s^^}"; unit=kernel; [ $part = loops ] && unit=call
                   cases=(); IFS=';' read -ra picked <<< "${!filters:-}"
                   for c in "${picked[@]}"; do cases+=(--case "$c"); done
                   impls=$(python3 -c "import sys; from swabench.inputs import scenarios as sc
s = sc.select(sc.load(sc.find(sys.argv[1])), sys.argv[4:]); loops = set(sys.argv[3].split())
print(' '.join(f'--impl {i}' for i in sorted({p.impl for p in s.points}) if (i in loops) == (sys.argv[2] == 'loops')))" \
                     "$s" "$part" "$NCU_LOOPS" "${picked[@]}")
                   [ -n "$impls" ] || continue
                   name="h200-ncu-$s-$v"; [ $part = loops ] && name="h200-ncu-$s-loops-$v"
                   ( time sb profile "$s" --tool ncu --ncu-unit $unit "${cases[@]}" $impls --out "$out/$name" ) 2>&1 | tail -45
                 done
               done ;;
    noncausal) v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb run noncausal --out "$out/h200-noncausal-$v" ) 2>&1 | tail -30 ;;
    chunked)   v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb run chunked --out "$out/h200-chunked-$v" ) 2>&1 | tail -30
               sb report "$out/h200-chunked-$v" --out "$out/plots-chunked-$v" 2>&1 | tail -2 ;;
    chunked-tests) timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k "chunk or non_causal" \
                 2>&1 | tee "$out/gpu-chunked-tests.log" | tail -8 ;;
    price)     for m in gpt-oss-120b gemma-3-27b llama-4-scout; do
                 again=(); [ -f "$out/h200-price-$m/meta.json" ] && again=(--resume)  # a call cut short
                 ( time sb price --model "$m" --out "$out/h200-price-$m" "${again[@]}" ) 2>&1 | tail -22
               done ;;
    release)   v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb warmup release --jobs 16 ) 2>&1 | tail -45
               ( time sb run release --out "$out/h200-release-$v" ) 2>&1 | tail -40 ;;
    tree)      v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb warmup tree --jobs 16 ) 2>&1 | tail -30
               fresh_compile_cache
               ( time sb run tree --out "$out/h200-tree-$v" ) 2>&1 | tail -40
               sb report "$out/h200-tree-$v" --out "$out/plots-tree-$v" 2>&1 | tail -2 ;;
    shelf-warmup) ( time timeout "${WARMUP_S:-540}" python3 -m swabench warmup shelf --jobs "${WARMUP_JOBS:-16}" ) 2>&1 \
                 | tee "$out/shelf-warmup.log" | tail -45
               rm -f "$out"/jitcache.tar.xz.part-*
               tar cJf - -C /tmp/fiws .cache | split -b 15M - "$out/jitcache.tar.xz.part-" && ls -la "$out" ;;
    shelf-tests) timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -v -rs -p no:cacheprovider tests/test_gpu.py \
                 -k "xqa or fmha or bidirectional or batch_attention or mixed" 2>&1 \
                 | tee "$out/gpu-shelf-tests.log" | tail -30 ;;
    shelf)     v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               again=(); [ -f "$out/h200-shelf-$v/meta.json" ] && again=(--resume)
               ( time timeout "${SHELF_S:-540}" python3 -m swabench run shelf --out "$out/h200-shelf-$v" "${again[@]}" ) \
                 2>&1 | tail -40
               sb report "$out/h200-shelf-$v" --out "$out/plots-shelf-$v" 2>&1 | tail -2 ;;
    shelf-ncu) v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               cases=(); IFS=';' read -ra picked <<< "$NCU_SHELF"
               for c in "${picked[@]}"; do cases+=(--case "$c"); done
               ( time timeout "${NCU_S:-540}" python3 -m swabench profile shelf --tool ncu "${cases[@]}" \
                   --out "$out/h200-ncu-shelf-$v" ) 2>&1 | tail -30 ;;
    release-shelf) v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               groups=(--case shelf-decode --case shelf-verify --case shelf-blocks --case shelf-mixed)
               ( time sb warmup release "${groups[@]}" --jobs 16 ) 2>&1 | tail -20
               ( time sb run release "${groups[@]}" --out "$out/h200-release-shelf-$v" ) 2>&1 | tail -20 ;;
    verdicts)  v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]\+' | head -1 | tr 'H' 'h')
               mkdir -p "$out/repro-$v"
               [ -f "repro/$g-$v/verdicts.json" ] && cp "repro/$g-$v/verdicts.json" "$out/repro-$v/"
               python3 -m pytest -q -p no:cacheprovider tests/test_repro_screen.py tests/test_repro_filing.py \
                 -k "installed_flashinfer or cited_line" > "$out/repro-$v/api.log" 2>&1 \
                 || echo "API CHECK FAILED (pytest exit $?): see $out/repro-$v/api.log; the scripts run all the same"
               tail -1 "$out/repro-$v/api.log"
               ( time python3 scripts/repro_verdicts.py "$out/repro-$v" ${REPRO_REFS:-} --jobs "${VERDICT_JOBS:-6}" ) \
                 2>&1 | tee "$out/repro-$v/this-call.log" | tail -25 ;;
    tree-tests) timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_trees.py 2>&1 \
                 | tee "$out/gpu-tree-tests.log" | tail -8 ;;
    tree-ncu)  v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               cases=(); IFS=';' read -ra picked <<< "$NCU_TREE"
               for c in "${picked[@]}"; do cases+=(--case "$c"); done
               ( time sb profile tree --tool ncu "${cases[@]}" --impl tree-mask-depth --impl tree-trim-depth \
                   --impl tree-window-slot --impl tree-branches --impl paged-trim --out "$out/h200-ncu-tree-$v" ) 2>&1 \
                 | tail -30 ;;
    release-tree)  v=$(python3 -c "import flashinfer; print(flashinfer.__version__)" 2>/dev/null || echo none)
               ( time sb warmup release --case tree --jobs 16 ) 2>&1 | tail -20
               ( time sb run release --case tree --out "$out/h200-release-tree-$v" ) 2>&1 | tail -20 ;;
    dumps)     v=$(python3 -c "import flashinfer; print(flashinfer.__version__)")
               for mode in "" ${DUMP_RUNS:+--runs} "--no-log"; do
                 python3 scripts/play_dump.py "$out/dump${mode:+-${mode#--}}-$v" $mode 2>&1 | tail -40
               done
               rm -rf "$out/dump-runs-$v/dump" ;;  # the KV cache at every run: about 1 GB
    crash)     g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]\+' | head -1 | tr 'H' 'h')
               ( time sb run crash --point-timeout 20 --out "$out/$g-crash" ) 2>&1 | grep -v '^run:' | tail -12
               ( time sb run crash --point-timeout 20 --out "$out/$g-crash" --resume ) 2>&1 | grep -v '^run:' | tail -6 ;;
    isolation-cost) python3 scripts/isolation_cost.py "$out/isolation" ${ISOLATION_SCENARIOS:-quick} \
                 --rounds "${ISOLATION_ROUNDS:-2}" 2>&1 | tail -12 ;;
  esac
done
