#!/usr/bin/env bash
# Start Parley on this machine with the embedded defaults (SQLite, in-memory channel layer, eager
# Celery, in-process inference). A first run creates the admin account and a tiny random demo
# checkpoint; set PARLEY_CHECKPOINT to a real checkpoint directory to serve real weights.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${1:-127.0.0.1}; PORT=${2:-8000}
mkdir -p var
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-webapp.settings.local}
PY=.venv/bin/python

if [[ -z "${PARLEY_ENGINE:-}" && -z "${PARLEY_CHECKPOINT:-}" ]]; then
  demo=var/checkpoints/tiny-personaplex
  if [[ ! -f $demo/config.json ]]; then
    echo "creating a tiny random demo checkpoint in $demo (random weights: it babbles) ..."
    $PY -m inference make-checkpoint --preset tiny-personaplex --out "$demo" --seed 0
  fi
  export PARLEY_ENGINE=personaplex PARLEY_CHECKPOINT=$demo
fi

$PY manage.py migrate --noinput -v 0
$PY manage.py bootstrap --url "http://$HOST:$PORT/"
# Above the 1 MiB event limit, so oversized events get event_too_large instead of a 1009 close.
exec .venv/bin/daphne -b "$HOST" -p "$PORT" --websocket-max-message-size 4194304 --websocket-max-frame-size 4194304 \
  webapp.asgi:application
