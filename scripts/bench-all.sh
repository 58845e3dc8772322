#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md, in order, with the machine's state before each. Figures go to
# bench-out/<name>/ (report.json, report.svg, or strategies.json) and to stdout. Traffic stays on
# 127.0.0.1; every Redis and database it uses is private and removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q --workspace
S=target/release/seatrush
L=target/release/seatrush-lab # bench (issue 27: the lab's binary)
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
SECONDS_PER_RUN=${SECONDS_PER_RUN:-10}

echo "## machine"; nproc; free -h | head -2; redis-server --version; uptime

run() { # name, args...
  local name=$1; shift
  echo; echo "## $name: seatrush-lab bench $* (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
  /usr/bin/time -f "cpu of the whole run (client, server, redis, replica): %U s user + %S s sys, %e s wall" \
    "$L" bench --out-dir "$OUT/$name" "$@" 2>&1 | grep -a -v -E '^\S*\[2m|INFO' || echo "## $name FAILED (see above)"
}

run closed-default --duration-s "$SECONDS_PER_RUN"
run closed-no-ceiling --duration-s "$SECONDS_PER_RUN" --no-ceiling
run lever-wait-per-admit --duration-s "$SECONDS_PER_RUN" --no-ceiling --commit-batch-max 1
run lever-commit-connections-1 --duration-s "$SECONDS_PER_RUN" --no-ceiling --commit-connections 1
run no-replica --duration-s "$SECONDS_PER_RUN" --no-ceiling --no-replica
run postgres --duration-s "$SECONDS_PER_RUN" --no-ceiling --backend postgres
run open-833 --rate 833 --connections 32 --duration-s 20 --no-ceiling
run open-8330 --rate 8330 --connections 256 --duration-s 20 --no-ceiling
# Availability under a crowd: 833 bookings/s alone, then with 20,000 availability polls/s beside
# them (the default mix's proportions scaled to 833/s); compare booking p99 and Redis commands/s.
run poll-baseline --rate 833 --connections 64 --duration-s 20 --no-ceiling
run poll-20000 --rate 20833 --connections 256 --duration-s 20 --no-ceiling \
  --mix poll=20000,fresh=716,retry=33,duplicate=33,unregistered=25,bot=25

# SQLite and PostgreSQL back to back in one command, so the machine's load hits both alike
# (issue 10); each prints both sides and the ratio of admitted/s.
compare() { # name, args...
  local name=$1; shift
  echo; echo "## $name: seatrush-lab bench compare-backends $* (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$L" bench compare-backends --out-dir "$OUT/$name" "$@" 2>&1 | grep -a -v -E '^\S*\[2m|INFO' || echo "## $name FAILED (see above)"
}
compare compare-closed --rounds 3 --duration-s "$SECONDS_PER_RUN" --no-ceiling
compare compare-open-833 --rate 833 --connections 32 --duration-s 20 --no-ceiling
compare compare-open-8330 --rate 8330 --connections 256 --duration-s 20 --no-ceiling

echo; echo "## strategies (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
"$L" bench strategies --out-dir "$OUT/strategies"

echo; echo "## one million codes: import, open, serve RSS, CPU per admission per process, profile of serve"
PERF=${PERF-1} scripts/million.sh "$S" "$OUT/million"
echo; echo "## the same on PostgreSQL: serve without the database engine in it, and the server's CPU"
DB=postgres CODES=300000 scripts/million.sh "$S" "$OUT/million-postgres"

echo; echo "## 20,000 availability polls a second beside 833 bookings: each process's CPU (issue 10, target 4)"
CODES=300000 BENCH_ARGS="--rate 20833 --connections 256 --mix poll=20000,fresh=716,retry=33,duplicate=33,unregistered=25,bot=25" \
  scripts/million.sh "$S" "$OUT/million-polls"

echo; echo "## serve's user-space instructions per admission (callgrind; repeatable where CPU seconds are not)"
scripts/serve-instructions.sh "$S" "$OUT/serve.callgrind"

echo; echo "## the Redis primary's instructions per admission by round size (callgrind): admit.lua now, and before issue 10's sixth pass"
git show 7180ad0:lua/admit.lua > "$OUT/admit-7180ad0.lua"
for batch in 1 4 16 64; do
  FORM=one scripts/redis-instructions.sh "$OUT/admit-7180ad0.lua" "$batch"
  scripts/redis-instructions.sh lua/admit.lua "$batch"
done

echo; echo "## Redis ceilings of admit.lua before the sixth pass and now, alternating (target 3b's yardstick)"
scripts/admit-ceilings.sh "$OUT/admit-7180ad0.lua"

echo; echo "## the embedded SQLite writer alone, by batch size: the database's share of serve's CPU (issue 10, target 3a)"
"$L" bench sqlite-floor --batches 1,9,13,32,128 --out-dir "$OUT/sqlite-floor" 2>&1 | grep -a -v -E '^\S*\[2m|INFO|WARN'

# The draw at the opening against first come, the same crowd (issue 31): seats won per tenth of
# the window, and the window's cost.
for backend in sqlite postgres; do
  echo; echo "## fair-start on $backend (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
  "$L" bench fair-start --backend "$backend" --out-dir "$OUT/fair-start-$backend" 2>&1 | grep -a -v -E '^\S*\[2m|INFO|WARN' \
    || echo "## fair-start on $backend FAILED (see above)"
done

# What the waiting list adds to a release (issue 30): release.lua where nobody waits, then where
# every release hands its seat to a waiter; and one waiter's memory.
echo; echo "## release-offer (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
"$L" bench release-offer --out-dir "$OUT/release-offer" 2>&1 | grep -a -v -E '^\S*\[2m|INFO|WARN' \
  || echo "## release-offer FAILED (see above)"
