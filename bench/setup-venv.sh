#!/usr/bin/env bash
# Makes bench/.venv with the analysis and report packages (requirements.txt), once. pesq compiles C
# code against numpy, so numpy goes in first and pesq builds without isolation.
set -euo pipefail
cd "$(dirname "$0")"
if [ -x .venv/bin/python3 ] && .venv/bin/python3 -c "import numpy, scipy, pesq, pystoi, matplotlib" 2>/dev/null; then
  exit 0
fi
python3 -m venv .venv || { echo "bench: python3 -m venv failed; install python3-venv (make deps does)"; exit 1; }
.venv/bin/pip install --quiet --upgrade pip wheel setuptools
.venv/bin/pip install --quiet "$(grep '^numpy' requirements.txt)" "$(grep '^cython' requirements.txt || echo cython)"
.venv/bin/pip install --quiet --no-build-isolation -r requirements.txt
.venv/bin/python3 -c "import numpy, scipy, pesq, pystoi, matplotlib; print('bench: analysis tools ready in bench/.venv')"
