#!/usr/bin/env bash
# serve's user-space instructions per admission, counted by callgrind: repeatable where CPU seconds
# on a shared VM are not (issue 10). A private Redis primary + replica on free ports, an SQLite
# file, 20,000 codes; serve runs under `valgrind --tool=callgrind`, a warm-up loads the allowlist,
# then the counters are zeroed, a fixed open loop runs, and the counters are dumped. Batches of one
# (commit and persist) so that no batch size depends on timing.
# Usage: scripts/serve-instructions.sh BINARY OUT_FILE   (RATE=400 DUR=10 CODES=20000 by default; the load
# from the seatrush-lab binary beside BINARY, or LAB=path)
set -uo pipefail
S=$(realpath "$1"); OUTF=$(realpath -m "$2")
# The load comes from the lab's binary, beside the product's unless LAB names another.
L=$(realpath "${LAB:-$(dirname "$S")/seatrush-lab}")
DIR=$(mktemp -d /tmp/seatrush-cg-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; private_db_drop; rm -rf "$DIR"; }
trap cleanup EXIT
. "$(dirname "$0")/private-sale.sh"
CODES=${CODES:-20000}
private_sale "$DIR" "$CODES"
private_open "$S"
valgrind --tool=callgrind --callgrind-out-file="$OUTF" "$S" serve --listen "127.0.0.1:$HTTP" --refusal-rate-per-minute 0 \
  --commit-batch-max 1 --persist-batch-max 1 > "$DIR/serve.log" 2>&1 & SERVE=$!; PIDS+=($SERVE)
wait_healthy 120
"$L" bench --url "http://127.0.0.1:$HTTP" --codes "$CODES" --code-start 0 --requests-max 300 --rate 50 --connections 8 --duration-s 3 --out-dir "$DIR/warm" >/dev/null 2>&1
callgrind_control -z "$SERVE" >/dev/null
"$L" bench --url "http://127.0.0.1:$HTTP" --codes "$CODES" --code-start 1000 --rate "${RATE:-400}" --connections 32 --duration-s "${DUR:-10}" --out-dir "$DIR/out" 2>&1 | grep -a -E 'loop|checks'
callgrind_control -d "$SERVE" >/dev/null
kill -TERM "$SERVE"; wait "$SERVE" 2>/dev/null
admitted=$(python3 -c "import json; print(json.load(open('$DIR/out/report.json'))['admitted'])")
total=$(callgrind_annotate "$OUTF.1" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | grep -oE "^[0-9,]+" | tr -d ,)
echo "admitted $admitted; instructions $total; per admission $((total / admitted)) (profile: callgrind_annotate $OUTF.1)"
