#!/usr/bin/env bash
# Python environments. .venv holds the app (and the test tools with `test`); .venv-pipecat holds pipecat-ai; .venv-moshi-ref
# holds the reference implementation moshi 0.2.13 that the parity tests compare against. moshi pins an older torch,
# so it gets its own venv, installed without its dependency pins (moshi 0.2.13 declares torch<2.10 but runs on 2.13).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp() { sha256sum pyproject.toml scripts/install-python.sh | sha256sum | cut -c1-16; }
if [[ ! -x .venv/bin/python ]]; then $PY -m venv .venv; fi
extras=""; [[ "${1:-}" == "test" ]] && extras="[test]"
installed=$(cat .venv/.parley-installed 2>/dev/null || true)
# Installs run as background jobs (start_install), each into its own log; finish_installs waits for all of them,
# prints each log, and fails if any failed.
jobs_pids=(); jobs_logs=()
start_install() {  # the function that installs one venv, what it installs
  local log; log=$(mktemp -t parley-install.XXXXXX)
  echo "installing $2 ..."
  ( set -euo pipefail; start=$SECONDS; "$1"; echo "installed $2 ($((SECONDS - start)) s)" ) >"$log" 2>&1 &
  jobs_pids+=($!); jobs_logs+=("$log")
}
finish_installs() {
  local failed=0 i
  for i in "${!jobs_pids[@]}"; do
    wait "${jobs_pids[$i]}" || { failed=1; echo "FAILED:"; }
    cat "${jobs_logs[$i]}"; rm -f "${jobs_logs[$i]}"
  done
  return $failed
}
install_app() {
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".$extras"
  # silero-vad declares torchaudio, whose wheels pin an older torch; the VAD needs neither torchaudio nor
  # onnxruntime (inference/turns/vad.py loads its packaged TorchScript model), so it goes in without them.
  .venv/bin/pip install -q --no-deps silero-vad==6.2.3
  echo "$(stamp)$extras" > .venv/.parley-installed
}
# A test install already holds everything `run` needs.
if [[ "$installed" != "$(stamp)$extras" && "$installed" != "$(stamp)[test]" ]]; then
  start_install install_app "Python packages into .venv"
fi
# The three venvs the tests alone need are independent of .venv and of each other: they install at once, beside
# .venv's install (above, in the background). Each writes its stamp only when it is complete, so a failed or
# interrupted install is redone next time.
install_moshi_ref() {
  $PY -m venv .venv-moshi-ref
  .venv-moshi-ref/bin/pip install -q --upgrade pip
  .venv-moshi-ref/bin/pip install -q torch==2.13.0
  .venv-moshi-ref/bin/pip install -q --no-deps moshi==0.2.13
  .venv-moshi-ref/bin/pip install -q "numpy<2.3" "safetensors<0.8" "huggingface-hub<1.0" "einops<0.9" \
    "sentencepiece<0.3" "sphn>=0.2,<0.3" "aiohttp<3.12" tqdm
  touch .venv-moshi-ref/.parley-installed
}
# pipecat-ai, for the test that drives Parley with pipecat's stock OpenAI Realtime service (tests/sdk/
# test_pipecat_realtime.py). It pins older protobuf, soundfile and soxr than the app's, so it gets its own venv.
install_pipecat() {
  $PY -m venv .venv-pipecat
  .venv-pipecat/bin/pip install -q --upgrade pip
  .venv-pipecat/bin/pip install -q "pipecat-ai[openai]==1.14.0"
  touch .venv-pipecat/.parley-installed
}
# The Token2Wav reference (PyPI minicpmo 0.1.2, module stepaudio2.token2wav) that made
# tests/data/minicpmo45/token2wav/reference.npz; its declared deps (moviepy, decord, ...) are not needed for it.
install_minicpmo_ref() {
  $PY -m venv .venv-minicpmo-ref
  .venv-minicpmo-ref/bin/pip install -q --upgrade pip
  .venv-minicpmo-ref/bin/pip install -q torch==2.13.0
  .venv-minicpmo-ref/bin/pip install -q --no-deps minicpmo==0.1.2 torchaudio==2.11.0
  .venv-minicpmo-ref/bin/pip install -q onnx==1.23.2 onnxruntime==1.31.1 hyperpyyaml==1.2.3 "einops<0.9" tqdm \
    "numpy<2.3" soundfile librosa transformers diffusers
  touch .venv-minicpmo-ref/.parley-installed
}
if [[ "${1:-}" == "test" ]]; then
  [[ -f .venv-moshi-ref/.parley-installed ]] ||
    start_install install_moshi_ref "the reference moshi 0.2.13 into .venv-moshi-ref"
  [[ -f .venv-pipecat/.parley-installed ]] || start_install install_pipecat "pipecat-ai 1.14.0 into .venv-pipecat"
  [[ -f .venv-minicpmo-ref/.parley-installed ]] ||
    start_install install_minicpmo_ref "the reference minicpmo 0.1.2 into .venv-minicpmo-ref"
fi
finish_installs
