#!/usr/bin/env bash
# Export the reference MiniCPM-o 4.5 package (OpenBMB/MiniCPM-o-Demo, folder MiniCPMO45/) from a git mirror of that
# repository into the git-ignored .ref/minicpmo-demo/ (never committed: bench/unit_reference.py imports it from
# there at run time, unmodified). The mirror comes from the session tools' fetch (github:OpenBMB/MiniCPM-o-Demo).
#
# Usage: scripts/unit-reference-src.sh [GIT_DIR] [COMMIT]
#   GIT_DIR default /work/.mirror/OpenBMB+MiniCPM-o-Demo/repo, COMMIT default HEAD (28b60cf when this was written)
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/.mirror/OpenBMB+MiniCPM-o-Demo/repo}
rev=${2:-HEAD}
dest=.ref/minicpmo-demo
mkdir -p .git/info
grep -qx "/.ref/" .git/info/exclude 2>/dev/null || echo "/.ref/" >> .git/info/exclude
rm -rf "$dest"
mkdir -p "$dest"
# every file of MiniCPMO45/ that the mirror holds (its tokenizer.json blob is absent: the tokenizer is built from
# vocab.json + merges.txt + tokenizer_config.json, see bench/unit_reference.py)
mkdir -p "$dest/MiniCPMO45"
git --git-dir="$src" ls-tree --format='%(objectname) %(path)' "$rev" MiniCPMO45/ | while read -r obj path; do
  if git --git-dir="$src" cat-file -e "$obj" 2>/dev/null; then
    git --git-dir="$src" cat-file blob "$obj" > "$dest/$path"
  else
    echo "absent from the mirror: $path"
  fi
done
git --git-dir="$src" rev-parse "$rev" > "$dest/COMMIT"
ls -l "$dest/MiniCPMO45"
echo "reference at $(cat "$dest/COMMIT") in $dest"
