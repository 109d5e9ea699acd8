#!/bin/bash
# Names the code the next device command runs: the sent checkout's HEAD, and a fingerprint of its serving code that
# env.sh checks on the device, so a result can never carry the name of another commit (a COMMIT left from the
# carry's build did once). Run after each commit, before each device command; the checkout must be clean.
#
#   bash bench/loadpath/stamp.sh [CARRY]      (default .venv-loadpath)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.venv-loadpath}
cd "$ROOT"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "stamp.sh: the checkout has uncommitted changes; commit them (results are named by the commit)" >&2
    exit 1
fi
git rev-parse --short=7 HEAD > "$DEST/COMMIT"
git ls-files inference webapp bench deploy > "$DEST/FILES"
xargs -a "$DEST/FILES" -d '\n' cat | sha1sum | cut -d' ' -f1 > "$DEST/FINGERPRINT"
echo "stamped $(cat "$DEST/COMMIT") ($(wc -l < "$DEST/FILES") files)"
