#!/usr/bin/env bash
# Create (or bring up to date) .venv next to this script with the pinned
# analysis dependencies. Safe to run every time: when .venv already matches
# requirements*.txt and imports cleanly it returns in about a second.
#
#   ./setup-venv.sh            # uses python3 from PATH
#   PYTHON=python3.11 ./setup-venv.sh
#
# Needs (Debian 12): python3-venv, python3-dev, build-essential; pesq is
# compiled from source because PyPI has no wheel for it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.requirements.sha256"

die() { echo "setup-venv: $*" >&2; exit 1; }

want="$(cat "$here/requirements.txt" "$here/requirements-build.txt" | sha256sum | cut -d' ' -f1)"

# Imports everything and runs pesq once: a pesq wheel compiled against another
# numpy imports as "numpy.core.multiarray failed to import", so importing is
# the only reliable check.
healthy() {
    "$venv/bin/python" - <<'PY' >/dev/null 2>&1
import numpy as np, scipy, matplotlib, pystoi, cryptography
from pesq import pesq
t = np.arange(16000) / 16000.0
x = np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)
assert pesq(16000, x, x, "wb") > 4.0
PY
}

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && healthy; then
    echo "setup-venv: $venv is up to date"
    exit 0
fi

# Fail early with the package to install, rather than deep inside a compiler log.
command -v "$py" >/dev/null || die "$py not found; install it: apt-get install -y python3 python3-venv python3-dev"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$("$py" -V 2>&1) is too old; numpy/matplotlib pins need Python 3.11+"
command -v cc >/dev/null || die "no C compiler (needed to build pesq); install it: apt-get install -y build-essential"
"$py" - <<'PY' || die "Python headers missing (needed to build pesq); install them: apt-get install -y python3-dev"
import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
PY

# A venv whose interpreter no longer runs (python upgraded or removed) is rebuilt.
if [ -e "$venv" ] && ! "$venv/bin/python" -c 'pass' >/dev/null 2>&1; then
    echo "setup-venv: $venv is broken, recreating it"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv" 2>/dev/null \
        || { rm -rf "$venv"; die "'$py -m venv' failed; install it: apt-get install -y python3-venv"; }
fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
rm -f "$stamp"
"${pip[@]}" install -r "$here/requirements-build.txt"
# Everything but pesq comes as wheels.
"${pip[@]}" install -r <(grep -v '^pesq' "$here/requirements.txt")
# pesq: compiled against the numpy just installed (no build isolation, which
# would pick whatever numpy is newest) and never taken from pip's wheel cache,
# which may hold a build made against another numpy.
pesq_pin="$(grep '^pesq==' "$here/requirements.txt")"
"${pip[@]}" install --no-build-isolation --no-cache-dir --force-reinstall --no-deps "$pesq_pin"

healthy || die "installed, but importing numpy/scipy/matplotlib/pystoi/pesq fails; run: $venv/bin/python -c 'import pesq'"
echo "$want" > "$stamp"
echo "setup-venv: $venv ready ($("$venv/bin/python" -V))"
