#!/usr/bin/env bash
# Put back the wheels a bundle carried in parts (gpu-split.sh): for each NAME.whl.manifest in STAGE/parts, once all
# its parts are staged, check the stream's sha256, unpack its files into STAGE/unpacked/NAME.whl and check each
# against the wheel's RECORD.  Parts may arrive over several transfers: each run says how many a wheel still lacks.
# Copied into a bundle as join.sh; setup.sh copies what it unpacked into the install folder.
#
#   gpu-join.sh STAGE
#   gpu-join.sh --check-record FOLDER NAME    FOLDER: a wheel's files unpacked (gpu-split.sh checks a wheel so)
#
# Every manifest is checked before anything is joined: it must read "NAME SHA256 PARTS" with NAME the manifest's own
# name less .manifest (a plain file name ending in .whl), SHA256 64 hex digits and PARTS 1 to 100; else exit 2.
# Exit 1: parts that do not join to the wheel's files; exit 2: a wrong argument, manifest or RECORD.
set -euo pipefail
exec </dev/null  # nothing here reads a terminal: a `source setup.sh` must never wait on one
fail() { echo "swabench: $1" >&2; exit 2; }
WHEEL_NAME='^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$'

check_record() {  # FOLDER NAME: exit 1 where a file differs from the RECORD, 2 where the RECORD cannot be read
    python3 - "$1" "$2" <<'PY'
import base64, csv, hashlib, pathlib, sys

root, name = pathlib.Path(sys.argv[1]), sys.argv[2]


def refuse(why: str) -> None:
    print(f"swabench: {name}: {why}", file=sys.stderr)
    sys.exit(2)


records = sorted(root.glob("*.dist-info/RECORD"))
if len(records) != 1:
    refuse(f"holds {len(records) or 'no'} *.dist-info/RECORD files; a wheel holds one")
record = records[0].relative_to(root)
try:
    rows = list(csv.reader(records[0].read_text().splitlines()))
except (OSError, UnicodeDecodeError, csv.Error) as e:
    refuse(f"{record} cannot be read ({e})")
for number, row in enumerate(rows, 1):
    where = f"{record} line {number}"
    if len(row) != 3:
        refuse(f"{where}: {len(row)} fields; a RECORD line is PATH,ALGORITHM=DIGEST,SIZE")
    path, digest, _ = row
    parts = pathlib.PurePosixPath(path).parts
    if not path or path.startswith("/") or ".." in parts:
        refuse(f"{where}: the path {path!r} lies outside the wheel")
    if not digest:
        continue
    algo, _, want = digest.partition("=")
    if algo not in hashlib.algorithms_guaranteed or algo.startswith("shake") or not want:
        refuse(f"{where}: the digest {digest!r} is not ALGORITHM=DIGEST with a hashlib algorithm (sha256)")
    file = root / path
    if file.is_symlink() or not file.is_file():
        print(f"swabench: {name}: {path}, which the RECORD lists, is not among its files", file=sys.stderr)
        sys.exit(1)
    try:
        data = file.read_bytes()
    except OSError as e:
        refuse(f"{path} cannot be read ({e.strerror or e})")
    got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
    if got != want:
        print(f"swabench: {name}: {path}: {algo} differs from the wheel's RECORD", file=sys.stderr)
        sys.exit(1)
PY
}

if [ "${1:-}" = --check-record ]; then
    [ $# -eq 3 ] && [ -d "$2" ] || fail "usage: gpu-join.sh --check-record FOLDER NAME (FOLDER: a wheel's files)"
    check_record "$2" "$3"
    exit 0
fi
[ $# -eq 1 ] || fail "usage: gpu-join.sh STAGE (the folder whose parts/ holds the staged parts)"
STAGE="$1"
[ -d "$STAGE" ] || fail "STAGE $STAGE: not a folder"
if [ -L "$STAGE/unpacked" ] || { [ -e "$STAGE/unpacked" ] && [ ! -d "$STAGE/unpacked" ]; }; then
    fail "$STAGE/unpacked: not a folder of its own (a link or a file); move it away"
fi
shopt -s nullglob
names=() sums=() counts=()
for manifest in "$STAGE"/parts/*.manifest; do
    [ -f "$manifest" ] || fail "$manifest: not a regular file"
    name="" sum="" count="" rest=""
    read -r name sum count rest < "$manifest" || true  # a last line without its newline is read all the same
    [ "$name" = "$(basename "$manifest" .manifest)" ] && [[ "$name" =~ $WHEEL_NAME ]] \
        || fail "$manifest: names '$name'; a manifest names the wheel it is called after (NAME.whl.manifest: NAME.whl)"
    [[ "$sum" =~ ^[0-9a-f]{64}$ ]] || fail "$manifest: SHA256 '$sum' is not 64 hex digits"
    [[ "$count" =~ ^([1-9][0-9]?|100)$ ]] || fail "$manifest: PARTS '$count' is not a count of 1 to 100"
    [ -z "$rest" ] || fail "$manifest: holds more than NAME SHA256 PARTS"
    names+=("$name") sums+=("$sum") counts+=("$count")
done
mkdir -p "$STAGE/unpacked"
for i in "${!names[@]}"; do
    name="${names[$i]}" sum="${sums[$i]}" count="${counts[$i]}"
    [ -f "$STAGE/unpacked/$name/.joined" ] && continue
    parts=()
    for ((p = 0; p < count; p++)); do
        part="$STAGE/parts/$name.tar.xz.part$(printf %02d "$p")"
        [ -f "$part" ] && parts+=("$part")
    done
    if [ "${#parts[@]}" -lt "$count" ]; then
        echo "swabench: $name: ${#parts[@]} of $count parts staged in $STAGE; carry the rest and source setup.sh" \
             "again" >&2
        continue
    fi
    files="$STAGE/unpacked/$name"  # $name is a plain file name (checked above): this stays inside unpacked/
    rm -rf "$files" && mkdir "$files"
    if [ "$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)" != "$sum" ] \
            || ! cat "${parts[@]}" | xz -dc | tar xf - -C "$files" 2>/dev/null; then
        rm -rf "$files"
        echo "swabench: $name: its parts do not join to the bundled wheel's files; bundle it again" >&2
        exit 1
    fi
    status=0
    check_record "$files" "$name" || status=$?
    if [ "$status" -ne 0 ]; then
        rm -rf "$files"
        echo "swabench: $name: its parts do not join to the bundled wheel's files; bundle it again" >&2
        exit "$status"
    fi
    touch "$files/.joined"
    echo "swabench: $name joined from $count parts" >&2
done
