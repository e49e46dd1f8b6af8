#!/usr/bin/env bash
# Installs the real peers the integration tests talk to, from the package registries, into
# DEST: the MCP servers mcp-server-time (PyPI) and @modelcontextprotocol/server-everything
# (npm), used by tests/it/mcp.rs, and the official `openai` and `anthropic` Python SDKs
# (PyPI, into DEST/sdk), used by tests/it/compat.rs, and the Prometheus project's
# `prometheus_client` Python package (PyPI, into DEST/prom), whose OpenMetrics parser reads the
# daemon's /metrics in tests/it/metrics.rs. Idempotent: an existing install is kept, so once
# installed the tests run offline.
set -euo pipefail
dest="${1:?usage: install-test-peers.sh DEST [mcp|sdk|metrics]...}"
shift || true
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(mcp sdk metrics)
mkdir -p "$dest"
# Tests run in parallel: one install at a time into DEST.
exec 9>"$dest/.lock"
flock 9
for part in "${parts[@]}"; do
  case "$part" in
    mcp)
      if [ ! -f "$dest/py/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/py" mcp-server-time
        touch "$dest/py/.done"
      fi
      if [ ! -f "$dest/npm/.done" ]; then
        mkdir -p "$dest/npm"
        npm install --silent --no-audit --no-fund --prefix "$dest/npm" @modelcontextprotocol/server-everything
        touch "$dest/npm/.done"
      fi
      ;;
    sdk)
      if [ ! -f "$dest/sdk/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/sdk" openai anthropic
        touch "$dest/sdk/.done"
      fi
      ;;
    metrics)
      if [ ! -f "$dest/prom/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/prom" prometheus_client
        touch "$dest/prom/.done"
      fi
      ;;
    *)
      echo "install-test-peers.sh: unknown part $part (mcp, sdk or metrics)" >&2
      exit 2
      ;;
  esac
done
