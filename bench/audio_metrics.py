#!/usr/bin/env python3
"""Delay and quality of speech that crossed Squelch, for the end-to-end benchmark.

The listener's recording runs on the sound card's timeline: silence, the utterance, silence, the
utterance again... `bursts` finds each repetition of the reference near where the talker's schedule
says it should start, by GCC-PHAT cross-correlation (its phase transform whitens the spectrum, so the
peak stays sharp for speech, whose energy sits in a few formants), and scores each aligned repetition
with PESQ-WB and STOI at 16 kHz.

    audio_metrics.py bursts REFERENCE.wav RECORDING.wav --send-times-ms 120.5,8300.2,...
    audio_metrics.py latency REFERENCE.wav DEGRADED.wav
    audio_metrics.py quality REFERENCE.wav DEGRADED.wav

Output is JSON on stdout; errors are one line on stderr and a non-zero exit.
"""
import argparse
import json
import sys
from math import gcd

import numpy as np
from scipy.io import wavfile
from scipy.signal import resample_poly

RATE = 16_000


class MetricsError(Exception):
    pass


def read(path):
    """A WAV file as float mono at 16 kHz."""
    try:
        rate, data = wavfile.read(path)
    except (OSError, ValueError) as error:
        raise MetricsError(f"can't read {path}: {error}")
    data = data.astype(np.float64)
    if data.ndim > 1:
        data = data.mean(axis=1)
    if np.abs(data).max(initial=0) > 1.5:  # integer samples
        data = data / 32768.0
    g = gcd(rate, RATE)
    return resample_poly(data, RATE // g, rate // g)


def gcc_phat(reference, window):
    """Lag (samples) of `reference` inside `window`, and the peak's height over the median (confidence)."""
    n = len(reference) + len(window)
    size = 1 << (n - 1).bit_length()
    cross = np.fft.rfft(window, size) * np.conj(np.fft.rfft(reference, size))
    cross /= np.abs(cross) + 1e-12
    correlation = np.fft.irfft(cross, size)[: len(window)]
    lag = int(np.argmax(correlation))
    confidence = float(correlation[lag] / (np.median(np.abs(correlation)) + 1e-12))
    return lag, confidence


def quality(reference, degraded):
    """PESQ-WB and STOI of an aligned repetition (same length as the reference)."""
    from pesq import pesq, NoUtterancesError, PesqError
    from pystoi import stoi
    try:
        pesq_wb = float(pesq(RATE, reference, degraded, "wb"))
    except (NoUtterancesError, PesqError) as error:
        raise MetricsError(f"PESQ could not score this burst ({error.__class__.__name__}): the recording holds no speech there")
    return pesq_wb, float(stoi(reference, degraded, RATE, extended=False))


def bursts(reference_path, recording_path, send_times_ms, search_ms=1500):
    reference, recording = read(reference_path), read(recording_path)
    if np.abs(recording).max(initial=0) < 1e-4:
        raise MetricsError(f"{recording_path} is silent: the listener heard nothing")
    results = []
    for sent in send_times_ms:
        start = int(round(sent * RATE / 1000))
        lo, hi = max(0, start), min(len(recording), start + int(search_ms * RATE / 1000) + len(reference))
        window = recording[lo:hi]
        if len(window) < len(reference):
            results.append({"sent_ms": sent, "error": "the recording ends before this burst"})
            continue
        lag, confidence = gcc_phat(reference, window)
        latency_ms = (lo + lag - start) * 1000 / RATE
        aligned = recording[lo + lag: lo + lag + len(reference)]
        entry = {"sent_ms": sent, "latency_ms": latency_ms, "confidence": confidence}
        try:
            entry["pesq_wb"], entry["stoi"] = quality(reference, aligned)
        except MetricsError as error:
            entry["error"] = str(error)
        results.append(entry)
    latencies = sorted(r["latency_ms"] for r in results if "latency_ms" in r)
    scored = [r for r in results if "pesq_wb" in r]

    def pct(q):
        return float(np.percentile(latencies, q)) if latencies else None

    return {
        "p50_ms": pct(50), "p95_ms": pct(95),
        "pesq_wb": float(np.mean([r["pesq_wb"] for r in scored])) if scored else None,
        "stoi": float(np.mean([r["stoi"] for r in scored])) if scored else None,
        "per_burst": results,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bursts")
    b.add_argument("reference")
    b.add_argument("recording")
    b.add_argument("--send-times-ms", required=True, help="comma-separated send times on the recording's timeline")
    for name in ("latency", "quality"):
        p = sub.add_parser(name)
        p.add_argument("reference")
        p.add_argument("degraded")
    args = parser.parse_args()
    try:
        if args.command == "bursts":
            times = [float(t) for t in args.send_times_ms.split(",") if t.strip()]
            out = bursts(args.reference, args.recording, times)
        elif args.command == "latency":
            out = bursts(args.reference, args.degraded, [0.0], search_ms=60_000)
            out = {"latency_ms": out["p50_ms"]}
        else:
            ref, deg = read(args.reference), read(args.degraded)
            lag, _ = gcc_phat(ref, deg) if len(deg) >= len(ref) else (0, 0)
            aligned = deg[lag: lag + len(ref)]
            if len(aligned) < len(ref):
                aligned = np.pad(aligned, (0, len(ref) - len(aligned)))
            pesq_wb, stoi_value = quality(ref, aligned)
            out = {"pesq_wb": pesq_wb, "stoi": stoi_value}
    except (MetricsError, ValueError) as error:
        print(f"audio_metrics: {error}", file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
