#!/usr/bin/env bash
# Produce the benchmark's talker input: one espeak-ng utterance of ordinary
# speech, 48 kHz mono 16-bit, peak at -3 dBFS, 0.3 s of silence at each end.
#
#   ./make_speech.sh OUT.wav ["text to speak"]
#
# Uses sox for the conversion when present, else audio_metrics.py (numpy/scipy;
# set PYTHON to the venv's python, e.g. PYTHON=.venv/bin/python).
# The output is deterministic for a given espeak-ng/sox version, so runs compare.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-}"
text="${2:-Dispatch to unit seven. Proceed to the north gate and report on arrival.}"
py="${PYTHON:-python3}"

if [ -z "$out" ]; then
    echo "usage: $0 OUT.wav [\"text to speak\"]" >&2
    exit 2
fi
if ! command -v espeak-ng >/dev/null; then
    echo "make_speech: espeak-ng is not installed; install it with:" >&2
    echo "    sudo apt-get install -y espeak-ng" >&2
    exit 1
fi
outdir="$(dirname "$out")"
[ -d "$outdir" ] || { echo "make_speech: directory $outdir does not exist" >&2; exit 2; }

tmp="$(mktemp --suffix=.wav)"
trap 'rm -f "$tmp"' EXIT

# A fixed voice and rate, so the utterance (and its length) never changes
# between runs; espeak-ng writes 22.05 kHz mono 16-bit.
espeak-ng -v en-us -s 160 -w "$tmp" "$text"

if command -v sox >/dev/null; then
    # -D: no dither, so the output is bit-identical run to run.
    # gain -n -3: peak normalise to -3 dBFS; rate -v: very high quality resampler.
    sox -D "$tmp" -r 48000 -c 1 -b 16 -e signed-integer "$out" gain -n -3 rate -v 48000 pad 0.3 0.3
else
    "$py" "$here/audio_metrics.py" prepare "$tmp" "$out" --rate 48000 --pad-s 0.3 >/dev/null
fi
echo "make_speech: wrote $out ($(du -k "$out" | cut -f1) KiB)"
