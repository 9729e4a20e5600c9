#!/usr/bin/env python3
"""Mumble fan-out load: murmurd's server CPU per forwarded voice packet.

    bench/.venv/bin/python3 bench/mumble_load.py --listeners N --seconds S \\
        [--payload 80] [--rate 50] [--murmurd /usr/sbin/murmurd] [--port 0]

The same shape as squelch-bench's fan-out: one talker, N listeners in one
channel, loopback. The script starts its own murmurd (Debian's mumble-server
1.3.4) in a temporary directory with a murmur.ini made for the benchmark,
connects N listeners and one talker over TLS, makes murmurd use UDP for every
one of them (an encrypted UDP ping each, answered before talking starts), then
has the talker send S seconds of legacy-format Opus packets (`payload` bytes of
filler each, `rate` per second, OCB2-AES128 as Mumble encrypts them). Listeners
only count the datagrams they receive; one of them decrypts everything it gets,
which proves the crypto and the packet format. While the talker talks, every
listener's socket waits in this process's one event loop (epoll), as
squelch-bench's listeners and its kernel floor's reader wait: on loopback,
waking a sleeping reader is part of what each send costs the server.

murmurd's CPU time (user + system, whole process) is taken over the talk window:
from just before the first voice packet to TAIL_S after the last one. It
includes the keepalives (each client's TCP Ping and UDP ping every 5 s, as
Mumble's client sends them), which cost murmurd about 0.1 CPU s/s at 1,000
listeners: idle_cpu_per_s measures that just before the talk.

stdout: one JSON object on one line:
    listeners, packets_sent, datagrams_received, expected (= packets_sent *
    listeners), server_cpu_seconds, cpu_us_per_packet (= server_cpu_seconds /
    expected * 1e6), seconds (as asked), window_seconds (the CPU window),
    idle_cpu_per_s (murmurd's CPU seconds per second with everyone connected
    and keeping alive but nobody talking). The forwarding cost alone, as in
    shared/reference/relay-vs-mumble.md, is
    (server_cpu_seconds - idle_cpu_per_s * window_seconds) / expected.
stderr: progress, warnings, and on failure one line "mumble_load: <what to do>"
(exit 2), followed by the end of murmurd's output when murmurd is what failed.

Facts about murmurd used here are from Mumble 1.3.4's sources
(src/murmur/Server.cpp, src/CryptState.cpp, src/Mumble.proto,
src/PacketDataStream.h); the reasons are in the comments where they matter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import random
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

try:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
except ImportError:  # reported when a CryptState is first made, so --help works without it
    Cipher = None

HOST = "127.0.0.1"
DEFAULT_MURMURD = "/usr/sbin/murmurd"
MURMUR_USER = "mumble-server"  # created by Debian's mumble-server package

# 1.2.4: new enough for Opus, old enough that a newer murmurd keeps the legacy UDP format.
CLIENT_VERSION = 1 << 16 | 2 << 8 | 4

# TCP message types: their order in MUMBLE_MH_ALL (src/Message.h).
MSG_VERSION, MSG_UDPTUNNEL, MSG_AUTHENTICATE, MSG_PING, MSG_REJECT, MSG_SERVERSYNC = 0, 1, 2, 3, 4, 5
MSG_CRYPTSETUP = 15

# UDP packet types (header byte >> 5) of the legacy format.
UDP_PING, UDP_OPUS = 1, 4
OPUS_TERMINATOR = 0x2000  # in the Opus length varint: last frame of the burst
OPUS_MAX_LEN = 0x1FFF

STARTUP_TIMEOUT_S = 30.0   # a first start benchmarks PBKDF2 (~1.5 s) and makes a certificate
HANDSHAKE_TIMEOUT_S = 30.0
UDP_READY_TIMEOUT_S = 30.0
CONNECT_BATCH = 50         # listeners handshaking at once
KEEPALIVE_S = 5.0          # TCP Ping and UDP ping period per client, as Mumble's client does
DRAIN_INTERVAL_S = 0.1     # listeners' UDP sockets are emptied this often (batching keeps it cheap)
UDP_RCVBUF = 256 * 1024    # ~5 s of voice per socket: a stalled drain loses nothing
IDLE_BASELINE_S = (2.0, 5.0)  # idle window: half the talk, within these bounds (it is noisy)
TAIL_S = 1.0               # CPU window ends this long after the last packet: in-flight forwards finish
AES_BLOCK = 16

# A UDP ping's timestamp is opaque to murmurd, which echoes the packet. Keeping
# it below 0x80 (one varint byte) makes every ping reply exactly 4 + 1 + 1 bytes,
# shorter than any voice packet (4 + header + session + sequence + length + opus),
# so listeners tell voice from ping replies by size without decrypting.
PING_REPLY_LEN = 6


class LoadError(Exception):
    """The benchmark cannot run or went wrong; the message says what to do, for a person."""


def log(msg: str) -> None:
    print(f"mumble_load: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------ Mumble varints


def varint_encode(value: int) -> bytes:
    """Mumble's PacketDataStream varint (not protobuf's): the first byte's high
    bits give the width: 0xxxxxxx, 10xxxxxx +1, 110xxxxx +2, 1110xxxx +3,
    11110000 + u32, 11110100 + u64; negatives as 111110__ (-1..-4) or 11111000 + ~value."""
    if value < 0:
        inv = ~value
        if inv <= 0x3:
            return bytes([0xFC | inv])
        return b"\xf8" + varint_encode(inv)
    if value < 0x80:
        return bytes([value])
    if value < 0x4000:
        return bytes([0x80 | (value >> 8), value & 0xFF])
    if value < 0x200000:
        return bytes([0xC0 | (value >> 16), (value >> 8) & 0xFF, value & 0xFF])
    if value < 0x10000000:
        return bytes([0xE0 | (value >> 24), (value >> 16) & 0xFF, (value >> 8) & 0xFF, value & 0xFF])
    if value < 0x100000000:
        return b"\xf0" + value.to_bytes(4, "big")
    if value < 0x10000000000000000:
        return b"\xf4" + value.to_bytes(8, "big")
    raise ValueError(f"varint out of range: {value}")


def varint_decode(buf: bytes, pos: int = 0) -> tuple[int, int]:
    """(value, position after it); ValueError when buf ends inside the varint."""
    def take(n: int) -> int:
        if pos + 1 + n > len(buf):
            raise ValueError("truncated varint")
        return int.from_bytes(buf[pos + 1:pos + 1 + n], "big")

    if pos >= len(buf):
        raise ValueError("truncated varint")
    v = buf[pos]
    if v & 0x80 == 0x00:
        return v, pos + 1
    if v & 0xC0 == 0x80:
        return (v & 0x3F) << 8 | take(1), pos + 2
    if v & 0xE0 == 0xC0:
        return (v & 0x1F) << 16 | take(2), pos + 3
    if v & 0xF0 == 0xE0:
        return (v & 0x0F) << 24 | take(3), pos + 4
    kind = v & 0xFC
    if kind == 0xF0:
        return take(4), pos + 5
    if kind == 0xF4:
        return take(8), pos + 9
    if kind == 0xF8:
        inner, end = varint_decode(buf, pos + 1)
        return ~inner, end
    return ~(v & 0x03), pos + 1  # 0xFC: -1..-4


# ------------------------------------------------- protobuf, by hand (5 messages)


def pb_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_uint(field: int, value: int) -> bytes:
    return pb_varint(field << 3 | 0) + pb_varint(value)


def pb_bytes(field: int, value: bytes | str) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    return pb_varint(field << 3 | 2) + pb_varint(len(value)) + value


def pb_decode(buf: bytes) -> dict[int, list]:
    """field number -> values: ints for varints, bytes for length-delimited and
    fixed-width fields. Unknown fields are kept, so callers just ignore them."""
    fields: dict[int, list] = {}
    pos = 0

    def read_varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(buf):
                raise ValueError("truncated protobuf varint")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while pos < len(buf):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = read_varint()
        elif wire in (1, 2, 5):
            n = 8 if wire == 1 else 4 if wire == 5 else read_varint()
            if pos + n > len(buf):
                raise ValueError("truncated protobuf field")
            value = buf[pos:pos + n]
            pos += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        fields.setdefault(field, []).append(value)
    return fields


def frame(msg_type: int, body: bytes) -> bytes:
    """Mumble's TCP framing: uint16 type, uint32 length, protobuf."""
    return struct.pack(">HI", msg_type, len(body)) + body


def encode_version() -> bytes:
    return (pb_uint(1, CLIENT_VERSION) + pb_bytes(2, "mumble_load") + pb_bytes(3, "Linux")
            + pb_bytes(4, "bench"))


def encode_authenticate(username: str, opus: bool = True) -> bytes:
    return pb_bytes(1, username) + pb_uint(5, int(opus))


def encode_ping(timestamp: int) -> bytes:
    return pb_uint(1, timestamp)


def decode_cryptsetup(body: bytes) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(key, client_nonce, server_nonce), each None when absent. All three at
    login; none when murmurd asks for our encrypt nonce (a resync)."""
    f = pb_decode(body)
    return tuple(f[n][-1] if n in f else None for n in (1, 2, 3))  # type: ignore[return-value]


def decode_serversync(body: bytes) -> int:
    f = pb_decode(body)
    if 1 not in f:
        raise ValueError("ServerSync without a session")
    return f[1][-1]


def decode_reject(body: bytes) -> tuple[int, str]:
    f = pb_decode(body)
    return f.get(1, [0])[-1], f.get(2, [b""])[-1].decode("utf-8", "replace")


# ------------------------------------------------------------- OCB2-AES128

_MASK128 = (1 << 128) - 1


def _s2(x: int) -> int:
    """Doubling in GF(2^128) on the block read big-endian, as Mumble's S2 macro does."""
    return ((x << 1) & _MASK128) ^ (0x87 if x >> 127 else 0)


def _s3(x: int) -> int:
    return x ^ _s2(x)


def _int(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _blk(x: int) -> bytes:
    return x.to_bytes(AES_BLOCK, "big")


def _carry(iv: bytearray, step: int) -> None:
    """Carries a wrap of nonce byte 0 into bytes 1.. (little-endian), up (+1) or back (-1)."""
    for i in range(1, AES_BLOCK):
        old = iv[i]
        iv[i] = (old + step) & 0xFF
        if (iv[i] if step > 0 else old):
            break


class CryptStateOCB2:
    """Mumble's CryptState: OCB2-AES128 with its packet format, nonce increment
    and replay/late handling (src/CryptState.cpp, 1.3.4).

    A packet is nonce[0] | tag[0..2] | ciphertext, the ciphertext exactly as long
    as the plaintext. A client encrypts with the CryptSetup client_nonce and
    decrypts with the server_nonce; murmurd the other way round.
    """

    def __init__(self, key: bytes, encrypt_iv: bytes, decrypt_iv: bytes):
        if Cipher is None:
            raise LoadError("the Python package 'cryptography' is missing; run bench/setup-venv.sh (make deps)")
        if len(key) != 16 or len(encrypt_iv) != 16 or len(decrypt_iv) != 16:
            raise ValueError("OCB2-AES128 needs a 16-byte key and 16-byte nonces")
        cipher = Cipher(algorithms.AES(key), modes.ECB())
        # ECB keeps no state between blocks, so one context serves every call.
        self._aes_enc = cipher.encryptor().update
        self._aes_dec = cipher.decryptor().update
        self.encrypt_iv = bytearray(encrypt_iv)
        self.decrypt_iv = bytearray(decrypt_iv)
        self.decrypt_history = bytearray(256)
        self.good = self.late = self.lost = 0

    def _e(self, x: int) -> int:
        return _int(self._aes_enc(_blk(x)))

    def ocb_encrypt(self, plain: bytes, nonce: bytes) -> tuple[bytes, bytes]:
        """(ciphertext, 16-byte tag)."""
        delta = _int(self._aes_enc(bytes(nonce)))
        checksum = 0
        out = bytearray()
        pos, left = 0, len(plain)
        while left > AES_BLOCK:
            block = _int(plain[pos:pos + AES_BLOCK])
            # Mumble's counter to the XEX* attack (eprint 2019/311 section 9): a
            # second-to-last block of zeros (but its last byte) gets its first
            # bit flipped. murmurd does it too, so ciphertexts match byte for byte.
            flip = left - AES_BLOCK <= AES_BLOCK and not any(plain[pos:pos + AES_BLOCK - 1])
            delta = _s2(delta)
            tmp = delta ^ block
            if flip:
                tmp ^= 1 << 120
            out += _blk(delta ^ self._e(tmp))
            checksum ^= block ^ (1 << 120 if flip else 0)
            pos += AES_BLOCK
            left -= AES_BLOCK
        delta = _s2(delta)
        pad = _blk(self._e(delta ^ (left * 8)))
        tmp = plain[pos:] + pad[left:]  # the final block, padded with the pad's own bytes
        checksum ^= _int(tmp)
        out += bytes(a ^ b for a, b in zip(pad[:left], tmp[:left]))
        tag = _blk(self._e(_s3(delta) ^ checksum))
        return bytes(out), tag

    def ocb_decrypt(self, encrypted: bytes, nonce: bytes) -> tuple[bytes, bytes, bool]:
        """(plaintext, 16-byte tag, ok); ok is False for the XEX* attack pattern."""
        delta = _int(self._aes_enc(bytes(nonce)))
        checksum = 0
        out = bytearray()
        pos, left = 0, len(encrypted)
        while left > AES_BLOCK:
            delta = _s2(delta)
            tmp = delta ^ _int(encrypted[pos:pos + AES_BLOCK])
            block = delta ^ _int(self._aes_dec(_blk(tmp)))
            out += _blk(block)
            checksum ^= block
            pos += AES_BLOCK
            left -= AES_BLOCK
        delta = _s2(delta)
        pad = _blk(self._e(delta ^ (left * 8)))
        tmp = bytes(a ^ b for a, b in zip(encrypted[pos:] + bytes(AES_BLOCK - left), pad))
        checksum ^= _int(tmp)
        out += tmp[:left]
        ok = tmp[:AES_BLOCK - 1] != _blk(delta)[:AES_BLOCK - 1]
        tag = _blk(self._e(_s3(delta) ^ checksum))
        return bytes(out), tag, ok

    def encrypt(self, plain: bytes) -> bytes:
        # The nonce is incremented (little-endian, carry from byte 0) before each packet.
        iv = self.encrypt_iv
        for i in range(AES_BLOCK):
            iv[i] = (iv[i] + 1) & 0xFF
            if iv[i]:
                break
        ct, tag = self.ocb_encrypt(plain, bytes(iv))
        return bytes([iv[0]]) + tag[:3] + ct

    def decrypt(self, packet: bytes) -> bytes | None:
        """The plaintext, or None for a packet that is forged, replayed or too
        far out of order. Mumble's CryptState::decrypt, step for step."""
        if len(packet) < 4:
            return None
        iv = self.decrypt_iv
        save = bytes(iv)
        ivbyte = packet[0]
        restore = False
        late = lost = 0
        if (iv[0] + 1) & 0xFF == ivbyte:  # in order
            if ivbyte > iv[0]:
                iv[0] = ivbyte
            elif ivbyte < iv[0]:
                iv[0] = ivbyte
                _carry(iv, +1)
            else:
                return None
        else:  # out of order or a repeat
            diff = ivbyte - iv[0]
            if diff > 128:
                diff -= 256
            elif diff < -128:
                diff += 256
            if ivbyte < iv[0] and -30 < diff < 0:  # late, no wraparound
                late, lost, restore = 1, -1, True
                iv[0] = ivbyte
            elif ivbyte > iv[0] and -30 < diff < 0:  # late, from before a wraparound
                late, lost, restore = 1, -1, True
                iv[0] = ivbyte
                _carry(iv, -1)
            elif ivbyte > iv[0] and diff > 0:  # a few lost
                lost = ivbyte - iv[0] - 1
                iv[0] = ivbyte
            elif ivbyte < iv[0] and diff > 0:  # a few lost, and wrapped around
                lost = 256 - iv[0] + ivbyte - 1
                iv[0] = ivbyte
                _carry(iv, +1)
            else:
                return None
            if self.decrypt_history[iv[0]] == iv[1]:  # replay
                iv[:] = save
                return None
        plain, tag, ok = self.ocb_decrypt(packet[4:], bytes(iv))
        if not ok or tag[:3] != packet[1:4]:
            iv[:] = save
            return None
        self.decrypt_history[iv[0]] = iv[1]
        if restore:
            iv[:] = save
        self.good += 1
        self.late += late
        self.lost += lost
        return plain


# ---------------------------------------------------------------- murmurd


def murmur_ini(directory: Path, port: int, users: int) -> str:
    """murmur.ini for the benchmark. No inline comments: QSettings would read
    them as part of the value."""
    lines = [
        f"database={directory / 'murmur.sqlite'}",
        f"host={HOST}",
        f"port={port}",
        "ice=",
        "dbus=",
        "bonjour=false",
        f"users={users}",
        "usersperchannel=0",
        "bandwidth=72000",
        # Otherwise more than 10 connections in 120 s from one address are banned.
        "autobanAttempts=0",
        "autobanTimeframe=0",
        "autobanTime=0",
        "allowping=false",
        "registerName=",
        # Opus from the first user on.
        "opusthreshold=0",
        # No log rows in the database: murmurd writes one per connect and login,
        # which only slows down connecting 1,000 listeners. The console log stays.
        "logdays=-1",
    ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    """A port free for both TCP and UDP on HOST (murmurd binds both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t:
            t.bind((HOST, 0))
            port = t.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind((HOST, port))
                except OSError:
                    continue
                return port
    raise LoadError(f"found no port free for both TCP and UDP on {HOST}; pass one with --port")


def process_cpu_clock(pid: int) -> tuple[Callable[[], float], str]:
    """A function returning the CPU seconds (user + system, all threads) used so
    far by process pid, and where it reads them from."""
    # The kernel's per-process CPU clock, as glibc's clock_getcpuclockid builds
    # its id (CPUCLOCK_SCHED = 2, no per-thread bit): nanoseconds, not ticks.
    clk = ((~pid) << 3) | 2
    try:
        time.clock_gettime_ns(clk)
        return (lambda: time.clock_gettime_ns(clk) / 1e9), "clock_gettime"
    except (OSError, OverflowError):
        pass
    tick = os.sysconf("SC_CLK_TCK")
    stat = f"/proc/{pid}/stat"

    def from_proc() -> float:
        with open(stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)

    from_proc()
    return from_proc, "/proc/PID/stat"


class Murmurd:
    """murmurd in the foreground in its own temporary directory."""

    def __init__(self, binary: str, port: int, users: int):
        self.binary, self.port, self.users = binary, port, users
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.out_path: Path | None = None

    def start(self) -> None:
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise LoadError(f"murmurd not found at {self.binary}; install mumble-server (make deps)")
        cmd = [self.binary, "-ini", "", "-fg"]
        as_root = os.geteuid() == 0
        if as_root:
            # murmurd refuses to keep root ("Failed to set initial capabilities")
            # and then misbehaves: run it as the package's unprivileged user.
            try:
                pw = pwd.getpwnam(MURMUR_USER)
            except KeyError:
                raise LoadError(f"user {MURMUR_USER} does not exist; install mumble-server (make deps)") from None
            setpriv = shutil.which("setpriv")
            if not setpriv:
                raise LoadError("setpriv not found (needed to run murmurd unprivileged); apt-get install -y util-linux")
            # --pdeathsig: murmurd goes away with us even if we are killed outright.
            cmd = [setpriv, f"--reuid={MURMUR_USER}", f"--regid={MURMUR_USER}", "--clear-groups",
                   "--pdeathsig", "TERM"] + cmd
        if self.port == 0:
            self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mumble_load."))
        ini = self.dir / "murmur.ini"
        ini.write_text(murmur_ini(self.dir, self.port, self.users))
        cmd[cmd.index("-ini") + 1] = str(ini)
        if as_root:
            for p in (self.dir, ini):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        # Its console log goes to a file, not a pipe: a pipe nobody reads while
        # 1,000 clients connect would fill up and stall murmurd.
        self.out_path = self.dir / "murmurd.out"
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         cwd=self.dir)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        listening = None
        while True:
            text = self.output()
            # A server that cannot bind logs it and "Stopped", but murmurd keeps
            # running; the UDP bind is logged just after "Server listening".
            failed = [line for line in text.splitlines()
                      if ("Listen on" in line and "failed" in line) or "Failed to bind UDP" in line
                      or "Failed to create UDP" in line or line.endswith("=> Stopped")]
            if failed:
                raise LoadError(f"murmurd could not listen on {HOST}:{self.port} ({failed[0].split('=> ')[-1]}); "
                                f"its output:\n{self._tail(text)}")
            if listening is None and "Server listening" in text:
                listening = time.monotonic()
            if listening is not None and time.monotonic() - listening > 0.3:
                return
            if self.proc.poll() is not None:
                raise LoadError(f"murmurd exited with status {self.proc.returncode} before listening on "
                                f"{HOST}:{self.port}; its output:\n{self._tail(text)}")
            if time.monotonic() > deadline:
                raise LoadError(f"murmurd did not report 'Server listening' within {STARTUP_TIMEOUT_S:.0f} s "
                                f"(port {self.port} taken?); its output:\n{self._tail(text)}")
            time.sleep(0.1)

    def output(self) -> str:
        try:
            return self.out_path.read_text(errors="replace") if self.out_path else ""
        except OSError:
            return ""

    @staticmethod
    def _tail(text: str, lines: int = 25) -> str:
        tail = text.strip().splitlines()[-lines:]
        return "\n".join(f"  murmurd: {line}" for line in tail) or "  murmurd: (no output)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# ----------------------------------------------------------------- clients


class Client:
    """One Mumble user: TLS control connection, a UDP socket, a CryptState."""

    def __init__(self, name: str, port: int, ssl_ctx: ssl.SSLContext):
        self.name, self.port, self.ssl_ctx = name, port, ssl_ctx
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.udp: socket.socket | None = None
        self.crypt: CryptStateOCB2 | None = None
        self.session: int | None = None
        self.synced: asyncio.Future | None = None
        self.read_task: asyncio.Task | None = None
        self.udp_ok = False
        self.error: str | None = None
        self.tunnelled = 0   # voice that came over TCP instead of UDP
        self.resyncs = 0
        self._ping_ts = 0
        self._keepalive: asyncio.TimerHandle | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.synced = loop.create_future()
        try:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.port, ssl=self.ssl_ctx), HANDSHAKE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as e:
            raise LoadError(f"{self.name}: cannot connect to murmurd at {HOST}:{self.port} over TLS ({e!r})") from None
        self.send(MSG_VERSION, encode_version())
        self.send(MSG_AUTHENTICATE, encode_authenticate(self.name, opus=True))
        self.read_task = loop.create_task(self._read_loop())
        try:
            await asyncio.wait_for(asyncio.shield(self.synced), HANDSHAKE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise LoadError(f"{self.name}: no CryptSetup and ServerSync from murmurd within "
                            f"{HANDSHAKE_TIMEOUT_S:.0f} s") from None
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.setblocking(False)
        self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_RCVBUF)
        self.udp.bind((HOST, 0))
        self.udp.connect((HOST, self.port))  # only murmurd's datagrams; send() without an address
        self.udp_ping()  # murmurd learns our UDP address from the first packet it decrypts
        # Keepalive from now on (murmurd drops a client silent for 30 s, and
        # connecting 1,000 takes a while), at a random phase so that the
        # clients' pings are spread evenly over the period.
        self._keepalive = loop.call_later(random.uniform(0, KEEPALIVE_S), self._keep_alive)

    def _keep_alive(self) -> None:
        self.tcp_ping()
        self.udp_ping()
        self._keepalive = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._keep_alive)

    def send(self, msg_type: int, body: bytes) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(frame(msg_type, body))

    def tcp_ping(self) -> None:
        self.send(MSG_PING, encode_ping(time.monotonic_ns() // 1000))

    def udp_ping(self) -> None:
        self._ping_ts = (self._ping_ts + 1) & 0x7F  # one varint byte: see PING_REPLY_LEN
        try:
            self.udp.send(self.crypt.encrypt(bytes([UDP_PING << 5]) + varint_encode(self._ping_ts)))
        except OSError:
            pass  # a full socket buffer loses one ping; the next one comes in 5 s

    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(6)
                msg_type, length = struct.unpack(">HI", head)
                body = await self.reader.readexactly(length)
                self._handle(msg_type, body)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as e:
            self._fail(f"murmurd closed the connection ({type(e).__name__})")
        except LoadError as e:
            self._fail(str(e))
        except ValueError as e:
            self._fail(f"unreadable message from murmurd ({e})")

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        if not self.synced.done():
            self.synced.set_exception(LoadError(f"{self.name}: {why}"))

    def _handle(self, msg_type: int, body: bytes) -> None:
        if msg_type == MSG_CRYPTSETUP:
            key, client_nonce, server_nonce = decode_cryptsetup(body)
            if key is not None:
                if client_nonce is None or server_nonce is None:
                    raise LoadError("CryptSetup with a key but without nonces")
                self.crypt = CryptStateOCB2(key, encrypt_iv=client_nonce, decrypt_iv=server_nonce)
            elif server_nonce is not None:  # answer to a resync we asked for (we never do)
                if self.crypt is not None:
                    self.crypt.decrypt_iv[:] = server_nonce
            elif self.crypt is not None:
                # murmurd asks for our encrypt nonce after it failed to decrypt
                # for a while (e.g. while trying unknown UDP addresses against
                # every user): tell it, as Mumble's client does.
                self.resyncs += 1
                self.send(MSG_CRYPTSETUP, pb_bytes(2, bytes(self.crypt.encrypt_iv)))
        elif msg_type == MSG_SERVERSYNC:
            self.session = decode_serversync(body)
            if self.crypt is None:
                raise LoadError("ServerSync before CryptSetup")
            if not self.synced.done():
                self.synced.set_result(None)
        elif msg_type == MSG_REJECT:
            kind, reason = decode_reject(body)
            raise LoadError(f"murmurd rejected {self.name}: {reason or 'no reason given'} (Reject type {kind})")
        elif msg_type == MSG_UDPTUNNEL:
            self.tunnelled += 1
        # Everything else (Version, ChannelState, UserState, Ping replies...) is skipped.

    def drain_decrypting(self) -> tuple[int, list[bytes]]:
        """Reads all waiting datagrams and decrypts them: (undecryptable count,
        voice plaintexts). A ping reply marks UDP as working."""
        bad, voice = 0, []
        while True:
            try:
                data = self.udp.recv(2048)
            except (BlockingIOError, InterruptedError):
                return bad, voice
            except OSError:
                continue  # e.g. ICMP port unreachable reported on a connected socket
            plain = self.crypt.decrypt(data)
            if plain is None or not plain:
                bad += 1
            elif plain[0] >> 5 == UDP_PING:
                self.udp_ok = True
            elif plain[0] >> 5 == UDP_OPUS:
                voice.append(plain)

    def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self.read_task is not None:
            self.read_task.cancel()
        if self.writer is not None:
            self.writer.transport.abort()  # no TLS close_notify dance for 1,000 connections
        if self.udp is not None:
            self.udp.close()


def count_voice(socks: Sequence[socket.socket], buf: bytearray) -> int:
    """The listeners' hot loop: receive every waiting datagram, count those
    longer than a ping reply. Nothing else, so that 1,000 listeners cost the
    load generator little of the CPU murmurd shares with it."""
    n = 0
    for s in socks:
        recv_into = s.recv_into
        try:
            while True:
                if recv_into(buf) > PING_REPLY_LEN:
                    n += 1
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass
    return n


def voice_plaintext(seq: int, payload: bytes, last: bool) -> bytes:
    """Legacy UDP Opus packet from a client: header (type 4, target 0: normal
    speech), sequence, Opus length (0x2000 on the burst's last frame), Opus."""
    return (bytes([UDP_OPUS << 5 | 0]) + varint_encode(seq)
            + varint_encode(len(payload) | (OPUS_TERMINATOR if last else 0)) + payload)


def filler(n: int) -> bytes:
    # Never zero: a block of zeros would trip the XEX* counter-measure (see ocb_encrypt).
    return bytes(i % 255 + 1 for i in range(n))


# ------------------------------------------------------------------- the run


class Bench:
    def __init__(self, args: argparse.Namespace, server: Murmurd, cpu: Callable[[], float]):
        self.args, self.server, self.cpu = args, server, cpu
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # murmurd's self-signed certificate
        self.ssl_ctx = ctx
        self.listeners: list[Client] = []
        self.talker: Client | None = None
        self.talking = False
        self.voice_count = 0         # forwarded voice datagrams counted, all listeners
        self.probe_checked = False   # listener 0 decrypted and checked a voice packet
        self.failure: LoadError | None = None  # raised in a reader callback, re-raised by talk()
        self.probe_bad = 0
        self.payload = filler(args.payload)
        self.background: list[asyncio.Task] = []
        self._buf = bytearray(2048)

    def clients(self) -> list[Client]:
        return self.listeners + [self.talker]

    def check_clients(self) -> None:
        for t in self.background:  # e.g. the probe found a packet it cannot decrypt
            if t.done() and not t.cancelled() and t.exception():
                raise t.exception()
        if not self.server.alive():
            raise LoadError(f"murmurd exited (status {self.server.proc.returncode}); its output:\n"
                            f"{self.server._tail(self.server.output())}")
        for c in self.clients():
            if c.error:
                raise LoadError(f"{c.name}: {c.error}")

    async def drain(self) -> None:
        """Empties the UDP sockets every DRAIN_INTERVAL_S, decrypting (to see
        ping replies); while talking only the talker's, since the listeners'
        are read as they become readable (wait_for_voice)."""
        while True:
            for c in [self.talker] if self.talking else self.clients():
                if c.udp is not None:  # connected
                    c.drain_decrypting()
            await asyncio.sleep(DRAIN_INTERVAL_S)

    def wait_for_voice(self, loop: asyncio.AbstractEventLoop, waiting: bool) -> None:
        """While talking, each listener's socket waits in the event loop's
        epoll and is read when readable: listener 0 decrypts everything (the
        probe), the others only count. Polled sockets with nobody waiting on
        them would spare murmurd every wake-up of a reader, which squelchd's
        listeners (one event loop) and the kernel floor's reader cost the
        sender: 10.0-11.0 against 12.2-12.4 us per packet at 20 listeners."""
        probe = self.listeners[0]
        for c in self.listeners:
            if not waiting:
                loop.remove_reader(c.udp)
            elif c is probe:
                loop.add_reader(c.udp, self.probe_readable, probe)
            else:
                loop.add_reader(c.udp, self.count_readable, c.udp)

    def count_readable(self, sock: socket.socket) -> None:
        self.voice_count += count_voice([sock], self._buf)

    def probe_readable(self, probe: Client) -> None:
        # An exception here would go to the event loop's handler, not to run(). The socket stops
        # waiting too: left readable, it would call this again at once, over and over.
        try:
            self.drain_probe(probe)
        except LoadError as e:
            self.failure = e
            asyncio.get_running_loop().remove_reader(probe.udp)

    def drain_probe(self, probe: Client) -> None:
        bad, voice = probe.drain_decrypting()
        self.probe_bad += bad
        self.voice_count += len(voice)
        if bad and not self.probe_checked:
            raise LoadError(f"{probe.name} could not decrypt a datagram from murmurd: OCB2 or nonce handling is wrong")
        if voice and not self.probe_checked:
            self.check_voice(voice[0])
            self.probe_checked = True

    def check_voice(self, plain: bytes) -> None:
        """A forwarded packet: our header, then the talker's session (murmurd
        inserts it), then exactly what the talker sent after its header."""
        try:
            kind, target = plain[0] >> 5, plain[0] & 0x1F
            session, pos = varint_decode(plain, 1)
            _seq, pos = varint_decode(plain, pos)
            length, pos = varint_decode(plain, pos)
            opus = plain[pos:pos + (length & OPUS_MAX_LEN)]
        except (ValueError, IndexError):
            raise LoadError(f"forwarded voice packet does not parse: {plain.hex()}") from None
        problems = []
        if kind != UDP_OPUS or target != 0:
            problems.append(f"header type {kind} target {target}, expected {UDP_OPUS} and 0")
        if session != self.talker.session:
            problems.append(f"session {session}, expected the talker's {self.talker.session}")
        if opus != self.payload or pos + len(opus) != len(plain):
            problems.append(f"payload of {len(opus)} bytes (+{len(plain) - pos - len(opus)} trailing) "
                            f"differs from the {len(self.payload)} bytes sent")
        if problems:
            raise LoadError("forwarded voice packet decrypted but is not what was sent: " + "; ".join(problems))

    def make_clients(self) -> None:
        n = self.args.listeners
        width = max(4, len(str(n - 1)))
        self.listeners = [Client(f"l{i:0{width}d}", self.server.port, self.ssl_ctx) for i in range(n)]
        self.talker = Client("talker", self.server.port, self.ssl_ctx)

    async def connect_all(self) -> None:
        """Listeners in batches of CONNECT_BATCH (murmurd handshakes them on one
        thread), then the talker."""
        n = self.args.listeners
        step = max(1, n // 10)
        done = 0
        for start in range(0, n, CONNECT_BATCH):
            batch = self.listeners[start:start + CONNECT_BATCH]
            results = await asyncio.gather(*(c.connect() for c in batch), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            self.check_clients()
            before, done = done, done + len(batch)
            if done // step != before // step or done == n:
                log(f"{done}/{n} listeners connected")
        await self.talker.connect()

    async def wait_udp(self) -> None:
        """Every client must have had a UDP ping answered: then murmurd has its
        UDP address and sends it voice over UDP, not tunnelled through TLS."""
        deadline = time.monotonic() + UDP_READY_TIMEOUT_S
        last_ping = time.monotonic()
        while True:
            self.check_clients()
            missing = [c for c in self.clients() if not c.udp_ok]
            if not missing:
                return
            now = time.monotonic()
            if now > deadline:
                names = ", ".join(c.name for c in missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise LoadError(f"{len(missing)} of {len(self.clients())} clients got no answer to their UDP "
                                f"ping from murmurd within {UDP_READY_TIMEOUT_S:.0f} s ({names}); "
                                f"is UDP to {HOST}:{self.server.port} blocked?")
            if now - last_ping > 1.0:  # a lost ping is sent again
                for c in missing:
                    c.udp_ping()
                last_ping = now
            await asyncio.sleep(0.1)

    async def talk(self) -> tuple[int, float, float]:
        """Sends the voice; returns (packets sent, murmurd CPU seconds, window seconds)."""
        rate, n = self.args.rate, max(1, round(self.args.seconds * self.args.rate))
        talker = self.talker
        packets = [voice_plaintext(i, self.payload, last=(i == n - 1)) for i in range(n)]
        self.voice_count = 0
        self.talking = True
        loop = asyncio.get_running_loop()
        self.wait_for_voice(loop, True)
        sent = 0
        t0 = time.monotonic()
        cpu0 = self.cpu()
        for i, plain in enumerate(packets):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            talker.udp.send(talker.crypt.encrypt(plain))
            sent += 1
        await asyncio.sleep(TAIL_S)
        cpu1 = self.cpu()
        self.wait_for_voice(loop, False)
        if self.failure is not None:
            raise self.failure
        window = time.monotonic() - t0
        return sent, cpu1 - cpu0, window

    async def run(self) -> dict:
        n = self.args.listeners
        log(f"connecting {n} listeners and a talker to murmurd on {HOST}:{self.server.port}")
        try:
            self.make_clients()
            self.background = [asyncio.get_running_loop().create_task(self.drain())]
            await self.connect_all()
            await self.wait_udp()
            log("UDP works for every client")
            self.check_clients()

            idle_s = min(IDLE_BASELINE_S[1], max(IDLE_BASELINE_S[0], self.args.seconds / 2))
            c0 = self.cpu()
            await asyncio.sleep(idle_s)
            idle_per_s = (self.cpu() - c0) / idle_s

            log(f"talking for {self.args.seconds:g} s at {self.args.rate:g} packets/s, "
                f"{self.args.payload}-byte payloads")
            own0 = time.process_time()
            sent, cpu_s, window = await self.talk()
            own = time.process_time() - own0
            self.check_clients()
            await asyncio.sleep(0.05)
            self.voice_count += count_voice([c.udp for c in self.listeners[1:]], self._buf)
            self.drain_probe(self.listeners[0])
        finally:
            for t in self.background:
                t.cancel()
            await asyncio.gather(*self.background, return_exceptions=True)
            for c in self.clients():
                c.close()

        expected = sent * n
        log(f"murmurd used {cpu_s:.3f} s of CPU in the {window:.2f} s window ({idle_per_s:.3f} s/s when idle); "
            f"this load generator {own:.3f} s")
        if self.voice_count == 0:
            raise LoadError("listeners received no voice at all: murmurd dropped the talker's packets "
                            "(bandwidth limit? talker not in the listeners' channel?)")
        if not self.probe_checked:
            raise LoadError(f"{self.listeners[0].name} received no voice packet to decrypt and check")
        if self.probe_bad:
            log(f"warning: {self.probe_bad} datagrams to {self.listeners[0].name} did not decrypt")
        tunnelled = sum(c.tunnelled for c in self.listeners)
        if tunnelled:
            log(f"warning: {tunnelled} voice packets reached listeners tunnelled over TCP, not UDP")
        if self.voice_count < 0.99 * expected:
            log(f"warning: listeners received {self.voice_count} of {expected} datagrams "
                f"({100 * self.voice_count / expected:.1f}%)")
        return {
            "listeners": n,
            "packets_sent": sent,
            "datagrams_received": self.voice_count,
            "expected": expected,
            "server_cpu_seconds": round(cpu_s, 6),
            "cpu_us_per_packet": round(cpu_s / expected * 1e6, 4),
            "seconds": self.args.seconds,
            "window_seconds": round(window, 3),
            "idle_cpu_per_s": round(idle_per_s, 6),
        }


def run(args: argparse.Namespace) -> dict:
    # murmurd charges IP + UDP + crypt header + data per packet against bandwidth=72000
    # (Server::processMsg) and drops what exceeds it: 80-byte Opus at 50/s is 46.8 kbit/s.
    bits_per_s = (20 + 8 + 4 + len(voice_plaintext(1000, filler(args.payload), False))) * 8 * args.rate
    if bits_per_s > 72000:
        log(f"warning: {bits_per_s:.0f} bit/s exceeds murmurd's bandwidth=72000: it will drop packets")
    server = Murmurd(args.murmurd, args.port, args.listeners + 10)
    try:
        server.start()
        cpu, source = process_cpu_clock(server.proc.pid)
        log(f"murmurd ready on {HOST}:{server.port} (pid {server.proc.pid}, CPU from {source}, dir {server.dir})")
        return asyncio.run(Bench(args, server, cpu).run())
    finally:
        server.stop()


def _terminate(signum, _frame):
    # SIGTERM unwinds like Ctrl-C, so murmurd is stopped and the temp dir removed.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listeners", type=int, required=True, help="listeners in the talker's channel")
    ap.add_argument("--seconds", type=float, required=True, help="length of the talk")
    ap.add_argument("--payload", type=int, default=80, help="Opus bytes per packet (default 80)")
    ap.add_argument("--rate", type=float, default=50.0, help="packets per second (default 50)")
    ap.add_argument("--murmurd", default=DEFAULT_MURMURD, help=f"murmurd binary (default {DEFAULT_MURMURD})")
    ap.add_argument("--port", type=int, default=0, help="murmurd's TCP and UDP port (default 0: a free one)")
    args = ap.parse_args(argv)
    if args.listeners < 1:
        ap.error("--listeners must be at least 1")
    if args.seconds <= 0 or args.rate <= 0:
        ap.error("--seconds and --rate must be positive")
    if not 1 <= args.payload <= 900:  # murmurd drops datagrams over 1024 bytes
        ap.error("--payload must be 1..900")
    if not 0 <= args.port <= 65535:
        ap.error("--port must be 0..65535")

    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run(args)
    except LoadError as e:
        print(f"mumble_load: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mumble_load: interrupted; murmurd stopped", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
