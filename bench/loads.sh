#!/usr/bin/env bash
# Load time and time to first token of one model, hypura-cli beside vanilla llama-completion of the same build:
# first use (a fresh cache: no machine profile), then second runs with the file in the page cache and after it
# was dropped. One row per run: the case, load time (common_perf_print), prompt eval time, and the wall time of
# a one-token run from launch to exit (what a user waits for the first token, plus the exit).
#   bash bench/loads.sh MODEL [hypura-cli flags...]
# Environment: LIBDIR  the build's bin folder (llama-completion; default: .venv/hypura-lib's)
#              FRESH   an empty folder for first use's XDG_CACHE_HOME (default: a new temporary one)
#              XDG     the cache for second runs (default: FRESH, which first use filled)
#              DROP    how the file leaves the page cache (default: drop_caches; "evict": only this file's pages)
#              VANILLA vanilla's extra flags (default: none, its --fit; a row more with -lm none: pinned host weights)
set -uo pipefail
MODEL=$1; shift
LIBDIR=${LIBDIR:-$(cat .venv/hypura-lib 2> /dev/null)}
FRESH=${FRESH:-$(mktemp -d)}
XDG=${XDG:-$FRESH}
ARGS=(-p "Once upon a time" -n 1 -no-cnv --temp 0)

drop() {
    if [ "${DROP:-drop_caches}" = evict ]; then
        python3 -c "from hypura.tiers.residency import evict; import sys; evict(sys.argv[1])" "$MODEL"
    else
        sync; echo 3 > /proc/sys/vm/drop_caches
    fi
}
warm() { cat "$MODEL" > /dev/null; }
share() { python3 -c "from hypura.tiers.residency import cached_share; import sys; print(f'{cached_share(sys.argv[1]):.0%}')" "$MODEL"; }

row() {  # row CASE COMMAND...: runs it once, prints the row; the whole log goes to $LOGS/CASE.txt
    local name=$1; shift
    local before; before=$(share)
    local t0 t1; t0=$(date +%s.%N)
    "$@" < /dev/null > "$LOGS/$name.txt" 2>&1
    local rc=$?; t1=$(date +%s.%N)
    local load prompt
    load=$(grep -a "common_perf_print: *load time" "$LOGS/$name.txt" | tail -1 | grep -o "[0-9.]* ms" | head -1)
    prompt=$(grep -a "common_perf_print: prompt eval time" "$LOGS/$name.txt" | tail -1 | grep -o "[0-9.]* ms" | head -1)
    printf "| %-26s | %8s | %12s | %12s | %8.2f s | %s\n" "$name" "$before" "${load:-?}" "${prompt:-?}" \
        "$(awk "BEGIN {print $t1 - $t0}")" "$([ $rc = 0 ] || echo "rc $rc")$(grep -a -m1 -o 'hypura: load: [^;]*' "$LOGS/$name.txt")"
}

LOGS=${LOGS:-$(mktemp -d)}; mkdir -p "$LOGS"
hycli() { XDG_CACHE_HOME=$1 python3 -m hypura.cli.completion -m "$MODEL" "${ARGS[@]}" "${@:2}"; }
vanilla() { "$LIBDIR/llama-completion" -m "$MODEL" "${ARGS[@]}" ${VANILLA:-}; }
echo "model $(basename "$MODEL") ($(du -h "$MODEL" | cut -f1)), hypura-cli $*; logs in $LOGS"
echo "| run                        | cached   | load time    | prompt eval  | wall, -n 1 | hypura's load line"
warm
row hypura-first-use hycli "$FRESH" "$@"
row hypura-cached hycli "$XDG" "$@"
row vanilla-cached vanilla
VANILLA="${VANILLA:-} -lm none" row vanilla-lm-none-cached vanilla  # its weights read into pinned host memory
drop
row hypura-dropped hycli "$XDG" "$@"
drop
row vanilla-dropped vanilla
