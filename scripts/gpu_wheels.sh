#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine's Python lacks (it cannot download anything):
# dp-accounting, cryptography with cffi and pycparser (dprc_core's dependencies) and opacus (the
# benchmark's peer), for that machine's Python 3.12 on x86_64, from this machine's configured
# package index. scripts/gpu_check.sh installs whatever .whl/ holds into a temporary folder.
#   bash scripts/gpu_wheels.sh        # then carry ".whl" with the device run
set -euo pipefail
PY=${PY:-.venv/bin/python}
PYVER=${GPU_PYTHON_VERSION:-3.12}
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    dp-accounting cryptography cffi pycparser opacus 2>&1 | grep -v "is ignored" || true
ls -1 .whl
