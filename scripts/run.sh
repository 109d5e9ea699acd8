#!/usr/bin/env bash
# Start Parley on this machine with the embedded defaults (SQLite, in-memory channel layer, eager
# Celery, in-process inference). A first run creates the admin account and a tiny random demo
# checkpoint; set PARLEY_CHECKPOINT to a real checkpoint directory to serve real weights.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${1:-127.0.0.1}; PORT=${2:-8000}
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-webapp.settings.local}
PY=.venv/bin/python

# The local settings run with DEBUG on: a debug page must never be reachable from another machine.
if [[ $DJANGO_SETTINGS_MODULE == webapp.settings.local || ${DJANGO_DEBUG:-} =~ ^(1|true|yes|on)$ ]]; then
  case $HOST in
    127.*|localhost|::1|\[::1\]) ;;
    *) echo "refusing to serve with DEBUG on at $HOST: bind a loopback address (127.0.0.1), or use" \
            "DJANGO_SETTINGS_MODULE=webapp.settings.production behind TLS (docs/security.md)" >&2
       exit 2 ;;
  esac
fi

# var/ holds the database, the secret key and the inference token: private to this user.
umask 077
VAR=${PARLEY_VAR_DIR:-var}
mkdir -p "$VAR" && chmod 700 "$VAR"
# The web tier and a separate inference service (PARLEY_INFERENCE_URL) share this token.
if [[ -z "${PARLEY_INFERENCE_TOKEN:-}" ]]; then
  [[ -s $VAR/inference-token ]] || $PY -c "import secrets; print(secrets.token_urlsafe(32))" > "$VAR/inference-token"
  PARLEY_INFERENCE_TOKEN=$(<"$VAR/inference-token")
  export PARLEY_INFERENCE_TOKEN
fi

if [[ -z "${PARLEY_ENGINE:-}" && -z "${PARLEY_CHECKPOINT:-}" ]]; then
  demo=$VAR/checkpoints/tiny-personaplex
  if [[ ! -f $demo/config.json ]]; then
    echo "creating a tiny random demo checkpoint in $demo (random weights: it babbles) ..."
    $PY -m inference make-checkpoint --preset tiny-personaplex --out "$demo" --seed 0
  fi
  export PARLEY_ENGINE=personaplex PARLEY_CHECKPOINT=$demo
elif [[ "${PARLEY_ENGINE:-}" == "minicpmo" && -z "${PARLEY_CHECKPOINT:-}" ]]; then
  # The MiniCPM-o demo: tiny random weights plus tiny random Token2Wav assets (it speaks noise).
  demo=$VAR/checkpoints/tiny-minicpmo
  if [[ ! -f $demo/assets/token2wav/flow.yaml ]]; then
    echo "creating a tiny random MiniCPM-o demo checkpoint in $demo (random weights: it speaks noise) ..."
    $PY -m inference make-minicpmo-checkpoint --out "$demo"
  fi
  export PARLEY_CHECKPOINT=$demo
fi

$PY manage.py migrate --noinput -v 0
# A database file made before var/ was private (or with another umask) is closed to others too.
chmod 600 "$VAR"/db.sqlite3* 2>/dev/null || true
$PY manage.py bootstrap --url "http://$HOST:$PORT/"
# Above the 1 MiB event limit, so oversized events get event_too_large instead of a 1009 close.
exec .venv/bin/daphne -b "$HOST" -p "$PORT" --websocket-max-message-size 4194304 --websocket-max-frame-size 4194304 \
  webapp.asgi:application
