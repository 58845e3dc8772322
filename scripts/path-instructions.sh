#!/usr/bin/env bash
# The Redis primary's instructions per admission on the whole hot path (admit rounds and their
# WAIT, the persisted marks, feeding the replica, the background passes), against admit.lua alone
# in rounds of the same size (redis-instructions.sh), both counted by callgrind: instruction counts
# do not move with the machine's load, CPU seconds do (issue 32's target: at most 1.25x).
# A private sale whose primary runs under callgrind, with its replica; `seatrush serve` with
# rounds and database batches capped at what the release closed loop runs at, one committer
# connection and a writer that lingers for more, so that at callgrind's pace the rounds still fill
# (the script prints the sizes it ran at: the marks' batches stay below MARKS); a closed loop of `seatrush-lab bench --url` for DURATION_S seconds,
# counted from its first request to its last. What the primary does by the clock rather than by
# the admission (the reaper's passes, the heal's sweep, availability snapshots) is counted again
# over as long a quiet stretch right after the load and taken off: under callgrind the load runs
# some fifty times slower than in a real sale, so those would weigh fifty times too much.
# Kernel time (system calls) is not in these counts.
# Usage: scripts/path-instructions.sh SEATRUSH_BIN [OUT_DIR]
#   ROUND (default 5): admits a committer round sends; MARKS (default 13): bookings a database
#   batch writes, and so marks a mark's ZREM carries; COMMITTERS (1); LINGER_MS (40);
#   CODES (60000: the load must not sell out, or the refusals after it, each a read of the code's
#   record on the primary, are counted as the admissions' cost), DURATION_S (30); BENCH_ARGS (--connections 32); WAIT_TIMEOUT_MS (2000: the
#   primary runs some fifty times slower under callgrind, and at serve's 200 ms a WAIT now and
#   then falls short, whose settling and heal are no part of a sale's hot path).
set -euo pipefail
S=$(realpath "$1"); OUT=${2:-bench-out/path-instructions}
L=$(realpath "${LAB:-$(dirname "$S")/seatrush-lab}")
mkdir -p "$OUT"; OUT=$(realpath "$OUT")
DIR=$(mktemp -d /tmp/seatrush-path-cg-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 1; private_db_drop; rm -rf "$DIR"; }
trap cleanup EXIT
. "$(dirname "$0")/private-sale.sh"
CODES=${CODES:-60000}; DURATION_S=${DURATION_S:-30}; ROUND=${ROUND:-5}; MARKS=${MARKS:-13}
PRIMARY_WRAP="valgrind --tool=callgrind --callgrind-out-file=$DIR/cg.out" private_sale "$DIR" "$CODES"
VP=${PIDS[0]}
private_open "$S"
"$S" serve --listen "127.0.0.1:$HTTP" --refusal-rate-per-minute 0 --commit-batch-max "$ROUND" --persist-batch-max "$MARKS" --commit-connections "${COMMITTERS:-1}" --persist-linger-ms "${LINGER_MS:-40}" --wait-timeout-ms "${WAIT_TIMEOUT_MS:-2000}" > "$DIR/serve.log" 2>&1 & PIDS+=($!)
wait_healthy 30
count() { # the instructions since the last zeroing, dumped to a file of their own
  callgrind_control -d "$VP" >/dev/null 2>&1
  local dump; dump=$(ls "$DIR"/cg.out.* | sort -V | tail -1)
  callgrind_annotate "$dump" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | grep -oE "^[0-9,]+" | tr -d ,
}
calls() { # CMD: how many times the primary ran it so far
  redis-cli -p "$P1" info commandstats | tr -d '\r' | sed -nE "s/^cmdstat_$1:calls=([0-9]+),.*/\1/p" | grep . || echo 0
}
waits_before=$(calls wait); evals_before=$(calls evalsha); zrems_before=$(calls zrem)
stats() { redis-cli -p "$P1" info commandstats | tr -d '\r' | sed -nE 's/^cmdstat_([a-z|]+):calls=([0-9]+),.*/\1 \2/p' | sort; }
stats > "$DIR/stats.before"
callgrind_control -z "$VP" >/dev/null 2>&1
start=$(date +%s.%N)
"$L" bench --url "http://127.0.0.1:$HTTP" --codes "$CODES" --duration-s "$DURATION_S" --out-dir "$OUT" ${BENCH_ARGS:---connections 32} 2>&1 | grep -a -E "loop|checks" || true
loaded_s=$(echo "$(date +%s.%N) - $start" | bc)
total=$(count)
waits=$(( $(calls wait) - waits_before )); evals=$(( $(calls evalsha) - evals_before )); zrems=$(( $(calls zrem) - zrems_before ))
cp "$(ls "$DIR"/cg.out.* | sort -V | tail -1)" "$OUT/primary.callgrind"; cp "$DIR/serve.log" "$OUT/serve.log"
# Every command the primary ran during the load, with its calls (scripts' own commands included).
stats | join -a1 -e0 -o 0,1.2,2.2 - "$DIR/stats.before" | awk '{print $1, $2 - $3}' | sort -k2 -nr > "$OUT/commands.txt"
callgrind_control -z "$VP" >/dev/null 2>&1
sleep "$loaded_s"
quiet=$(count)
admitted=$(python3 -c "import json; print(json.load(open('$OUT/report.json'))['admitted'])")
if [ "$admitted" -ge "$CODES" ]; then
  echo "the load sold out ($admitted of $CODES codes admitted): the refusals after it are in the count; run again with more CODES"; exit 1
fi
echo "hot path, rounds of $ROUND, marks $MARKS a call: $admitted admitted in ${loaded_s%.*} s; $((total / admitted)) instructions per admission, $(((total - quiet) / admitted)) without the clock's share ($((quiet / ${loaded_s%.*})) a second when quiet; callgrind dump: $OUT/primary.callgrind, serve's log: $OUT/serve.log, the commands run: $OUT/commands.txt)"
ran=$(echo "scale=2; $admitted / $waits" | bc)
echo "  the load's rounds: $waits WAITs, $admitted admitted: $ran admissions a round; $((evals - waits)) other script calls; $zrems ZREMs (the marks): $(echo "scale=1; $admitted / $zrems" | bc) admissions each"
# The bare script twice: in rounds of the cap, and in rounds of the size the load's rounds had
# (a mix of the two sizes around it): a round's fixed cost (the call, its reads and writes, its
# WAIT: about 126,000 instructions) is a quarter of a round of five's, so rounds that did not fill
# weigh on the ratio to the first.
hot=$(((total - quiet) / admitted))
for batch in "$ROUND" "$ran"; do
  line=$(REPLICA=1 LEVELS=3 "$(dirname "$0")/redis-instructions.sh" "$(dirname "$0")/../lua/admit.lua" "$batch" 20000 | tail -1)
  echo "$line"
  bare=$(echo "$line" | sed -nE 's/.*; ([0-9]+) instructions per admission/\1/p')
  echo "  ratio, rounds of $batch: $(echo "scale=3; $hot / $bare" | bc) (with the clock's share: $(echo "scale=3; $total / $admitted / $bare" | bc))"
done
