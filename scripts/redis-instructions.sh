#!/usr/bin/env bash
# The Redis primary's instructions per admission for an admit.lua, counted by callgrind: CPU
# seconds on a shared VM move by 25 % from one minute to the next, instruction counts do not.
# A private redis-server (no replica) under `valgrind --tool=callgrind`, a free-seat pool, then N
# admissions of fresh codes in rounds of BATCH attempts, each round followed by `WAIT 0 0` as a
# committer round is, all sent by `redis-cli --pipe`.
# Usage: scripts/redis-instructions.sh ADMIT_LUA BATCH [N]   (BATCH may be a fraction: 3.7 mixes
#   rounds of 3 and 4 to that average, as a committer's rounds under load come)
#   FORM=many (default): BATCH attempts in one call (groups of five arguments, admit.lua since
#   issue 10's sixth pass); FORM=one: BATCH calls of one attempt each (four arguments, the
#   admit.lua before it: `git show 7180ad0:lua/admit.lua`).
#   LEVELS (default 1): levels the attempts ask for in turn (3: A1, B1, C1, the bench's event).
#   MARKS (default 0): after every MARKS admissions, one ZREM marking them, as the
#   database writer's batch does (0: no marks, the bare script).
#   REPLICA (default 0): 1 attaches a replica (a plain redis-server, not counted) before the
#   calls, so the primary feeds it every script's writes as a sale's primary does.
set -euo pipefail
LUA=$(realpath "$1"); BATCH=$2; N=${3:-20000}; FORM=${FORM:-many}
DIR=$(mktemp -d /tmp/seatrush-redis-cg-XXXX)
VP=; RP=
cleanup() { [ -n "$RP" ] && kill "$RP" 2>/dev/null; [ -n "$VP" ] && kill "$VP" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$DIR/cg.out" redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no > "$DIR/valgrind.log" 2>&1 & VP=$!
for _ in $(seq 200); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
if [ "${REPLICA:-0}" = 1 ]; then
  RPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" --replicaof 127.0.0.1 "$PORT" > "$DIR/replica.log" 2>&1 & RP=$!
  for _ in $(seq 300); do
    redis-cli -p "$RPORT" info replication 2>/dev/null | grep -q "master_link_status:up" && break; sleep 0.2
  done
  redis-cli -p "$RPORT" info replication | grep -q "master_link_status:up" || { echo "the replica never synced"; exit 1; }
fi
SHA=$(redis-cli -p "$PORT" script load "$(cat "$LUA")")
python3 "$(dirname "$0")/admit_calls.py" "$DIR" "$N" "$BATCH" "$SHA" --form "$FORM" --levels "${LEVELS:-1}" \
  --marks "${MARKS:-0}" --wait
redis-cli -p "$PORT" --pipe < "$DIR/setup.resp" >/dev/null
callgrind_control -z "$VP" >/dev/null 2>&1
redis-cli -p "$PORT" --pipe < "$DIR/calls.resp" > "$DIR/pipe.log"
grep -q "errors: 0" "$DIR/pipe.log" || { echo "errors in the run: $(tail -1 "$DIR/pipe.log")"; exit 1; }
admitted=$(redis-cli -p "$PORT" hlen '{ev:b}:adm')
callgrind_control -d "$VP" >/dev/null 2>&1
total=$(callgrind_annotate "$DIR/cg.out.1" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | grep -oE "^[0-9,]+" | tr -d ,)
echo "$(basename "$LUA") FORM=$FORM BATCH=$BATCH LEVELS=${LEVELS:-1} MARKS=${MARKS:-0} REPLICA=${REPLICA:-0}: $admitted admitted; $((total / admitted)) instructions per admission"
