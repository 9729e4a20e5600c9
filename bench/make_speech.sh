#!/usr/bin/env bash
# The talker's input for the end-to-end benchmark: a dispatch phrase spoken by espeak-ng, as 48 kHz
# mono 16-bit WAV with 0.3 s of silence at each end (so the codec's start-up and the end marker are
# outside the speech that is scored).
set -euo pipefail
out="${1:-bench/speech.wav}"
command -v espeak-ng >/dev/null || { echo "make_speech: espeak-ng is missing; run: apt-get install -y espeak-ng sox (make deps does)"; exit 1; }
command -v sox >/dev/null || { echo "make_speech: sox is missing; run: apt-get install -y sox (make deps does)"; exit 1; }
tmp=$(mktemp --suffix=.wav)
trap 'rm -f "$tmp"' EXIT
espeak-ng -v en-us -s 150 -w "$tmp" "Unit twelve, proceed to the north gate. Two vehicles waiting."
sox "$tmp" -r 48000 -c 1 -b 16 "$out" pad 0.3 0.3
echo "make_speech: wrote $out ($(soxi -D "$out") s)"
