#!/usr/bin/env bash
# Issue 13 "Show it": 100,000 distinct unknown event ids against one `serve` — its memory before
# and after, and the Redis commands they cost. A private Redis (own port, never :6379) and SQLite
# in a temp dir; one event opened so the server has something real to serve.
#
#   scripts/unknown-ids-bench.sh            # 100,000 ids
#   IDS=20000 scripts/unknown-ids-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-./target/release/seatrush}
IDS=${IDS:-100000}
PORT=${PORT:-7821}
LISTEN=${LISTEN:-127.0.0.1:7881}
DIR=$(mktemp -d)

cleanup() {
  [ -n "${SERVE_PID:-}" ] && kill "$SERVE_PID" 2>/dev/null || true
  [ -f "$DIR/redis.pid" ] && kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true
}
trap cleanup EXIT

redis-server --port "$PORT" --save '' --appendonly no --maxmemory-policy noeviction --dir "$DIR" \
  --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log"
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
export SEATRUSH_REDIS_URL=redis://127.0.0.1:$PORT SEATRUSH_DATABASE_URL=sqlite://$DIR/db.sqlite
export SEATRUSH_LISTEN=$LISTEN SEATRUSH_WAIT_REPLICAS=0
printf 'id = "real"\ntotal_seats = 10\nhold_seconds = 900\n[levels]\nA1 = 10\n' >"$DIR/event.toml"
echo CODE-0001 >"$DIR/codes.txt"
"$BIN" event apply "$DIR/event.toml" >/dev/null
"$BIN" allowlist import --event real "$DIR/codes.txt" >/dev/null
"$BIN" open --event real >/dev/null 2>&1
"$BIN" serve 2>"$DIR/serve.log" &
SERVE_PID=$!
for _ in $(seq 100); do curl -sf "http://$LISTEN/healthz" >/dev/null && break; sleep 0.1; done
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVE_PID/status"; }
calls() { redis-cli -p "$PORT" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(hgetall|smembers|exists)/ {n += $3} END {print n + 0}'; }
curl -sf "http://$LISTEN/api/events/real" >/dev/null
BEFORE=$(rss_kb); CALLS_BEFORE=$(calls)
echo "load: $(uptime)"
START=$(date +%s.%N)
python3 - "$LISTEN" "$IDS" <<'PY'
import http.client, sys, threading
host, n = sys.argv[1], int(sys.argv[2])
threads = 8
statuses = {}
def run(k):
    c = http.client.HTTPConnection(host)
    for i in range(k, n, threads):
        c.request("GET", f"/api/events/unknown-{i}")
        r = c.getresponse(); r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print("answers by status:", statuses)
PY
SECONDS_TAKEN=$(echo "$(date +%s.%N) - $START" | bc)
AFTER=$(rss_kb); CALLS_AFTER=$(calls)
echo "load: $(uptime)"
echo "$IDS distinct unknown ids in ${SECONDS_TAKEN}s"
echo "serve RSS: $((BEFORE / 1024)) MiB before, $((AFTER / 1024)) MiB after ($(( (AFTER - BEFORE) )) KiB more)"
echo "catalog Redis reads (HGETALL + SMEMBERS + EXISTS) for them: $((CALLS_AFTER - CALLS_BEFORE))"
