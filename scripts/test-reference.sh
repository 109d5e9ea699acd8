#!/usr/bin/env bash
# The live NVIDIA/personaplex reference runs (`make test-reference`): the tests marked `personaplex_reference`,
# which run the reference package itself on the tiny checkpoints and compare it with ours and with the stored
# reference data that `make test` checks. Needs a checkout of NVIDIA/personaplex at 3428dfd in
# PARLEY_PERSONAPLEX_SRC (scripts/install-personaplex-ref.sh builds .venv-personaplex-ref from it).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-personaplex-ref.sh || exit $?
export PYTHONUNBUFFERED=1
.venv/bin/python -m pytest -p no:cacheprovider -m personaplex_reference tests/inference "$@"
rc=$?
[[ $rc -eq 5 ]] && echo "FAILED: test-reference collected no tests"
exit $rc
