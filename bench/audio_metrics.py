#!/usr/bin/env python3
"""Audio metrics for the Squelch benchmarks: latency by GCC-PHAT, PESQ-WB and STOI.

Importable module and CLI:

    python3 audio_metrics.py latency REF DEG
    python3 audio_metrics.py quality REF DEG [--lenient]
    python3 audio_metrics.py bursts  REF DEG --send-times-ms 0,4000,8000 [--quality]
    python3 audio_metrics.py prepare IN OUT          # talker input: 48 kHz mono 16-bit, padded

Every command prints one JSON object on stdout. Problems with the input (missing
file, not a WAV, silence, no match) print one line on stderr and exit non-zero:
1 = the audio could not be measured, 2 = bad usage / unreadable input.

Conventions: every time is in milliseconds. A latency is the position in the
degraded recording of the reference's *first sample* (padding included), so
latency 0 means the two files line up as they are, and a positive latency means
the degraded copy is later.

Only numpy and scipy are needed for latency; pesq and pystoi are imported when
quality is asked for, so the latency tools run without them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from scipy.io import wavfile
from scipy.signal import resample_poly

# All analysis happens at 16 kHz: PESQ-WB and STOI need (or resample to) it,
# and 62.5 us per sample is far finer than the +-2 ms we have to resolve.
ANALYSIS_RATE = 16000

# GCC-PHAT band. Below 80 Hz there is only hum and DC offset, and above 7.6 kHz
# the 16 kHz resampler's anti-alias filter rolls the signal off; with PHAT every
# bin counts equally, so bins that carry no speech would only add noise.
PHAT_BAND_HZ = (80.0, 7600.0)

# A match is believed only when its peak stands this many standard deviations
# above the correlation at nearby lags. Measured on espeak speech: a clean copy
# scores in the thousands, 10-30 % of 20 ms chunks lost scores 200-600, noise
# at -10 dB SNR still ~40, while pure noise, or another sentence buried in
# noise, scores 4.5-7 (the largest of ~10^4 random values sits near 4 sigma).
MIN_PEAK_TO_NOISE = 10.0

# A second peak this close to the best one means the reference appears more
# than once (or is periodic) and the single-lag answer is a guess.
AMBIGUOUS_PROMINENCE = 1.5

# Peaks closer than this are the same peak (pitch periods and the main lobe).
PEAK_EXCLUSION_MS = 5.0

# Lags within this distance of the peak supply the noise floor for peak_to_noise.
NOISE_NEIGHBOURHOOD_MS = 1000.0

# Files shorter than this cannot be aligned meaningfully.
MIN_AUDIO_S = 0.1

# Below this peak level (-70 dBFS) a file is considered digital silence.
SILENCE_PEAK = 10 ** (-70 / 20)


class AudioError(Exception):
    """The audio could not be measured; the message says why, for a person."""


class InputError(AudioError):
    """A file is missing, unreadable or not usable WAV."""


AudioLike = Union[str, Path, "tuple[int, np.ndarray]"]


# --------------------------------------------------------------------------- I/O


def read_wav(path: Union[str, Path]) -> tuple[int, np.ndarray]:
    """Read a WAV as (rate, float64 mono samples in [-1, 1])."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a WAV file")
    try:
        rate, data = wavfile.read(str(p))
    except Exception as e:  # scipy raises ValueError/EOFError/struct.error for junk
        raise InputError(f"{p}: not a readable WAV file ({e})") from None
    return rate, _to_float_mono(data, str(p))


def _to_float_mono(data: np.ndarray, name: str) -> np.ndarray:
    if data.dtype == np.uint8:
        x = (data.astype(np.float64) - 128.0) / 128.0
    elif np.issubdtype(data.dtype, np.integer):
        # scipy left-justifies 24-bit into int32, so the dtype's range is right.
        x = data.astype(np.float64) / float(-np.iinfo(data.dtype).min)
    elif np.issubdtype(data.dtype, np.floating):
        x = data.astype(np.float64)
    else:
        raise InputError(f"{name}: unsupported sample type {data.dtype}")
    if x.ndim == 2:
        # Our pipeline writes mono; a stereo capture is mixed down rather than
        # refused, because both channels carry the same talker.
        x = x.mean(axis=1)
    if x.size == 0:
        raise InputError(f"{name}: WAV file has no samples")
    if not np.all(np.isfinite(x)):
        raise InputError(f"{name}: WAV file contains NaN or infinite samples")
    return x


def _load(audio: AudioLike, what: str) -> tuple[np.ndarray, str]:
    """Accept a path or a (rate, samples) tuple; return 16 kHz samples and a name."""
    if isinstance(audio, (str, Path)):
        rate, x = read_wav(audio)
        name = str(audio)
    else:
        try:
            rate, data = audio
        except (TypeError, ValueError):
            raise InputError(f"{what}: expected a path or a (rate, samples) tuple") from None
        name = f"<{what}>"
        x = _to_float_mono(np.asarray(data), name)
    if not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise InputError(f"{name}: invalid sample rate {rate!r}")
    return resample(x, int(rate), ANALYSIS_RATE), name


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling: exact for rational ratios such as 48k/16k and 22.05k/16k."""
    if rate_in == rate_out:
        return x
    g = math.gcd(rate_in, rate_out)
    return resample_poly(x, rate_out // g, rate_in // g)


def _check_long_enough(x: np.ndarray, name: str) -> None:
    # Shorter than this, a correlation peak says nothing: a few pitch periods
    # match almost anywhere, and the noise floor cannot be estimated.
    if x.size < MIN_AUDIO_S * ANALYSIS_RATE:
        raise InputError(f"{name}: only {x.size * 1000 / ANALYSIS_RATE:.1f} ms of audio; "
                         f"need at least {MIN_AUDIO_S * 1000:.0f} ms")


def _check_not_silent(x: np.ndarray, name: str) -> None:
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak < SILENCE_PEAK:
        level = "digital silence" if peak == 0 else f"peak {20 * math.log10(peak):.1f} dBFS"
        raise AudioError(f"{name}: recording is silent ({level}); nothing to measure")


# ----------------------------------------------------------------------- GCC-PHAT


@dataclass
class _Correlation:
    cc: np.ndarray  # normalised: 1.0 at the lag of an exact (delayed) copy
    first_lag: int  # lag, in samples, of cc[0]


def gcc_phat(degraded: np.ndarray, reference: np.ndarray, rate: int = ANALYSIS_RATE) -> tuple[np.ndarray, np.ndarray]:
    """GCC-PHAT of degraded against reference.

    Returns (lags in samples, correlation). A peak at lag k means degraded[t]
    resembles reference[t - k]: positive k = degraded is later. The correlation
    is scaled so an exact delayed copy peaks at 1.0.
    """
    c = _gcc_phat(np.asarray(degraded, float), np.asarray(reference, float), rate)
    return np.arange(c.first_lag, c.first_lag + c.cc.size), c.cc


def _gcc_phat(deg: np.ndarray, ref: np.ndarray, rate: int) -> _Correlation:
    # Linear (not circular) correlation needs room for every lag from
    # -(len(ref)-1) to len(deg)-1; scipy's fast length keeps the FFT cheap.
    from scipy.fft import next_fast_len

    n = next_fast_len(deg.size + ref.size - 1, real=True)
    spec = np.fft.rfft(deg, n) * np.conj(np.fft.rfft(ref, n))
    mag = np.abs(spec)
    # PHAT keeps only the phase, which makes the peak sharp regardless of the
    # speech spectrum. Bins where the cross-spectrum is exactly zero (e.g. a
    # file that is digital silence in that band) would divide 0 by 0: the tiny
    # relative floor gives them weight ~0 instead of NaN.
    floor = mag.max() * 1e-9 if mag.max() > 0 else 1.0
    freqs = np.fft.rfftfreq(n, 1.0 / rate)
    band = (freqs >= PHAT_BAND_HZ[0]) & (freqs <= min(PHAT_BAND_HZ[1], rate / 2))
    spec = np.where(band, spec / np.maximum(mag, floor), 0.0)
    cc = np.fft.irfft(spec, n)
    # What a perfect copy would score (all band bins coherent), for scaling to 1.
    perfect = np.fft.irfft(band.astype(float), n)[0]
    cc = cc / perfect if perfect > 0 else cc
    # Reorder so index 0 is the most negative lag.
    neg = ref.size - 1
    cc = np.concatenate((cc[n - neg:], cc[: deg.size])) if neg else cc[: deg.size].copy()
    return _Correlation(cc=cc, first_lag=-neg)


@dataclass
class _Peak:
    lag: float  # samples, sub-sample interpolated
    index: int
    height: float
    prominence: float
    peak_to_noise: float


def _pick_peak(cc: np.ndarray, lo: int, hi: int, rate: int) -> _Peak:
    """Best peak of cc[lo:hi] (indices into cc), with its confidence figures."""
    lo, hi = max(lo, 0), min(hi, cc.size)
    if hi - lo < 3:
        raise AudioError("search window is too short to hold a correlation peak")
    win = cc[lo:hi]
    i = int(np.argmax(win))
    height = float(win[i])
    # Parabolic interpolation: the PHAT peak is a few samples wide, so fitting
    # its top gives well under a sample of error.
    frac = 0.0
    if 0 < i < win.size - 1:
        a, b, c = win[i - 1], win[i], win[i + 1]
        denom = a - 2 * b + c
        if denom < 0:
            frac = float(np.clip(0.5 * (a - c) / denom, -0.5, 0.5))
    excl = int(round(PEAK_EXCLUSION_MS * rate / 1000))
    mask = np.ones(win.size, bool)
    mask[max(0, i - excl): i + excl + 1] = False
    rest = win[mask]
    if rest.size:
        second = float(rest.max())
        prominence = height / second if second > 0 else math.inf
        # The noise floor is taken from lags near the peak only: far lags
        # often slide the reference over digital silence, where the
        # correlation is ~0, and would make any peak look significant.
        near = int(NOISE_NEIGHBOURHOOD_MS * rate / 1000)
        local_mask = mask.copy()
        local_mask[: max(0, i - near)] = False
        local_mask[i + near + 1:] = False
        local = win[local_mask] if local_mask.sum() >= 50 else rest
        spread = float(np.std(local))
        ptn = (height - float(np.mean(local))) / spread if spread > 0 else math.inf
    else:
        prominence, ptn = math.inf, math.inf
    return _Peak(lag=lo + i + frac, index=lo + i, height=height, prominence=prominence, peak_to_noise=ptn)


def _finite(v: float) -> float | None:
    # "+ 0.0" turns -0.0 into 0.0 so the JSON never shows a negative zero.
    return round(v, 3) + 0.0 if math.isfinite(v) else None


# ------------------------------------------------------------------------ latency


@dataclass
class LatencyResult:
    latency_ms: float  # degraded minus reference; positive = degraded later
    peak: float  # correlation height, 1.0 = exact copy; drops with loss/noise/codec
    prominence: float  # peak / best other peak > 5 ms away; ~1 = ambiguous
    peak_to_noise: float  # peak in robust std devs above the correlation floor
    ambiguous: bool  # True when another lag matches nearly as well
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("latency_ms", "peak", "prominence", "peak_to_noise"):
            d[k] = _finite(d[k])
        return d


def latency(reference_wav: AudioLike, degraded_wav: AudioLike,
            max_latency_ms: float | None = None, min_latency_ms: float | None = None) -> LatencyResult:
    """Delay of degraded_wav relative to reference_wav, in ms, by GCC-PHAT.

    reference_wav holds the utterance once; degraded_wav is a recording that
    contains it once, anywhere (seconds of leading silence are fine). Either
    argument is a path or a (rate, samples) tuple, at any sample rate.
    min/max_latency_ms optionally restrict the lags searched.
    Raises AudioError when either file is silent or no convincing match exists.
    """
    ref, ref_name = _load(reference_wav, "reference")
    deg, deg_name = _load(degraded_wav, "degraded")
    return _latency(ref, ref_name, deg, deg_name, min_latency_ms, max_latency_ms)


def _latency(ref: np.ndarray, ref_name: str, deg: np.ndarray, deg_name: str,
             min_latency_ms: float | None, max_latency_ms: float | None) -> LatencyResult:
    if min_latency_ms is not None and max_latency_ms is not None and max_latency_ms <= min_latency_ms:
        raise InputError("max_latency_ms must be greater than min_latency_ms")
    _check_long_enough(ref, ref_name)
    _check_long_enough(deg, deg_name)
    _check_not_silent(ref, ref_name)
    _check_not_silent(deg, deg_name)
    corr = _gcc_phat(deg, ref, ANALYSIS_RATE)
    to_idx = lambda ms: int(round(ms * ANALYSIS_RATE / 1000)) - corr.first_lag
    lo = to_idx(min_latency_ms) if min_latency_ms is not None else 0
    hi = to_idx(max_latency_ms) + 1 if max_latency_ms is not None else corr.cc.size
    pk = _pick_peak(corr.cc, lo, hi, ANALYSIS_RATE)
    lat_ms = (pk.lag + corr.first_lag) * 1000.0 / ANALYSIS_RATE
    if pk.peak_to_noise < MIN_PEAK_TO_NOISE:
        raise AudioError(
            f"{deg_name}: the reference was not found in it (best match only "
            f"{pk.peak_to_noise:.1f} sigma above noise, need {MIN_PEAK_TO_NOISE:g}; "
            f"peak {pk.height:.3f} at {lat_ms:.1f} ms). Does it contain the utterance?")
    warnings = []
    ambiguous = pk.prominence < AMBIGUOUS_PROMINENCE
    if ambiguous:
        warnings.append(
            f"another lag matches almost as well (prominence {pk.prominence:.2f}); "
            "does the recording contain the utterance more than once? Use bursts.")
    # Sub-millisecond negatives are just interpolation around a zero delay.
    if lat_ms < -1.0:
        warnings.append("degraded is EARLIER than the reference (negative latency): are the arguments swapped?")
    return LatencyResult(latency_ms=lat_ms, peak=pk.height, prominence=pk.prominence,
                         peak_to_noise=pk.peak_to_noise, ambiguous=ambiguous, warnings=warnings)


# ------------------------------------------------------------------------- bursts


@dataclass
class Burst:
    index: int
    send_ms: float | None  # from the caller's schedule (None when not given)
    appear_ms: float | None  # where the reference's first sample appears in the recording
    latency_ms: float | None  # appear - send; None when the burst was not found
    peak: float | None = None
    peak_to_noise: float | None = None
    pesq_wb: float | None = None
    stoi: float | None = None
    note: str | None = None  # why it was not found / not scored

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("send_ms", "appear_ms", "latency_ms", "peak", "peak_to_noise", "pesq_wb", "stoi"):
            if d[k] is not None:
                d[k] = _finite(float(d[k]))
        return d


def find_bursts(reference: AudioLike, degraded: AudioLike, expected_count: int,
                send_times_ms: Sequence[float] | None = None, *,
                min_latency_ms: float = -20.0, max_latency_ms: float = 2000.0,
                with_quality: bool = False) -> list[Burst]:
    """Locate each repetition of `reference` in a recording of several.

    With send_times_ms (ms since the recording's first sample, on the same
    clock, increasing, one per repetition), repetition i is searched for
    between send_i + min_latency_ms and send_i + max_latency_ms, and never
    past send_{i+1} + min_latency_ms, so a lost burst cannot steal its
    neighbour's audio. Its latency is (appearance time) - send_i.

    Without a schedule, the expected_count best-matching, non-overlapping
    positions are taken and latency_ms is their time from the recording's start.

    A burst that is not in the recording (lost, muted) comes back with
    latency_ms None and a note, rather than failing the whole run.
    """
    if expected_count < 1:
        raise InputError("expected_count must be at least 1")
    if send_times_ms is not None:
        send = [float(s) for s in send_times_ms]
        if len(send) != expected_count:
            raise InputError(f"expected_count is {expected_count} but send_times_ms has {len(send)} entries")
        if any(not math.isfinite(s) for s in send):
            raise InputError("send_times_ms contains a non-finite value")
        if any(b <= a for a, b in zip(send, send[1:])):
            raise InputError("send_times_ms must be strictly increasing")
    if max_latency_ms <= min_latency_ms:
        raise InputError("max_latency_ms must be greater than min_latency_ms")

    ref, ref_name = _load(reference, "reference")
    deg, deg_name = _load(degraded, "degraded")
    _check_long_enough(ref, ref_name)
    _check_long_enough(deg, deg_name)
    _check_not_silent(ref, ref_name)
    _check_not_silent(deg, deg_name)
    ms = lambda samples: samples * 1000.0 / ANALYSIS_RATE
    smp = lambda t_ms: int(round(t_ms * ANALYSIS_RATE / 1000))

    if send_times_ms is None:
        windows = _blind_windows(deg, ref, expected_count)
        send = [None] * len(windows)
    else:
        windows = []
        for i, s in enumerate(send):
            end = s + max_latency_ms
            if i + 1 < len(send):
                end = min(end, send[i + 1] + min_latency_ms)
            windows.append((smp(s + min_latency_ms), smp(end)))

    bursts = []
    for i, ((lo, hi), s) in enumerate(zip(windows, send)):
        b = Burst(index=i, send_ms=s, appear_ms=None, latency_ms=None)
        bursts.append(b)
        # Correlate only the part of the recording this burst can occupy, so
        # each burst gets its own PHAT normalisation and confidence.
        seg_lo, seg_hi = max(lo, 0), min(hi + ref.size, deg.size)
        if hi <= 0 or seg_hi - seg_lo < ref.size // 4:
            b.note = "search window lies outside the recording"
            continue
        seg = deg[seg_lo:seg_hi]
        if np.max(np.abs(seg)) < SILENCE_PEAK:
            b.note = "recording is silent where this burst should be"
            continue
        corr = _gcc_phat(seg, ref, ANALYSIS_RATE)
        # Lags (relative to seg_lo) allowed for this burst.
        pk = _pick_peak(corr.cc, (lo - seg_lo) - corr.first_lag, (hi - seg_lo) - corr.first_lag + 1, ANALYSIS_RATE)
        appear = ms(seg_lo + corr.first_lag + pk.lag)
        b.peak, b.peak_to_noise = pk.height, pk.peak_to_noise
        if pk.peak_to_noise < MIN_PEAK_TO_NOISE:
            b.note = f"not found (best match {pk.peak_to_noise:.1f} sigma above noise)"
            continue
        b.appear_ms = appear
        b.latency_ms = appear - (s if s is not None else 0.0)
        if with_quality:
            try:
                q = _quality_at(ref, deg, int(round(appear * ANALYSIS_RATE / 1000)), strict=False)
                b.pesq_wb, b.stoi = q.pesq_wb, q.stoi
                if q.pesq_error:
                    b.note = q.pesq_error
            except AudioError as e:
                b.note = str(e)
    return bursts


def _blind_windows(deg: np.ndarray, ref: np.ndarray, count: int) -> list[tuple[int, int]]:
    """Without a schedule: lag windows around the `count` best non-overlapping matches."""
    corr = _gcc_phat(deg, ref, ANALYSIS_RATE)
    cc = corr.cc.copy()
    # Repetitions cannot overlap by more than half an utterance, so after taking
    # a peak, blank out that much either side before looking for the next.
    sep = max(ref.size // 2, 1)
    half = int(0.05 * ANALYSIS_RATE)
    found = []
    for _ in range(count):
        i = int(np.argmax(cc))
        if not math.isfinite(cc[i]) or cc[i] == -np.inf:
            break
        found.append(i + corr.first_lag)
        cc[max(0, i - sep): i + sep + 1] = -np.inf
    return [(lag - half, lag + half) for lag in sorted(found)]


def burst_latencies(reference: AudioLike, degraded: AudioLike, expected_count: int,
                    send_times_ms: Sequence[float] | None = None, **kwargs) -> list[float | None]:
    """Mouth-to-ear latency (ms) of each repetition: appearance time - send time.

    See find_bursts for the arguments. Entry i is None when burst i was not
    found in the recording.
    """
    return [b.latency_ms for b in find_bursts(reference, degraded, expected_count, send_times_ms, **kwargs)]


def summarize(values: Sequence[float | None]) -> dict:
    """mean/p50/p95/min/max over the found values, and how many were lost (None)."""
    v = np.array([x for x in values if x is not None], float)
    out = {"count": int(v.size), "missing": int(sum(x is None for x in values))}
    if v.size:
        out.update(mean=_finite(float(v.mean())), p50=_finite(float(np.percentile(v, 50))), p95=_finite(float(np.percentile(v, 95))),
                   min=_finite(float(v.min())), max=_finite(float(v.max())))
    return out


# ------------------------------------------------------------------------ quality


@dataclass
class QualityResult:
    pesq_wb: float | None  # ITU-T P.862.2 MOS-LQO, 1.04 .. 4.64
    stoi: float | None  # 0 .. 1
    latency_ms: float | None  # the alignment used
    pesq_error: str | None = None  # set (and pesq_wb None) only in lenient mode
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("pesq_wb", "stoi", "latency_ms"):
            if d[k] is not None:
                d[k] = _finite(d[k])
        return d


def quality(reference_wav: AudioLike, degraded_wav: AudioLike, strict: bool = True) -> QualityResult:
    """PESQ-WB and STOI of the degraded recording against the reference.

    The degraded file is first aligned with latency() and cut to the
    reference's length, so it may hold seconds of silence around the speech.
    With strict=False a PESQ failure gives pesq_wb None plus pesq_error
    instead of raising (STOI is still computed).
    """
    ref, ref_name = _load(reference_wav, "reference")
    deg, deg_name = _load(degraded_wav, "degraded")
    lat = _latency(ref, ref_name, deg, deg_name, None, None)
    q = _quality_at(ref, deg, int(round(lat.latency_ms * ANALYSIS_RATE / 1000)), strict)
    q.warnings = lat.warnings + q.warnings
    return q


def _quality_at(ref: np.ndarray, deg: np.ndarray, lag: int, strict: bool) -> QualityResult:
    warnings = []
    # Cut the degraded to the reference's span; zero-fill whatever the
    # recording lacks so both have equal length, which STOI requires.
    start, end = lag, lag + ref.size
    aligned = np.zeros(ref.size)
    src_lo, src_hi = max(start, 0), min(end, deg.size)
    if src_hi > src_lo:
        aligned[src_lo - start: src_hi - start] = deg[src_lo:src_hi]
    missing = ref.size - max(src_hi - src_lo, 0)
    if missing > 0:
        warnings.append(f"the recording does not cover {missing * 1000 / ANALYSIS_RATE:.0f} ms of the "
                        "reference; that part was scored as silence")
    if np.max(np.abs(aligned)) < SILENCE_PEAK:
        raise AudioError("the degraded audio is silent over the reference's span; PESQ/STOI cannot be computed")

    try:
        from pesq import pesq as _pesq, PesqError, NoUtterancesError, BufferTooShortError
        from pystoi import stoi as _stoi
    except ImportError as e:
        # A pesq wheel built against another numpy major also lands here.
        raise AudioError(f"quality needs working pesq and pystoi packages ({e}); "
                         "run setup-venv.sh (next to this script) and use its .venv/bin/python") from None

    # STOI first: it is pure numpy and does not fail on odd input.
    if ref.size < ANALYSIS_RATE * 0.4:
        raise AudioError(f"reference is only {ref.size * 1000 / ANALYSIS_RATE:.0f} ms long; "
                         "PESQ/STOI need at least ~0.4 s of speech")
    import warnings as _w
    with _w.catch_warnings(record=True) as caught:
        _w.simplefilter("always")
        stoi_v = float(_stoi(ref, aligned, ANALYSIS_RATE, extended=False))
    for c in caught:  # pystoi warns (and returns 1e-5) when too little speech
        warnings.append(f"STOI: {c.message}")

    pesq_v, pesq_err = None, None
    try:
        pesq_v = float(_pesq(ANALYSIS_RATE, ref, aligned, "wb"))
    except NoUtterancesError:
        pesq_err = ("PESQ found no utterances: after alignment the degraded (or the reference) holds no "
                    "speech-level signal. Is the recording silent or mostly lost?")
    except BufferTooShortError:
        pesq_err = "PESQ: the signal is too short (needs about 0.25 s or more)"
    except PesqError as e:
        pesq_err = f"PESQ failed: {type(e).__name__}: {e}"
    if pesq_err and strict:
        raise AudioError(pesq_err)
    return QualityResult(pesq_wb=pesq_v, stoi=stoi_v, latency_ms=lag * 1000.0 / ANALYSIS_RATE,
                         pesq_error=pesq_err, warnings=warnings)


# ------------------------------------------------------------------ talker input


def prepare_talker_wav(in_wav: Union[str, Path], out_wav: Union[str, Path], rate: int = 48000,
                       pad_s: float = 0.3, peak_dbfs: float = -3.0) -> dict:
    """Turn a TTS WAV into the benchmark's talker input.

    48 kHz mono 16-bit, peak normalised to peak_dbfs (a fixed level so runs are
    comparable and the codec never clips), pad_s of digital silence each end.
    Used by make_speech.sh when sox is missing.
    """
    src_rate, x = read_wav(in_wav)
    _check_not_silent(x, str(in_wav))
    y = resample(x, src_rate, rate)
    y *= 10 ** (peak_dbfs / 20) / np.max(np.abs(y))
    pad = np.zeros(int(round(pad_s * rate)))
    y = np.concatenate((pad, y, pad))
    pcm = np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16)
    try:
        wavfile.write(str(out_wav), rate, pcm)
    except OSError as e:
        raise InputError(f"{out_wav}: cannot write ({e.strerror})") from None
    return {"output": str(out_wav), "rate": rate, "seconds": round(pcm.size / rate, 3)}


# ---------------------------------------------------------------------------- CLI


def _parse_times(text: str) -> list[float]:
    try:
        return [float(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None


def _times_from_file(path: str) -> list[float]:
    """A JSON list of numbers, or an object with a send_times_ms list."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict):
        data = data.get("send_times_ms")
    if not isinstance(data, list) or not all(isinstance(t, (int, float)) for t in data):
        raise InputError(f"{path}: expected a JSON list of numbers or {{\"send_times_ms\": [...]}}")
    return [float(t) for t in data]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("latency", help="delay of DEG relative to REF (GCC-PHAT), JSON")
    p.add_argument("ref"), p.add_argument("deg")
    p.add_argument("--max-latency-ms", type=float), p.add_argument("--min-latency-ms", type=float)
    p = sub.add_parser("quality", help="PESQ-WB and STOI of DEG against REF after alignment, JSON")
    p.add_argument("ref"), p.add_argument("deg")
    p.add_argument("--lenient", action="store_true", help="report a PESQ failure in the JSON instead of exiting 1")
    p = sub.add_parser("bursts", help="per-repetition latency in a recording of several repetitions, JSON")
    p.add_argument("ref"), p.add_argument("deg")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--send-times-ms", type=_parse_times, help="comma-separated send times, ms since recording start")
    g.add_argument("--schedule", help="JSON file: a list of send times (ms) or {\"send_times_ms\": [...]}")
    p.add_argument("--expected-count", type=int, help="number of repetitions (default: length of the schedule)")
    p.add_argument("--min-latency-ms", type=float, default=-20.0)
    p.add_argument("--max-latency-ms", type=float, default=2000.0)
    p.add_argument("--quality", action="store_true", help="also score each found burst with PESQ-WB and STOI")
    p = sub.add_parser("prepare", help="convert a TTS WAV to the 48 kHz mono 16-bit talker input")
    p.add_argument("input"), p.add_argument("output")
    p.add_argument("--rate", type=int, default=48000), p.add_argument("--pad-s", type=float, default=0.3)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "latency":
            r = latency(args.ref, args.deg, max_latency_ms=args.max_latency_ms, min_latency_ms=args.min_latency_ms)
            out = r.to_dict()
        elif args.cmd == "quality":
            out = quality(args.ref, args.deg, strict=not args.lenient).to_dict()
        elif args.cmd == "bursts":
            send = args.send_times_ms if args.send_times_ms is not None else (
                _times_from_file(args.schedule) if args.schedule else None)
            count = args.expected_count if args.expected_count is not None else (
                len(send) if send is not None else None)
            if count is None:
                ap.error("bursts needs --send-times-ms, --schedule or --expected-count")
            bursts = find_bursts(args.ref, args.deg, count, send, min_latency_ms=args.min_latency_ms,
                                 max_latency_ms=args.max_latency_ms, with_quality=args.quality)
            out = {"bursts": [b.to_dict() for b in bursts],
                   "latency_ms": summarize([b.latency_ms for b in bursts])}
            if args.quality:
                out["pesq_wb"] = summarize([b.pesq_wb for b in bursts])
                out["stoi"] = summarize([b.stoi for b in bursts])
            lost = [b.index for b in bursts if b.latency_ms is None]
            if lost and len(lost) < len(bursts):
                print(f"warning: {len(lost)} of {count} bursts not found (indices {lost})", file=sys.stderr)
            if all(b.latency_ms is None for b in bursts):
                print(json.dumps(out, indent=2))
                print(f"error: none of the {count} bursts was found in {args.deg}", file=sys.stderr)
                return 1
        else:
            out = prepare_talker_wav(args.input, args.output, rate=args.rate, pad_s=args.pad_s)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except AudioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for w in out.get("warnings", []) if isinstance(out, dict) else []:
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
