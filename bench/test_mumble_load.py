#!/usr/bin/env python3
"""Tests for mumble_load.py. Run: .venv/bin/python -m unittest -v test_mumble_load

The end-to-end test needs Debian's mumble-server (murmurd at /usr/sbin/murmurd)
and is skipped without it; the others need only the cryptography package.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import unittest
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import mumble_load as ml  # noqa: E402

MURMURD = "/usr/sbin/murmurd"

# OCB2 test vectors from Mumble's own tests, src/tests/TestCrypt/TestCrypt.cpp
# (TestCrypt::testvectors, "from draft-krovetz-ocb-00.txt"; the same in
# src/tests/TestCrypt.cpp of 1.3.x). Key and nonce are both 00 01 .. 0f.
RAWKEY = bytes(range(16))
BLANK_TAG = bytes.fromhex("BF31081307 73AD5EC70EC69E7875A7B0".replace(" ", ""))
LONG_TAG = bytes.fromhex("9DB0CDF880F73E3E10D4EB3217766688")
LONG_CRYPTED = bytes.fromhex(
    "F75D6BC8B4DC8D66B836A2B08B32A636" "9F1CD3C5228D79FD6C267F5F6AA7B231" "C7DFB9D59951AE9C")
# TestCrypt::authcrypt's nonce.
NONCE = bytes.fromhex("ffeeddccbbaa99887766554433221100")


class OCB2Tests(unittest.TestCase):
    def test_mumble_test_vectors(self):
        cs = ml.CryptStateOCB2(RAWKEY, RAWKEY, RAWKEY)
        ct, tag = cs.ocb_encrypt(b"", RAWKEY)
        self.assertEqual(ct, b"")
        self.assertEqual(tag, BLANK_TAG)
        ct, tag = cs.ocb_encrypt(bytes(range(40)), RAWKEY)
        self.assertEqual(ct, LONG_CRYPTED)
        self.assertEqual(tag, LONG_TAG)

    def test_ocb_round_trip_0_to_64(self):
        # TestCrypt::authcrypt: same tag on both sides, plaintext back.
        cs = ml.CryptStateOCB2(RAWKEY, NONCE, NONCE)
        for n in range(65):
            src = bytes((i + 1) & 0xFF for i in range(n))
            ct, enctag = cs.ocb_encrypt(src, NONCE)
            self.assertEqual(len(ct), n)
            plain, dectag, ok = cs.ocb_decrypt(ct, NONCE)
            self.assertTrue(ok, n)
            self.assertEqual(plain, src, n)
            self.assertEqual(dectag, enctag, n)

    def pair(self):
        client_nonce, server_nonce = bytes(range(100, 116)), bytes([0xFE] + [0x55] * 15)
        client = ml.CryptStateOCB2(RAWKEY, encrypt_iv=client_nonce, decrypt_iv=server_nonce)
        server = ml.CryptStateOCB2(RAWKEY, encrypt_iv=server_nonce, decrypt_iv=client_nonce)
        return client, server

    def test_packet_round_trip_0_to_64(self):
        # Packets are 4 bytes longer than the plaintext; the nonce byte wraps
        # (0xFE start) and the carry must reach the next byte on both sides.
        client, server = self.pair()
        for n in range(65):
            msg = bytes((7 * i + n) & 0xFF for i in range(n))
            packet = server.encrypt(msg)
            self.assertEqual(len(packet), n + 4)
            self.assertEqual(client.decrypt(packet), msg, n)
            self.assertEqual(server.decrypt(client.encrypt(msg)), msg, n)
        self.assertEqual(client.good, 65)
        self.assertEqual(bytes(client.decrypt_iv), bytes(server.encrypt_iv))

    def test_encrypt_increments_nonce_little_endian(self):
        cs = ml.CryptStateOCB2(RAWKEY, bytes([0xFF, 0xFF] + [0] * 14), RAWKEY)
        packet = cs.encrypt(b"x")
        self.assertEqual(bytes(cs.encrypt_iv), bytes([0, 0, 1] + [0] * 13))
        self.assertEqual(packet[0], 0)

    def test_replay_tamper_and_lost_packets(self):
        client, server = self.pair()
        p1 = server.encrypt(b"It was a funky funky town!")
        self.assertIsNotNone(client.decrypt(p1))
        self.assertIsNone(client.decrypt(p1), "a replay must be refused")
        p2 = bytearray(server.encrypt(b"It was a funky funky town!"))
        for bit in range(len(p2) * 8):
            p2[bit // 8] ^= 1 << (bit % 8)
            self.assertIsNone(client.decrypt(bytes(p2)), bit)
            p2[bit // 8] ^= 1 << (bit % 8)
        self.assertIsNotNone(client.decrypt(bytes(p2)))
        for _ in range(20):  # 20 lost, then in order again
            server.encrypt(b"lost")
        self.assertEqual(client.decrypt(server.encrypt(b"after")), b"after")
        self.assertEqual(client.lost, 20)

    def test_xex_counter_measure_matches_murmurd(self):
        # A zero second-to-last block is flipped on encryption; decryption
        # returns the flipped plaintext (as murmurd's does), not a failure.
        client, server = self.pair()
        msg = b"\x01" * 16 + bytes(16) + b"tail"
        out = client.decrypt(server.encrypt(msg))
        self.assertIsNotNone(out)
        self.assertEqual(out[16], 1)
        self.assertEqual(out[17:], msg[17:])


class VarintTests(unittest.TestCase):
    # (value, encoded width, first byte's fixed prefix bits, its mask)
    WIDTHS = [
        (0, 1, 0x00, 0x80), (0x7F, 1, 0x00, 0x80),
        (0x80, 2, 0x80, 0xC0), (0x3FFF, 2, 0x80, 0xC0),
        (0x4000, 3, 0xC0, 0xE0), (0x1FFFFF, 3, 0xC0, 0xE0),
        (0x200000, 4, 0xE0, 0xF0), (0xFFFFFFF, 4, 0xE0, 0xF0),
        (0x10000000, 5, 0xF0, 0xFF), (0xFFFFFFFF, 5, 0xF0, 0xFF),
        (0x100000000, 9, 0xF4, 0xFF), (2**64 - 1, 9, 0xF4, 0xFF),
        (-1, 1, 0xFC, 0xFC), (-4, 1, 0xFC, 0xFC), (-5, 2, 0xF8, 0xFF), (-0x1000, 3, 0xF8, 0xFF),
    ]

    def test_every_width_round_trips(self):
        for value, width, prefix, mask in self.WIDTHS:
            enc = ml.varint_encode(value)
            self.assertEqual(len(enc), width, hex(value))
            self.assertEqual(enc[0] & mask, prefix, hex(value))
            self.assertEqual(ml.varint_decode(b"\xaa" + enc + b"\xbb", 1), (value, 1 + width), hex(value))

    def test_known_encodings(self):
        self.assertEqual(ml.varint_encode(80 | ml.OPUS_TERMINATOR), b"\xa0\x50")
        self.assertEqual(ml.varint_encode(0x123456), b"\xd2\x34\x56")
        self.assertEqual(ml.varint_encode(-1), b"\xfc")

    def test_truncated(self):
        for value, width, *_ in self.WIDTHS:
            if width > 1:
                with self.assertRaises(ValueError):
                    ml.varint_decode(ml.varint_encode(value)[:-1])
        with self.assertRaises(ValueError):
            ml.varint_decode(b"")

    def test_voice_packet_layout(self):
        p = ml.voice_plaintext(5, ml.filler(80), last=True)
        self.assertEqual(p[0], 0x80)  # Opus (4) << 5, target 0
        self.assertEqual(p[1], 5)
        self.assertEqual(p[2:4], b"\xa0\x50")  # 80 | 0x2000
        self.assertEqual(len(p), 4 + 80)
        self.assertNotIn(0, ml.filler(600))
        self.assertEqual(ml.voice_plaintext(5, b"ab", last=False)[2], 2)
        # Anything murmurd forwards is longer than its ping replies (counted out by size).
        self.assertGreater(4 + 1 + len(ml.voice_plaintext(0, b"x", False)), ml.PING_REPLY_LEN)


class ProtobufTests(unittest.TestCase):
    def test_authenticate(self):
        self.assertEqual(ml.encode_authenticate("l0001", opus=True), b"\x0a\x05l0001\x28\x01")

    def test_version_and_frame(self):
        body = ml.encode_version()
        self.assertTrue(body.startswith(b"\x08\x84\x84\x04"))  # field 1 = 0x010204
        self.assertEqual(ml.pb_decode(body)[1], [0x010204])
        self.assertEqual(ml.frame(ml.MSG_AUTHENTICATE, b"abc"), b"\x00\x02\x00\x00\x00\x03abc")

    def test_cryptsetup(self):
        key, cn, sn = bytes(range(16)), bytes(range(16, 32)), bytes(range(32, 48))
        body = (b"\x0a\x10" + key + b"\x38\x96\x01"  # an unknown varint field 7 = 150, skipped
                + b"\x12\x10" + cn + b"\x1a\x10" + sn)
        self.assertEqual(ml.decode_cryptsetup(body), (key, cn, sn))
        self.assertEqual(ml.decode_cryptsetup(b""), (None, None, None))  # murmurd's resync request
        with self.assertRaises(ValueError):
            ml.decode_cryptsetup(b"\x0a\x10" + key[:5])

    def test_serversync_and_reject(self):
        body = ml.pb_uint(1, 300) + ml.pb_uint(2, 72000) + ml.pb_bytes(3, "welcome") + b"\x21" + bytes(8)
        self.assertEqual(ml.decode_serversync(body), 300)
        self.assertEqual(ml.decode_reject(ml.pb_uint(1, 6) + ml.pb_bytes(2, "Server is full")),
                         (6, "Server is full"))


class IniTests(unittest.TestCase):
    def test_ini(self):
        text = ml.murmur_ini(Path("/tmp/mumble_load.x"), 12345, 1010)
        lines = text.splitlines()
        kv = dict(line.split("=", 1) for line in lines)
        self.assertEqual(len(kv), len(lines), "every line is key=value, once")
        for line in lines:
            self.assertNotRegex(line, r"[;#]", "QSettings would read an inline comment as the value")
            self.assertEqual(line, line.strip())
        self.assertEqual(kv["autobanAttempts"], "0")
        self.assertEqual(kv["autobanTimeframe"], "0")
        self.assertEqual(kv["autobanTime"], "0")
        self.assertEqual(kv["users"], "1010")
        self.assertEqual(kv["port"], "12345")
        self.assertEqual(kv["host"], "127.0.0.1")
        self.assertEqual(kv["database"], "/tmp/mumble_load.x/murmur.sqlite")
        for key, value in [("ice", ""), ("dbus", ""), ("bonjour", "false"), ("usersperchannel", "0"),
                           ("bandwidth", "72000"), ("allowping", "false"), ("registerName", ""),
                           ("opusthreshold", "0")]:
            self.assertEqual(kv[key], value, key)


class CpuClockTests(unittest.TestCase):
    def busy(self, seconds: float = 0.2) -> None:
        t = time.process_time()
        while time.process_time() - t < seconds:
            pass

    def test_clock_gettime_and_proc_fallback(self):
        read, source = ml.process_cpu_clock(os.getpid())
        self.assertEqual(source, "clock_gettime")
        with mock.patch.object(ml.time, "clock_gettime_ns", side_effect=OSError(22, "Invalid argument")):
            read_proc, source_proc = ml.process_cpu_clock(os.getpid())
        self.assertEqual(source_proc, "/proc/PID/stat")
        a, b = read(), read_proc()
        self.busy()
        self.assertAlmostEqual(read() - a, 0.2, delta=0.1)
        self.assertAlmostEqual(read_proc() - b, 0.2, delta=0.1)  # clock ticks: 10 ms


class CommandLineTests(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, str(HERE / "mumble_load.py"), *args],
                              capture_output=True, text=True, timeout=60)

    def test_missing_murmurd_is_one_actionable_line(self):
        p = self.run_script("--listeners", "1", "--seconds", "1", "--murmurd", "/nonexistent/murmurd")
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stdout, "")
        self.assertIn("murmurd not found at /nonexistent/murmurd; install mumble-server", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)

    def test_bad_arguments(self):
        self.assertEqual(self.run_script("--listeners", "0", "--seconds", "1").returncode, 2)


@unittest.skipUnless(os.path.exists(MURMURD), f"murmurd not installed at {MURMURD} "
                     "(apt-get install -y mumble-server, or make deps)")
class EndToEndTests(unittest.TestCase):
    def test_five_listeners_two_seconds(self):
        p = subprocess.run([sys.executable, str(HERE / "mumble_load.py"), "--listeners", "5", "--seconds", "2"],
                           capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stdout)
        r = json.loads(lines[0])
        self.assertEqual(r["listeners"], 5)
        self.assertEqual(r["packets_sent"], 100)
        self.assertEqual(r["expected"], 500)
        self.assertGreaterEqual(r["datagrams_received"], 0.98 * r["expected"], p.stderr)
        self.assertLessEqual(r["datagrams_received"], r["expected"])
        self.assertGreater(r["server_cpu_seconds"], 0)
        self.assertGreater(r["cpu_us_per_packet"], 0)
        self.assertAlmostEqual(r["cpu_us_per_packet"],
                               r["server_cpu_seconds"] / r["expected"] * 1e6, delta=0.01)
        m = re.search(r"dir (\S+)\)", p.stderr)
        self.assertIsNotNone(m, p.stderr)
        self.assertFalse(os.path.exists(m.group(1)), "the temporary directory is removed")


if __name__ == "__main__":
    unittest.main()
