#!/usr/bin/env bash
# Put back the wheels a bundle carried in parts (gpu-split.sh): for each NAME.whl.manifest in STAGE/parts, once all
# its parts are staged, check the stream's sha256, unpack its files into STAGE/unpacked/NAME.whl and check each
# against the wheel's RECORD.  Parts may arrive over several transfers: each run says how many a wheel still lacks.
# Copied into a bundle as join.sh; setup.sh copies what it unpacked into the install folder.
#
#   gpu-join.sh STAGE
set -euo pipefail
STAGE="$1"
mkdir -p "$STAGE/unpacked"
shopt -s nullglob
for manifest in "$STAGE"/parts/*.manifest; do
    read -r name sum count < "$manifest"
    [ -f "$STAGE/unpacked/$name/.joined" ] && continue
    parts=()
    for ((i = 0; i < count; i++)); do
        part="$STAGE/parts/$name.tar.xz.part$(printf %02d "$i")"
        [ -f "$part" ] && parts+=("$part")
    done
    if [ "${#parts[@]}" -lt "$count" ]; then
        echo "swabench: $name: ${#parts[@]} of $count parts staged in $STAGE; carry the rest and source setup.sh again" >&2
        continue
    fi
    rm -rf "$STAGE/unpacked/$name" && mkdir -p "$STAGE/unpacked/$name"
    if [ "$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)" != "$sum" ] \
            || ! cat "${parts[@]}" | xz -dc | tar xf - -C "$STAGE/unpacked/$name" 2>/dev/null \
            || ! python3 - "$STAGE/unpacked/$name" <<'PY'
import base64, csv, hashlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
record = next(root.glob("*.dist-info/RECORD"))
for path, digest, _ in csv.reader(record.read_text().splitlines()):
    if digest:
        algo, want = digest.split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, (root / path).read_bytes()).digest()).rstrip(b"=").decode()
        if got != want:
            sys.exit(f"{path}: {algo} differs from the wheel's RECORD")
PY
    then
        rm -rf "$STAGE/unpacked/$name"
        echo "swabench: $name: its parts do not join to the bundled wheel's files; bundle it again" >&2
        exit 1
    fi
    touch "$STAGE/unpacked/$name/.joined"
    echo "swabench: $name joined from $count parts" >&2
done
