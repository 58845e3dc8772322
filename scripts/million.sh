#!/usr/bin/env bash
# One million codes: `allowlist import` + `open` wall time, then `serve`'s RSS once it has copied
# the allowlist into memory and again after a load run. Private Redis primary+replica on free
# ports and an SQLite file, all under a temp dir removed at the end. DB=postgres: a fresh database
# on the local PostgreSQL instead (dropped at the end), and the CPU its server processes spent.
set -euo pipefail
S=$(realpath "$1"); OUT=$2
# The load comes from the lab's binary, beside the product's unless LAB names another.
L=$(realpath "${LAB:-$(dirname "$S")/seatrush-lab}")
mkdir -p "$OUT"; OUT=$(realpath "$OUT")
DIR=$(mktemp -d /tmp/seatrush-million-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; private_db_drop; rm -rf "$DIR"; }
trap cleanup EXIT
. "$(dirname "$0")/private-sale.sh"
CODES=${CODES:-1000000} # fewer (CODES=300000) when the machine is too loaded for a million to open
# BENCH_ARGS: more flags for the load run, e.g. the availability polls of issue 10's target 4:
# BENCH_ARGS="--rate 20833 --connections 256 --mix poll=20000,fresh=716,retry=33,duplicate=33,unregistered=25,bot=25"
private_sale "$DIR" "$CODES"
"$S" event apply "$DIR/event.toml"
start=$(date +%s.%N)
/usr/bin/time -f "import: %e s" "$S" allowlist import --event bench "$DIR/codes.txt"
# On a loaded machine a staging command can pass the Redis response timeout (2 s); open is safe
# to run again (staged keys, then an atomic switch), so try it up to three times and say so.
for attempt in 1 2 3; do
  /usr/bin/time -f "open: %e s (attempt $attempt)" "$S" open --event bench && break
  [ "$attempt" = 3 ] && exit 1
done
echo "import + open: $(echo "$(date +%s.%N) - $start" | bc) s"
# The whole crowd comes from one address: without --refusal-rate-per-minute 0 its unregistered
# codes are rate limited (429) after the first 30 a minute, as `bench`'s own server does.
# SERVE_ENV: environment for serve alone, e.g. SERVE_ENV=TOKIO_WORKER_THREADS=1 (issue 10, tenth pass).
env ${SERVE_ENV:-} "$S" serve --listen "127.0.0.1:$HTTP" --refusal-rate-per-minute 0 > "$DIR/serve.log" 2>&1 & SERVE=$!; PIDS+=($SERVE)
for _ in $(seq 100); do curl -s "http://127.0.0.1:$HTTP/healthz" >/dev/null && break; sleep 0.1; done
echo "serve RSS with $CODES codes in memory: $(grep VmRSS /proc/$SERVE/status)"
cpu() { awk '{printf "%.2f", ($14+$15)/100}' "/proc/$1/stat"; }
# Every PostgreSQL server process's CPU, in hundredths of a second (the cluster is shared, but
# nothing else uses it during the run; processes that exit meanwhile are not counted).
pg_ticks() { local t=0 p; for p in $(pgrep -x postgres); do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo $t; }
pg_before=$(pg_ticks)
# serve's CPU by thread name: the request path (tokio-rt-worker) apart from SQLite's threads; user
# and kernel apart, and the thread's context switches (half of serve's CPU was found in the kernel).
threads() {
  for t in /proc/$SERVE/task/*; do
    echo "$(tr ' ' _ < "$t/comm") $(awk '{print $14, $15}' "$t/stat") $(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status")"
  done | awk '{u[$1]+=$2; k[$1]+=$3; c[$1]+=$4} END {for (n in u) print n, u[n], k[n], c[n]}' | sort
}
threads > "$DIR/threads.before"
before=("$(cpu $SERVE)" "$(cpu "${PIDS[0]}")" "$(cpu "${PIDS[1]}")")
if [ -n "${PERF:-}" ]; then # PERF=1: a call-graph profile of serve for 5 s in the middle of the run
  (sleep 3; perf record -F 499 -g -o "$OUT/serve.perf.data" -p "$SERVE" -- sleep 5 >/dev/null 2>&1) & PERFJOB=$!
fi
if [ -n "${SYSCALLS:-}" ]; then # SYSCALLS=1: serve's system calls by thread and kind over the whole run (perf stat)
  EV=$(for c in recvfrom writev write epoll_wait futex pread64 pwrite64 fcntl fsync fdatasync; do printf 'syscalls:sys_enter_%s,' $c; done)
  perf stat -e "${EV%,}" --per-thread -x, -p "$SERVE" -o "$DIR/syscalls.csv" & STATJOB=$!
fi
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -o "$DIR/gen.time" -f "%U %S" "$L" bench --url "http://127.0.0.1:$HTTP" --codes "$CODES" --duration-s 10 --out-dir "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -a -E 'loop|latency|polls|checks'
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
serve_s=$(echo "$(cpu $SERVE) - ${before[0]}" | bc); primary_s=$(echo "$(cpu "${PIDS[0]}") - ${before[1]}" | bc); replica_s=$(echo "$(cpu "${PIDS[1]}") - ${before[2]}" | bc)
gen_s=$(awk '{print $1 + $2}' "$DIR/gen.time")
threads > "$DIR/threads.after"
pg_s=$(echo "scale=2; ($(pg_ticks) - $pg_before) / 100" | bc)
admitted=$(python3 -c "import json; print(json.load(open('$OUT/report.json'))['admitted'])")
echo "cpu during the run: serve $serve_s s, redis primary $primary_s s, replica $replica_s s, load generator $gen_s s; $admitted admitted"
pairs=("serve $serve_s" "redis-primary $primary_s" "replica $replica_s" "load-generator $gen_s")
[ "${DB:-sqlite}" = postgres ] && pairs+=("postgresql $pg_s")
for pair in "${pairs[@]}"; do
  set -- $pair; echo "cpu per admission: $1 $(echo "scale=1; $2 * 1000000 / $admitted" | bc) us"
done
join -a 2 -e 0 -o 0,1.2,1.3,1.4,2.2,2.3,2.4 "$DIR/threads.before" "$DIR/threads.after" | awk -v n="$admitted" \
  '$5 + $6 > $2 + $3 {printf "  serve thread %s: %.1f us (user %.1f, kernel %.1f), %.2f context switches\n", $1, ($5 + $6 - $2 - $3) * 10000 / n, ($5 - $2) * 10000 / n, ($6 - $3) * 10000 / n, ($7 - $4) / n}'
if [ -n "${SYSCALLS:-}" ]; then
  kill -INT "$STATJOB"; wait "$STATJOB" || true
  # "name-tid,count,,syscalls:sys_enter_kind,...", summed over the threads of a name, per admission.
  # A thread started during the run (sqlx's readers) is counted under the thread that started it.
  awk -F, -v n="$admitted" '$4 ~ /sys_enter_/ && $2 ~ /^[0-9]+$/ {t = $1; sub(/-[0-9]+$/, "", t); k = $4; sub(/.*sys_enter_/, "", k); c[t, k] += $2; names[t]; kinds[k]}
    END {for (t in names) {line = ""; for (k in kinds) if (c[t, k] > 0) line = line sprintf(" %s %.2f", k, c[t, k] / n); if (line != "") print "  serve thread " t " system calls per admission:" line}}' "$DIR/syscalls.csv" | sort
fi
if [ -n "${PERF:-}" ]; then
  wait "$PERFJOB" || true
  perf report -i "$OUT/serve.perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -40 > "$OUT/serve.perf.top.txt" || true
  echo "profile of serve: $OUT/serve.perf.data (top symbols in $OUT/serve.perf.top.txt)"
fi
echo "serve after the load: $(grep -E 'VmRSS' /proc/$SERVE/status), peak $(grep VmHWM /proc/$SERVE/status)"
