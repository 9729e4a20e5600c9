#!/usr/bin/env python3
"""Tests for audio_metrics.py. Run: .venv/bin/python -m unittest -v test_audio_metrics

Speech comes from espeak-ng when it is installed (as on the benchmark
machines); otherwise from a synthetic voiced signal, so the tests still run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
from scipy.io import wavfile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import audio_metrics as am  # noqa: E402

RATE = 48000
SENTENCE = "Dispatch to unit seven. Proceed to the north gate and report on arrival."
HAVE_ESPEAK = shutil.which("espeak-ng") is not None


def synthetic_speech(rate: int, seconds: float = 3.0, seed: int = 7) -> np.ndarray:
    """Voiced 'syllables': harmonic stacks with a wandering pitch, separated by pauses.

    Not speech, but it has what GCC-PHAT and PESQ care about: broadband
    harmonics, changing pitch and silence between words.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 30))
    env = np.zeros_like(t)
    pos = 0.1
    while pos < seconds - 0.3:
        dur = rng.uniform(0.15, 0.35)
        sel = (t >= pos) & (t < pos + dur)
        env[sel] = np.sin(np.pi * (t[sel] - pos) / dur)
        pos += dur + rng.uniform(0.05, 0.2)
    y = x * env + 0.02 * rng.standard_normal(t.size) * env  # a little breath noise
    return 0.5 * y / np.max(np.abs(y))


def make_reference(tmp: Path) -> np.ndarray:
    """The talker utterance at 48 kHz with 0.3 s padding, as float in [-1, 1]."""
    if HAVE_ESPEAK:
        raw = tmp / "espeak.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), SENTENCE], check=True)
        rate, x = am.read_wav(raw)
        x = am.resample(x, rate, RATE)
    else:
        x = synthetic_speech(RATE)
    x = 0.7 * x / np.max(np.abs(x))
    pad = np.zeros(int(0.3 * RATE))
    return np.concatenate((pad, x, pad))


def write16(path: Path, x: np.ndarray, rate: int = RATE) -> Path:
    wavfile.write(str(path), rate, np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16))
    return path


def delayed(x: np.ndarray, ms: float, tail_s: float = 1.0, rate: int = RATE) -> np.ndarray:
    """A 'real-time recording': silence, the utterance starting ms later, silence."""
    return np.concatenate((np.zeros(int(round(ms * rate / 1000))), x, np.zeros(int(tail_s * rate))))


def with_gaps(x: np.ndarray, fraction: float = 0.10, chunk_ms: float = 20, seed: int = 1,
              rate: int = RATE) -> np.ndarray:
    """Zero out a random `fraction` of 20 ms chunks, like lost packets with no concealment."""
    rng = np.random.default_rng(seed)
    y = x.copy()
    n = int(rate * chunk_ms / 1000)
    for i in range(0, y.size, n):
        if rng.random() < fraction:
            y[i:i + n] = 0
    return y


def with_noise(x: np.ndarray, snr_db: float, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.mean(x[np.abs(x) > 1e-3] ** 2)
    return x + rng.normal(0, np.sqrt(p / 10 ** (snr_db / 10)), x.size)


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = Path(cls._tmp.name)
        cls.ref = make_reference(cls.tmp)
        cls.ref_path = write16(cls.tmp / "ref.wav", cls.ref)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()


class LatencyTests(Base):
    DELAYS = (0, 37, 120, 2500)

    def test_known_delays_within_2ms(self):
        for ms in self.DELAYS:
            with self.subTest(delay_ms=ms):
                deg = write16(self.tmp / f"deg_{ms}.wav", delayed(self.ref, ms))
                r = am.latency(self.ref_path, deg)
                self.assertAlmostEqual(r.latency_ms, ms, delta=2.0)
                self.assertGreater(r.peak, 0.9)
                self.assertFalse(r.ambiguous)

    def test_gaps_and_noise_within_5ms(self):
        for ms in self.DELAYS:
            with self.subTest(delay_ms=ms):
                deg = with_noise(with_gaps(delayed(self.ref, ms), 0.10, seed=ms), 15, seed=ms)
                r = am.latency(self.ref_path, write16(self.tmp / f"gap_{ms}.wav", deg))
                self.assertAlmostEqual(r.latency_ms, ms, delta=5.0)

    def test_leading_silence_of_several_seconds_with_noise_floor(self):
        deg = with_noise(delayed(self.ref, 6000, tail_s=3), 20)
        r = am.latency(self.ref_path, write16(self.tmp / "long.wav", deg))
        self.assertAlmostEqual(r.latency_ms, 6000, delta=2.0)

    def test_different_rates_and_float_wav(self):
        # Reference at 22.05 kHz float32, degraded at 48 kHz int16.
        ref22 = am.resample(self.ref, RATE, 22050).astype(np.float32)
        ref_path = self.tmp / "ref22.wav"
        wavfile.write(str(ref_path), 22050, ref22)
        deg = write16(self.tmp / "deg48.wav", delayed(self.ref, 250))
        self.assertAlmostEqual(am.latency(ref_path, deg).latency_ms, 250, delta=2.0)

    def test_arrays_accepted(self):
        r = am.latency((RATE, self.ref), (RATE, delayed(self.ref, 80)))
        self.assertAlmostEqual(r.latency_ms, 80, delta=2.0)

    def test_degraded_earlier_is_negative(self):
        # Degraded lacks the first 50 ms of the reference: it is "early".
        r = am.latency((RATE, self.ref), (RATE, self.ref[int(0.05 * RATE):]))
        self.assertAlmostEqual(r.latency_ms, -50, delta=2.0)

    def test_repeated_utterance_flagged_ambiguous(self):
        deg = np.concatenate((delayed(self.ref, 100), delayed(self.ref, 100)))
        self.assertTrue(am.latency((RATE, self.ref), (RATE, deg)).ambiguous)

    def test_gcc_phat_sign_and_scale(self):
        x = np.random.default_rng(0).standard_normal(4000)
        lags, cc = am.gcc_phat(np.concatenate((np.zeros(123), x)), x)
        self.assertEqual(lags[np.argmax(cc)], 123)
        self.assertAlmostEqual(cc.max(), 1.0, delta=0.05)


class BurstTests(Base):
    def recording(self, send, lat, noise=0.002):
        total = int((send[-1] + 3000) * RATE / 1000) + self.ref.size
        rec = np.zeros(total)
        for s, l in zip(send, lat):
            if l is not None:
                i = int(round((s + l) * RATE / 1000))
                rec[i:i + self.ref.size] += self.ref
        return rec + np.random.default_rng(5).normal(0, noise, rec.size)

    def test_latency_per_burst_with_schedule(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [300 + i * (dur_ms + 1500) for i in range(5)]
        lat = [95, 132.5, 88, 410, 1250]
        got = am.burst_latencies((RATE, self.ref), (RATE, self.recording(send, lat)), 5, send)
        for g, want in zip(got, lat):
            self.assertAlmostEqual(g, want, delta=2.0)

    def test_lost_burst_is_none_and_does_not_steal_neighbour(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [300 + i * (dur_ms + 1000) for i in range(4)]
        lat = [100, None, 120, 110]
        got = am.burst_latencies((RATE, self.ref), (RATE, self.recording(send, lat)), 4, send,
                                 max_latency_ms=3000)
        self.assertIsNone(got[1])
        for i in (0, 2, 3):
            self.assertAlmostEqual(got[i], lat[i], delta=2.0)

    def test_with_gaps(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [500 + i * (dur_ms + 2000) for i in range(3)]
        rec = with_gaps(self.recording(send, [150, 160, 170]), 0.10)
        got = am.burst_latencies((RATE, self.ref), (RATE, rec), 3, send)
        for g, want in zip(got, [150, 160, 170]):
            self.assertAlmostEqual(g, want, delta=5.0)

    def test_without_schedule_gives_appearance_times(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [200 + i * (dur_ms + 1000) for i in range(3)]
        rec = self.recording(send, [100, 100, 100])
        got = am.burst_latencies((RATE, self.ref), (RATE, rec), 3)
        for g, s in zip(got, send):
            self.assertAlmostEqual(g, s + 100, delta=2.0)

    def test_bad_schedule(self):
        with self.assertRaises(am.InputError):
            am.burst_latencies((RATE, self.ref), (RATE, self.ref), 2, [0])
        with self.assertRaises(am.InputError):
            am.burst_latencies((RATE, self.ref), (RATE, self.ref), 2, [500, 100])

    def test_summarize(self):
        s = am.summarize([10.0, None, 20.0, 30.0])
        self.assertEqual((s["count"], s["missing"], s["p50"]), (3, 1, 20.0))


class QualityTests(Base):
    def test_identical(self):
        q = am.quality(self.ref_path, self.ref_path)
        self.assertGreaterEqual(q.pesq_wb, 4.3)
        self.assertGreater(q.stoi, 0.99)

    def test_identical_but_delayed_is_aligned(self):
        deg = write16(self.tmp / "q_delay.wav", delayed(self.ref, 2500))
        q = am.quality(self.ref_path, deg)
        self.assertAlmostEqual(q.latency_ms, 2500, delta=1)
        self.assertGreaterEqual(q.pesq_wb, 4.3)
        self.assertGreater(q.stoi, 0.99)

    def test_gapped_scores_lower(self):
        clean = am.quality(self.ref_path, self.ref_path)
        deg = write16(self.tmp / "q_gap.wav", with_gaps(delayed(self.ref, 120), 0.10))
        q = am.quality(self.ref_path, deg)
        self.assertLess(q.pesq_wb, clean.pesq_wb - 0.5)
        self.assertLess(q.stoi, clean.stoi)
        self.assertGreater(q.stoi, 0.5)

    def test_recording_cut_short_is_warned(self):
        deg = delayed(self.ref, 100)[: int(0.1 * RATE) + self.ref.size // 2]
        q = am.quality((RATE, self.ref), (RATE, deg))
        self.assertTrue(any("does not cover" in w for w in q.warnings))

    def test_pesq_error_has_clear_message(self):
        import pesq
        with mock.patch.object(pesq, "pesq", side_effect=pesq.NoUtterancesError("x")):
            with self.assertRaisesRegex(am.AudioError, "no utterances"):
                am.quality((RATE, self.ref), (RATE, self.ref))
            q = am.quality((RATE, self.ref), (RATE, self.ref), strict=False)
            self.assertIsNone(q.pesq_wb)
            self.assertIn("no utterances", q.pesq_error)
            self.assertGreater(q.stoi, 0.99)

    def test_burst_quality(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [300, 300 + dur_ms + 1500]
        rec = np.zeros(int((send[-1] + dur_ms + 2000) * RATE / 1000))
        for s in send:
            i = int((s + 100) * RATE / 1000)
            rec[i:i + self.ref.size] = self.ref
        bursts = am.find_bursts((RATE, self.ref), (RATE, rec), 2, send, with_quality=True)
        for b in bursts:
            self.assertGreaterEqual(b.pesq_wb, 4.3)


class BadInputTests(Base):
    def test_missing_file(self):
        with self.assertRaisesRegex(am.InputError, "no such file"):
            am.latency(self.tmp / "nope.wav", self.ref_path)

    def test_not_a_wav(self):
        junk = self.tmp / "junk.wav"
        junk.write_text("this is not audio")
        with self.assertRaisesRegex(am.InputError, "not a readable WAV"):
            am.latency(self.ref_path, junk)

    def test_silent_recording(self):
        silent = write16(self.tmp / "silent.wav", np.zeros(RATE * 3))
        with self.assertRaisesRegex(am.AudioError, "silent"):
            am.latency(self.ref_path, silent)
        with self.assertRaisesRegex(am.AudioError, "silent"):
            am.quality(self.ref_path, silent)

    def test_noise_without_speech(self):
        noise = write16(self.tmp / "noise.wav", np.random.default_rng(9).normal(0, 0.05, RATE * 8))
        with self.assertRaisesRegex(am.AudioError, "not found"):
            am.latency(self.ref_path, noise)

    def test_empty_wav(self):
        empty = write16(self.tmp / "empty.wav", np.zeros(0))
        with self.assertRaisesRegex(am.InputError, "no samples"):
            am.latency(self.ref_path, empty)


class CliTests(Base):
    def run_cli(self, *args):
        return subprocess.run([sys.executable, str(HERE / "audio_metrics.py"), *map(str, args)],
                              capture_output=True, text=True)

    def test_latency_json(self):
        deg = write16(self.tmp / "cli_deg.wav", delayed(self.ref, 120))
        p = self.run_cli("latency", self.ref_path, deg)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertAlmostEqual(out["latency_ms"], 120, delta=2)
        for k in ("peak", "prominence", "peak_to_noise", "ambiguous"):
            self.assertIn(k, out)

    def test_quality_json(self):
        p = self.run_cli("quality", self.ref_path, self.ref_path)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertGreaterEqual(out["pesq_wb"], 4.3)

    def test_bursts_json(self):
        dur_ms = self.ref.size * 1000 / RATE
        send = [300, 300 + dur_ms + 1500]
        rec = np.zeros(int((send[-1] + dur_ms + 2000) * RATE / 1000))
        for s in send:
            i = int((s + 90) * RATE / 1000)
            rec[i:i + self.ref.size] = self.ref
        deg = write16(self.tmp / "cli_bursts.wav", rec)
        p = self.run_cli("bursts", self.ref_path, deg, "--send-times-ms", ",".join(f"{s:.3f}" for s in send))
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertEqual(out["latency_ms"]["count"], 2)
        self.assertAlmostEqual(out["latency_ms"]["p50"], 90, delta=2)

    def test_errors_exit_nonzero_with_message(self):
        p = self.run_cli("latency", self.tmp / "missing.wav", self.ref_path)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no such file", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        silent = write16(self.tmp / "cli_silent.wav", np.zeros(RATE))
        p = self.run_cli("quality", self.ref_path, silent)
        self.assertEqual(p.returncode, 1)
        self.assertIn("silent", p.stderr)
        self.assertNotIn("Traceback", p.stderr)


class TalkerInputTests(unittest.TestCase):
    def test_prepare_talker_wav(self):
        with tempfile.TemporaryDirectory() as d:
            src = write16(Path(d) / "in.wav", synthetic_speech(22050, 2.0), rate=22050)
            out = Path(d) / "talker.wav"
            am.prepare_talker_wav(src, out)
            rate, data = wavfile.read(out)
            self.assertEqual((rate, data.dtype, data.ndim), (48000, np.int16, 1))
            pad = int(0.3 * 48000)
            self.assertFalse(data[:pad].any() or data[-pad:].any())
            self.assertAlmostEqual(np.max(np.abs(data)) / 32767, 10 ** (-3 / 20), delta=0.01)

    @unittest.skipUnless(HAVE_ESPEAK, "espeak-ng not installed")
    def test_make_speech_sh(self):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "talker.wav"
            p = subprocess.run(["bash", str(HERE / "make_speech.sh"), str(out)], capture_output=True, text=True,
                               env={"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHON": sys.executable})
            self.assertEqual(p.returncode, 0, p.stderr)
            rate, data = wavfile.read(out)
            self.assertEqual((rate, data.dtype, data.ndim), (48000, np.int16, 1))
            self.assertGreater(data.size / rate, 2.0)
            self.assertFalse(data[: int(0.29 * rate)].any())

    def test_make_speech_sh_without_espeak(self):
        with tempfile.TemporaryDirectory() as d:
            # A PATH with the shell tools but no espeak-ng.
            for tool in ("bash", "dirname", "mktemp", "rm"):
                Path(d, tool).symlink_to(shutil.which(tool))
            p = subprocess.run([shutil.which("bash"), str(HERE / "make_speech.sh"), str(Path(d) / "o.wav")],
                               capture_output=True, text=True, env={"PATH": d})
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("apt-get install -y espeak-ng", p.stderr)


if __name__ == "__main__":
    unittest.main()
