#!/usr/bin/env bash
# The Redis primary's instructions per admission for an admit.lua, counted by callgrind: CPU
# seconds on a shared VM move by 25 % from one minute to the next, instruction counts do not.
# A private redis-server (no replica) under `valgrind --tool=callgrind`, a free-seat pool, then N
# admissions of fresh codes in rounds of BATCH attempts, each round followed by `WAIT 0 0` as a
# committer round is, all sent by `redis-cli --pipe`.
# Usage: scripts/redis-instructions.sh ADMIT_LUA BATCH [N]
#   FORM=many (default): BATCH attempts in one call (groups of five arguments, admit.lua since
#   issue 10's sixth pass); FORM=one: BATCH calls of one attempt each (four arguments, the
#   admit.lua before it: `git show 7180ad0:lua/admit.lua`).
#   LEVELS (default 1): levels the attempts ask for in turn (3: A1, B1, C1, the bench's event).
#   MARKS (default 0): after every MARKS admissions, one persisted.lua call marking them, as the
#   database writer's batch does (0: no marks, the bare script).
set -euo pipefail
LUA=$(realpath "$1"); BATCH=$2; N=${3:-20000}; FORM=${FORM:-many}
DIR=$(mktemp -d /tmp/seatrush-redis-cg-XXXX)
VP=
cleanup() { [ -n "$VP" ] && kill "$VP" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$DIR/cg.out" redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no > "$DIR/valgrind.log" 2>&1 & VP=$!
for _ in $(seq 200); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
SHA=$(redis-cli -p "$PORT" script load "$(cat "$LUA")")
PSHA=$(redis-cli -p "$PORT" script load "$(cat "$(dirname "$LUA")/persisted.lua")")
python3 - "$DIR" "$N" "$BATCH" "$FORM" "$SHA" "${LEVELS:-1}" "${MARKS:-0}" "$PSHA" <<'PY'
import sys, hashlib
d, n, batch, form, sha = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
levels = ['A1', 'B1', 'C1'][:int(sys.argv[6])]
marks, psha = int(sys.argv[7]), sys.argv[8]
def resp(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)
keys = ['{ev:b}:adm', '{ev:b}:taken', '{ev:b}:cap', '{ev:b}:free', '{ev:b}:pending', '{ev:b}:meta']
with open(d + '/setup.resp', 'wb') as f:
    for level in levels:
        f.write(resp('HSET', keys[2], level, 10 ** 9))
    f.write(resp('HSET', keys[5], 'state', 'open'))  # admit.lua admits only while open (older ones ignore KEYS[6])
    for s in range(1, n + 1, 1000):
        args = []
        for seat in range(s, min(n, s + 999) + 1):
            args += [seat, seat]
        f.write(resp('ZADD', keys[3], *args))
with open(d + '/calls.resp', 'wb') as f:
    codes = [hashlib.sha256(b'%d' % i).hexdigest() for i in range(n)]
    unmarked = []
    for r in range(0, n, batch):
        attempts = [(c, 'nonce-' + c[:16], levels[(r + j) % len(levels)], 'adm-' + c[:24])
                    for j, c in enumerate(codes[r:r + batch])]
        if form == 'one':
            for a in attempts:
                f.write(resp('EVALSHA', sha, len(keys), *keys, *a))
        else:
            f.write(resp('EVALSHA', sha, len(keys), *keys, *[x for a in attempts for x in (*a, 'admit')]))
        f.write(resp('WAIT', 0, 0))
        unmarked += attempts
        while marks and len(unmarked) >= marks:
            batch_marks, unmarked = unmarked[:marks], unmarked[marks:]
            f.write(resp('EVALSHA', psha, 2, keys[0], keys[4], *[x for a in batch_marks for x in (a[0], a[1], a[3])]))
PY
redis-cli -p "$PORT" --pipe < "$DIR/setup.resp" >/dev/null
callgrind_control -z "$VP" >/dev/null 2>&1
redis-cli -p "$PORT" --pipe < "$DIR/calls.resp" > "$DIR/pipe.log"
grep -q "errors: 0" "$DIR/pipe.log" || { echo "errors in the run: $(tail -1 "$DIR/pipe.log")"; exit 1; }
admitted=$(redis-cli -p "$PORT" hlen '{ev:b}:adm')
callgrind_control -d "$VP" >/dev/null 2>&1
total=$(callgrind_annotate "$DIR/cg.out.1" 2>/dev/null | grep -m1 "PROGRAM TOTALS" | grep -oE "^[0-9,]+" | tr -d ,)
echo "$(basename "$LUA") FORM=$FORM BATCH=$BATCH LEVELS=${LEVELS:-1} MARKS=${MARKS:-0}: $admitted admitted; $((total / admitted)) instructions per admission"
