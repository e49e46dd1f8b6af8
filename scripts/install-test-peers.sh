#!/usr/bin/env bash
# Installs the real MCP servers the integration tests talk to, from the package registries:
# mcp-server-time (PyPI) and @modelcontextprotocol/server-everything (npm), into DEST.
# Idempotent: an existing install is kept. Used by tests/it/mcp.rs.
set -euo pipefail
dest="${1:?usage: install-test-peers.sh DEST}"
mkdir -p "$dest"
if [ ! -f "$dest/py/.done" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$dest/py" mcp-server-time
  touch "$dest/py/.done"
fi
if [ ! -f "$dest/npm/.done" ]; then
  mkdir -p "$dest/npm"
  npm install --silent --no-audit --no-fund --prefix "$dest/npm" @modelcontextprotocol/server-everything
  touch "$dest/npm/.done"
fi
