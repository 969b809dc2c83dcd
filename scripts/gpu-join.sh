#!/usr/bin/env bash
# Join the wheels a bundle carried in parts: for each NAME.whl.manifest in STAGE/parts ("NAME.whl SHA256 PARTS"),
# once all its parts (NAME.whl.xz.partNN) are staged, decompress them into STAGE/whl/NAME.whl and check its sha256.
# Parts may arrive over several transfers: each prints how many it still lacks.  Copied into a bundle as join.sh.
#
#   gpu-join.sh STAGE
set -euo pipefail
STAGE="$1"
mkdir -p "$STAGE/whl"
shopt -s nullglob
for manifest in "$STAGE"/parts/*.manifest; do
    read -r name sum count < "$manifest"
    [ -f "$STAGE/whl/$name" ] && continue
    parts=("$STAGE/parts/$name".xz.part*)
    if [ "${#parts[@]}" -lt "$count" ]; then
        echo "swabench: $name: ${#parts[@]} of $count parts staged in $STAGE; carry the rest and source setup.sh again" >&2
        continue
    fi
    if ! cat "${parts[@]}" | xz -dc > "$STAGE/whl/$name.joining" 2>/dev/null \
            || ! echo "$sum  $STAGE/whl/$name.joining" | sha256sum -c --status; then
        rm -f "$STAGE/whl/$name.joining"
        echo "swabench: $name: its parts do not join to the bundled wheel (not one xz stream, or its sha256 differs); bundle it again" >&2
        exit 1
    fi
    mv "$STAGE/whl/$name.joining" "$STAGE/whl/$name"
    echo "swabench: $name joined from $count parts" >&2
done
