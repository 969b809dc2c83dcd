#!/usr/bin/env bash
# Build an offline bundle for a Linux x86-64 GPU node (Python 3.12, CUDA 13, torch already installed)
# that cannot reach a package index.  Run it where pip can reach PyPI, then copy DEST next to the
# checkout on the node and, from the checkout's root, `source DEST/setup.sh`.
#
#   scripts/gpu-bundle.sh [RELEASE] [DEST]          RELEASE: flashinfer-python version (default 0.7.4)
#                                                   DEST: the bundle's folder (default .gpu)
#   JIT_CACHE=path/to/jitcache.tar.xz scripts/gpu-bundle.sh 0.7.4 .gpu   also copies a prebuilt JIT cache
#   FIB=1 ...        also bundles flashinfer-bench and what it needs beyond the node's image (pydantic), for
#                    scripts/fib_evaluate.py
#   NO_CUPTI=1 ...   leaves out cupti-python (6 MB; FlashInfer's autotuner uses it only when it is there), so
#                    that a large JIT cache (default + serving on 0.7.4: 20 MB) still fits a 64 MiB transfer
#   CUDNN=1 ...      also bundles the cuDNN frontend (nvidia-cudnn-frontend, 11.6 MB; the node's image has cuDNN's
#                    libraries, nvidia-cudnn-cu13), for the cudnn backend
#   FA4=1 ...        also bundles FlashAttention-4 (flash-attn-4 and the CuTe DSL it compiles with, 6.9 MB) and, in
#                    parts/, the DSL's CUDA-13 libraries (a 92 MB wheel, about 61 MiB as an xz'd tar of its files) in
#                    parts of at most 30 MiB: setup.sh stages the parts it is given and installs the wheel's files
#                    once all have come
#   FA3=1 ...        also bundles vLLM's FlashAttention-3 (its library and interface out of the vllm 0.26.0 wheel,
#                    which pins the node's torch 2.11.0; no vllm install) as one 7.9 MB part in parts/
#   SGL_FA3=1 ...    also bundles SGLang's FlashAttention-3 (flash_ops and its wrapper out of sglang-kernel 0.4.5,
#                    the build sglang 0.5.17 pins for torch 2.11.0) in parts of at most 36 MiB: xz takes long on it
#                    (about 50 min on 2 cores) and, with a dictionary that spans the library, 16 GB of memory
#
# The bundle holds:
#   whl/               wheels the node lacks: apache-tvm-ffi, nvtx, cupti-python (unless NO_CUPTI), pyelftools
#   whl-cudnn/, whl-fa4/  CUDNN=1's and FA4=1's wheels, apart, so that each can travel in a call of its own
#   flashinfer.tar.xz  flashinfer-python RELEASE, unpacked, with the kernel sources of unrelated ops removed (xz -9)
#                      (its prefill/decode JIT sources are kept whole, and csrc/xqa and csrc/fmha_v2 for the shelf)
#   deb/               libdw1 and libelf1, which the Nsight Systems report importer needs (when apt can fetch them)
#   jitcache.tar.xz    only with JIT_CACHE: FlashInfer JIT modules compiled for this RELEASE on the node's GPU, each
#                      built module's objects emptied (ninja reads their dates only).
#                      Without one, modules compile on first use (`swabench warmup SCENARIO` builds a
#                      scenario's modules in parallel before anything is timed).
#   parts/             with FA4, FA3 or SGL_FA3: each large wheel as tar.xz parts and a manifest (scripts/gpu-split.sh)
#   setup.sh           scripts/gpu-setup.sh: installs into /tmp/site, unpacks the JIT cache into /tmp/fiws
#   join.sh            scripts/gpu-join.sh: joins the staged parts, checking each file against the wheel's RECORD
#
# The new bundle is written beside DEST's old one, which keeps its wheels, parts and cache until every download has
# succeeded: a rebuild where pip cannot reach PyPI leaves a working bundle as it was.  Exit 2: a wrong argument.
#
# To keep the modules a node compiled, pack its cache back on the node and bundle it next time:
#   tar cJf jitcache.tar.xz -C /tmp/fiws .cache
# A cache is only good for the release and GPU architecture it was built with.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "gpu-bundle.sh: $1" >&2; exit 2; }
[ $# -le 2 ] || fail "usage: scripts/gpu-bundle.sh [RELEASE] [DEST]"
RELEASE="${1:-0.7.4}"
DEST="${2:-.gpu}"
[[ "$RELEASE" =~ ^[0-9]+(\.[0-9]+)*([._-]?[A-Za-z0-9]+)*$ ]] \
    || fail "RELEASE $RELEASE: not a flashinfer-python version (0.7.4, 0.7.2.post1, ...)"
[ -n "$DEST" ] || fail "DEST: empty; give the bundle's folder"
[ ! -e "$DEST" ] || [ -d "$DEST" ] || fail "DEST $DEST: exists and is not a folder"
if [ -n "${JIT_CACHE:-}" ] && [ ! -f "$JIT_CACHE" ]; then
    fail "JIT_CACHE=$JIT_CACHE: no such file"
fi
mkdir -p "$DEST"
NEW="$(mktemp -d "$DEST/.bundle.XXXXXX")"  # the new bundle, until every download has succeeded
TMP="$(mktemp -d)"
trap 'rm -rf "$NEW" "$TMP"' EXIT
mkdir "$NEW/whl" "$NEW/deb"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # pip download, without the warnings some pip configurations print for every package
    python3 -m pip download -q --no-deps "$@" 2>&1 | { grep -v '^WARNING' || true; }
}
download "${PLAT[@]}" -d "$NEW/whl" "apache-tvm-ffi>=0.1.11,<0.2" nvtx pyelftools
if [ -n "${FIB:-}" ]; then
    download "${PLAT[@]}" -d "$NEW/whl" flashinfer-bench==0.1.2 pydantic pydantic-core annotated-types \
        typing-inspection typing-extensions docstring-parser
fi
if [ -n "${CUDNN:-}" ]; then
    download "${PLAT[@]}" -d "$NEW/whl-cudnn" nvidia-cudnn-frontend==1.32.0
fi
if [ -n "${FA4:-}" ]; then  # the image has cuda-bindings, einops and protobuf; tvm-ffi is bundled above
    download "${PLAT[@]}" -d "$NEW/whl-fa4" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 quack-kernels==0.6.5 \
        torch-c-dlpack-ext==0.1.5
    download "${PLAT[@]}" -d "$TMP/libs" nvidia-cutlass-dsl-libs-cu13==4.8.1
    bash "$HERE/gpu-split.sh" "$TMP"/libs/nvidia_cutlass_dsl_libs_cu13-*.whl "$NEW/parts"
fi
build="built for torch 2.11.0, CUDA 13"
if [ -n "${FA3:-}" ]; then  # the engine's wheel only for its FA3 files (scripts/subset-wheel.py)
    download "${PLAT[@]}" -d "$TMP/vllm" vllm==0.26.0
    fa3="$(python3 "$HERE/subset-wheel.py" "$TMP"/vllm/vllm-0.26.0-*.whl "$TMP/fa3" --name swabench-vllm-fa3 \
        --keep vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so --keep vllm/vllm_flash_attn/flash_attn_interface.py \
        --empty vllm/__init__.py --empty vllm/vllm_flash_attn/__init__.py --build "$build")"
    bash "$HERE/gpu-split.sh" "$fa3" "$NEW/parts" $((36 << 20))
fi
if [ -n "${SGL_FA3:-}" ]; then
    download "${PLAT[@]}" -d "$TMP/sgl" sglang-kernel==0.4.5
    sgl="$(python3 "$HERE/subset-wheel.py" "$TMP"/sgl/sglang_kernel-0.4.5-*.whl "$TMP/sglfa3" --name swabench-sgl-fa3 \
        --keep sgl_kernel/flash_ops.abi3.so --keep sgl_kernel/flash_attn.py --keep sgl_kernel/debug_utils.py \
        --empty sgl_kernel/__init__.py --build "$build")"
    XZ_DICT=1536MiB bash "$HERE/gpu-split.sh" "$sgl" "$NEW/parts" $((36 << 20))
fi
if [ -z "${NO_CUPTI:-}" ]; then download "${PLAT[@]}" -d "$NEW/whl" cupti-python; fi
download --only-binary=:all: -d "$TMP" "flashinfer-python==$RELEASE"
python3 - "$TMP" <<'PY'
import pathlib, shutil, sys, zipfile
tmp = pathlib.Path(sys.argv[1])
whl = next(tmp.glob("flashinfer_python-*.whl"))
out = tmp / "site"
zipfile.ZipFile(whl).extractall(out)
fi = out / "flashinfer"
keep = {"xqa", "fmha_v2"}  # the sources TRT-LLM's XQA and fmha v2 JIT-build from (impls.xqa, impls.fmha_v2)
drop = [p for p in (fi / "data" / "csrc").iterdir() if p.is_dir() and p.name not in keep]
drop += [fi / "data/cutlass/examples", fi / "data/cutlass/python", fi / "data/cccl/python", fi / "moe_ep/kernel_src"]
drop += list((fi / "experimental").glob("*/csrc")) + list(fi.glob("cake_*_backend/csrc"))
for p in drop:
    shutil.rmtree(p, ignore_errors=True)
for folder in (fi / "experimental", fi / "fused_moe"):  # kernel sources of ops the suite never builds
    for source in [f for pattern in ("*.cu", "*.cuh", "*.h") for f in folder.rglob(pattern)]:
        source.unlink()
PY
tar cf - -C "$TMP/site" . | xz -9 -T0 > "$NEW/flashinfer.tar.xz"
( cd "$NEW/deb" && apt-get download libdw1 libelf1 >/dev/null 2>&1 ) \
    || echo "note: could not fetch libdw1/libelf1 (nsys reports need them on the node)" >&2
cp "$HERE/gpu-setup.sh" "$NEW/setup.sh"
cp "$HERE/gpu-join.sh" "$NEW/join.sh"
if [ -n "${JIT_CACHE:-}" ]; then
    mkdir -p "$TMP/cache" && tar xJf "$JIT_CACHE" -C "$TMP/cache"
    bash "$HERE/stub-jit-cache.sh" "$TMP/cache"
    tar cf - -C "$TMP/cache" .cache | xz -9 -T0 > "$NEW/jitcache.tar.xz"
fi
# all is here: the new bundle replaces the old one's wheels (CUDNN=1's, FA4=1's too), parts and JIT cache; the old
# .deb files stay where apt could not fetch new ones
rm -rf "$DEST"/whl "$DEST"/whl-* "$DEST/parts" "$DEST/jitcache.tar.xz"
if ls "$NEW"/deb/*.deb >/dev/null 2>&1; then rm -rf "$DEST/deb"; else rmdir "$NEW/deb"; fi
mv "$NEW"/* "$DEST/"
echo "flashinfer-python $RELEASE bundled in $DEST ($(du -sh "$DEST" | cut -f1))" \
     "$([ -f "$DEST/jitcache.tar.xz" ] && echo "with a JIT cache" || echo "without a JIT cache: modules compile on first use")"
