import Foundation
import Testing
import TerminalUI

private func sampleModel(members: Int = 4) -> ScreenModel {
    var roster = [
        ScreenModel.Member(name: "Alice", role: "dispatcher", talking: true),
        ScreenModel.Member(name: "Bob", role: "driver", isSelf: true),
        ScreenModel.Member(name: "Carol", role: "driver", connection: .reconnecting),
        ScreenModel.Member(name: "Dave", role: "driver", muted: true, connection: .offline),
    ]
    for n in roster.count..<max(members, roster.count) {
        roster.append(ScreenModel.Member(name: "Member \(n + 1)", role: "crew"))
    }
    return ScreenModel(channelName: "#ops-north", serviceStatus: .ready, transmissionMode: .halfDuplex,
                       localState: .receiving, activeSpeaker: "Alice", roster: Array(roster.prefix(members)),
                       inputLevel: .init(rms: 0.12, peak: 0.5),
                       network: .init(roundTripMilliseconds: 23.4, lossPercent: 0.4, jitterBufferMilliseconds: 60),
                       keyboard: .kitty, status: .init("Connected to squelch.example:4433"))
}

private func checkBounds(_ frame: Frame, width: Int, height: Int, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(frame.lines.count == height, sourceLocation: sourceLocation)
    #expect(frame.styles.count == height, sourceLocation: sourceLocation)
    for line in frame.lines {
        #expect(DisplayWidth.of(line) <= width, "\(line)", sourceLocation: sourceLocation)
        #expect(!line.contains("\u{1B}") && !line.contains("\n"), sourceLocation: sourceLocation)
    }
}

@Suite("Screen")
struct ScreenTests {
    @Test("80×24 shows everything")
    func full() {
        let frame = Screen.render(sampleModel(), width: 80, height: 24)
        checkBounds(frame, width: 80, height: 24)
        let text = frame.lines.joined(separator: "\n")
        for expected in ["#ops-north", "● ready", "half-duplex", "RECEIVING", "Speaker: Alice", "dB", "RTT 23 ms",
                         "loss 0.4%", "jitter buffer 60 ms", "Members (4)", "Bob (you)", "reconnecting", "offline",
                         "Connected to squelch.example:4433", "Hold Space to talk"] {
            #expect(text.contains(expected), "missing \(expected)")
        }
        #expect(frame.lines[0].contains("walkie"))
        #expect(frame.lines[23].contains("q quit"))               // hints on the bottom line
        #expect(frame.styles[frame.lines.firstIndex { $0.contains("RECEIVING") }!] == .receive)
    }

    @Test("a long status message wraps, so its advice at the end shows")
    func statusWraps() {
        var model = sampleModel()
        model.status = .init("no answer from squelchd at 127.0.0.1:27700; check that it runs and the address and port are right", isError: true)
        let frame = Screen.render(model, width: 80, height: 24)
        checkBounds(frame, width: 80, height: 24)
        let rows = frame.lines.indices.filter { frame.styles[$0] == .error }
        #expect(rows.count == 2, "\(frame.lines)")
        #expect(frame.lines[rows[0]] == "  no answer from squelchd at 127.0.0.1:27700; check that it runs and the address")
        #expect(frame.lines[rows[1]] == "  and port are right")
        #expect(frame.lines[23].contains("q quit"), "the hints stay on the bottom line")
        #expect(rows.allSatisfy { !frame.lines[$0].contains("…") }, "nothing of it cut")
        // Three lines at most: the rest is cut.
        model.status = .init(String(repeating: "word ", count: 60))
        let narrow = Screen.render(model, width: 40, height: 24)
        checkBounds(narrow, width: 40, height: 24)
        let statusRows = narrow.lines.filter { $0.hasPrefix("  word") }
        #expect(statusRows.count == 3 && statusRows[2].hasSuffix("…"), "\(narrow.lines)")
        // A short terminal keeps the first line, marked as going on, before it gives up the speaker.
        model.status = .init("no answer from squelchd at 127.0.0.1:27700; check that it runs and the address and port are right", isError: true)
        let short = Screen.render(model, width: 80, height: 8)
        checkBounds(short, width: 80, height: 8)
        let kept = short.lines.filter { $0.hasPrefix("  no answer") }
        #expect(kept.count == 1 && kept[0].hasSuffix("…"), "\(short.lines)")
        #expect(short.lines.contains { $0.contains("Speaker: Alice") }, "\(short.lines)")
        model.status = .init("a message that wraps at forty columns onto a second line")
        let cut = Screen.render(model, width: 40, height: 8).lines.filter { $0.hasPrefix("  a message") }
        #expect(cut == ["  a message that wraps at forty columns…"], "\(cut)")
        // A short one stays one line.
        model.status = .init("Connected to squelchd again")
        #expect(Screen.render(model, width: 80, height: 24).lines.filter { $0.contains("Connected to squelchd again") }.count == 1)
    }

    @Test("40×12 keeps the essentials and summarises the roster")
    func small() {
        let frame = Screen.render(sampleModel(members: 9), width: 40, height: 12)
        checkBounds(frame, width: 40, height: 12)
        let text = frame.lines.joined(separator: "\n")
        for expected in ["#ops-north", "RECEIVING", "Speaker: Alice", "Alice", "more", "q quit"] {
            #expect(text.contains(expected), "missing \(expected)\n\(text)")
        }
        #expect(!frame.lines[11].isEmpty)
    }

    @Test("transmitting and latched banners, with the elapsed time")
    func banners() {
        var model = sampleModel()
        model.localState = .transmitting
        model.activeSpeaker = "Bob"
        model.transmitElapsed = 12_400_000_000
        model.maximumTransmit = 60_000_000_000
        var frame = Screen.render(model, width: 80, height: 24)
        #expect(frame.lines.contains { $0.contains("TRANSMITTING  0:12 / 1:00") })
        #expect(frame.styles.contains(.transmit))

        model.localState = .latched
        model.keyboard = .legacy
        frame = Screen.render(model, width: 80, height: 24)
        #expect(frame.lines.contains { $0.contains("LATCHED — Space to stop") })
        #expect(frame.lines[23].contains("Esc to stop"))
    }

    @Test("key hints differ between kitty and legacy keyboards")
    func hints() {
        var model = sampleModel()
        model.localState = .idle
        let kitty = Screen.render(model, width: 80, height: 24).lines[23]
        model.keyboard = .legacy
        let legacy = Screen.render(model, width: 80, height: 24).lines[23]
        #expect(kitty.contains("Hold Space to talk") && !kitty.contains("latch"))
        #expect(legacy.contains("tap") && legacy.contains("latch"))
        model.localState = .background
        #expect(Screen.render(model, width: 80, height: 24).lines[23].contains("b return"))
        // A listen-only member is not invited to talk, and the header says why.
        model.localState = .idle
        model.transmissionMode = .listenOnly
        let listenOnly = Screen.render(model, width: 80, height: 24)
        #expect(listenOnly.lines[23].contains("Listen only") && !listenOnly.lines[23].contains("Hold"), "\(listenOnly.lines[23])")
        #expect(listenOnly.lines[0].contains("listen only"), "\(listenOnly.lines[0])")
    }

    @Test("names from the network cannot inject escape sequences")
    func sanitized() {
        var model = sampleModel()
        model.activeSpeaker = "Mallory\u{1B}[2J\u{07}"
        model.roster[0].name = "Eve\u{1B}]0;pwned\u{07}"
        let frame = Screen.render(model, width: 80, height: 24)
        checkBounds(frame, width: 80, height: 24)
        #expect(frame.lines.contains { $0.contains("Mallory\u{FFFD}[2J") })
    }

    @Test("wide characters are measured in columns")
    func wide() {
        var model = sampleModel()
        model.channelName = "配車センター北地区の緊急チャンネル"
        model.roster[0].name = "山田太郎😀"
        for width in [20, 40, 80] {
            checkBounds(Screen.render(model, width: width, height: 24), width: width, height: 24)
        }
        #expect(DisplayWidth.of("山田") == 4)
        #expect(DisplayWidth.of("e\u{301}") == 1)
        #expect(DisplayWidth.truncate("abcdef", to: 4) == "abc…")
    }

    @Test("every size from 0×0 to 100×30 fits exactly")
    func allSizes() {
        let models = [sampleModel(members: 0), sampleModel(members: 12)]
        for model in models {
            for width in stride(from: 0, through: 100, by: 3) {
                for height in 0...30 {
                    let frame = Screen.render(model, width: width, height: height)
                    checkBounds(frame, width: width, height: height)
                    if height >= 3 && width >= 24 {
                        #expect(frame.lines[height - 1].contains("quit"))
                    }
                }
            }
        }
    }

    @Test("ANSI redraw: positions every line first, then only what changed")
    func ansi() {
        let model = sampleModel()
        let first = Screen.render(model, width: 80, height: 24)
        let full = String(decoding: Screen.ansi(first), as: UTF8.self)
        #expect(full.hasPrefix("\u{1B}[?2026h"))
        #expect(full.hasSuffix("\u{1B}[?2026l"))
        #expect(full.contains("\u{1B}[1;1H") && full.contains("\u{1B}[24;1H"))
        #expect(full.contains("\u{1B}[2J"))

        var changed = model
        changed.activeSpeaker = "Carol"
        let second = Screen.render(changed, width: 80, height: 24)
        let diff = String(decoding: Screen.ansi(second, previous: first), as: UTF8.self)
        let row = second.lines.firstIndex { $0.contains("Speaker: Carol") }! + 1
        #expect(diff.contains("\u{1B}[\(row);1H"))
        #expect(diff.contains("Speaker: Carol"))
        #expect(!diff.contains("\u{1B}[2J"))
        #expect(diff.components(separatedBy: ";1H").count == 2)  // exactly one line rewritten
        #expect(Screen.ansi(second, previous: second) == Array("\u{1B}[?2026h\u{1B}[?2026l".utf8))
    }
}
