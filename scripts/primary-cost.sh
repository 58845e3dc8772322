#!/usr/bin/env bash
# The Redis primary's CPU per admission on the hot path, against the bare admit script on the same
# primary in the same run (issue 32's target: at most 1.25x). A private sale (private-sale.sh: a
# primary, a replica, SQLite or DB=postgres), `seatrush serve`, a closed loop of `seatrush-lab
# bench --url` for DURATION_S seconds; the primary's INFO cpu and commandstats are read around
# the load, so its CPU splits into commands and what lies outside them (reading and writing
# sockets, feeding the replica). Then, on the same primary with the replica still attached,
# REF_N admissions of fresh codes through admit.lua in rounds of the load's own mean round size
# (admissions / WAIT calls: a committer round sends one WAIT) on the bench's three levels,
# pipelined by `redis-cli --pipe`.
# Usage: scripts/primary-cost.sh SEATRUSH_BIN [OUT_DIR]
set -euo pipefail
S=$(realpath "$1"); OUT=${2:-bench-out/primary-cost}
L=$(realpath "${LAB:-$(dirname "$S")/seatrush-lab}")
LUA=$(realpath "$(dirname "$0")/../lua/admit.lua")
mkdir -p "$OUT"; OUT=$(realpath "$OUT")
DIR=$(mktemp -d /tmp/seatrush-primary-cost-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; private_db_drop; rm -rf "$DIR"; }
trap cleanup EXIT
. "$(dirname "$0")/private-sale.sh"
CODES=${CODES:-300000}; DURATION_S=${DURATION_S:-10}; REF_N=${REF_N:-100000}
private_sale "$DIR" "$CODES"
private_open "$S"
"$S" serve --listen "127.0.0.1:$HTTP" --refusal-rate-per-minute 0 > "$DIR/serve.log" 2>&1 & PIDS+=($!)
wait_healthy 10

# INFO cpu + commandstats of the primary as "name value" lines: cpu (seconds, user + sys) and,
# per command, its calls and its microseconds.
snapshot() {
  redis-cli -p "$P1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "cpu %.6f\n", s}'
  redis-cli -p "$P1" info commandstats | tr -d '\r' |
    sed -nE 's/^cmdstat_([a-z|]+):calls=([0-9]+),usec=([0-9]+),.*/\1 \2 \3/p' |
    awk '{print "calls_" $1, $2; print "usec_" $1, $3}'
}
delta() { # BEFORE AFTER NAME
  awk -v n="$3" 'NR == FNR { if ($1 == n) b = $2; next } $1 == n { a = $2 } END { printf "%.6f", a - b }' "$1" "$2"
}
snapshot > "$DIR/before"
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
"$L" bench --url "http://127.0.0.1:$HTTP" --codes "$CODES" --duration-s "$DURATION_S" --out-dir "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -a -E 'loop|checks'
snapshot > "$DIR/after"
admitted=$(python3 -c "import json; print(json.load(open('$OUT/report.json'))['admitted'])")
us() { echo "scale=2; $1 * 1000000 / $admitted" | bc; }
cpu=$(delta "$DIR/before" "$DIR/after" cpu)
waits=$(delta "$DIR/before" "$DIR/after" calls_wait | cut -d. -f1)
round=$(echo "scale=2; r = $admitted / $(( waits > 0 ? waits : 1 )); if (r < 1) r = 1; r" | bc)
echo "hot path: $admitted admitted, $waits WAITs (mean round $round admissions); primary CPU $(us "$cpu") us per admission"
# Commands a script calls are counted in commandstats too (inside their EVALSHA's time), so
# only the top-level ones the hot path sends are summed (zrem: the database writer's marks); the
# rest is outside any command.
inside=0
for name in evalsha zrem wait replconf time zcard hgetall smembers info ping; do
  u=$(delta "$DIR/before" "$DIR/after" "usec_$name"); c=$(delta "$DIR/before" "$DIR/after" "calls_$name" | cut -d. -f1)
  [ "$c" -gt 0 ] || continue
  inside=$(echo "$inside + $u / 1000000" | bc -l)
  echo "  $name: $c calls, $(echo "scale=2; $u / $admitted" | bc) us per admission"
done
echo "  outside commands (sockets, the event loop, the replica's feed): $(us "$(echo "$cpu - $inside" | bc -l)") us per admission"

# The reference: admit.lua alone, the same round size, pipelined, on the same primary.
SHA=$(redis-cli -p "$P1" script load "$(cat "$LUA")")
python3 "$(dirname "$0")/admit_calls.py" "$DIR" "$REF_N" "$round" "$SHA" --levels 3 --tag ev:ref
redis-cli -p "$P1" --pipe < "$DIR/setup.resp" >/dev/null
snapshot > "$DIR/ref.before"
redis-cli -p "$P1" --pipe < "$DIR/calls.resp" > "$DIR/pipe.log"
snapshot > "$DIR/ref.after"
grep -q "errors: 0" "$DIR/pipe.log" || { echo "errors in the reference: $(tail -1 "$DIR/pipe.log")"; exit 1; }
ref_admitted=$(redis-cli -p "$P1" hlen '{ev:ref}:adm')
ref_cpu=$(delta "$DIR/ref.before" "$DIR/ref.after" cpu)
ref_us=$(echo "scale=2; $ref_cpu * 1000000 / $ref_admitted" | bc)
hot_us=$(us "$cpu")
echo "bare admit.lua, rounds of $round, pipelined: $ref_admitted admitted; primary CPU $ref_us us per admission"
echo "ratio hot path / bare script: $(echo "scale=2; $hot_us / $ref_us" | bc)"
