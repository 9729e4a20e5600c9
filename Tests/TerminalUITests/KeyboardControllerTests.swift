import Testing
import TerminalUI

private func ms(_ value: UInt64) -> UInt64 { value * 1_000_000 }
private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }
private let esc = "\u{1B}"

/// Feeds byte chunks at their times, ticking at every deadline in between, as the app's loop would.
private func drive(_ keyboard: inout KeyboardController, _ timeline: [(UInt64, String)], until end: UInt64)
    -> [(UInt64, KeyboardController.Action)] {
    var log: [(UInt64, KeyboardController.Action)] = []
    func tick(upTo limit: UInt64) {
        while let deadline = keyboard.nextDeadline, deadline <= ms(limit) {
            log += keyboard.tick(now: deadline).map { (deadline / 1_000_000, $0) }
        }
    }
    for (time, text) in timeline {
        tick(upTo: time)
        log += keyboard.receive(bytes(text), now: ms(time)).map { (time, $0) }
    }
    tick(upTo: end)
    return log
}

private func same(_ a: [(UInt64, KeyboardController.Action)], _ b: [(UInt64, KeyboardController.Action)]) -> Bool {
    a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
}

@Suite("KeyboardController")
struct KeyboardControllerTests {
    @Test("kitty terminal: probe reply enables the protocol, then press to release is exact")
    func kitty() {
        var keyboard = KeyboardController()
        var timeline: [(UInt64, String)] = [(5, "\(esc)[?0u\(esc)[?62;c"), (1000, "\(esc)[32u")]
        timeline += stride(from: UInt64(1646), through: 2486, by: 40).map { ($0, "\(esc)[32;1:2u") }
        timeline.append((2506, "\(esc)[32;1:3u"))
        let log = drive(&keyboard, timeline, until: 4000)
        #expect(same(log, [(5, .enableKittyKeyboard), (1000, .startTransmit), (2506, .stopTransmit(.released))]), "\(log)")
        #expect(keyboard.holdToTalk.mode == .kitty)
    }

    @Test("xterm: DA only, so legacy timing; Space bytes make a hold")
    func xterm() {
        var keyboard = KeyboardController()
        var timeline: [(UInt64, String)] = [(5, "\(esc)[?64;1;2;6;9;15;16;17;18;21;22;28c"), (1000, " ")]
        timeline += stride(from: UInt64(1660), through: 2500, by: 40).map { ($0, " ") }
        let log = drive(&keyboard, timeline, until: 4000)
        #expect(same(log, [(1000, .startTransmit), (2600, .stopTransmit(.repeatsEnded))]), "\(log)")
        #expect(keyboard.probe.support == .legacy)
    }

    @Test("a lone ESC becomes Escape after the timeout and cancels a latched transmission")
    func escapeCancels() {
        var keyboard = KeyboardController()
        let log = drive(&keyboard, [(0, " "), (2000, esc)], until: 3000)
        #expect(same(log, [(0, .startTransmit), (2050, .stopTransmit(.cancelled))]), "\(log)")
    }

    @Test("q unkeys before quitting; focus loss unkeys; m toggles mute without unkeying")
    func commands() {
        var keyboard = KeyboardController()
        var log = drive(&keyboard, [(0, " "), (1000, "m"), (2000, "q")], until: 2100)
        #expect(same(log, [(0, .startTransmit), (1000, .command(.toggleMute)),
                           (2000, .stopTransmit(.cancelled)), (2000, .command(.quit))]), "\(log)")

        keyboard = KeyboardController()
        log = drive(&keyboard, [(0, "\(esc)[?0u\(esc)[?62;c"), (10, "\(esc)[32u"), (500, "\(esc)[O"), (900, "\(esc)[32;1:3u")], until: 1000)
        #expect(same(log, [(0, .enableKittyKeyboard), (10, .startTransmit), (500, .stopTransmit(.focusLost))]), "\(log)")
        #expect(!keyboard.focused)
    }

    @Test("Ctrl-C in either encoding quits; Ctrl-Z suspends")
    func controlKeys() {
        var keyboard = KeyboardController()
        var log = drive(&keyboard, [(0, "\u{03}")], until: 10)
        #expect(same(log, [(0, .command(.quit))]))
        log = drive(&keyboard, [(20, "\(esc)[?0u\(esc)[?62;c"), (30, "\(esc)[122;5u")], until: 40)
        #expect(same(log, [(20, .enableKittyKeyboard), (30, .command(.suspend))]))
    }
}
