#!/usr/bin/env bash
# Runs agentd against a real local model, the way a user would: Qwen2.5-Coder-1.5B-Instruct
# (Q4_K_M) served by llama.cpp's llama-server, agentd with the shipped providers.d/llamacpp.toml
# pointed at it, and a dozen things a user does (a question, a second turn, files, the
# workspace, memory, a command, the silence convention, streaming, --history). Nothing sits
# between agentd and the server. Prints PASS/FAIL per flow with its latency.
#
# Each check looks at what a user would: the file on disk, the fact in the reply. A failure is
# put down to the model (a wrong or missing answer, no tool called) or to agentd (the server
# refused agentd's request, a tool call or a silence marker reached the user as text, an empty
# reply counted as an answer, a file landed at workspace/workspace/..., --history opens on the
# context block, the streamed answer is malformed). Exit status 1 when any flow failed for
# agentd's fault, 0 otherwise (the model's failures are printed, not counted).
#
# Not in CI: the model is 1.1 GB and a run takes 10-20 minutes on two cores. Usage:
#   scripts/real-model-check.sh [--keep]      # --keep leaves the run directory and its logs
# Env: LLAMA_THREADS (default 1; more threads on a busy CPU make generation far slower),
#      LLAMA_THREADS_BATCH (default 2: prompt processing), FLOW_TIMEOUT (seconds, default 900).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
keep=0
[ "${1:-}" = "--keep" ] && keep=1

peers="$root/target/tmp/test-peers"
echo "real-model-check: installing llama-server and the model into $peers (once)"
bash scripts/install-test-peers.sh "$peers" llama llama-real
echo "real-model-check: building agentd"
cargo build --locked --quiet --bin agentd --bin agent-send
bin="$root/target/debug"
model="$peers/llama-real/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"

run="$root/target/real-model-check/run-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run/config" "$run/providers.d"
cp -r "$root/workspace" "$run/workspace"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
llama_port="$(free_port)"
http_port="$(free_port)"
token="real-model-check-$RANDOM$RANDOM"

sed "s#^base_url = .*#base_url = \"http://127.0.0.1:$llama_port/v1\"#" \
  providers.d/llamacpp.toml >"$run/providers.d/llamacpp.toml"
cat >"$run/config/agentd.toml" <<EOF
[agent]
name = "agentd"
workspace = "../workspace"
timezone = "UTC"

[providers]
dir = "../providers.d"
load = ["llamacpp"]

[http]
enabled = true
host = "127.0.0.1"
port = $http_port

[logging]
file = false
EOF

pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$keep" = 1 ]; then
    echo "real-model-check: run directory kept: $run"
  else
    rm -rf "$run"
  fi
}
trap cleanup EXIT

echo "real-model-check: starting llama-server on 127.0.0.1:$llama_port"
LD_LIBRARY_PATH="$peers/llama/bin" "$peers/llama/bin/llama-server" -m "$model" --jinja \
  --host 127.0.0.1 --port "$llama_port" -c 16384 --no-webui \
  --threads "${LLAMA_THREADS:-1}" --threads-batch "${LLAMA_THREADS_BATCH:-2}" \
  >"$run/llama-server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$llama_port/health" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -20 "$run/llama-server.log"; exit 2; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$llama_port/health" >/dev/null || { echo "llama-server not healthy" >&2; exit 2; }

echo "real-model-check: starting agentd (HTTP API on 127.0.0.1:$http_port)"
(cd "$run" && AGENTD_STATE_DIR="$run/state" AGENTD_HTTP_TOKEN="$token" \
  exec "$bin/agentd" run -c "$run/config/agentd.toml" >"$run/agentd.log" 2>&1) &
pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$http_port/api/v1/status" >/dev/null 2>&1 && break
  sleep 0.2
done

RUN="$run" HTTP_PORT="$http_port" TOKEN="$token" BIN="$bin" python3 - <<'PY'
import hashlib, json, os, re, secrets, sqlite3, subprocess, sys, time, urllib.error, urllib.request

RUN, PORT, TOKEN, BIN = os.environ["RUN"], os.environ["HTTP_PORT"], os.environ["TOKEN"], os.environ["BIN"]
WS = os.path.join(RUN, "workspace")
TIMEOUT = float(os.environ.get("FLOW_TIMEOUT", "900"))
# What a user must never see: a tool call or a silence marker written as text.
TOOL_TEXT = re.compile(r'<tool_call>|</tool_call>|"arguments"\s*:|"name"\s*:\s*"[a-z_]+"')
SILENT = re.compile(r"NO_REPLY|HEARTBEAT_OK")


class Fail(Exception):
    def __init__(self, who, why):
        super().__init__(why)
        self.who, self.why = who, why


def post(path, body, timeout=TIMEOUT):
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def chat(sender, message):
    """One message through POST /api/v1/chat; the reply text ("" when silent)."""
    status, raw = post("/api/v1/chat", {"message": message, "sender": sender})
    body = json.loads(raw or b"{}")
    if status != 200:
        err = body.get("error", raw.decode(errors="replace"))
        # The server refusing agentd's request is agentd's doing; other failures (an empty or
        # malformed answer, too many tool calls) are the model's.
        who = "agentd" if re.search(r"HTTP [45]\d\d|connect", err) else "model"
        raise Fail(who, f"HTTP {status}: {err[:300]}")
    reply = body.get("reply", "")
    if SILENT.search(reply):
        raise Fail("agentd", f"a silence marker reached the user: {reply[:300]!r}")
    if TOOL_TEXT.search(reply):
        raise Fail("agentd", f"a tool call reached the user as text: {reply[:300]!r}")
    if not reply.strip() and not body.get("silent"):
        raise Fail("agentd", "an empty reply was delivered as an answer")
    return reply


def expect(reply, *words):
    low = reply.lower()
    missing = [w for w in words if w.lower() not in low]
    if missing:
        raise Fail("model", f"reply lacks {missing}: {reply[:300]!r}")
    return reply


def ws(path):
    return os.path.join(WS, path)


def read(path):
    try:
        with open(ws(path), encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return None


def check_file(path, word):
    doubled = os.path.join("workspace", path)
    if read(doubled) is not None:
        raise Fail("agentd", f"the file landed at workspace/{doubled}")
    text = read(path)
    if text is None:
        raise Fail("model", f"{path} was not written")
    if word not in text:
        raise Fail("model", f"{path} lacks {word!r}: {text[:200]!r}")


secret_word = "quokka-" + secrets.token_hex(3)
with open(ws("secret-note.txt"), "w") as f:
    f.write(f"The password of the day is {secret_word}.\n")
data = secrets.token_hex(32) + "\n"
with open(ws("data.txt"), "w") as f:
    f.write(data)
data_hash = hashlib.sha256(data.encode()).hexdigest()


def flow_question():
    return expect(chat("q", "What is the capital of France? Answer in one word."), "paris")


def flow_second_turn():
    return expect(chat("q", "And the capital of Italy? One word."), "rome")


def flow_write():
    reply = chat("w", "Create the file notes.txt containing exactly this line: buy milk")
    check_file("notes.txt", "buy milk")
    return reply


def flow_read():
    return expect(chat("r", "Read the file secret-note.txt and tell me the password in it."),
                  secret_word)


def flow_write_then_read():
    reply = chat("wr", "Write the word pear into fruit.txt, then read fruit.txt back to me.")
    check_file("fruit.txt", "pear")
    return expect(reply, "pear")


def flow_list():
    reply = chat("l", "List the files in the workspace.")
    names = [n for n in ("secret-note.txt", "data.txt", "SOUL.md", "AGENTS.md") if n in reply]
    if len(names) < 2:
        raise Fail("model", f"reply names fewer than 2 workspace files: {reply[:300]!r}")
    return reply


def flow_remember():
    reply = chat("m", "Remember this fact for later: my sister's name is Anna.")
    db = sqlite3.connect(f"file:{RUN}/state/memory.db?mode=ro", uri=True)
    facts = db.execute("SELECT entity, attribute, value FROM facts WHERE invalidated_at IS NULL").fetchall()
    if not any("anna" in " ".join(map(str, f)).lower() for f in facts):
        raise Fail("model", f"no fact about Anna stored (facts: {facts[:5]}); reply {reply[:200]!r}")
    return reply


def flow_recall():
    status, raw = post("/api/v1/sessions/reset", {"target": "http-m"})
    if status != 200:
        raise Fail("agentd", f"reset: HTTP {status} {raw[:200]!r}")
    time.sleep(2)
    return expect(chat("m", "What is my sister's name?"), "anna")


def flow_exec():
    return expect(chat("x", "Run the shell command `sha256sum data.txt` and tell me the hash it prints."),
                  data_hash[:12])


def flow_workspace_prefix():
    reply = chat("p", "Write the word kiwi to workspace/todo.txt")
    check_file("todo.txt", "kiwi")
    return reply


def flow_silence():
    # Silent or a short answer are both fine; a marker or a tool call as text is not.
    return chat("s", "Thanks, that's all for now.") or "(silent)"


def flow_stream():
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}/v1/chat/completions", method="POST",
        data=json.dumps({"model": "agentd", "stream": True, "messages": [
            {"role": "user", "content": "Say hello to Maria in one short sentence."}]}).encode(),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    try:
        resp = urllib.request.urlopen(req, timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        raise Fail("agentd", f"HTTP {e.code}: {e.read()[:300]!r}")
    text, chunks, done = "", 0, False
    for line in resp:
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
        chunks += 1
    if not done:
        raise Fail("agentd", "the stream ended without [DONE]")
    if TOOL_TEXT.search(text) or SILENT.search(text):
        raise Fail("agentd", f"tool call or marker in the streamed text: {text[:300]!r}")
    if not text.strip():
        raise Fail("agentd", "the stream carried no text")
    return expect(text, "maria") + f"  [{chunks} chunks]"


def flow_history():
    out = subprocess.run([f"{BIN}/agent-send", "--state-dir", f"{RUN}/state", "-c",
                          f"{RUN}/config/agentd.toml", "--history", "http-q"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise Fail("agentd", f"--history exit {out.returncode}: {out.stderr[:300]}")
    text = out.stdout
    first_user = text.find("capital of France")
    context = text.find("agentd-context")
    if first_user < 0:
        raise Fail("agentd", f"--history lacks the first message: {text[:300]!r}")
    if 0 <= context < first_user:
        raise Fail("agentd", f"--history shows the context block first: {text[:300]!r}")
    return text.strip().splitlines()[0] if text.strip() else ""


FLOWS = [
    ("a question", flow_question),
    ("a second turn", flow_second_turn),
    ("write a file", flow_write),
    ("read a file", flow_read),
    ("write then read", flow_write_then_read),
    ("list the workspace", flow_list),
    ("remember a fact", flow_remember),
    ("recall it (new session)", flow_recall),
    ("run a command", flow_exec),
    ("workspace/ prefix", flow_workspace_prefix),
    ("stay silent", flow_silence),
    ("stream /v1/chat/completions", flow_stream),
    ("--history", flow_history),
]

results = []
for name, flow in FLOWS:
    t0 = time.monotonic()
    try:
        detail, verdict = flow(), "PASS"
    except Fail as f:
        detail, verdict = f.why, f"FAIL ({f.who})"
    except Exception as e:  # a broken flow is a failure of the check, shown as agentd's
        detail, verdict = f"{type(e).__name__}: {e}", "FAIL (agentd)"
    took = time.monotonic() - t0
    results.append((verdict, took))
    detail = " ".join(str(detail).split())[:160]
    print(f"{verdict:<14} {name:<28} {took:7.1f} s  {detail}", flush=True)

passed = sum(v == "PASS" for v, _ in results)
model = sum(v == "FAIL (model)" for v, _ in results)
agentd = sum(v == "FAIL (agentd)" for v, _ in results)
lat = sorted(t for _, t in results)
print(f"{len(results)} flows: {passed} passed, {model} failed (model), {agentd} failed (agentd); "
      f"latency median {lat[len(lat) // 2]:.1f} s, max {lat[-1]:.1f} s")
sys.exit(1 if agentd else 0)
PY
