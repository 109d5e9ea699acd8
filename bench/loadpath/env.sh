# Sourced on the GPU host (bash): the carried web stack on PYTHONPATH, nginx on PATH, the code at COMMIT in
# $LOADPATH_SRC, BENCH_COMMIT for results_io. The device image has python3 3.12 + torch, no Django/daphne/nginx.
L=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SITE=${LOADPATH_SITE:-/tmp/site}          # overridable for a local dry run
# BEFORE=1 (a carry built with BEFORE=<commit>): that commit's code, in a folder of its own
code=none commit_file=COMMIT
if [ -n "${BEFORE:-}" ]; then
    code=before.tar.xz commit_file=BEFORE
    [ -e "$L/$code" ] || { echo "BEFORE=1, but this carry was built without BEFORE=<commit>"; return 1; }
fi
# COMMIT's code is the checkout the device tool sent, this carry's parent folder: its serving code must be what
# bench/loadpath/stamp.sh fingerprinted, or the results would carry another commit's name.
if [ -z "${BEFORE:-}" ]; then
    LOADPATH_SRC=${LOADPATH_SRC:-$(dirname "$L")}
    sent=$(cd "$LOADPATH_SRC" && xargs -a "$L/FILES" -d '\n' cat | sha1sum | cut -d' ' -f1)
    if [ "$sent" != "$(cat "$L/FINGERPRINT")" ]; then
        echo "the checkout sent is not $(cat "$L/COMMIT") as stamped: commit, run bench/loadpath/stamp.sh, send it clean"
        return 1
    fi
fi
export LOADPATH_SRC=${LOADPATH_SRC:-/tmp/loadpath-src${BEFORE:+-before}}
if [ ! -e "$SITE/django" ] && [ ! -e "$SITE/av" ]; then
    mkdir -p "$SITE" && tar -xJf "$L/webstack.tar.xz" -C "$SITE" || return 1
fi
# A warm host keeps /tmp between commands: the code is unpacked again when the carry holds another commit.
if [ -e "$L/$code" ] && [ "$(cat "$LOADPATH_SRC/.commit" 2>/dev/null)" != "$(cat "$L/$commit_file")" ]; then
    rm -rf "$LOADPATH_SRC" && mkdir -p "$LOADPATH_SRC" && tar -xJf "$L/$code" -C "$LOADPATH_SRC" || return 1
    cp "$L/$commit_file" "$LOADPATH_SRC/.commit"
fi
if [ -e "$L/py-spy.xz" ] && [ ! -x "$SITE/bin/py-spy" ]; then
    mkdir -p "$SITE/bin" && xz -dc "$L/py-spy.xz" > "$SITE/bin/py-spy" && chmod +x "$SITE/bin/py-spy"
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$L/bin:$SITE/bin:$PATH" LD_LIBRARY_PATH="$L/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BENCH_COMMIT=$(cat "$L/$commit_file") PYTHONUNBUFFERED=1 SPEECH="$L/speech.npy"
