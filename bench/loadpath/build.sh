#!/bin/bash
# Builds the carry for the serving bench on the GPU host: .venv-loadpath/ (git-ignored) in the checkout the
# device tool sends (a session's own checkout, not a helper's worktree). The device image has python3 3.12 and
# torch but no Django, daphne or nginx, and reaches no registry; its tree limit is 64 MiB with tests/data's
# ~40 MB already in it, so the web stack goes compressed (~16 MB) and PyAV as a stand-in (av_stub/av: the
# bench's calls are audio only; PyAV's FFmpeg alone would be 19 MB more).
#
#   PY312=python3.12 bash bench/loadpath/build.sh [DEST]      (here: PYENV_VERSION=3.12.1 python3.12)
#
# Then on the device: bash .venv-loadpath/soak.sh, or bash .venv-loadpath/run.sh LOG <serving_e2e args>.
# The device runs the checkout the device tool sends (its serving code checked against the carry's FINGERPRINT); after
# committing more, run bench/loadpath/stamp.sh before the next device command, and send the checkout clean.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.venv-loadpath}
PY312=${PY312:-python3.12}
WORK=$(mktemp -d /tmp/loadpath-build.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$PY312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'

# The project's web dependencies at their pins, less what the device image has (torch and the model stack,
# numpy, scipy, pillow, pyarrow, onnx, prometheus-client, psutil, uvloop), Postgres (the bench uses SQLite),
# S3 (django-storages' boto3), pocketsphinx (imported only for transcripts) and PyAV (the stand-in);
# websockets is the load generator's client.
SKIP='^(torch|transformers|huggingface_hub|safetensors|sentencepiece|numpy|scipy|pillow|psycopg.*|pyarrow|onnx|onnxruntime|prometheus-client|pocketsphinx|av|boto3|django-storages)=='
mapfile -t PINS < <(python3 - "$ROOT/pyproject.toml" <<'PYEOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for dep in project["dependencies"]:
    print(dep.replace("[binary]", ""))
print(next(d for d in project["optional-dependencies"]["test"] if d.startswith("websockets==")))
PYEOF
)
PINS=($(printf '%s\n' "${PINS[@]}" | grep -Ev "$SKIP"))
PLATFORMS=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
    PLATFORMS+=(--platform "${p}_x86_64")
done
"$PY312" -m pip download -q -d "$WORK/wheels" --only-binary=:all: "${PLATFORMS[@]}" "${PINS[@]}"
rm -f "$WORK"/wheels/{numpy,scipy,psutil,av}-*.whl   # dependencies of the kept ones that the image has
"$PY312" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WORK"/wheels/*.whl

# Smaller: Django's locales but English, GeoDjango, the admin's static files; debug info of the extensions.
site=$WORK/site
find "$site/django" -type d -path '*/locale/*' -prune ! -name en -exec rm -rf {} +
rm -rf "$site"/django/contrib/{gis,postgres,admin/static} "$site"/twisted/test "$site"/twisted/*/test
find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$site" -name '*.so*' -type f -exec file {} + | grep 'not stripped' | cut -d: -f1 | xargs -r strip --strip-debug
cp -r "$ROOT/bench/loadpath/av_stub/av" "$site/av"

mkdir -p "$DEST/bin" "$DEST/lib"
tar -cf - -C "$site" . | xz -T2 -9 > "$DEST/webstack.tar.xz"
cp /usr/sbin/nginx "$DEST/bin/nginx"
# py-spy for serving_e2e.py --profile-s: the static binary of its wheel (8 MB; 2.0 MB as xz; env.sh unpacks it).
# A call carries 64 MiB with the checkout's tracked files (45 MB): only where asked for (PYSPY=1), and never beside
# a second commit's code (BEFORE)
rm -f "$DEST/py-spy.xz"
if [ -n "${PYSPY:-}" ] && [ -z "${BEFORE:-}" ]; then
    "$PY312" -m pip download -q -d "$WORK/pyspy" --no-deps --only-binary=:all: py-spy==0.4.3
    unzip -q -p "$WORK"/pyspy/py_spy-*.whl 'py_spy-*.data/scripts/py-spy' | xz -T2 -9 > "$DEST/py-spy.xz"
fi
cp -L "$(ldd /usr/sbin/nginx | awk '/libpcre2-8/ {print $3}')" "$DEST/lib/libpcre2-8.so.0"
(cd "$ROOT" && .venv/bin/python -c "from pathlib import Path; from bench.serving_e2e import make_speech; make_speech(Path('$DEST/speech.npy'))")
source_at() {
    git -C "$ROOT" archive --format=tar "$1" bench deploy inference webapp templates static manage.py pyproject.toml \
        tests/__init__.py tests/cluster tests/services.py \
        tests/data/personaplex/ckpt/{config.json,tokenizer.model,mimi_config.json} | xz -9
}
# BEFORE=<commit>: that commit's code too, for a side-by-side run in one command (run.sh's BEFORE=1 runs it)
rm -f "$DEST/before.tar.xz" "$DEST/BEFORE"
if [ -n "${BEFORE:-}" ]; then
    source_at "$BEFORE" > "$DEST/before.tar.xz"
    git -C "$ROOT" rev-parse --short=7 "$BEFORE" > "$DEST/BEFORE"
fi
# The code at HEAD is the checkout the device tool sends: named and fingerprinted here, checked by env.sh there
bash "$ROOT/bench/loadpath/stamp.sh" "$DEST"
cp "$ROOT"/bench/loadpath/{env.sh,run.sh,soak.sh,two_cores.sh,unit.sh} "$DEST/"
du -sh "$DEST"/*
