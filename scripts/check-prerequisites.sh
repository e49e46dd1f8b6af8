#!/usr/bin/env bash
# What the test suite needs besides Rust, checked before the first test: every missing piece is
# listed with the command that fixes it, and the script exits 1 if any is missing. Then the
# real peers the tests talk to (scripts/install-test-peers.sh) are installed into
# target/tmp/test-peers, where the tests look for them, so a registry that cannot be reached
# is reported here, not in the middle of the run. Nothing is skipped: the suite needs all of it.
set -uo pipefail
cd "$(dirname "$0")/.."

missing=()
need() { # need DESCRIPTION FIX CONDITION...
  local what="$1" fix="$2"
  shift 2
  if ! "$@" >/dev/null 2>&1; then
    missing+=("$what — fix: $fix")
  fi
}
have() { command -v "$1"; }

need "python3 (MCP reference server, SDK clients, A2A client, metrics parser, Synapse and matrix-nio)" \
  "apt-get install python3 python3-pip" have python3
need "pip for python3" "apt-get install python3-pip" python3 -m pip --version
need "python3 3.10 or later (the Synapse homeserver of the Matrix tests)" \
  "install Python 3.10 or later (Debian 12: apt-get install python3)" \
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'
need "node and npm (the MCP reference server @modelcontextprotocol/server-everything, the MCP Inspector)" \
  "apt-get install nodejs npm" have npm
need "systemd-analyze (the units are checked offline)" "apt-get install systemd" have systemd-analyze
need "apt-get and dpkg-deb (Prometheus' promtool comes from Debian's prometheus package)" \
  "run the suite on Debian or Ubuntu" bash -c 'command -v apt-get && command -v dpkg-deb'
need "chromium and chromium-driver (the web console's browser tests), or root to install them" \
  "apt-get install chromium chromium-driver" \
  bash -c '{ command -v chromium && command -v chromedriver; } || [ "$(id -u)" -eq 0 ]'
need "setpriv (tests run the daemon as an unprivileged user)" "apt-get install util-linux" have setpriv
need "the time zone database (/usr/share/zoneinfo)" "apt-get install tzdata" \
  test -f /usr/share/zoneinfo/Europe/Berlin
need "user namespaces (the exec and MCP sandbox)" \
  "sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 where it exists)" \
  bash -c '[ "$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0)" -gt 0 ]'
need "an open-files limit of at least 4096 (ulimit -n)" "ulimit -n 4096 (or raise nofile in /etc/security/limits.conf)" \
  bash -c '[ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge 4096 ]'
need "root, or an uid that may switch to nobody (tests run the daemon as uid 65534)" \
  "run the suite as root, as CI does" bash -c '[ "$(id -u)" -eq 0 ]'

if [ ${#missing[@]} -gt 0 ]; then
  echo "The test suite cannot run here; missing:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 1
fi

dest=target/tmp/test-peers
echo "test peers: installing into $dest (once; needs PyPI, npm and Debian's package archive)" >&2
if ! scripts/install-test-peers.sh "$dest"; then
  echo "The test suite cannot run here: the test peers could not be installed into $dest" >&2
  echo "  - fix: give this machine access to PyPI and the npm registry, then run again" >&2
  exit 1
fi
echo "prerequisites: all present" >&2
