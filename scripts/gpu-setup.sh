# Source on the GPU node from the checkout's root:  source .gpu/setup.sh   (built by scripts/gpu-bundle.sh,
# which copies this file into the bundle as setup.sh).
# Installs into /tmp/site ($SWABENCH_SITE; nothing system-wide), points FlashInfer's JIT cache at /tmp/fiws and
# unpacks the bundled cache there if there is one, and puts Nsight Systems (shipped inside Nsight Compute on the H200
# image) on PATH.  A wheel carried in parts (FA4's CUDA-13 libraries) is staged in $SWABENCH_STAGE (default
# /tmp/swabench-stage, kept while the node stays warm): each transfer adds its parts, and the one that completes them
# joins them (join.sh) and installs the wheel's files.  FA4's compiled kernels are cached on disk in /tmp/fa4cache.
_kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_stage="${SWABENCH_STAGE:-/tmp/swabench-stage}"
_site="${SWABENCH_SITE:-/tmp/site}"
mkdir -p "$_site" /tmp/fiws "$_stage/parts"
for _manifest in "$_kit"/parts/*.manifest; do  # another bundle's parts of the same wheel: not to be mixed with these
    [ -f "$_manifest" ] || continue
    _staged="$_stage/parts/$(basename "$_manifest")"
    if [ -f "$_staged" ] && ! cmp -s "$_manifest" "$_staged"; then
        rm -rf "${_staged%.manifest}".tar.xz.part* "$_stage/unpacked/$(basename "${_manifest%.manifest}")"
    fi
done
if ls "$_kit"/parts/* >/dev/null 2>&1; then cp -f "$_kit"/parts/* "$_stage/parts/"; fi
bash "$_kit/join.sh" "$_stage"
if ls "$_kit"/whl*/*.whl >/dev/null 2>&1; then  # whl/, and CUDNN=1's and FA4=1's folders where they came
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_site" \
        "$_kit"/whl*/*.whl
fi
# after pip: --upgrade replaces a package's whole folder, and the CuTe DSL's CUDA-13 libraries share theirs
for _files in "$_stage"/unpacked/*/; do [ -f "$_files/.joined" ] && cp -r "$_files"* "$_site/"; done
if [ -f "$_kit/flashinfer.tar.xz" ]; then
    rm -rf "$_site/flashinfer" "$_site"/flashinfer_python-*.dist-info  # another bundle's release, on a warm node
    tar xJf "$_kit/flashinfer.tar.xz" -C "$_site"
fi
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
export PYTHONPATH="$_site${PYTHONPATH:+:$PYTHONPATH}"
# a .pth file is read in site-packages, not on PYTHONPATH: the CuTe DSL's (nvidia_cutlass_dsl_packages.pth) adds this
if [ -d "$_site/nvidia_cutlass_dsl/dsl_packages" ]; then
    export PYTHONPATH="$_site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH"
fi
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS="${MAX_JOBS:-16}"
# FlashInfer leaves the freshness of its JIT modules to ninja, which compares file times: date the
# freshly unpacked sources back so that prebuilt modules count as up to date.
find "$_site" -exec touch -h -d '2001-01-01 00:00:00' {} +
if [ -f "$_kit/jitcache.tar.xz" ]; then
    tar xJf "$_kit/jitcache.tar.xz" -C /tmp/fiws
    find /tmp/fiws/.cache/flashinfer/*/*/generated -exec touch -h -d '2001-01-01 00:00:00' {} + 2>/dev/null
fi
if ls "$_kit"/deb/*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/dwx && for f in "$_kit"/deb/*.deb; do dpkg -x "$f" /tmp/dwx; done
    export LD_LIBRARY_PATH="/tmp/dwx/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for d in /opt/nvidia/nsight-compute/*/host/target-linux-x64; do [ -x "$d/nsys" ] && export PATH="$PATH:$d"; done
python3 - <<'PY' >&2 || true
import importlib
for name, needs in (("cudnn", "CUDNN=1"), ("flash_attn.cute", "FA4=1")):
    try:
        importlib.import_module(name)
        print(f"swabench: {name} imports")
    except Exception as e:
        print(f"swabench: {name} does not import ({type(e).__name__}: {str(e)[:200]}); a bundle made with {needs} has it")
PY
unset _kit _stage _site _files _manifest _staged
