#!/usr/bin/env bash
# Empties the objects of each FlashInfer JIT module built under DIR (a JIT cache, as scripts/gpu-bundle.sh packs it),
# their dates kept: ninja only compares dates, so the module still counts as built, and the cache is a quarter
# smaller.  A module not linked yet keeps its objects, to resume from, and so does one whose .ninja_log misses its
# library or an object (two builds of it raced): ninja would build that again and link it with the emptied objects,
# a library missing their symbols.  Usage: scripts/stub-jit-cache.sh DIR
set -euo pipefail
fail() { echo "stub-jit-cache.sh: $1" >&2; exit 2; }
[ $# -eq 1 ] || fail "usage: scripts/stub-jit-cache.sh DIR (a JIT cache's folder)"
dir="$1"
[ -d "$dir" ] || fail "DIR $dir: not a folder"
find "$dir" -path '*/cached_ops/*' -name '*.so' -print0 | while IFS= read -r -d '' so; do
    module="$(dirname "$so")"
    logged=yes
    for f in "$so" "$module"/*.o; do
        [ -e "$f" ] || continue
        grep -qF "/$(basename "$f")" "$module/.ninja_log" 2>/dev/null || logged=no
    done
    [ "$logged" = yes ] || continue
    for o in "$module"/*.o; do
        [ -f "$o" ] && [ "$so" -nt "$o" ] && { : > "$o.empty"; touch -r "$o" "$o.empty"; mv "$o.empty" "$o"; }
    done
done
