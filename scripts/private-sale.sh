# Sourced by million.sh and serve-instructions.sh: a private Redis primary + replica on free ports
# (noeviction, min-replicas-to-write 1, as a sale runs), an SQLite file, CODES codes written to
# $DIR/codes.txt and an event `bench` with a seat per code in $DIR/event.toml, all under DIR.
# DB=postgres: a fresh database on the local PostgreSQL (127.0.0.1:5432, user postgres) instead of
# the SQLite file, dropped by private_db_drop (call it from the caller's cleanup).
# PRIMARY_WRAP: a command the primary runs under (path-instructions.sh: valgrind --tool=callgrind).
# private_open SEATRUSH_BIN then applies the event, imports its codes and opens it; wait_healthy
# SECONDS waits for serve's /healthz.
# Sets P1 (primary port), HTTP (a free port for serve), PIDS (stopped by the caller's cleanup),
# and exports SEATRUSH_DATABASE_URL and SEATRUSH_REDIS_URL.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

private_sale() { # DIR CODES
  local dir=$1 codes=$2 p2
  P1=$(port); p2=$(port); HTTP=$(port)
  ${PRIMARY_WRAP:-} redis-server --port "$P1" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --maxmemory-policy noeviction --logfile "$dir/p.log" & PIDS+=($!)
  redis-server --port "$p2" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --dbfilename r.rdb --replicaof "127.0.0.1 $P1" --logfile "$dir/r.log" & PIDS+=($!)
  for _ in $(seq 300); do redis-cli -p "$p2" info replication 2>/dev/null | grep -q master_link_status:up && break; sleep 0.1; done
  # The primary counts a replica as good only once it has acknowledged (REPLCONF ACK, once a second).
  for _ in $(seq 30); do redis-cli -p "$P1" info replication 2>/dev/null | grep -q 'slave0:.*state=online' && break; sleep 0.1; done
  redis-cli -p "$P1" config set min-replicas-to-write 1 >/dev/null
  export SEATRUSH_DATABASE_URL="sqlite://$dir/db.sqlite" SEATRUSH_REDIS_URL="redis://127.0.0.1:$P1"
  if [ "${DB:-sqlite}" = postgres ]; then
    PRIVATE_DB="seatrush_private_$$"
    psql -q -h 127.0.0.1 -U postgres -d postgres -c "CREATE DATABASE $PRIVATE_DB" >/dev/null
    export SEATRUSH_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$PRIVATE_DB"
  fi
  python3 -c "
with open('$dir/codes.txt','w') as f:
    f.writelines('BENCH-%07d\n' % i for i in range($codes))"
  printf 'id = "bench"\ntotal_seats = %s\nhold_seconds = 3600\n[levels]\nA1 = %s\nB1 = %s\nC1 = %s\n' "$codes" "$codes" "$codes" "$codes" > "$dir/event.toml"
}

private_db_drop() {
  [ -n "${PRIVATE_DB:-}" ] && psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $PRIVATE_DB WITH (FORCE)" >/dev/null 2>&1 || true
}

private_open() { # SEATRUSH_BIN: the event applied, its codes imported, the event opened
  # On a loaded machine a staging command can pass the Redis response timeout; open is safe to
  # run again (staged keys, then an atomic switch).
  local s=$1 attempt
  "$s" event apply "$DIR/event.toml" >/dev/null
  "$s" allowlist import --event bench "$DIR/codes.txt" >/dev/null
  for attempt in 1 2 3; do "$s" open --event bench >/dev/null 2>&1 && return 0; done
  echo "open failed three times"; return 1
}

wait_healthy() { # SECONDS: until serve on $HTTP answers /healthz
  local _
  for _ in $(seq $(( $1 * 10 ))); do curl -s "http://127.0.0.1:$HTTP/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "serve did not answer /healthz in $1 s"; return 1
}
