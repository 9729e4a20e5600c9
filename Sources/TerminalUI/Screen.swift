import Foundation

/// One full screen: exactly `height` lines, none wider than `width` columns, each with a whole-line style.
public struct Frame: Hashable, Sendable {
    public enum Style: Hashable, Sendable {
        case plain, title, dim, transmit, receive, highlight, warning, error
    }

    public let width: Int
    public let height: Int
    public let lines: [String]
    public let styles: [Style]
}

/// Renders the interactive screen. `render` is a pure function of the model and the terminal size, so tests
/// can check layouts without a terminal; `ansi` turns frames into the bytes that repaint the screen.
///
/// Layout at 80×24, top to bottom: header (walkie, channel, service status, mode), rule, the state banner,
/// the speaker, microphone meter, network stats, rule, the members, and at the bottom a rule, the status
/// line and key hints. On smaller screens spacers go first, then rules, then the meter, network and member
/// title lines; the header, banner and key hints always stay. Lines are cut with "…", except the status
/// message, which wraps onto up to three lines.
public enum Screen {
    /// The frame for `model` on a `width` × `height` terminal.
    public static func render(_ model: ScreenModel, width: Int, height: Int) -> Frame {
        let width = max(0, width)
        let height = max(0, height)
        let layout = Layout(model: model, width: width)
        let rows = layout.fit(height: height)
        return Frame(width: width, height: height,
                     lines: rows.map { DisplayWidth.truncate($0.text, to: width) },
                     styles: rows.map(\.style))
    }

    /// The bytes that turn the screen showing `previous` into `frame`: only changed lines are rewritten, each
    /// in place (cursor positioning, then text, then erase to end of line), inside a synchronized update so
    /// terminals that support it show no intermediate state. Nothing is cleared first, so nothing flickers;
    /// with no previous frame or a new size, the screen is cleared and everything drawn.
    public static func ansi(_ frame: Frame, previous: Frame? = nil) -> [UInt8] {
        var out = "\u{1B}[?2026h"
        let full = previous.map { $0.width != frame.width || $0.height != frame.height } ?? true
        if full { out += "\u{1B}[H\u{1B}[2J" }
        for row in 0..<frame.lines.count {
            let line = frame.lines[row]
            let style = frame.styles[row]
            if !full, let previous, previous.lines[row] == line, previous.styles[row] == style { continue }
            out += "\u{1B}[\(row + 1);1H" + sgr(style) + line + "\u{1B}[0m"
            // Erasing after a line that fills the row would hit the pending-wrap column and wipe the last
            // character on xterm-like terminals, so only short lines get it.
            if DisplayWidth.of(line) < frame.width { out += "\u{1B}[K" }
        }
        out += "\u{1B}[?2026l"
        return Array(out.utf8)
    }

    private static func sgr(_ style: Frame.Style) -> String {
        switch style {
        case .plain: ""
        case .title: "\u{1B}[1m"
        case .dim: "\u{1B}[2m"
        case .transmit: "\u{1B}[1;97;41m"
        case .receive: "\u{1B}[1;30;42m"
        case .highlight: "\u{1B}[32m"
        case .warning: "\u{1B}[33m"
        case .error: "\u{1B}[1;31m"
        }
    }
}

// MARK: - Layout

private struct Row {
    /// What may go when space is short: higher goes first.
    enum Priority {
        case essential, high, medium, rule, spacer
    }

    var text: String
    var style: Frame.Style
    var priority: Priority
    /// The lines of a wrapped status message: when the rest are dropped for room, the first ends in "…".
    enum StatusPart { case first, rest }
    var statusPart: StatusPart? = nil
}

private struct Layout {
    let model: ScreenModel
    let width: Int

    /// Chooses rows for `height` lines: drops optional rows by priority until the fixed rows plus a few
    /// members fit, then gives the members what is left and pads so the hints sit on the bottom line.
    func fit(height: Int) -> [Row] {
        var top = topRows()
        var bottom = bottomRows()
        let wantedMembers = min(model.roster.count, 3)
        for dropping in [Row.Priority.spacer, .rule, .medium, .high] {
            if top.count + bottom.count + wantedMembers <= height { break }
            top.removeAll { $0.priority == dropping }
            let hadRest = bottom.contains { $0.statusPart == .rest }
            bottom.removeAll { $0.priority == dropping }
            if hadRest, !bottom.contains(where: { $0.statusPart == .rest }), let first = bottom.firstIndex(where: { $0.statusPart == .first }) {
                // The rest of the message went for room: "…" says so, cutting the line if it is full.
                bottom[first].text = DisplayWidth.truncate(bottom[first].text + " …", to: width)
            }
        }
        let memberSpace = height - top.count - bottom.count
        guard memberSpace >= 0 else {
            // Too small even for the essentials: keep what fits, hints last if there is any room.
            let rows = top + bottom
            guard height > 0 else { return [] }
            return Array(rows.prefix(height - 1)) + [rows[rows.count - 1]]
        }
        var middle = memberRows(limit: memberSpace)
        if middle.count < memberSpace {
            middle += Array(repeating: Row(text: "", style: .plain, priority: .spacer), count: memberSpace - middle.count)
        }
        return top + middle + bottom
    }

    // MARK: Sections

    private func topRows() -> [Row] {
        var rows = [
            Row(text: header(), style: .title, priority: .essential),
            rule(),
            Row(text: "", style: .plain, priority: .spacer),
            banner(),
            Row(text: speakerLine(), style: .plain, priority: .high),
            Row(text: "", style: .plain, priority: .spacer),
            Row(text: meterLine(), style: model.muted ? .warning : .plain, priority: .medium),
            Row(text: networkLine(), style: .plain, priority: .medium),
            rule(),
        ]
        let title = model.roster.isEmpty ? "  No other members" : "  Members (\(model.roster.count))"
        rows.append(Row(text: title, style: .title, priority: .medium))
        return rows
    }

    private func bottomRows() -> [Row] {
        let status = model.status.map { DisplayWidth.sanitize($0.text) }
        let style: Frame.Style = model.status?.isError == true ? .error : .plain
        // Wrapped, not cut: the end of a message is the part that says what to do ("check that it
        // runs", "press b once it is back"). At most `maximumStatusLines`; members give up the rows.
        // The first line stays as long as the speaker line does; the rest go before it (with the
        // meter and network lines), and the first then ends in "…" to say it goes on.
        let statusRows = status.map { text in
            Self.wrap(text, width: width - 2, lines: Self.maximumStatusLines).enumerated().map { index, line in
                Row(text: "  " + line, style: style, priority: index == 0 ? .high : .medium, statusPart: index == 0 ? .first : .rest)
            }
        } ?? [Row(text: "", style: .plain, priority: .spacer)]
        return [rule()] + statusRows + [Row(text: " " + firstFitting(hints(), margin: 1), style: .dim, priority: .essential)]
    }

    static let maximumStatusLines = 3

    /// `text` in lines of at most `width` columns, broken at spaces; a word wider than a line, and
    /// whatever is left past the last line, are cut with "…" when the frame is drawn.
    static func wrap(_ text: String, width: Int, lines: Int) -> [String] {
        guard width > 0, DisplayWidth.of(text) > width, lines > 1 else { return [text] }
        var result: [String] = []
        var current = ""
        var words = text.split(separator: " ", omittingEmptySubsequences: true)[...]
        while let word = words.first {
            let candidate = current.isEmpty ? String(word) : current + " " + word
            if DisplayWidth.of(candidate) <= width || current.isEmpty {
                current = candidate
                words = words.dropFirst()
                continue
            }
            result.append(current)
            current = ""
            if result.count == lines - 1 {
                // The last line takes the rest; the frame cuts it with "…".
                current = words.joined(separator: " ")
                break
            }
        }
        if !current.isEmpty { result.append(current) }
        return result
    }

    private func rule() -> Row {
        Row(text: String(repeating: "─", count: width), style: .dim, priority: .rule)
    }

    private func header() -> String {
        let left = " walkie · " + DisplayWidth.sanitize(model.channelName)
        let status = switch model.serviceStatus {
        case .ready: "● ready"
        case .connecting: "◌ connecting"
        case .unavailable: "✕ unavailable"
        }
        let mode = switch model.transmissionMode {
        case .halfDuplex: "half-duplex"
        case .fullDuplex: "full-duplex"
        case .listenOnly: "listen only"
        }
        for right in [status + " · " + mode + " ", status + " "]
        where DisplayWidth.of(left) + 1 + DisplayWidth.of(right) <= width {
            return DisplayWidth.pad(left, to: width - DisplayWidth.of(right)) + right
        }
        // Narrow: keep the service status and cut the channel name, while a useful part of it still shows.
        let right = status + " "
        let room = width - DisplayWidth.of(right) - 1
        return room >= 12 ? DisplayWidth.pad(left, to: room) + " " + right : left
    }

    private func banner() -> Row {
        let key = model.bindings.pushToTalk.name
        var text: String
        var style = Frame.Style.plain
        switch model.localState {
        case .idle:
            text = "○ Idle"
        case .requestingFloor:
            text = "◔ Requesting the floor…"
            style = .warning
        case .transmitting:
            text = "● TRANSMITTING"
            style = .transmit
        case .latched:
            text = "● LATCHED — \(key) to stop"
            style = .transmit
        case .receiving:
            text = "◀ RECEIVING"
            style = .receive
        case .background:
            text = "◌ BACKGROUND — waiting for a push"
            style = .dim
        }
        if let elapsed = model.transmitElapsed, [.transmitting, .latched].contains(model.localState) {
            text += "  " + Self.clock(elapsed)
            if let limit = model.maximumTransmit { text += " / " + Self.clock(limit) }
        }
        if model.muted { text += "  · speaker muted" }
        // Padded so a highlighted banner is a full-width bar.
        return Row(text: DisplayWidth.pad("  " + text, to: width), style: style, priority: .essential)
    }

    private func speakerLine() -> String {
        if model.localState == .background { return "  Voice connection suspended" }
        guard let speaker = model.activeSpeaker else { return "  Speaker: —" }
        return "  Speaker: " + DisplayWidth.sanitize(speaker)
    }

    private func meterLine() -> String {
        let label = "  Mic  "
        guard let level = model.inputLevel else { return label + "—" }
        let rmsDB = Self.decibels(level.rms)
        let value = " \(Int(rmsDB.rounded())) dB"
        let barWidth = width - DisplayWidth.of(label) - DisplayWidth.of(value) - 1
        guard barWidth >= 4 else { return label + String(value.dropFirst()) }
        let filled = Int((Self.fraction(rmsDB) * Double(barWidth)).rounded())
        let peakCell = min(barWidth - 1, Int((Self.fraction(Self.decibels(level.peak)) * Double(barWidth)).rounded(.down)))
        var bar = ""
        for cell in 0..<barWidth {
            bar += cell < filled ? "█" : (cell == peakCell && level.peak > 0 ? "▌" : "·")
        }
        return label + bar + value
    }

    private func networkLine() -> String {
        guard let n = model.network else { return "  Net  —" }
        let rtt = Int(n.roundTripMilliseconds.rounded())
        let loss = Self.oneDecimal(n.lossPercent)
        let jitter = Int(n.jitterBufferMilliseconds.rounded())
        return "  " + firstFitting([
            "Net  RTT \(rtt) ms · loss \(loss)% · jitter buffer \(jitter) ms",
            "RTT \(rtt) ms · loss \(loss)% · jb \(jitter) ms",
            "RTT \(rtt) loss \(loss)% jb \(jitter)",
        ], margin: 2)
    }

    private func memberRows(limit: Int) -> [Row] {
        guard limit > 0, !model.roster.isEmpty else { return [] }
        let shownCount = model.roster.count <= limit ? model.roster.count : limit - 1
        let shown = model.roster.prefix(shownCount)
        let names = shown.map { DisplayWidth.sanitize($0.name) + ($0.isSelf ? " (you)" : "") }
        let roles = shown.map { $0.role.map(DisplayWidth.sanitize) ?? "" }
        let nameColumn = min(names.map(DisplayWidth.of).max() ?? 0, max(8, width / 3))
        let roleColumn = min(roles.map(DisplayWidth.of).max() ?? 0, width / 5)
        var rows: [Row] = []
        for (index, member) in shown.enumerated() {
            let marker = switch member.connection {
            case .connected: "●"
            case .reconnecting: "◐"
            case .offline: "○"
            }
            var flags: [String] = []
            if member.talking { flags.append("▶ talking") }
            if member.muted { flags.append("muted") }
            switch member.connection {
            case .connected: break
            case .reconnecting: flags.append("reconnecting…")
            case .offline: flags.append("offline")
            }
            var text = "  \(marker) " + DisplayWidth.pad(names[index], to: nameColumn)
            if roleColumn > 0 { text += "  " + DisplayWidth.pad(roles[index], to: roleColumn) }
            if !flags.isEmpty { text += "  " + flags.joined(separator: " · ") }
            while text.last == " " { text.removeLast() }
            let style: Frame.Style = member.talking ? .highlight : member.connection == .offline ? .dim : .plain
            rows.append(Row(text: text, style: style, priority: .medium))
        }
        if shownCount < model.roster.count {
            rows.append(Row(text: "  … +\(model.roster.count - shownCount) more", style: .dim, priority: .medium))
        }
        return rows
    }

    private func hints() -> [String] {
        let b = model.bindings
        let ptt = b.pushToTalk.name
        let quit = Self.name(b.quit), background = Self.name(b.background)
        let mute = Self.name(b.toggleMute) + (model.muted ? " unmute" : " mute")
        switch (model.localState, model.keyboard) {
        case (.background, _):
            return ["\(background) return to the channel · \(quit) quit", "\(background) return · \(quit) quit"]
        case _ where model.transmissionMode == .listenOnly:
            return ["Listen only: your token has no talk right · \(mute) · \(background) background · \(quit) quit",
                    "Listen only · \(mute) · \(quit) quit", "\(quit) quit"]
        case (.latched, _):
            return ["\(ptt) or Esc to stop · \(mute) · \(background) background · \(quit) quit",
                    "\(ptt)/Esc stop · \(mute) · \(quit) quit", "\(ptt) stop · \(quit) quit"]
        case (_, .kitty):
            return ["Hold \(ptt) to talk · \(mute) · \(background) background · \(quit) quit",
                    "Hold \(ptt) talk · \(mute) · \(background) bg · \(quit) quit", "\(ptt) talk · \(quit) quit"]
        case (_, .legacy):
            return ["Hold \(ptt) to talk, tap to latch · Esc stop · \(mute) · \(background) background · \(quit) quit",
                    "Hold \(ptt) talk, tap latch · \(mute) · \(background) bg · \(quit) quit",
                    "Hold \(ptt) talk · \(mute) · \(quit) quit", "\(ptt) talk · \(quit) quit"]
        }
    }

    /// The first variant that fits in the width after `margin` columns; the last (shortest) otherwise.
    private func firstFitting(_ variants: [String], margin: Int) -> String {
        variants.first { DisplayWidth.of($0) + margin <= width } ?? variants[variants.count - 1]
    }
}

// MARK: - Formatting

extension Layout {
    static func name(_ keys: Set<Key>) -> String {
        keys.map(\.name).min() ?? "?"
    }

    static func clock(_ nanoseconds: UInt64) -> String {
        let seconds = nanoseconds / 1_000_000_000
        let remainder = seconds % 60
        return "\(seconds / 60):" + (remainder < 10 ? "0" : "") + "\(remainder)"
    }

    static func decibels(_ amplitude: Double) -> Double {
        guard amplitude.isFinite, amplitude > 0 else { return -60 }
        return max(-60, min(0, 20 * log10(amplitude)))
    }

    /// Position on the meter for a level in dBFS (-60 → 0, 0 → 1).
    static func fraction(_ decibels: Double) -> Double {
        (decibels + 60) / 60
    }

    static func oneDecimal(_ value: Double) -> String {
        guard value.isFinite else { return "—" }
        let tenths = Int((abs(value) * 10).rounded())
        return (value < 0 ? "-" : "") + "\(tenths / 10).\(tenths % 10)"
    }
}
