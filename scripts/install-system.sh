#!/usr/bin/env bash
# Debian packages Parley needs. `run` needs only python3-venv and gcc; the tests also drive Debian's
# chromium with a fake microphone made by espeak-ng + sox, and start throwaway PostgreSQL / Redis servers
# (tests/services.py) and nginx (the cluster test) of their own. Idempotent; uses sudo when not root.
set -euo pipefail
want=(python3 python3-venv python3-dev gcc make)
# pocketsphinx-testdata: recorded LibriVox sentences with transcripts (tests/librivox.py) for the recognisers
[[ "${1:-}" == "test" ]] && want+=(chromium espeak-ng sox postgresql redis-server nginx pocketsphinx-testdata)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "installing Debian packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
