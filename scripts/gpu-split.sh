#!/usr/bin/env bash
# Write a wheel too large for one transfer as parts of at most PART_BYTES (default 30 MiB): its files unpacked, as
# one tar stream compressed with xz -9e (a wheel's own deflate leaves xz little: the CuTe DSL's CUDA-13 libraries
# are 88 MiB as an xz'd wheel, about 61 MiB as an xz'd tar of its files), and a manifest ("NAME.whl SHA256 PARTS",
# the stream's sha256; one xz thread, so that the same wheel always gives the same parts).  gpu-join.sh puts the files
# back on the node and checks each against the wheel's RECORD.
#
#   gpu-split.sh WHEEL DEST [PART_BYTES]
set -euo pipefail
WHEEL="$1" DEST="$2" PART_BYTES="${3:-$((30 << 20))}"
name="$(basename "$WHEEL")"
mkdir -p "$DEST"
rm -f "$DEST/$name".tar.xz.part* "$DEST/$name.manifest"
files="$(mktemp -d)"
trap 'rm -rf "$files"' EXIT
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$WHEEL" "$files"
tar cf - --sort=name --owner=0 --group=0 --mtime=@0 -C "$files" . | xz -9e -T1 \
    | split -b "$PART_BYTES" -d -a 2 - "$DEST/$name.tar.xz.part"
count=$(ls "$DEST/$name".tar.xz.part* | wc -l)
echo "$name $(cat "$DEST/$name".tar.xz.part* | sha256sum | cut -d' ' -f1) $count" > "$DEST/$name.manifest"
