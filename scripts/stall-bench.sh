#!/usr/bin/env bash
# Issue 13 "Show it": the database stalls for STALL_S seconds under CONNECTIONS connections of
# booking load (open loop, RATE requests a second spread over them). A real deployment on loopback: a private Redis primary + replica (noeviction, on
# their own ports, never :6379), a fresh PostgreSQL database, one `seatrush serve` process, and
# `seatrush-lab bench --url` as the crowd (closed loop). After WARMUP_S seconds one transaction takes
# ACCESS EXCLUSIVE on `bookings` and holds it for STALL_S seconds: every booking write waits.
#
# Prints: how fast the 503s came (p50/p99), serve's peak memory (VmHWM) and its RSS before the
# load, and how long after the stall admissions are back to the pre-stall rate (per-second
# timeline of the bench report). Everything it starts it stops; the database is dropped.
#
#   scripts/stall-bench.sh                 # 2,000 connections, 10 s stall
#   CONNECTIONS=500 STALL_S=5 scripts/stall-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-./target/release/seatrush}
LAB=${LAB:-$(dirname "$BIN")/seatrush-lab}
CONNECTIONS=${CONNECTIONS:-2000}
STALL_S=${STALL_S:-10}
WARMUP_S=${WARMUP_S:-10}
AFTER_S=${AFTER_S:-20}
# Open loop: a closed loop of 2,000 connections re-sends each 503 at once and measures only how
# fast the server can refuse; a crowd pressing "book" is closer to a fixed arrival rate.
RATE=${RATE:-1500}
SEATS=${SEATS:-600000}
PRIMARY_PORT=${PRIMARY_PORT:-7811}
REPLICA_PORT=${REPLICA_PORT:-7812}
LISTEN=${LISTEN:-127.0.0.1:7880}
PG_ADMIN=${PG_ADMIN:-postgres://postgres@127.0.0.1:5432/test}
DB=stallbench_$$
DIR=$(mktemp -d)
ulimit -n "$(ulimit -Hn)"   # 2,000 connections need ~2,000 descriptors on each side

cleanup() {
  [ -n "${SERVE_PID:-}" ] && kill "$SERVE_PID" 2>/dev/null || true
  for p in "$DIR"/primary.pid "$DIR"/replica.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  psql -q "$PG_ADMIN" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

redis() { redis-server --port "$1" --save '' --appendonly no --maxmemory-policy noeviction --dir "$DIR" \
  --daemonize yes --pidfile "$DIR/$2.pid" --logfile "$DIR/$2.log" --dbfilename "$2.rdb" "${@:3}"; }
redis "$PRIMARY_PORT" primary
redis "$REPLICA_PORT" replica --replicaof 127.0.0.1 "$PRIMARY_PORT"
for _ in $(seq 50); do redis-cli -p "$REPLICA_PORT" info replication | grep -q 'master_link_status:up' && break; sleep 0.1; done
psql -q "$PG_ADMIN" -c "CREATE DATABASE $DB" >/dev/null

export SEATRUSH_REDIS_URL=redis://127.0.0.1:$PRIMARY_PORT
export SEATRUSH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/$DB
export SEATRUSH_LISTEN=$LISTEN SEATRUSH_OPERATOR_TOKEN=stall-bench-operator-token-0f3b6e9d
third=$((SEATS / 3))
cat >"$DIR/event.toml" <<TOML
id = "bench"
total_seats = $SEATS
hold_seconds = 900
[levels]
A1 = $third
B1 = $third
C1 = $third
TOML
seq -f 'BENCH-%07g' 0 $((SEATS - 1)) >"$DIR/codes.txt"
"$BIN" event apply "$DIR/event.toml" >/dev/null
"$BIN" allowlist import --event bench "$DIR/codes.txt" >/dev/null
"$BIN" open --event bench 2>/dev/null

"$BIN" serve 2>"$DIR/serve.log" &
SERVE_PID=$!
for _ in $(seq 100); do curl -sf "http://$LISTEN/healthz" >/dev/null && break; sleep 0.1; done
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVE_PID/status"; }
RSS_IDLE=$(rss_kb)

DURATION=$((WARMUP_S + STALL_S + AFTER_S))
echo "load: $(uptime)"
"$LAB" bench --url "http://$LISTEN" --event bench --codes "$SEATS" --connections "$CONNECTIONS" \
  --duration-s "$DURATION" --rate "$RATE" --mix fresh=100 --out-dir "$DIR/out" >"$DIR/bench.txt" 2>&1 &
BENCH_PID=$!
sleep "$WARMUP_S"
STALL_FROM=$WARMUP_S
psql -q "$SEATRUSH_DATABASE_URL" -c "BEGIN; LOCK TABLE bookings IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep($STALL_S); COMMIT;" >/dev/null
wait "$BENCH_PID" || true
HWM=$(awk '/^VmHWM/ {print $2}' "/proc/$SERVE_PID/status")
RSS_AFTER=$(rss_kb)
echo "load: $(uptime)"
cat "$DIR/bench.txt" | grep -v '^\s*$' | tail -12
python3 - "$DIR/out/report.json" "$STALL_FROM" "$STALL_S" "$RSS_IDLE" "$HWM" "$RSS_AFTER" <<'PY'
import json, sys
report, stall_from, stall_s, idle, hwm, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(int, sys.argv[4:7])
r = json.load(open(report))
t = {s["second"]: s for s in r["timeline"]}
before = [t[s]["admitted"] for s in range(2, stall_from) if s in t]
base = sum(before) / max(len(before), 1)
end = stall_from + stall_s
back = next((s - end for s in sorted(t) if s >= end and t[s]["admitted"] >= 0.9 * base), None)
print(f"pre-stall admitted/s {base:.0f}; during the stall {[t[s]['admitted'] for s in range(stall_from, end) if s in t]}")
print(f"after the stall (s from its end: admitted) {[(s - end, t[s]['admitted']) for s in range(end, end + 8) if s in t]}")
print(f"back to >= 90% of the pre-stall rate {back} s after the stall ended")
rl = r["retry_latency_ms"]
print(f"503 retry answers {r['retries']}: p50 {rl['p50']:.1f} ms, p99 {rl['p99']:.1f} ms, max {rl['max']:.1f} ms")
print(f"serve memory: {idle/1024:.0f} MiB idle, peak (VmHWM) {hwm/1024:.0f} MiB, {after/1024:.0f} MiB after")
PY
