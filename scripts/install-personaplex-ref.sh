#!/usr/bin/env bash
# The PersonaPlex reference (NVIDIA/personaplex at 3428dfd, package moshi-personaplex) in .venv-personaplex-ref, for
# `make test-reference`. It is on no package registry, so it is built from a checkout of that repository named by
# PARLEY_PERSONAPLEX_SRC (`--check-source`: only check that there is one). `make test` never needs it: it compares
# against the reference's stored outputs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
src=${PARLEY_PERSONAPLEX_SRC:-}
if [[ -z "$src" ]]; then
  echo "make test-reference: PARLEY_PERSONAPLEX_SRC is not set; point it at a checkout of NVIDIA/personaplex (commit 3428dfd)" >&2
  exit 2
fi
if [[ ! -f "$src/moshi/pyproject.toml" ]]; then
  echo "make test-reference: PARLEY_PERSONAPLEX_SRC=$src is not a checkout of NVIDIA/personaplex (no moshi/pyproject.toml there)" >&2
  exit 2
fi
[[ "${1:-}" == "--check-source" ]] && exit 0  # `make test-reference` checks the checkout before installing anything
stamp=$(sha256sum "$src/moshi/pyproject.toml" scripts/install-personaplex-ref.sh | sha256sum | cut -c1-16)
if [[ "$(cat .venv-personaplex-ref/.parley-installed 2>/dev/null || true)" != "$stamp" ]]; then
  echo "installing the reference NVIDIA/personaplex from $src into .venv-personaplex-ref ..."
  rm -rf .venv-personaplex-ref
  $PY -m venv .venv-personaplex-ref
  .venv-personaplex-ref/bin/pip install -q --upgrade pip
  .venv-personaplex-ref/bin/pip install -q torch==2.13.0
  # a copy, not the checkout itself: pip builds in place, and the checkout may be read-only
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  cp -r "$src/moshi" "$build/moshi"
  .venv-personaplex-ref/bin/pip install -q --no-deps "$build/moshi"
  .venv-personaplex-ref/bin/pip install -q numpy==2.2.6 safetensors==0.7.0 einops==0.8.2 sentencepiece==0.2.3 \
    sphn==0.1.12 pyloudnorm==0.2.0 huggingface-hub==0.36.2 tqdm
  echo "$stamp" > .venv-personaplex-ref/.parley-installed
fi
