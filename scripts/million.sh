#!/usr/bin/env bash
# One million codes: `allowlist import` + `open` wall time, then `serve`'s RSS once it has copied
# the allowlist into memory and again after a load run. Private Redis primary+replica on free
# ports and an SQLite file, all under a temp dir removed at the end.
set -euo pipefail
S=$(realpath "$1"); OUT=$2
mkdir -p "$OUT"; OUT=$(realpath "$OUT")
DIR=$(mktemp -d /tmp/seatrush-million-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P1=$(port); P2=$(port); HTTP=$(port)
redis-server --port "$P1" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" --maxmemory-policy noeviction --logfile "$DIR/p.log" & PIDS+=($!)
redis-server --port "$P2" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" --dbfilename r.rdb --replicaof "127.0.0.1 $P1" --logfile "$DIR/r.log" & PIDS+=($!)
for _ in $(seq 50); do redis-cli -p "$P2" info replication 2>/dev/null | grep -q master_link_status:up && break; sleep 0.1; done
redis-cli -p "$P1" config set min-replicas-to-write 1 >/dev/null
export SEATRUSH_DATABASE_URL="sqlite://$DIR/db.sqlite" SEATRUSH_REDIS_URL="redis://127.0.0.1:$P1"
python3 -c "
with open('$DIR/codes.txt','w') as f:
    f.writelines('BENCH-%07d\n' % i for i in range(1000000))"
printf 'id = "bench"\ntotal_seats = 1000000\nhold_seconds = 3600\n[levels]\nA1 = 1000000\nB1 = 1000000\nC1 = 1000000\n' > "$DIR/event.toml"
"$S" event apply "$DIR/event.toml"
start=$(date +%s.%N)
/usr/bin/time -f "import: %e s" "$S" allowlist import --event bench "$DIR/codes.txt"
/usr/bin/time -f "open: %e s" "$S" open --event bench
echo "import + open: $(echo "$(date +%s.%N) - $start" | bc) s"
"$S" serve --listen "127.0.0.1:$HTTP" > "$DIR/serve.log" 2>&1 & SERVE=$!; PIDS+=($SERVE)
for _ in $(seq 100); do curl -s "http://127.0.0.1:$HTTP/healthz" >/dev/null && break; sleep 0.1; done
echo "serve RSS with 1,000,000 codes in memory: $(grep VmRSS /proc/$SERVE/status)"
cpu() { awk '{printf "%.2f", ($14+$15)/100}' "/proc/$1/stat"; }
before=("$(cpu $SERVE)" "$(cpu "${PIDS[0]}")" "$(cpu "${PIDS[1]}")")
/usr/bin/time -f "load generator cpu: %U s user + %S s sys" "$S" bench --url "http://127.0.0.1:$HTTP" --codes 1000000 --duration-s 10 --out-dir "$OUT" 2>&1 | grep -a -E 'loop|latency|checks|cpu'
echo "cpu during the run: serve $(echo "$(cpu $SERVE) - ${before[0]}" | bc) s, redis primary $(echo "$(cpu "${PIDS[0]}") - ${before[1]}" | bc) s, replica $(echo "$(cpu "${PIDS[1]}") - ${before[2]}" | bc) s"
echo "serve after the load: $(grep -E 'VmRSS' /proc/$SERVE/status), peak $(grep VmHWM /proc/$SERVE/status)"
