#!/bin/sh
# Write build/symbol-order.txt: the functions agentd executes while it starts, idles and answers
# messages, which build.rs asks the linker to place first in the release binary's code, so the
# pages a running daemon touches are few and together (`bench footprint`). Run it after changes that move much code or after a compiler or dependency update,
# then check `bench footprint` before and after.
#
# Needs valgrind and a release build: the build here is the shipped one with its symbol table
# kept (AGENTD_KEEP_SYMBOLS=1 changes nothing else, so the names match), linked again at the end
# without it. Took 9 minutes on 2 cores (two links of the release binary, callgrind runs).
set -eu
export LC_ALL=C
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "symbol-order.sh: valgrind is needed" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM HUP

AGENTD_KEEP_SYMBOLS=1 cargo build --release --locked --bins
cp "$target/release/agentd" "$work/agentd"
cp "$target/release/bench" "$work/bench"

cat > "$work/cg.sh" <<EOS
#!/bin/sh
exec valgrind --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file="$work/\${CG_PHASE}.%p" "$work/agentd" "\$@"
EOS
chmod +x "$work/cg.sh"
# Two phases, each a set of callgrind outputs: a start (to the first `/api/v1/status` 200, and
# the stop), then a start with FIFO, HTTP and Telegram, 3 s idle, 200 HTTP and 20 Telegram
# messages; a session of 100 messages one after the other; 300 messages over 3 sessions that
# compact every ~30 messages (code a long-running daemon runs, but only after a while).
CG_PHASE=start "$work/bench" startup --runs 1 --agentd "$work/cg.sh"
CG_PHASE=run "$work/bench" footprint --agentd "$work/cg.sh"
CG_PHASE=run "$work/bench" overhead --sequential-only --messages 100 --agentd "$work/cg.sh"
CG_PHASE=run "$work/bench" soak --messages 300 --sessions 3 --concurrency 3 \
    --compaction-tokens 8000 --agentd "$work/cg.sh"
# Optional third phase, the Matrix channel logging in and syncing: with
# SYMBOL_ORDER_MATRIX="<homeserver URL> <@bot:server>" and the access token of a bot user that
# has never logged in with agentd in AGENTD_MATRIX_TOKEN (docs/BENCHMARKS.md). Its functions go
# last, so a daemon without Matrix keeps its pages together.
if [ -n "${SYMBOL_ORDER_MATRIX:-}" ]; then
    set -- $SYMBOL_ORDER_MATRIX
    CG_PHASE=matrix "$work/bench" footprint --matrix "$1" --matrix-user "$2" --agentd "$work/cg.sh"
fi

# Every function callgrind saw run (fn= and cfn= lines name them, the first time with their
# name), kept if the binary defines it as code. What a start runs comes first, so an idle
# daemon's code is one run of pages; then what only messages run.
ran() { cat "$@" | sed -n 's/^c\{0,1\}fn=([0-9]*) //p' | sort -u; }
nm --defined-only "$work/agentd" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u > "$work/defined"
ran "$work"/start.* | comm -12 - "$work/defined" > "$work/start"
ran "$work"/run.* | comm -12 - "$work/defined" | comm -23 - "$work/start" > "$work/later"
: > "$work/matrix"
if ls "$work"/matrix.* >/dev/null 2>&1; then
    sort -u "$work/start" "$work/later" > "$work/seen"
    ran "$work"/matrix.* | comm -12 - "$work/defined" | comm -23 - "$work/seen" > "$work/matrix"
fi
# An empty list (valgrind wrote nothing) must not replace the committed one.
[ -s "$work/start" ] && [ -s "$work/later" ] || {
    echo "symbol-order.sh: callgrind recorded no functions; build/symbol-order.txt left as it was" >&2
    exit 1
}
mkdir -p build
cat "$work/start" "$work/later" "$work/matrix" > build/symbol-order.txt
# The names hold a hash of the compiler's version and of the dependencies: build.rs warns when
# another compiler builds or Cargo.lock changed.
{ "${RUSTC:-rustc}" -V; echo "Cargo.lock $(cksum < Cargo.lock)"; } > build/symbol-order.rustc
echo "symbol-order.sh: $(wc -l < "$work/start") functions at the start, $(wc -l < "$work/later") more for messages, $(wc -l < "$work/matrix") more for Matrix, in build/symbol-order.txt"

# The shipped build again: stripped, with the new order (build.rs watches the file only once
# it exists).
touch build.rs
env -u AGENTD_KEEP_SYMBOLS cargo build --release --locked --bins
