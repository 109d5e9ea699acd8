#!/usr/bin/env bash
# Debian packages Parley needs. `run` needs only python3-venv and gcc; the tests also drive Debian's
# chromium with a fake microphone made by espeak-ng + sox, and start throwaway PostgreSQL / Redis servers
# (tests/services.py) and nginx (the cluster test) of their own. With `test` it also installs the npm packages
# the browser tests inject into pages (package.json: axe-core, pinned by package-lock.json) into node_modules/.
# Idempotent; uses sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
want=(python3 python3-venv python3-dev gcc make)
# pocketsphinx-testdata: recorded LibriVox sentences with transcripts (tests/librivox.py) for the recognisers
[[ "${1:-}" == "test" ]] && want+=(chromium espeak-ng sox postgresql redis-server nginx pocketsphinx-testdata)
missing=()
# npm from any source will do (a nodejs package of another origin ships its own npm and conflicts with Debian's).
[[ "${1:-}" == "test" ]] && ! command -v npm >/dev/null && missing+=(npm)
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A stamp of the lock file it was installed from: an unchanged lock file needs no second install.
if [[ "${1:-}" == "test" && "$(cat node_modules/.parley-installed 2>/dev/null)" != "$(sha256sum < package-lock.json)" ]]; then
  echo "installing npm packages for the browser tests (package-lock.json) ..."
  npm ci --no-audit --no-fund --loglevel=error
  sha256sum < package-lock.json > node_modules/.parley-installed
fi
