#!/usr/bin/env python3
"""Turn the benchmarks' results.json into docs/benchmarks.md and PNG plots.

    python3 report.py RESULTS.json OUT.md PLOTS_DIR

OUT.md is rewritten from scratch except for hand-written notes: everything
from a line `<!-- manual -->` on, in the existing OUT.md, is carried over
verbatim to the end of the new file. Plots are linked relative to OUT.md.

Sections missing from results.json (a partial or quick run) are reported as
"not measured in this run"; a malformed results.json is an error (exit 2) that
names the offending field, because it means the writer has a bug.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MANUAL_MARKER = "<!-- manual -->"
NOT_MEASURED = "_Not measured in this run._"


class ReportError(Exception):
    """results.json (or an output path) is unusable; the message says where."""


# --------------------------------------------------------------- reading input


def _num(obj: dict, key: str, where: str) -> float | None:
    """A number field; None when absent or null (= not measured)."""
    v = obj.get(key)
    if v is None:
        return None
    # bool is an int in Python, but `true` where a figure belongs is a writer bug.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ReportError(f"{where}.{key}: expected a number, got {json.dumps(v)}")
    return float(v)


def _bool(obj: dict, key: str, where: str) -> bool | None:
    v = obj.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise ReportError(f"{where}.{key}: expected true/false, got {json.dumps(v)}")


def _section(data: dict, key: str, kind: type) -> Any:
    """A top-level section, or None when missing/null/empty."""
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, kind):
        raise ReportError(f"{key}: expected {'a list' if kind is list else 'an object'}, got {type(v).__name__}")
    if kind is list:
        for i, row in enumerate(v):
            if not isinstance(row, dict):
                raise ReportError(f"{key}[{i}]: expected an object, got {json.dumps(row)}")
    return v or None


def load_results(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file (run the benchmarks first: make bench)") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object at the top level")
    return data


# ---------------------------------------------------------------- formatting


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        s = f"{v:,.0f}"
    elif v == int(v) and digits <= 1 and abs(v) >= 10:
        s = f"{v:.0f}"
    else:
        s = f"{v:.{digits}f}"
    return f"{s} {unit}" if unit else s


def cell(text: Any) -> str:
    """Make arbitrary text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


@dataclass
class Target:
    key: str  # name in results.json "targets"
    label: str
    unit: str
    upper: bool  # True: figure must be <= target; False: >= target
    digits: int = 1


TARGETS = [
    Target("fanout_cpu_us_200", "Fan-out CPU per forwarded packet, 200 listeners", "µs", True, 2),
    Target("fanout_relay_p99_ms_200", "Fan-out: last of 200 listeners served, p99 (server)", "ms", True, 2),
    Target("fanout_vs_mumble_200", "Fan-out CPU per packet against Mumble's, 200 listeners", "x", True, 2),
    Target("fanout_relay_vs_floor_200", "Fan-out: last of 200 served, p99, against the kernel floor's burst p99", "x", True, 2),
    Target("fanout_grant_p95_ms_200", "Floor grant p95 with 200 listeners, idle channel", "ms", True),
    Target("mouth_to_ear_p95_ms", "Mouth-to-ear p95, clean network", "ms", True),
    Target("pesq_clean", "PESQ-WB, clean network", "", False, 2),
    Target("pesq_10_percent", "PESQ-WB, 10 % loss", "", False, 2),
    Target("floor_access_p95_ms", "Floor access p95", "ms", True),
    Target("late_entry_ms", "Late entry (join mid-burst to audio)", "ms", True),
    Target("kb_per_connection", "Memory per connection", "KiB", True),
    Target("push_per_second", "Push notifications per second", "/s", False, 0),
    Target("push_last_wake_ms", "Push: last wake of a burst handed to APNs after", "ms", True),
    Target("push_cpu_vs_h2load", "Push client CPU per push against h2load's", "x", True, 2),
    Target("push_rate_vs_h2load", "Pushes per second against h2load's", "x", False, 2),
    Target("push_storm_relay_vs_quiet", "Relay fan-out p99 while a burst's wakes go out, against after", "x", True, 2),
    Target("cluster_redirect_round_trips", "Cluster: round trips a redirect adds to a join", "", True, 1),
]
TARGET_BY_KEY = {t.key: t for t in TARGETS}


class Verdicts:
    """Collects every target check so the summary lists them all in one place."""

    def __init__(self, targets: dict):
        self.targets = targets
        self.rows: list[list[str]] = []

    def target_value(self, key: str) -> float | None:
        return _num(self.targets, key, "targets")

    def target_text(self, key: str) -> str:
        t, v = TARGET_BY_KEY[key], self.target_value(key)
        if v is None:
            return "no target"
        return f"{'≤' if t.upper else '≥'} {fmt(v, t.unit, t.digits)}"

    def verdict(self, key: str, figure: float | None, summary_label: str | None = None,
                record: bool = True) -> str:
        t, target = TARGET_BY_KEY[key], self.target_value(key)
        shown = fmt(figure, t.unit, t.digits)
        if figure is None:
            result = "not measured"
        elif target is None:
            result = f"no target ({shown})"
        else:
            met = figure <= target if t.upper else figure >= target
            result = f"met ({shown})" if met else f"**missed** ({shown})"
        if record:
            self.rows.append([summary_label or t.label, shown, self.target_text(key), result])
        return result


# --------------------------------------------------------------------- plots


def _plt():
    import matplotlib
    matplotlib.use("Agg")  # no display on CI; must precede pyplot's import
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # No "Software" metadata: the PNG then only changes when the figures do,
    # which keeps regenerated docs out of diffs.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    _plt().close(fig)


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _target_line(ax, value: float | None, label: str) -> None:
    if value is not None:
        ax.axhline(value, color="tab:red", linestyle="--", linewidth=1, label=label)


def plot_fanout(rows: list[dict], cpu_target: float | None, out: Path) -> list[str]:
    plt = _plt()
    xs = [r["listeners"] for r in rows]
    made = []
    cpu = [_nan(r["cpu_us_per_packet"]) for r in rows]
    if not all(math.isnan(v) for v in cpu):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(xs, cpu, marker="o", label="squelchd")
        for key, label, marker in (("mumble_cpu_us_per_packet", "murmurd (Mumble)", "s"),
                                   ("floor_cpu_us_per_datagram", "kernel floor", "^")):
            values = [_nan(r.get(key)) for r in rows]
            if not all(math.isnan(x) for x in values):
                ax.plot(xs, values, marker=marker, label=label)
        if cpu_target is not None:
            ax.plot([200], [cpu_target], marker="*", markersize=12, linestyle="none",
                    color="tab:red", label="target (at 200 listeners)")
        ax.set(xlabel="listeners", ylabel="CPU µs per forwarded packet",
               title="Fan-out: server CPU per forwarded packet")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3), ax.legend()
        _save(fig, out / "fanout-cpu.png")
        made.append("fanout-cpu.png")
    series = [(label, [_nan(r[key]) for r in rows], marker) for label, key, marker in (
        ("server p50", "relay_p50_ms", "o"), ("server p99", "relay_p99_ms", "s"),
        ("client p50", "last_listener_p50_ms", "^"), ("client p99", "last_listener_p99_ms", "v"))]
    if not all(math.isnan(v) for _, values, _ in series for v in values):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for label, values, marker in series:
            if not all(math.isnan(v) for v in values):
                ax.plot(xs, values, marker=marker, label=label)
        ax.set(xlabel="listeners", ylabel="ms", title="Fan-out: time until the last listener has the packet")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3), ax.legend()
        _save(fig, out / "fanout-latency.png")
        made.append("fanout-latency.png")
    return made


def _cond_label(r: dict) -> str:
    return f"{fmt(r['loss_percent'], '%', 0)} loss\n{fmt(r['jitter_ms'], 'ms', 0)} jitter"


def _grouped_bars(ax, labels: list[str], series: list[tuple[str, list[float]]]) -> None:
    n = len(series)
    width = 0.8 / n
    for k, (name, values) in enumerate(series):
        pos = [i + (k - (n - 1) / 2) * width for i in range(len(labels))]
        bars = ax.bar(pos, values, width, label=name)
        ax.bar_label(bars, fmt="%.2f" if max((v for v in values if not math.isnan(v)), default=0) < 10 else "%.0f",
                     fontsize=7, padding=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def plot_mouth_to_ear(rows: list[dict], p95_target: float | None, out: Path) -> str | None:
    p50 = [_nan(r["p50_ms"]) for r in rows]
    p95 = [_nan(r["p95_ms"]) for r in rows]
    if all(math.isnan(v) for v in p50 + p95):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    _grouped_bars(ax, [_cond_label(r) for r in rows], [("p50", p50), ("p95", p95)])
    _target_line(ax, p95_target, "p95 target (clean network)")
    ax.set(ylabel="ms", title="Mouth-to-ear latency per network condition")
    # Headroom so the legend sits above the bars instead of on them.
    top = max([x for x in p50 + p95 if not math.isnan(x)] + [p95_target or 0])
    ax.set_ylim(0, top * 1.3)
    ax.grid(axis="y", alpha=0.3), ax.legend(loc="upper left", ncols=3, fontsize=8)
    _save(fig, out / "mouth-to-ear.png")
    return "mouth-to-ear.png"


def plot_quality(rows: list[dict], targets: dict[str, tuple[float | None, Callable[[dict], bool]]],
                 out: Path) -> str | None:
    pesq = [_nan(r["pesq_wb"]) for r in rows]
    stoi = [_nan(r["stoi"]) for r in rows]
    if all(math.isnan(v) for v in pesq + stoi):
        return None
    plt = _plt()
    labels = [_cond_label(r) for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(rows)), 4))
    _grouped_bars(a1, labels, [("PESQ-WB", pesq)])
    # Each PESQ target applies to some conditions only: mark it over those bars.
    styles = iter([("tab:red", "--"), ("tab:purple", ":"), ("tab:brown", "-.")])
    for name, (value, applies) in targets.items():
        idx = [i for i, r in enumerate(rows) if applies(r)]
        color, ls = next(styles, ("black", "--"))
        if value is not None and idx:
            a1.hlines(value, min(idx) - 0.45, max(idx) + 0.45, colors=color, linestyles=ls,
                      linewidth=2, label=f"target, {name}: {value:.2f}")
    # PESQ-WB's scale is 1.04 .. 4.64; the extra top room holds the legend.
    a1.set(ylabel="MOS-LQO", title="PESQ wideband (P.862.2)", ylim=(1, 5.4))
    a1.grid(axis="y", alpha=0.3), a1.legend(loc="upper right", ncols=2, fontsize=7)
    _grouped_bars(a2, labels, [("STOI", stoi)])
    a2.set(ylabel="STOI", title="Intelligibility (STOI)", ylim=(0, 1.05))
    a2.grid(axis="y", alpha=0.3)
    _save(fig, out / "quality.png")
    return "quality.png"


def plot_push(push: dict, targets: Verdicts, out: Path) -> str | None:
    per_s = _num(push, "per_second", "push")
    last = _num(push, "last_wake_ms", "push")
    if per_s is None and last is None:
        return None
    h2 = push.get("h2load") if isinstance(push.get("h2load"), dict) else None
    plt = _plt()
    fig, axes = plt.subplots(1, 3 if h2 else 2, figsize=(10 if h2 else 7, 3.4))
    panels = [(per_s, "push_per_second", "Throughput", "pushes / s",
               _num(h2, "per_second", "push.h2load") if h2 else None)]
    if h2:
        panels.append((_num(push, "client_cpu_us_per_push", "push"), None, "Client CPU per push", "µs",
                       _num(h2, "client_cpu_us_per_push", "push.h2load")))
    wakes = push.get("wakes_per_burst")
    panels.append((last, "push_last_wake_ms", f"Last of {wakes:,} wakes" if isinstance(wakes, int) else "Last wake", "ms", None))
    for ax, (value, key, title, unit, reference) in zip(axes, panels):
        target = targets.target_value(key) if key else None
        names, vals, colors = ["squelchd"], [_nan(value)], ["tab:blue"]
        if reference is not None:
            names.append("h2load")
            vals.append(reference)
            colors.append("tab:orange")
        if target is not None:
            names.append("target")
            vals.append(target)
            colors.append("tab:gray")
        bars = ax.bar(names, vals, color=colors)
        ax.bar_label(bars, labels=[fmt(None if math.isnan(v) else v, "", 0 if unit != "µs" else 1) for v in vals], fontsize=8)
        ax.set(title=title, ylabel=unit)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Push notifications")
    _save(fig, out / "push.png")
    return "push.png"


# ------------------------------------------------------------------ sections


def _img(rel: str, name: str, alt: str) -> str:
    return f"![{alt}]({rel}/{name})"


def _pick_condition(rows: list[dict], loss: float) -> dict | None:
    """The row with this loss and the least jitter: targets are about loss alone."""
    cands = [r for r in rows if r["loss_percent"] == loss]
    return min(cands, key=lambda r: r["jitter_ms"]) if cands else None


FLOOR_KEYS = ("floor_cpu_us_per_datagram", "floor_burst_p50_ms", "floor_burst_p99_ms")


def section_fanout(data: dict, v: Verdicts, plots: Path, rel: str) -> list[str]:
    out = ["## Fan-out", "",
           "One talker, N listeners on one server: CPU the server spends per forwarded "
           "packet; how long from a talker packet's arrival until the server has handed the copy "
           "for the last listener to the kernel (server, from its relay histogram); how long until "
           "the last listener's socket has it as the benchmark process sees it (client, which "
           "hosts every listener on the same two cores); and the floor grant time, request to "
           "grant at the talker (on an event loop of its own), with the channel idle and back to "
           "back (each request as soon as the previous release is seen, while the server may still "
           "be telling every listener about it).", ""]
    rows = _section(data, "fanout", list)
    if not rows:
        for key in ("fanout_cpu_us_200", "fanout_vs_mumble_200", "fanout_relay_p99_ms_200", "fanout_relay_vs_floor_200",
                    "fanout_grant_p95_ms_200"):
            v.verdict(key, None)
        return out + [NOT_MEASURED, ""]
    keys = ("cpu_us_per_packet", "relay_p50_ms", "relay_p99_ms", "last_listener_p50_ms", "last_listener_p99_ms",
            "grant_p50_ms", "grant_p95_ms", "grant_back_to_back_p50_ms", "grant_back_to_back_p95_ms",
            "mumble_cpu_us_per_packet", "idle_cpu_ms_per_s", "mumble_idle_cpu_ms_per_s", *FLOOR_KEYS)
    parsed = []
    for i, r in enumerate(rows):
        w = f"fanout[{i}]"
        n = _num(r, "listeners", w)
        if n is None:
            raise ReportError(f"{w}.listeners: missing")
        parsed.append({"listeners": n, **{k: _num(r, k, w) for k in keys}})
    parsed.sort(key=lambda r: r["listeners"])
    out += [table(["Listeners", "CPU per packet", "Server p50", "Server p99", "Client p50", "Client p99",
                   "Grant p50", "Grant p95", "Back to back p50", "Back to back p95"],
                  [[fmt(r["listeners"], "", 0), fmt(r["cpu_us_per_packet"], "µs", 2),
                    fmt(r["relay_p50_ms"], "ms", 2), fmt(r["relay_p99_ms"], "ms", 2),
                    fmt(r["last_listener_p50_ms"], "ms", 2), fmt(r["last_listener_p99_ms"], "ms", 2),
                    fmt(r["grant_p50_ms"], "ms", 2), fmt(r["grant_p95_ms"], "ms", 2),
                    fmt(r["grant_back_to_back_p50_ms"], "ms", 2), fmt(r["grant_back_to_back_p95_ms"], "ms", 2)]
                   for r in parsed]), ""]
    floored = [r for r in parsed if r["floor_cpu_us_per_datagram"] is not None]
    if floored:
        out += ["The kernel's floor on the same machine, measured by the same run: datagrams the size "
                "of a sealed copy, already built, sent with one thread's `sendmmsg` to N loopback "
                "sockets on which a reader thread waits, as the listeners do (no sealing, no "
                "connection state, nothing else running). CPU: the sending thread's; burst: until "
                "the last datagram's send returns. With one sending thread, as the server has, "
                "neither figure can be beaten by the server on this machine.", "",
                table(["Listeners", "CPU per datagram", "Burst p50", "Burst p99"],
                      [[fmt(r["listeners"], "", 0), fmt(r["floor_cpu_us_per_datagram"], "µs", 2),
                        fmt(r["floor_burst_p50_ms"], "ms", 2), fmt(r["floor_burst_p99_ms"], "ms", 2)]
                       for r in floored]), ""]
    versus = [r for r in parsed if r["mumble_cpu_us_per_packet"] and r["cpu_us_per_packet"] is not None]
    for r in parsed:
        mumble = r["mumble_cpu_us_per_packet"]
        r["vs_mumble"] = r["cpu_us_per_packet"] / mumble if mumble and r["cpu_us_per_packet"] is not None else None
        floor = r["floor_burst_p99_ms"]
        r["relay_vs_floor"] = r["relay_p99_ms"] / floor if floor and r["relay_p99_ms"] is not None else None
    if versus:
        out += ["Against Mumble's server (Debian's mumble-server, murmurd) with the same load, run right "
                "after squelchd at each listener count (`--versus-mumble`; bench/mumble_load.py speaks "
                "Mumble's protocol: TLS control, OCB2-AES128 UDP voice). Each server's CPU is its own "
                "process's; murmurd also encrypts every forwarded packet once per listener. Idle: each "
                "server's CPU per second with everyone connected and nobody talking, measured just "
                "before the talk (it is part of the per-packet figures, which divide all the CPU of "
                "the talk window by the packets forwarded).", "",
                table(["Listeners", "squelchd", "murmurd", "squelchd / murmurd", "Kernel floor",
                       "squelchd idle", "murmurd idle"],
                      [[fmt(r["listeners"], "", 0), fmt(r["cpu_us_per_packet"], "µs", 2),
                        fmt(r["mumble_cpu_us_per_packet"], "µs", 2), fmt(r["vs_mumble"], "x", 2),
                        fmt(r["floor_cpu_us_per_datagram"], "µs", 2),
                        fmt(r["idle_cpu_ms_per_s"], "ms/s", 2), fmt(r["mumble_idle_cpu_ms_per_s"], "ms/s", 2)]
                       for r in versus]), ""]
    at200 = next((r for r in parsed if r["listeners"] == 200), None)
    figures = []
    for key, field, label, unit, digits in (
            ("fanout_cpu_us_200", "cpu_us_per_packet", "CPU per packet at 200 listeners", "µs", 2),
            ("fanout_vs_mumble_200", "vs_mumble", "CPU per packet against Mumble's at 200 listeners", "x", 2),
            ("fanout_relay_p99_ms_200", "relay_p99_ms", "Last of 200 listeners served, p99 (server)", "ms", 2),
            ("fanout_relay_vs_floor_200", "relay_vs_floor", "Last of 200 served, p99, against the kernel floor's burst p99", "x", 2),
            ("fanout_grant_p95_ms_200", "grant_p95_ms", "Floor grant p95 at 200 listeners, idle channel", "ms", 1)):
        figure = at200[field] if at200 else None
        res = v.verdict(key, figure)
        if at200 is None:
            res = "not measured (no 200-listener point)"
        figures.append([label, fmt(figure, unit, digits), v.target_text(key), res])
    out += [table(["Figure", "Value", "Target", "Met / missed"], figures), ""]
    for name in plot_fanout(parsed, v.target_value("fanout_cpu_us_200"), plots):
        out += [_img(rel, name, name[:-4]), ""]
    return out


def section_mouth_to_ear(data: dict, v: Verdicts, plots: Path, rel: str) -> list[str]:
    out = ["## Mouth-to-ear latency and voice quality", "",
           "The same spoken sentence is sent as repeated talk bursts through the server "
           "to a listener under emulated packet loss and jitter. Latency is the time from a "
           "burst's send to its appearance in the listener's recording (GCC-PHAT); quality "
           "compares each received burst with the original (PESQ-WB, STOI).", ""]
    rows = _section(data, "mouth_to_ear", list)
    if not rows:
        for k in ("mouth_to_ear_p95_ms", "pesq_clean", "pesq_10_percent"):
            v.verdict(k, None)
        return out + [NOT_MEASURED, ""]
    parsed = []
    for i, r in enumerate(rows):
        w = f"mouth_to_ear[{i}]"
        p = {k: _num(r, k, w) for k in ("loss_percent", "jitter_ms", "p50_ms", "p95_ms", "pesq_wb", "stoi", "bursts")}
        for k in ("loss_percent", "jitter_ms"):
            if p[k] is None:
                raise ReportError(f"{w}.{k}: missing (every condition needs loss_percent and jitter_ms)")
        parsed.append(p)
    parsed.sort(key=lambda r: (r["loss_percent"], r["jitter_ms"]))

    p95_target = v.target_value("mouth_to_ear_p95_ms")
    p95_head = f"p95 ≤ {fmt(p95_target, 'ms')}" if p95_target is not None else "p95 target"
    out += [table(["Loss", "Jitter", "Bursts", "p50", "p95", "PESQ-WB", "STOI", p95_head],
                  [[fmt(r["loss_percent"], "%", 0), fmt(r["jitter_ms"], "ms", 0), fmt(r["bursts"], "", 0),
                    fmt(r["p50_ms"], "ms"), fmt(r["p95_ms"], "ms"), fmt(r["pesq_wb"], "", 2),
                    fmt(r["stoi"], "", 3),
                    v.verdict("mouth_to_ear_p95_ms", r["p95_ms"], record=False)]
                   for r in parsed]), "",
            "The latency target is for the clean network; the last column shows how far "
            "each condition lands from it.", ""]

    clean = next((r for r in parsed if r["loss_percent"] == 0 and r["jitter_ms"] == 0), None)
    lossy = _pick_condition(parsed, 10)
    t_rows = []
    for key, row, label, field in (
            ("mouth_to_ear_p95_ms", clean, "Mouth-to-ear p95, 0 % loss, 0 ms jitter", "p95_ms"),
            ("pesq_clean", clean, "PESQ-WB, 0 % loss, 0 ms jitter", "pesq_wb"),
            ("pesq_10_percent", lossy,
             f"PESQ-WB, 10 % loss, {fmt(lossy['jitter_ms'], 'ms', 0)} jitter" if lossy else "PESQ-WB, 10 % loss",
             "pesq_wb")):
        fig = row[field] if row else None
        res = v.verdict(key, fig, summary_label=label)
        if row is None:
            res = "not measured (condition not in this run)"
        t_rows.append([label, fmt(fig, TARGET_BY_KEY[key].unit, TARGET_BY_KEY[key].digits),
                       v.target_text(key), res])
    out += [table(["Figure", "Value", "Target", "Met / missed"], t_rows), ""]

    name = plot_mouth_to_ear(parsed, p95_target, plots)
    if name:
        out += [_img(rel, name, "mouth-to-ear latency per condition"), ""]
    lossy_loss = lossy["loss_percent"] if lossy else None
    lossy_jit = lossy["jitter_ms"] if lossy else None
    name = plot_quality(parsed, {
        "clean": (v.target_value("pesq_clean"), lambda r: r["loss_percent"] == 0 and r["jitter_ms"] == 0),
        "10 % loss": (v.target_value("pesq_10_percent"),
                      lambda r: r["loss_percent"] == lossy_loss and r["jitter_ms"] == lossy_jit),
    }, plots)
    if name:
        out += [_img(rel, name, "PESQ-WB and STOI per condition"), ""]
    return out


def section_floor(data: dict, v: Verdicts) -> list[str]:
    out = ["## Floor control", "",
           "Time for a push-to-talk press to be granted the floor, and for a listener who "
           "joins while someone is talking to start hearing them.", ""]
    f = _section(data, "floor", dict)
    if not f:
        v.verdict("floor_access_p95_ms", None)
        v.verdict("late_entry_ms", None)
        return out + [NOT_MEASURED, ""]
    p50 = _num(f, "access_p50_ms", "floor")
    lost = _bool(f, "late_entry_first_word_lost", "floor")
    lost_text = "n/a" if lost is None else ("yes" if lost else "no")
    lost_res = "not measured" if lost is None else ("**missed** (yes)" if lost else "met (no)")
    out += [table(["Figure", "Value", "Target", "Met / missed"], [
        ["Floor access p50", fmt(p50, "ms"), "—", "—"],
        ["Floor access p95", fmt(_num(f, "access_p95_ms", "floor"), "ms"),
         v.target_text("floor_access_p95_ms"), v.verdict("floor_access_p95_ms", _num(f, "access_p95_ms", "floor"))],
        ["Late entry", fmt(_num(f, "late_entry_ms", "floor"), "ms"), v.target_text("late_entry_ms"),
         v.verdict("late_entry_ms", _num(f, "late_entry_ms", "floor"))],
        ["Late entry loses the first word", lost_text, "no", lost_res],
    ]), ""]
    v.rows.append(["Late entry loses the first word", lost_text, "no", lost_res])
    return out


def section_handshakes(data: dict) -> list[str]:
    out = ["## Handshakes and session resume", "",
           "New sessions per second, and time from a resumed session's first packet to "
           "its first audio.", ""]
    h = _section(data, "handshakes", dict)
    if not h:
        return out + [NOT_MEASURED, ""]
    w = "handshakes"
    return out + [table(["Figure", "Value", "Target", "Met / missed"], [
        ["Handshakes per second", fmt(_num(h, "per_second", w), "/s", 0), "—", "—"],
        ["Resume to first audio, p50", fmt(_num(h, "resume_to_first_audio_ms_p50", w), "ms", 2), "—", "—"],
        ["Resume to first audio, p99", fmt(_num(h, "resume_to_first_audio_ms_p99", w), "ms", 2), "—", "—"],
    ]), ""]


def section_cluster(data: dict, v: Verdicts) -> list[str]:
    out = ["## Cluster", "",
           "Three `squelchd` processes on one PostgreSQL (`squelch-bench cluster`): how long a channel "
           "is silent after `kill -9` of its home (until a listener hears the next burst, which itself "
           "lasts 0.5 s), what a redirect adds to a join, and placement transactions per second.", ""]
    c = _section(data, "cluster", dict)
    if not c:
        return out + [NOT_MEASURED, ""]
    w = "cluster"
    lease = _num(c, "lease_s", w)
    kills = _num(c, "kills", w)
    failover_max = _num(c, "failover_max_s", w)
    verdict = "—" if failover_max is None else ("met" if failover_max <= 8 else "**missed**") + f" ({failover_max:.1f} s)"
    direct, redirected = _num(c, "join_direct_ms", w), _num(c, "join_redirected_ms", w)
    rtt = _num(c, "path_rtt_ms", w)
    extra = _num(c, "redirect_extra_round_trips", w)
    if extra is None:  # a run from before entry passes: the redirect cost only on loopback
        redirect_rows = [["Join through a redirect", fmt(redirected, "ms", 2), "at most one extra round trip",
                          "—" if direct is None or redirected is None else f"a join and a handshake more (+{redirected - direct:.2f} ms)"]]
    else:
        redirect_rows = [
            ["Join through a redirect, with its entry pass (loopback)", fmt(redirected, "ms", 2), "—", "—"],
            ["Join through a redirect, pass unused (loopback)", fmt(_num(c, "join_redirected_without_pass_ms", w), "ms", 2), "—", "—"],
            [f"Join at the home, {fmt(rtt, 'ms', 0)} round-trip path", fmt(_num(c, "path_join_direct_ms", w), "ms", 1), "—", "—"],
            [f"Join through a redirect, {fmt(rtt, 'ms', 0)} path", fmt(_num(c, "path_join_redirected_ms", w), "ms", 1), "—", "—"],
            ["Round trips the redirect adds, with its entry pass (beyond its loopback cost)", fmt(extra, "", 1),
             v.target_text("cluster_redirect_round_trips"), v.verdict("cluster_redirect_round_trips", extra)],
            ["Same, pass unused (as before passes)", fmt(_num(c, "redirect_extra_round_trips_without_pass", w), "", 1), "—", "—"],
        ]
    if extra is None:
        v.verdict("cluster_redirect_round_trips", None)
    return out + [table(["Figure", "Value", "Target", "Met / missed"], [
        [f"Failover after kill -9, p50 ({fmt(kills, '', 0)} kills, lease {fmt(lease, 's', 0)})", fmt(_num(c, "failover_p50_s", w), "s", 1), "—", "—"],
        ["Failover after kill -9, maximum", fmt(failover_max, "s", 1), "≤ 8.0 s", verdict],
        ["Join at the home (loopback)", fmt(direct, "ms", 2), "—", "—"],
        *redirect_rows,
        ["Placement transactions per second", fmt(_num(c, "placements_per_second", w), "/s", 0), "—", "—"],
    ]), ""]


def section_fanout_channels(data: dict) -> list[str]:
    out = ["## Many channels at once", "",
           "Many channels talking together, one talker each at 50 packets/s (`squelch-bench fanout-channels`), "
           "with the relay on one thread and on more (`--relay-threads`): the server's CPU, its own fan-out time "
           "per talker packet (which for a copy sent by another thread includes that thread's wake-up), and the "
           "time from a talker's send to a listener's socket (one listener per channel; every listener reads on "
           "the benchmark's one listener thread, as in Fan-out).", ""]
    rows = _section(data, "fanout_channels", list)
    if not rows:
        return out + [NOT_MEASURED, ""]
    body = []
    for i, r in enumerate(rows):
        w = f"fanout_channels[{i}]"
        if not isinstance(r, dict):
            raise ReportError(f"{w}: expected an object, got {type(r).__name__}")
        lost, expected = _num(r, "lost", w), _num(r, "expected", w)
        body.append([fmt(_num(r, "relay_threads", w), "", 0),
                     f"{fmt(_num(r, 'channels', w), '', 0)} x {fmt(_num(r, 'listeners', w), '', 0)}",
                     fmt(_num(r, "cpu_us_per_packet", w), "µs", 2), fmt(_num(r, "server_cores", w), "", 2),
                     fmt(_num(r, "relay_p50_ms", w), "ms", 2), fmt(_num(r, "relay_p99_ms", w), "ms", 2),
                     fmt(_num(r, "delivery_p50_ms", w), "ms", 1), fmt(_num(r, "delivery_p99_ms", w), "ms", 1),
                     "—" if lost is None or expected is None else f"{lost:,.0f} of {expected:,.0f}"])
    return out + [table(["Relay threads", "Channels x listeners", "CPU per packet", "Server cores",
                         "Fan-out p50", "Fan-out p99", "Send to listener p50", "Send to listener p99", "Lost"], body), ""]


def section_push(data: dict, v: Verdicts, plots: Path, rel: str) -> list[str]:
    out = ["## Push notifications", "",
           "Wake-up pushes for listeners whose apps are asleep: sustained rate, and how "
           "long after a burst's first audio the last sleeping member's wake is accepted by APNs.", ""]
    p = _section(data, "push", dict)
    if not p:
        v.verdict("push_per_second", None)
        v.verdict("push_last_wake_ms", None)
        v.verdict("push_cpu_vs_h2load", None)
        v.verdict("push_rate_vs_h2load", None)
        v.verdict("push_storm_relay_vs_quiet", None)
        return out + [NOT_MEASURED, ""]
    per_s, last = _num(p, "per_second", "push"), _num(p, "last_wake_ms", "push")
    wakes = p.get("wakes_per_burst")
    sleepers = f"{wakes:,} sleeping members" if isinstance(wakes, int) else "sleeping members"
    cpu_ratio, rate_ratio = _num(p, "cpu_vs_h2load", "push"), _num(p, "rate_vs_h2load", "push")
    storm = p.get("storm") if isinstance(p.get("storm"), dict) else None
    storm_ratio = _num(storm, "p99_vs_quiet", "push.storm") if storm else None
    out += [table(["Figure", "Value", "Target", "Met / missed"], [
        ["Pushes per second", fmt(per_s, "/s", 0), v.target_text("push_per_second"),
         v.verdict("push_per_second", per_s)],
        [f"Last wake of {sleepers} accepted after", fmt(last, "ms"), v.target_text("push_last_wake_ms"),
         v.verdict("push_last_wake_ms", last)],
        ["Client CPU per push against h2load's", fmt(cpu_ratio, "x", 2), v.target_text("push_cpu_vs_h2load"),
         v.verdict("push_cpu_vs_h2load", cpu_ratio)],
        ["Pushes per second against h2load's", fmt(rate_ratio, "x", 2), v.target_text("push_rate_vs_h2load"),
         v.verdict("push_rate_vs_h2load", rate_ratio)],
        ["Relay fan-out p99 while the wakes go out, against after", fmt(storm_ratio, "x", 2),
         v.target_text("push_storm_relay_vs_quiet"), v.verdict("push_storm_relay_vs_quiet", storm_ratio)],
    ]), ""]
    if storm:
        out += [f"The wake run's channel also has {storm.get('listeners')} awake listeners; the talker talks for 1.2 s "
                "a burst, and the server's own fan-out histogram is read over the first 400 ms (the wakes go out) "
                "and the next 800 ms.", "",
                table(["Window", "Relay fan-out p50", "Relay fan-out p99"], [
                    ["While the wakes go out", fmt(_num(storm, "relay_p50_ms", "push.storm"), "ms", 2),
                     fmt(_num(storm, "relay_p99_ms", "push.storm"), "ms", 2)],
                    ["After", fmt(_num(storm, "quiet_relay_p50_ms", "push.storm"), "ms", 2),
                     fmt(_num(storm, "quiet_relay_p99_ms", "push.storm"), "ms", 2)]]), ""]
    h2 = p.get("h2load") if isinstance(p.get("h2load"), dict) else None
    if h2:
        rows = [[name, fmt(_num(d, "per_second", "push"), "/s", 0), fmt(_num(d, "client_cpu_us_per_push", "push"), "µs"),
                 fmt(_num(d, "simulator_cpu_us_per_push", "push"), "µs")] for name, d in (("squelchd's APNsClient", p), ("h2load (nghttp2)", h2))]
        out += ["The same `pushtotalk` request (headers, JWT, body) to the same simulator, 2 connections, "
                "the same streams in flight, alternating runs; medians.", "",
                table(["Client", "Pushes/s", "Client CPU per push", "Simulator CPU per push"], rows), ""]
    name = plot_push(p, v, plots)
    if name:
        out += [_img(rel, name, "push throughput"), ""]
    return out


def section_memory(data: dict, v: Verdicts) -> list[str]:
    out = ["## Memory", "", "Server resident memory idle and with 1000 connected clients. Idle is read after five members "
           "have joined and left, so that the code the first join pages in is not counted per connection.", ""]
    m = _section(data, "memory", dict)
    if not m:
        v.verdict("kb_per_connection", None)
        return out + [NOT_MEASURED, ""]
    kb = _num(m, "kb_per_connection", "memory")
    return out + [table(["Figure", "Value", "Target", "Met / missed"], [
        ["RSS idle", fmt(_num(m, "rss_idle_mb", "memory"), "MiB"), "—", "—"],
        ["RSS with 1000 connections", fmt(_num(m, "rss_1000_mb", "memory"), "MiB"), "—", "—"],
        ["Per connection", fmt(kb, "KiB"), v.target_text("kb_per_connection"), v.verdict("kb_per_connection", kb)],
    ]), ""]


# -------------------------------------------------------------------- document


def _when(data: dict) -> str:
    g = data.get("generated")
    if not isinstance(g, str) or not g.strip():
        return "an unknown date"
    try:
        t = dt.datetime.fromisoformat(g.strip().replace("Z", "+00:00"))
    except ValueError:
        return g.strip()
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc)
        return t.strftime("%Y-%m-%d %H:%M UTC")
    return t.strftime("%Y-%m-%d %H:%M")


def _machine(data: dict) -> str:
    m = data.get("machine")
    if m is None:
        return "not recorded"
    if not isinstance(m, dict):
        raise ReportError(f"machine: expected an object, got {type(m).__name__}")
    parts = []
    cores = _num(m, "cores", "machine")
    if cores is not None:
        parts.append(f"{cores:.0f} core{'s' if cores != 1 else ''}")
    for k in ("model", "os"):
        if m.get(k) not in (None, ""):
            parts.append(str(m[k]).replace("\n", " ").strip())
    return ", ".join(parts) or "not recorded"


def section_soak(data: dict) -> list[str]:
    out = ["## Soak under attack", "",
           "`squelch-bench soak`: squelchd at its default limits for minutes, real members on many channels "
           "taking turns to talk under loss (an impairment proxy per channel) and one leaving and joining "
           "again every second, while an attacker process floods handshakes that never join, abuses the "
           "floor and mute from inside a channel, replays ClientHellos, sprays garbage datagrams and sends "
           "malformed admin requests (issue 42).", ""]
    s = _section(data, "soak", dict)
    if not s:
        return out + [NOT_MEASURED, ""]
    w = "soak"
    ok, tried = _num(s, "joins_succeeded", w), _num(s, "joins_attempted", w)
    beyond, sigma = _num(s, "lost_beyond_emulated", w), _num(s, "lost_three_sigma", w)
    start, end = _num(s, "rss_start_mib", w), _num(s, "rss_end_mib", w)
    change = None if not start or end is None else 100 * (end - start) / start
    stalls, crashes = _num(s, "stalls_over_20ms", w), _num(s, "crashes", w)
    amplification = _num(s, "reflector_amplification", w)

    def verdict(good: bool | None, shown: str) -> str:
        return "—" if good is None else ("met" if good else "**missed**") + f" ({shown})"

    joins_pct = None if not tried else 100 * (ok or 0) / tried
    setup = (f"{fmt(_num(s, 'members', w), '', 0)} members on {fmt(_num(s, 'channels', w), '', 0)} channels, "
             f"{fmt(_num(s, 'loss_percent', w), '%', 0)} loss each way, {fmt(_num(s, 'minutes', w), 'min', 1)}")
    return out + [setup, "", table(["Figure", "Value", "Target", "Met / missed"], [
        ["Joins by real members that succeeded", f"{fmt(ok, '', 0)} of {fmt(tried, '', 0)}", "100 %",
         verdict(None if joins_pct is None else joins_pct >= 100, fmt(joins_pct, "%", 2))],
        ["Audio frames lost beyond the emulated loss", f"{fmt(beyond, '', 0)} (±{fmt(sigma, '', 0)} at 3σ)",
         "0 (within the noise)", verdict(None if beyond is None or sigma is None else beyond <= sigma, fmt(beyond, "", 0))],
        ["Emulated loss, server to members", fmt(_num(s, "emulated_loss_percent", w), "%", 2), "—", "—"],
        ["Server RSS, warm → end", f"{fmt(start, 'MiB', 1)} → {fmt(end, 'MiB', 1)}",
         "flat within 10 %", verdict(None if change is None else abs(change) <= 10, fmt(change, "%", 1))],
        ["Relay-loop stalls (ticks of 20 ms or more)", fmt(stalls, "", 0), "—", "—"],
        ["Relay-loop tick, p99", fmt(_num(s, "tick_p99_ms", w), "ms", 2), "—", "—"],
        ["Crashes", fmt(crashes, "", 0), "0", verdict(None if crashes is None else crashes == 0, fmt(crashes, "", 0))],
        ["Reflector: bytes back per byte sent", fmt(amplification, "x", 2), "≤ 3x",
         verdict(None if amplification is None else amplification <= 3, fmt(amplification, "x", 2))],
        ["Unjoined connections evicted", fmt(_num(s, "evicted", w), "", 0), "—", "—"],
        ["Floor requests over the allowance", fmt(_num(s, "floor_requests_limited", w), "", 0), "—", "—"],
    ]), ""]


def render(data: dict, md_path: Path, plots: Path) -> str:
    targets = data.get("targets") or {}
    if not isinstance(targets, dict):
        raise ReportError(f"targets: expected an object, got {type(targets).__name__}")
    v = Verdicts(targets)
    rel = Path(os.path.relpath(plots.resolve(), md_path.resolve().parent)).as_posix()
    quick = data.get("quick")
    if quick is not None and not isinstance(quick, bool):
        raise ReportError(f"quick: expected true/false, got {json.dumps(quick)}")

    body: list[str] = []
    body += section_fanout(data, v, plots, rel)
    body += section_fanout_channels(data)
    body += section_mouth_to_ear(data, v, plots, rel)
    body += section_floor(data, v)
    body += section_handshakes(data)
    body += section_push(data, v, plots, rel)
    body += section_cluster(data, v)
    body += section_soak(data)
    body += section_memory(data, v)

    head = ["# Squelch benchmarks", "",
            "<!-- Generated by bench/report.py from results.json: edits above the manual "
            "marker are overwritten. -->", "",
            f"Generated by `make bench` on {_when(data)}, machine: {_machine(data)}.", ""]
    if quick:
        head += ["> **Quick run**: fewer iterations and conditions than a full run; "
                 "figures are indicative only.", ""]
    missed = sum(1 for r in v.rows if r[3].startswith("**missed**"))
    met = sum(1 for r in v.rows if r[3].startswith("met"))
    head += ["## Summary", "", f"{met} target{'s' if met != 1 else ''} met, {missed} missed, "
             f"{len(v.rows) - met - missed} not measured or without a target.", "",
             table(["Figure", "Value", "Target", "Met / missed"], v.rows), ""]
    unknown = sorted(set(targets) - set(TARGET_BY_KEY))
    if unknown:
        head += ["Targets in results.json that this report does not know how to check: "
                 + ", ".join(f"`{cell(k)}`" for k in unknown) + ".", ""]
    return "\n".join(head + body).rstrip() + "\n"


def manual_tail(md_path: Path) -> str | None:
    """Everything from the manual marker on in the existing document, verbatim."""
    try:
        text = md_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{md_path}: cannot read the existing document to keep its manual section ({e})") from None
    i = text.find(MANUAL_MARKER)
    return text[i:] if i >= 0 else None


def write_report(results: Path, md_path: Path, plots: Path) -> list[Path]:
    data = load_results(results)
    try:
        plots.mkdir(parents=True, exist_ok=True)
        md_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create output directory: {e}") from None
    # Read the manual part before anything is written, and replace the file
    # atomically, so a failure can never lose hand-written text.
    tail = manual_tail(md_path)
    doc = render(data, md_path, plots)
    if tail is not None:
        doc += "\n" + tail
    else:
        doc += ("\n<!-- Hand-written notes: add a line holding only the HTML comment "
                "'manual' (as in bench/README.md) and write below it; report.py keeps "
                "everything from that line on. -->\n")
    fd, tmp = tempfile.mkstemp(dir=md_path.parent, prefix=".benchmarks.", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(doc)
        os.replace(tmp, md_path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ReportError(f"{md_path}: cannot write ({e})") from None
    return sorted(plots.glob("*.png"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write docs/benchmarks.md and plots from results.json.")
    ap.add_argument("results", type=Path, help="results.json written by the benchmarks")
    ap.add_argument("markdown", type=Path, help="document to (re)write, e.g. docs/benchmarks.md")
    ap.add_argument("plots", type=Path, help="directory for the PNG plots, e.g. docs/bench-plots")
    args = ap.parse_args(argv)
    try:
        pngs = write_report(args.results, args.markdown, args.plots)
    except ReportError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"report: error: {e}; run setup-venv.sh next to this script and use its .venv/bin/python",
              file=sys.stderr)
        return 2
    print(f"report: wrote {args.markdown} and {len(pngs)} plot(s) in {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
