#!/usr/bin/env bash
# Wheels the GPU machine's image lacks, downloaded into .whl/ (git-ignored through .git/info/exclude) so that a
# device call can carry them. The image has torch, triton, transformers, safetensors, sentencepiece, numpy,
# scipy and prometheus_client; the inference package also imports pydantic (config), pyloudnorm, soxr, sphn
# (audio) and python-json-logger, and the lockstep reference bench needs moshi 0.2.13.
# The MiniCPM-o reference (bench/unit_reference.py) gets its own folder, .whl/ref/: transformers 4.51 and the
# versions it pins (tokenizers 0.21, huggingface-hub < 1.0), accelerate 1.12 (the demo's pin) and soundfile with
# cffi (imported by the reference's modeling file), at the versions its CPU venv .venv-minicpmo-demo resolved;
# installed into a target of their own so they shadow the image's transformers 5 only for that bench.
#
# Usage, here:     scripts/gpu-wheels.sh
# then, on the device (carry: [".whl"]), start the command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site:. || exit
# and for the reference bench (carry: [".whl", ".ref"]; see bench/notes/unit-gpu.md):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ref-site \
#     .whl/ref/*.whl && PYTHONPATH=/tmp/ref-site python3 bench/unit_reference.py --src .ref/minicpmo-demo ...
# GPU tests there skip the suite's conftest (it imports Django, which the image lacks):
#   python3 -m pytest -q -p no:cacheprovider --noconftest -c /dev/null --rootdir . tests/gpu/
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
# the versions this project's own venv resolved, so the device runs what the tests here ran
versions=$(.venv/bin/python - <<'EOF'
from importlib.metadata import version
names = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pyloudnorm", "python-json-logger",
         "soxr", "sphn"]
print(" ".join(f"{n}=={version(n)}" for n in names))
EOF
)
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
  platforms+=(--platform "${tag}_x86_64")
done
# shellcheck disable=SC2086 # one argument per requirement
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl $versions moshi==0.2.13
ref="transformers==4.51.3 tokenizers==0.21.4 huggingface-hub==0.36.2 accelerate==1.12.0 soundfile==0.14.0"
ref="$ref cffi==2.1.1 pycparser==3.12"
# shellcheck disable=SC2086 # one argument per requirement
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl/ref $ref
ls -1 .whl .whl/ref
du -sh .whl .whl/ref
