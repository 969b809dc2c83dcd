#!/usr/bin/env bash
# Write a wheel too large for one transfer as xz parts of at most PART_BYTES (default 30 MiB) and a manifest
# ("NAME.whl SHA256 PARTS") in DEST; gpu-join.sh puts them back together on the node.
#
#   gpu-split.sh WHEEL DEST [PART_BYTES]
set -euo pipefail
WHEEL="$1" DEST="$2" PART_BYTES="${3:-$((30 << 20))}"
name="$(basename "$WHEEL")"
mkdir -p "$DEST"
rm -f "$DEST/$name".xz.part* "$DEST/$name.manifest"
xz -9e -T0 -c "$WHEEL" | split -b "$PART_BYTES" -d -a 2 - "$DEST/$name.xz.part"
count=$(ls "$DEST/$name".xz.part* | wc -l)
echo "$name $(sha256sum "$WHEEL" | cut -d' ' -f1) $count" > "$DEST/$name.manifest"
