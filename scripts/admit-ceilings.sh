#!/usr/bin/env bash
# Redis ceilings of two admit scripts on one private primary + replica (min-replicas-to-write 1,
# as a sale runs), alternating, ROUNDS times: what redis-benchmark gets from each with 50 clients.
# Issue 10 defined its yardstick (target 3b) as the admit script pipelined x16, one attempt a call.
# Since the sixth pass a call of one attempt costs Redis more, so that ceiling fell while Redis can
# do more: this prints the old script's pipelined ceiling (the yardstick as the issue measured it)
# beside the current script's pipelined and batched ones, in the same minutes.
# Usage: scripts/admit-ceilings.sh OLD_LUA   (e.g. git show 7180ad0:lua/admit.lua > /tmp/old.lua)
#   N=300000 calls a run (as `bench`), ROUNDS=3.
set -euo pipefail
OLD=$(realpath "$1"); NEW=$(realpath "$(dirname "$0")/../lua/admit.lua")
N=${N:-300000}; ROUNDS=${ROUNDS:-3}
DIR=$(mktemp -d /tmp/seatrush-ceilings-XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
. "$(dirname "$0")/private-sale.sh"
private_sale "$DIR" 1
cli() { redis-cli -p "$P1" "$@"; }
KEYS=("{ev:c}:adm" "{ev:c}:taken" "{ev:c}:cap" "{ev:c}:free" "{ev:c}:pending")
# A fresh pool with a seat for every attempt, so each one is a real admission.
fill() {
  cli del "${KEYS[@]}" >/dev/null
  cli hset "{ev:c}:cap" A1 1000000000000 >/dev/null
  for from in $(seq 1 50000 $((3 * N))); do
    cli eval "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do redis.call('ZADD', KEYS[1], i, i) end" 1 "{ev:c}:free" "$from" $((from + 49999)) >/dev/null
  done
}
OLD_SHA=$(cli script load "$(cat "$OLD")"); NEW_SHA=$(cli script load "$(cat "$NEW")")
ATTEMPT=(code-__rand_int__ nonce-ceiling-0001 A1 adm-__rand_int__)
rps() { redis-benchmark -h 127.0.0.1 -p "$P1" -c 50 -r 1000000000 --csv "$@" | sed -n 2p | cut -d'"' -f4; }
BATCH=()
for _ in $(seq 16); do BATCH+=("${ATTEMPT[@]}" admit); done
for round in $(seq "$ROUNDS"); do
  fill; old=$(rps -n "$N" -P 16 EVALSHA "$OLD_SHA" 5 "${KEYS[@]}" "${ATTEMPT[@]}")
  fill; new=$(rps -n "$N" -P 16 EVALSHA "$NEW_SHA" 5 "${KEYS[@]}" "${ATTEMPT[@]}" admit)
  fill; calls=$(rps -n $((N / 16)) -P 1 EVALSHA "$NEW_SHA" 5 "${KEYS[@]}" "${BATCH[@]}")
  printf 'round %s: old script pipelined x16 %.0f/s; current script pipelined x16 %.0f/s, 16 attempts a call %.0f attempts/s\n' \
    "$round" "$old" "$new" "$(echo "$calls * 16" | bc)"
done
