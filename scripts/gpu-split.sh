#!/usr/bin/env bash
# Write a wheel too large for one transfer as parts of at most PART_BYTES (default 30 MiB): its files unpacked, as
# one tar stream compressed with xz -9e (a wheel's own deflate leaves xz little: the CuTe DSL's CUDA-13 libraries
# are 88 MiB as an xz'd wheel, about 61 MiB as an xz'd tar of its files), and a manifest ("NAME.whl SHA256 PARTS",
# the stream's sha256; one xz thread, so that the same wheel always gives the same parts).  gpu-join.sh puts the files
# back on the node and checks each against the wheel's RECORD.
#
#   gpu-split.sh WHEEL DEST [PART_BYTES]
#   XZ_DICT=1536MiB gpu-split.sh ...   an xz dictionary that spans a large library (the default, -9e's 64 MiB,
#                                      does not): sglang-kernel's 1.12 GB flash_ops 119 MB instead of 130 MB, at about
#                                      16 GB of memory to write and 1.5 GiB to read back
#
# The wheel is checked first (a zip whose files match its RECORD, as gpu-join.sh checks them), and its parts are
# written beside DEST's old ones, which they replace only once all are written.  Exit 2: a wrong argument.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
fail() { echo "gpu-split.sh: $1" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || fail "usage: gpu-split.sh WHEEL DEST [PART_BYTES]"
WHEEL="$1" DEST="$2" PART_BYTES="${3:-$((30 << 20))}"
name="$(basename "$WHEEL")"
[ -f "$WHEEL" ] || fail "WHEEL $WHEEL: not a regular file (missing, a folder, a FIFO or a device)"
[[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$ ]] || fail "WHEEL $WHEEL: not a wheel's file name (NAME.whl)"
[[ "$PART_BYTES" =~ ^[1-9][0-9]{0,11}$ ]] || fail "PART_BYTES $PART_BYTES: not a whole number of bytes above 0"
[ -z "${XZ_DICT:-}" ] || { [[ "$XZ_DICT" =~ ^[1-9][0-9]{0,3}MiB$ ]] && [ "${XZ_DICT%MiB}" -le 1536 ]; } \
    || fail "XZ_DICT $XZ_DICT: not a size in MiB from 1 to 1536 (xz's largest dictionary; 1536MiB)"
[ ! -e "$DEST" ] || [ -d "$DEST" ] || fail "DEST $DEST: exists and is not a folder"
files="$(mktemp -d)"
trap 'rm -rf "$files" ${new:+"$new"}' EXIT
python3 - "$WHEEL" "$files" <<'PY'
import sys, zipfile

try:
    with zipfile.ZipFile(sys.argv[1]) as wheel:
        wheel.extractall(sys.argv[2])
except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
    print(f"gpu-split.sh: WHEEL {sys.argv[1]}: cannot be unpacked as a zip archive ({e})", file=sys.stderr)
    sys.exit(2)
PY
bash "$HERE/gpu-join.sh" --check-record "$files" "$name" \
    || fail "WHEEL $WHEEL: not a wheel whose files its RECORD lists"
mkdir -p "$DEST"
new="$(mktemp -d "$DEST/.split.XXXXXX")"
tar cf - --sort=name --owner=0 --group=0 --mtime=@0 -C "$files" . | xz -9e -T1 ${XZ_DICT:+--lzma2=preset=9e,dict=$XZ_DICT} \
    | split -b "$PART_BYTES" -d -a 2 - "$new/$name.tar.xz.part"
count=$(ls "$new/$name".tar.xz.part* | wc -l)
echo "$name $(cat "$new/$name".tar.xz.part* | sha256sum | cut -d' ' -f1) $count" > "$new/$name.manifest"
rm -f "$DEST/$name".tar.xz.part* "$DEST/$name.manifest"
mv "$new"/* "$DEST/"
