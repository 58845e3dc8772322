#!/usr/bin/env bash
# The API document against a fuzzer: starts `seatrush demo` (its own Redis pair, SQLite, the open
# event `demo` with codes DEMO-0001…) on a free port and runs Schemathesis with every check
# against the served /api/openapi.json. Any finding fails the script. Bounded: at most
# SCHEMATHESIS_MAX_EXAMPLES cases per operation (default 100; under a minute on two cores), an
# outer time limit, and a bounded wait for the server.
#
#   .ci/schemathesis.sh [path/to/seatrush]     (default: target/debug/seatrush, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
venv="${SCHEMATHESIS_VENV:-$HOME/.cache/seatrush/schemathesis-$SCHEMATHESIS_VERSION}"
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

binary="${1:-target/debug/seatrush}"
[ -x "$binary" ] || cargo build -q
token="schemathesis-$(python3 -c "import secrets; print(secrets.token_hex(16))")"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
SEATRUSH_OPERATOR_TOKEN="$token" SEATRUSH_LOG=warn "$binary" demo --listen "127.0.0.1:$port" >"$log" 2>&1 &
demo=$!
trap 'kill "$demo" 2>/dev/null; wait "$demo" 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 1 150); do
  url=$(sed -n 's|^seatrush demo is running at \(http://[^/]*\)/$|\1|p' "$log")
  [ -n "$url" ] && curl -fs "$url/healthz" >/dev/null && break
  kill -0 "$demo" 2>/dev/null || { cat "$log"; echo "seatrush demo exited before serving"; exit 1; }
  sleep 0.2
done
[ -n "$url" ] || { cat "$log"; echo "seatrush demo did not start within 30 s"; exit 1; }

# The document's example code, booked, so payment and cancel reach a real booking, not only 404s.
curl -fs -XPOST "$url/api/events/demo/bookings" -H 'content-type: application/json' \
  -d '{"code":"DEMO-0001","level":"B1","nonce":"schemathesis-0001","website":""}' >/dev/null

timeout "${SCHEMATHESIS_TIMEOUT_SECONDS:-300}" "$venv/bin/schemathesis" --config-file .ci/schemathesis.toml run "$url/api/openapi.json" \
  --checks all \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-100}" \
  --header "Authorization: Bearer $token" \
  --seed "${SCHEMATHESIS_SEED:-20261130}" \
  --no-color
