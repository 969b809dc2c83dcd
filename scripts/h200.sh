#!/usr/bin/env bash
# How the committed H200 runs are made: run from the checkout's root on the GPU node, after
# `source .gpu/setup.sh` (the offline bundle: ../shared/gpu-kit).  Usage: scripts/h200.sh OUTDIR [STEP...]
# Steps (default: all): tests peaks quick default reference wrappers profile check peers
set -uo pipefail
out="${1:?usage: scripts/h200.sh OUTDIR [STEP...]}"; shift
steps="${*:-tests peaks quick default reference wrappers profile check peers}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
sb() { python3 -m swabench "$@"; }
for step in $steps; do
  echo "=== $step $(date -u +%T)"
  case "$step" in
    tests)     timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5 ;;
    peaks)     sb env --peaks | grep -E '^(gpu|peak|nvidia_smi.clocks)' ;;
    quick)     ( time sb run quick --out "$out/h200-quick-run" ) 2>&1 | tail -18 ;;
    default)   ( time sb run default --out "$out/h200-default-run" ) 2>&1 | tail -30 ;;
    reference) sb run default --case "verify b32 p8192 q16 W1023 ps16 h8/2" --impl paged-window --impl paged-mask \
                 --l2 warm --out "$out/h200-reference-warm" 2>&1 | tail -6 ;;
    wrappers)  python3 scripts/wrapper_modes.py "$out/wrapper_modes.csv" ;;
    profile)   sb profile quick --out "$out/h200-quick-profile" 2>&1 | tail -30 ;;
    peers)     sb run peers --out "$out/h200-peers-run" 2>&1 | tail -16 ;;
    check)     sb check edges --out "$out/h200-edges-check" 2>&1 | tail -3
               sb check default --out "$out/h200-default-check" 2>&1 | tail -3 ;;
    *)         echo "unknown step $step" ;;
  esac
done
