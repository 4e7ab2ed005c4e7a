#!/usr/bin/env bash
# Set everything up and run the main job on the embedded default (SQLite): start a registry,
# import the batching article's M4 Pro table as node m4pro, and ask the placement question.
#   scripts/demo.sh            run, print the answer, stop the registry
#   scripts/demo.sh --serve    keep the registry running afterwards (Ctrl-C stops it)
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"

# The embedded default: a SQLite file, here in .fleetbench/ so the demo leaves any registry
# of yours alone. A database URL in the environment would point elsewhere: drop it.
unset FLEETBENCH_DATABASE_URL
export FLEETBENCH_DATA_DIR="$ROOT/.fleetbench"
PORT="${FLEETBENCH_DEMO_PORT:-8787}"
URL="http://127.0.0.1:$PORT"
MODEL="Mistral-Nemo-Instruct-2407-Q4_K_M"

if python -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)) != 0)"; then
    echo "port $PORT is in use; set FLEETBENCH_DEMO_PORT to another port" >&2
    exit 1
fi

TOKEN="$(fleetbench-registry token create --node m4pro --label chip=M4-Pro)"
LOG="$(mktemp -t fleetbench-registry.XXXXXX.log)"
fleetbench-registry serve --port "$PORT" > "$LOG" 2>&1 &
REGISTRY_PID=$!
trap 'kill $REGISTRY_PID 2>/dev/null; wait $REGISTRY_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    python -c "import httpx; httpx.get('$URL/healthz').raise_for_status()" 2>/dev/null && break
    kill -0 $REGISTRY_PID 2>/dev/null || { cat "$LOG" >&2; echo "the registry did not start" >&2; exit 1; }
    sleep 0.2
done
head -n 1 "$LOG"
echo "registry serving at $URL (log: $LOG)"

echo
echo "== import the article's table (Apple M4 Pro, $MODEL, llama.cpp build 11429)"
fleetbench-agent import examples/m4pro-mistral-nemo-q4km.md --node m4pro --model "$MODEL" \
    --registry "$URL" --token "$TOKEN" --measured-at 2026-10-16T12:00:00Z

echo
echo "== which node and concurrency gives at least 15 tokens/s per user?"
echo "GET $URL/v1/placement?model=$MODEL&min_tps_per_user=15"
fleetbench-agent placement --model "$MODEL" --min-tps-per-user 15 --registry "$URL" --json
fleetbench-agent placement --model "$MODEL" --min-tps-per-user 15 --registry "$URL"

if [ "${1:-}" = "--serve" ]; then
    echo "registry serving at $URL (API docs: $URL/docs); Ctrl-C stops it"
    wait $REGISTRY_PID || true
else
    echo "done; to keep a registry running: fleetbench-registry serve (docs at $URL/docs)"
fi
