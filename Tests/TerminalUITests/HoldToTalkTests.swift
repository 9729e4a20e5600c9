import Testing
import TerminalUI

private func ms(_ value: UInt64) -> UInt64 { value * 1_000_000 }

/// One input on a timeline, in milliseconds.
private enum Input {
    case byte(UInt64)           // legacy: one PTT byte
    case press(UInt64)          // kitty
    case `repeat`(UInt64)
    case release(UInt64)
    case focusLost(UInt64)
    case cancel(UInt64)

    var time: UInt64 {
        switch self {
        case .byte(let t), .press(let t), .repeat(let t), .release(let t), .focusLost(let t), .cancel(let t): t
        }
    }
}

/// Drives `ptt` like an event loop would: before each input, ticks at every deadline that falls before it;
/// after the last input, ticks through deadlines up to `until`. Returns events with their time in ms.
private func run(_ ptt: inout HoldToTalk, _ inputs: [Input], until end: UInt64) -> [(UInt64, HoldToTalk.Event)] {
    var log: [(UInt64, HoldToTalk.Event)] = []
    func tick(upTo limit: UInt64) {
        while let deadline = ptt.nextDeadline, deadline <= ms(limit) {
            log += ptt.tick(now: deadline).map { (deadline / 1_000_000, $0) }
        }
    }
    for input in inputs.sorted(by: { $0.time < $1.time }) {
        tick(upTo: input.time)
        let now = ms(input.time)
        let events: [HoldToTalk.Event] = switch input {
        case .byte: ptt.keyEvent(now: now)
        case .press: ptt.press(now: now)
        case .repeat: ptt.repeat(now: now)
        case .release: ptt.release(now: now)
        case .focusLost: ptt.focusLost(now: now)
        case .cancel: ptt.cancel(now: now)
        }
        log += events.map { (input.time, $0) }
    }
    tick(upTo: end)
    return log
}

/// A legacy key hold: the press byte, then auto-repeats after `delay` every `interval` until `release`.
private func legacyHold(at start: UInt64, release: UInt64, delay: UInt64, interval: UInt64) -> [Input] {
    [.byte(start)] + stride(from: start + delay, through: release, by: Int(interval)).map { .byte($0) }
}

private func same(_ a: [(UInt64, HoldToTalk.Event)], _ b: [(UInt64, HoldToTalk.Event)]) -> Bool {
    a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
}

@Suite("HoldToTalk")
struct HoldToTalkTests {
    @Test("a lone press half a second after an unlatching tap keys up within a release gap; that tap's own repeats never do")
    func pressSoonAfterUnlatch() {
        // Tap to latch at 0, tap to unlatch at 2000, a new tap at 2500 with nothing after it.
        var ptt = HoldToTalk()
        let log = run(&ptt, [.byte(0), .byte(2000), .byte(2500)], until: 5000)
        #expect(log.map(\.1) == [.startTransmit, .stopTransmit(.tapUnlatched), .startTransmit])
        let restart = log.last!.0
        #expect(restart > 2500 && restart <= 2500 + 300, "keyed up once no repeat followed (at \(restart) ms; \(log))")
        #expect(ptt.latched && ptt.transmitStartedAt == ms(2500), "a tap, so it latches; the time counts from the press")
        // Holding the unlatching key instead: its repeats (660 ms delay, 40 ms apart) never key up.
        var held = HoldToTalk()
        let repeats = run(&held, [.byte(0)] + legacyHold(at: 2000, release: 3500, delay: 660, interval: 40), until: 5000)
        #expect(repeats.map(\.1) == [.startTransmit, .stopTransmit(.tapUnlatched)])
        #expect(!held.transmitting)
    }

    @Test("X auto-repeat 660 ms / 40 ms: a 1.5 s hold stops 100 ms after the last repeat")
    func xHold() {
        var ptt = HoldToTalk(mode: .legacy)
        let log = run(&ptt, legacyHold(at: 0, release: 1500, delay: 660, interval: 40), until: 3000)
        // Last repeat at 660 + 21 × 40 = 1500; release gap max(2.5 × 40, 80) = 100 ms.
        #expect(same(log, [(0, .startTransmit), (1600, .stopTransmit(.repeatsEnded))]), "\(log)")
        #expect(ptt.learnedRepeatDelay == ms(660))
        #expect(ptt.learnedRepeatInterval == ms(40))
        #expect(ptt.releaseGap == ms(100))
        #expect(!ptt.transmitting && !ptt.latched)

        // A second hold with everything learned: last repeat at 5980, stop at 6080.
        let again = run(&ptt, legacyHold(at: 5000, release: 6000, delay: 660, interval: 40), until: 8000)
        #expect(same(again, [(5000, .startTransmit), (6080, .stopTransmit(.repeatsEnded))]), "\(again)")
    }

    @Test("a tap latches until the next press")
    func tapLatches() {
        var ptt = HoldToTalk(mode: .legacy)
        var log = run(&ptt, [.byte(0)], until: 749)
        #expect(same(log, [(0, .startTransmit)]))
        #expect(!ptt.latched)
        log = run(&ptt, [], until: 750)
        #expect(log.isEmpty && ptt.latched && ptt.transmitting)
        #expect(ptt.nextDeadline == ms(60_000))                 // only the maximum transmit time remains

        log = run(&ptt, [.byte(5000)], until: 7000)
        #expect(same(log, [(5000, .stopTransmit(.tapUnlatched))]), "\(log)")
        #expect(!ptt.latched && !ptt.transmitting)

        // The next tap latches again.
        log = run(&ptt, [.byte(8000)], until: 9000)
        #expect(same(log, [(8000, .startTransmit)]) && ptt.latched)
    }

    @Test("a latched transmission that ends elsewhere (revoked, input ended) lets the next tap talk again")
    func endedElsewhereUnlatches() {
        var ptt = HoldToTalk(mode: .legacy)
        _ = run(&ptt, [.byte(0)], until: 1000)
        #expect(ptt.latched && ptt.transmitting)
        #expect(ptt.transmissionEnded(now: ms(3000)).isEmpty, "nothing is left to stop")
        #expect(!ptt.latched && !ptt.transmitting)
        #expect(ptt.nextDeadline == nil, "the maximum transmit time went with it")
        // Without it, this tap would only unlatch the transmission already gone.
        let log = run(&ptt, [.byte(5000)], until: 5001)
        #expect(same(log, [(5000, .startTransmit)]), "\(log)")

        // A legacy hold cut off mid-way: its remaining repeats don't key up again.
        var held = HoldToTalk(mode: .legacy)
        _ = run(&held, legacyHold(at: 0, release: 1000, delay: 660, interval: 40).filter { $0.time <= 800 }, until: 800)
        #expect(held.transmitting)
        #expect(held.transmissionEnded(now: ms(800)).isEmpty)
        let rest = run(&held, legacyHold(at: 0, release: 1500, delay: 660, interval: 40).filter { $0.time > 800 }, until: 3000)
        #expect(rest.isEmpty, "\(rest)")
        #expect(!held.transmitting)

        // Kitty: the key is still down when the floor goes; its release changes nothing, a new press talks.
        var kitty = HoldToTalk(mode: .kitty)
        _ = kitty.press(now: ms(0))
        #expect(kitty.transmissionEnded(now: ms(100)).isEmpty)
        #expect(kitty.release(now: ms(200)).isEmpty)
        #expect(kitty.press(now: ms(300)) == [.startTransmit])
    }

    @Test("holding the key to unlatch does not key up again on its repeats")
    func holdToUnlatch() {
        var ptt = HoldToTalk(mode: .legacy)
        _ = run(&ptt, [.byte(0)], until: 1000)
        #expect(ptt.latched)
        let log = run(&ptt, legacyHold(at: 5000, release: 6500, delay: 660, interval: 40) + [.byte(9000)], until: 9100)
        #expect(same(log, [(5000, .stopTransmit(.tapUnlatched)), (9000, .startTransmit)]), "\(log)")
    }

    @Test("GNOME 500 ms / 30 ms: hold stops 80 ms after the last repeat; the tap window shrinks to 600 ms")
    func gnome() {
        var ptt = HoldToTalk(mode: .legacy)
        let hold = run(&ptt, legacyHold(at: 0, release: 1200, delay: 500, interval: 30), until: 2000)
        // Last repeat at 500 + 23 × 30 = 1190; max(2.5 × 30, 80) = 80.
        #expect(same(hold, [(0, .startTransmit), (1270, .stopTransmit(.repeatsEnded))]), "\(hold)")
        #expect(ptt.tapWindow == ms(600))

        let tap = run(&ptt, [.byte(3000)], until: 3599)
        #expect(same(tap, [(3000, .startTransmit)]) && !ptt.latched)
        _ = run(&ptt, [], until: 3600)
        #expect(ptt.latched)
    }

    @Test("a quick second tap unlatches once the repeat delay is known")
    func doubleTap() {
        var ptt = HoldToTalk(mode: .legacy)
        _ = run(&ptt, legacyHold(at: 0, release: 1000, delay: 660, interval: 40), until: 2000)
        let log = run(&ptt, [.byte(3000), .byte(3200)], until: 5000)
        #expect(same(log, [(3000, .startTransmit), (3200, .stopTransmit(.tapUnlatched))]), "\(log)")
        #expect(!ptt.transmitting)
    }

    @Test("kitty: transmits exactly from press to release")
    func kitty() {
        var ptt = HoldToTalk(mode: .kitty)
        // kitty 0.26.5 under X: press, repeats every 40 ms from +646 ms, release.
        let repeats = stride(from: UInt64(646), through: 1486, by: 40).map { Input.repeat($0) }
        let log = run(&ptt, [.press(0)] + repeats + [.release(1506)], until: 3000)
        #expect(same(log, [(0, .startTransmit), (1506, .stopTransmit(.released))]), "\(log)")
        // A short tap is a short transmission: no latching with real key-up events.
        let tap = run(&ptt, [.press(4000), .release(4080)], until: 6000)
        #expect(same(tap, [(4000, .startTransmit), (4080, .stopTransmit(.released))]), "\(tap)")
        #expect(!ptt.latched)
    }

    @Test("handle(_:now:) routes parser events by mode")
    func handleRoutes() {
        var kitty = HoldToTalk(mode: .kitty)
        #expect(kitty.handle(.press, now: 0) == [.startTransmit])
        #expect(kitty.handle(.repeat, now: ms(700)) == [])
        #expect(kitty.handle(.release, now: ms(900)) == [.stopTransmit(.released)])

        var legacy = HoldToTalk(mode: .legacy)
        #expect(legacy.handle(.press, now: 0) == [.startTransmit])
        #expect(legacy.handle(.press, now: ms(660)) == [])       // a repeat
        #expect(legacy.handle(.press, now: ms(700)) == [])
        #expect(legacy.tick(now: ms(1000)) == [.stopTransmit(.repeatsEnded)])
    }

    @Test("maximum transmit time, kitty: the still-held key stays quiet until pressed again")
    func maxTransmitKitty() {
        var ptt = HoldToTalk(mode: .kitty, configuration: .init(maximumTransmitDuration: ms(60_000)))
        let repeats = stride(from: UInt64(660), through: 70_000, by: 40).map { Input.repeat($0) }
        let log = run(&ptt, [.press(0)] + repeats + [.release(70_010), .press(71_000)], until: 72_000)
        #expect(same(log, [(0, .startTransmit), (60_000, .stopTransmit(.maxTransmitTime)), (71_000, .startTransmit)]), "\(log)")
    }

    @Test("maximum transmit time, legacy: repeats of the held key are swallowed")
    func maxTransmitLegacy() {
        var ptt = HoldToTalk(mode: .legacy, configuration: .init(maximumTransmitDuration: ms(5000)))
        let log = run(&ptt, legacyHold(at: 0, release: 8000, delay: 660, interval: 40) + [.byte(9000)], until: 9500)
        #expect(same(log, [(0, .startTransmit), (5000, .stopTransmit(.maxTransmitTime)), (9000, .startTransmit)]), "\(log)")
    }

    @Test("maximum transmit time ends a latched transmission")
    func maxTransmitLatched() {
        var ptt = HoldToTalk(mode: .legacy)
        let log = run(&ptt, [.byte(0)], until: 61_000)
        #expect(same(log, [(0, .startTransmit), (60_000, .stopTransmit(.maxTransmitTime))]), "\(log)")
        #expect(!ptt.latched && ptt.nextDeadline == nil)
    }

    @Test("maximum transmit time counts from the grant, not from a press that waited in the queue")
    func maxTransmitCountsFromTheGrant() {
        var ptt = HoldToTalk(mode: .legacy, configuration: .init(maximumTransmitDuration: ms(10_000)))
        #expect(ptt.keyEvent(now: 0) == [.startTransmit])
        _ = ptt.tick(now: ms(1000))
        #expect(ptt.latched && ptt.transmitStartedAt == 0)
        ptt.transmissionGranted(now: ms(6000))     // five seconds in the queue first
        #expect(ptt.transmitStartedAt == ms(6000) && ptt.nextDeadline == ms(16_000))
        #expect(ptt.tick(now: ms(15_999)).isEmpty)
        #expect(ptt.tick(now: ms(16_000)) == [.stopTransmit(.maxTransmitTime)])
        // Not transmitting: a late grant changes nothing.
        ptt.transmissionGranted(now: ms(17_000))
        #expect(ptt.transmitStartedAt == nil)
    }

    @Test("focus loss unkeys in both modes")
    func focusLoss() {
        var kitty = HoldToTalk(mode: .kitty)
        let k = run(&kitty, [.press(0), .repeat(700), .focusLost(900), .release(1500)], until: 2000)
        #expect(same(k, [(0, .startTransmit), (900, .stopTransmit(.focusLost))]), "\(k)")

        var legacy = HoldToTalk(mode: .legacy)
        let l = run(&legacy, [.byte(0), .focusLost(2000)], until: 3000)
        #expect(same(l, [(0, .startTransmit), (2000, .stopTransmit(.focusLost))]), "\(l)")
        #expect(!legacy.latched)
    }

    @Test("cancel (Esc) unkeys a hold and swallows its remaining repeats")
    func cancel() {
        var ptt = HoldToTalk(mode: .legacy)
        let log = run(&ptt, legacyHold(at: 0, release: 2000, delay: 660, interval: 40) + [.cancel(1000), .byte(3000)], until: 3100)
        #expect(same(log, [(0, .startTransmit), (1000, .stopTransmit(.cancelled)), (3000, .startTransmit)]), "\(log)")
    }

    @Test("a late probe reply switches to kitty mid-hold; the release then stops it")
    func modeSwitch() {
        var ptt = HoldToTalk(mode: .legacy)
        _ = ptt.keyEvent(now: 0)
        #expect(ptt.setMode(.kitty, now: ms(100)) == [])
        #expect(ptt.mode == .kitty && ptt.transmitting)
        #expect(ptt.tick(now: ms(5000)) == [])                  // no tap latching or repeat timeout in kitty mode
        #expect(ptt.release(now: ms(5100)) == [.stopTransmit(.released)])
    }

    @Test("a late tick still reports the stop, once")
    func lateTick() {
        var ptt = HoldToTalk(mode: .legacy)
        _ = run(&ptt, legacyHold(at: 0, release: 1500, delay: 660, interval: 40), until: 1500)
        #expect(ptt.nextDeadline == ms(1600))
        #expect(ptt.tick(now: ms(10_000)) == [.stopTransmit(.repeatsEnded)])
        #expect(ptt.tick(now: ms(20_000)) == [])
        #expect(ptt.nextDeadline == nil)
    }
}
