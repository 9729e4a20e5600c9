/// Decides when walkie transmits, from push-to-talk key events and the clock. Sans-I/O: the caller feeds
/// it events with their time, calls ``tick(now:)`` at ``nextDeadline``, and acts on the returned events.
///
/// Two ways to know the key is held (audio.md §5):
/// - **Kitty** (`.kitty`): the terminal reports press, repeat and release, so walkie transmits exactly
///   while the key is down. Feed ``press(now:)``, ``repeat(now:)`` and ``release(now:)``.
/// - **Legacy** (`.legacy`): a terminal only sends the key's byte on press and on each auto-repeat,
///   nothing on release. "Tap latches, hold is momentary": the first byte keys up at once; if repeats follow
///   (the first within the tap window, ~750 ms) it is a hold and walkie unkeys `max(2.5 × repeat interval,
///   80 ms)` (≈100 ms) after the repeats stop; if no repeat comes in the window it was a tap and walkie stays
///   latched until the next press. Feed ``keyEvent(now:)`` for every byte of the key. The repeat delay and
///   interval are learned from what the terminal actually sends, which narrows the tap window and the
///   release gap to the user's settings.
///
/// Safety stops in both modes: focus loss (``focusLost(now:)``), a maximum transmit time, and
/// ``cancel(now:)`` for command keys (Esc, quit, background). Other keys deliberately do not unkey: in kitty
/// mode the release is reported reliably, and in legacy mode pressing another key already ends the PTT
/// key's auto-repeat (X repeats only the last key pressed), which the repeat timeout notices.
///
/// Times are monotonic nanoseconds (`UInt64`); the origin does not matter.
public struct HoldToTalk: Sendable {
    /// How key events reach us; switch with ``setMode(_:now:)`` when the keyboard probe answers.
    public enum Mode: Hashable, Sendable {
        case kitty
        case legacy
    }

    public enum StopReason: Hashable, Sendable {
        /// Kitty: the key went up.
        case released
        /// Legacy: the auto-repeats stopped, so the held key was released.
        case repeatsEnded
        /// A press while latched (or a second tap) ended the latched transmission.
        case tapUnlatched
        case maxTransmitTime
        case focusLost
        /// ``cancel(now:)``: Esc or another command key.
        case cancelled
    }

    public enum Event: Hashable, Sendable {
        case startTransmit
        case stopTransmit(StopReason)
    }

    public struct Configuration: Hashable, Sendable {
        /// Longest single transmission; the channel's own burst limit is usually the same (60 s).
        public var maximumTransmitDuration: UInt64
        /// Legacy: how long the first byte waits for a repeat before it counts as a tap (before a repeat delay
        /// has been learned; afterwards `learned delay + repeatDelayMargin`, never more than this).
        public var tapWindow: UInt64
        /// Legacy: the repeats have ended once none came for `max(factor × interval, minimumReleaseGap)`.
        public var releaseGapFactor: Double
        public var minimumReleaseGap: UInt64
        /// Added to the release gap and tap window for links that bunch key bytes (SSH over a slow network).
        public var networkMargin: UInt64
        /// The repeat interval assumed until one has been measured. Generous on purpose (the Linux console
        /// repeats every ~92 ms): a too-short guess would unkey between the first repeats of a hold.
        public var assumedRepeatInterval: UInt64
        /// Slack over the learned repeat delay before a press is judged a tap.
        public var repeatDelayMargin: UInt64

        public init(maximumTransmitDuration: UInt64 = 60_000_000_000,
                    tapWindow: UInt64 = 750_000_000,
                    releaseGapFactor: Double = 2.5,
                    minimumReleaseGap: UInt64 = 80_000_000,
                    networkMargin: UInt64 = 0,
                    assumedRepeatInterval: UInt64 = 100_000_000,
                    repeatDelayMargin: UInt64 = 100_000_000) {
            self.maximumTransmitDuration = maximumTransmitDuration
            self.tapWindow = tapWindow
            self.releaseGapFactor = releaseGapFactor
            self.minimumReleaseGap = minimumReleaseGap
            self.networkMargin = networkMargin
            self.assumedRepeatInterval = assumedRepeatInterval
            self.repeatDelayMargin = repeatDelayMargin
        }
    }

    private enum Phase: Hashable, Sendable {
        case idle
        /// Legacy: transmitting since the first byte at `at`; tap or hold not yet known.
        case pressed(at: UInt64)
        /// Legacy: repeats are arriving; the last one at `lastEvent`.
        case holding(lastEvent: UInt64)
        /// Transmitting after a tap, until the next press.
        case latched
        /// Legacy, not transmitting: swallowing the rest of a key hold that just unkeyed (after a tap that
        /// unlatched, a maximum-time stop or a cancel), so its repeats do not key up again.
        case settling(lastEvent: UInt64, repeating: Bool)
        /// Legacy, not transmitting: one byte came while settling, too late to be the unkeying press's
        /// first auto-repeat for sure. If no repeat follows within the release gap, it was a new press
        /// (someone keying up again half a second after letting go) and transmission starts then.
        case unsure(at: UInt64)
        /// Kitty: the key is down.
        case down
    }

    public let configuration: Configuration
    public private(set) var mode: Mode
    /// When the current transmission started, or nil when not transmitting (for the elapsed-time display).
    public private(set) var transmitStartedAt: UInt64?
    /// Legacy: the terminal's auto-repeat delay as observed (smoothed), once a hold has shown it.
    public private(set) var learnedRepeatDelay: UInt64?
    /// Legacy: the auto-repeat interval as observed (smoothed).
    public private(set) var learnedRepeatInterval: UInt64?
    private var phase: Phase = .idle

    public init(mode: Mode = .legacy, configuration: Configuration = Configuration()) {
        self.mode = mode
        self.configuration = configuration
    }

    public var transmitting: Bool { transmitStartedAt != nil }

    /// True while a tap holds the transmission open ("LATCHED — Space to stop").
    public var latched: Bool { phase == .latched }

    /// Legacy: silence after which a hold's repeats count as ended.
    public var releaseGap: UInt64 {
        let interval = learnedRepeatInterval ?? configuration.assumedRepeatInterval
        let scaled = UInt64((Double(interval) * configuration.releaseGapFactor).rounded())
        return max(scaled, configuration.minimumReleaseGap) + configuration.networkMargin
    }

    /// Legacy: how long after the first byte a repeat may still arrive to make it a hold.
    public var tapWindow: UInt64 {
        guard let delay = learnedRepeatDelay else { return configuration.tapWindow + configuration.networkMargin }
        return min(configuration.tapWindow, delay + configuration.repeatDelayMargin) + configuration.networkMargin
    }

    /// The next time at which ``tick(now:)`` may change something (nil: nothing is timed). Every input
    /// also catches up on missed deadlines first, so a late tick never misorders events; it only delays them.
    public var nextDeadline: UInt64? {
        switch (phaseDeadline, transmitDeadline) {
        case (let a?, let b?): min(a, b)
        case (let a?, nil): a
        case (nil, let b?): b
        case (nil, nil): nil
        }
    }

    // MARK: - Inputs

    /// Kitty: the key went down (event type 1, or no event type).
    public mutating func press(now: UInt64) -> [Event] {
        var events = advance(to: now)
        switch phase {
        case .idle, .settling, .unsure:
            start(at: now, &events)
            phase = .down
        case .down:
            break                                           // a release we never saw; still held
        case .latched:
            stop(.tapUnlatched, &events)
        case .pressed, .holding:
            phase = .down                                   // switched from legacy mid-hold
        }
        return events
    }

    /// Kitty: auto-repeat while the key is down. Never keys up on its own: after a maximum-time stop or
    /// focus loss, a still-held key stays quiet until it is pressed again.
    public mutating func `repeat`(now: UInt64) -> [Event] {
        let events = advance(to: now)
        switch phase {
        case .pressed, .holding: phase = .down
        case .idle, .settling, .unsure, .latched, .down: break
        }
        return events
    }

    /// Kitty: the key went up.
    public mutating func release(now: UInt64) -> [Event] {
        var events = advance(to: now)
        switch phase {
        case .down, .pressed, .holding:
            stop(.released, &events)
        case .settling, .unsure:
            phase = .idle
        case .idle, .latched:
            break                                           // the release of the tap that latched, or stale
        }
        return events
    }

    /// Legacy: one byte of the push-to-talk key arrived (a press or an auto-repeat; the terminal does not say which).
    public mutating func keyEvent(now: UInt64) -> [Event] {
        var events = advance(to: now)
        switch phase {
        case .idle:
            start(at: now, &events)
            phase = .pressed(at: now)
        case .pressed(let first):
            let gap = elapsed(from: first, to: now)
            if isTooSoonForRepeat(gap) {
                // A second tap, not a repeat: the first press was a tap, and this one unlatches it.
                stop(.tapUnlatched, &events)
                phase = .settling(lastEvent: now, repeating: false)
            } else {
                learnDelay(gap)
                phase = .holding(lastEvent: now)
            }
        case .holding(let last):
            learnInterval(elapsed(from: last, to: now))
            phase = .holding(lastEvent: now)
        case .latched:
            stop(.tapUnlatched, &events)
            phase = .settling(lastEvent: now, repeating: false)
        case .settling(let last, let repeating):
            if !repeating, isTooSoonForRepeat(elapsed(from: last, to: now)) {
                start(at: now, &events)                     // a fresh tap right after the one that unkeyed
                phase = .pressed(at: now)
            } else if repeating {
                phase = .settling(lastEvent: now, repeating: true)
            } else {
                phase = .unsure(at: now)
            }
        case .unsure:
            // A second byte within the release gap: the key is held and repeating; keep swallowing.
            phase = .settling(lastEvent: now, repeating: true)
        case .down:
            break                                           // a legacy byte in kitty mode: the key is down anyway
        }
        return events
    }

    /// Routes a parsed PTT key event by ``mode``: kitty events carry their type; in legacy mode every event
    /// is a byte of the key.
    public mutating func handle(_ type: KeyEventType, now: UInt64) -> [Event] {
        switch (mode, type) {
        case (.kitty, .press): press(now: now)
        case (.kitty, .repeat): self.repeat(now: now)
        case (.kitty, .release): release(now: now)
        case (.legacy, .release): advance(to: now)
        case (.legacy, _): keyEvent(now: now)
        }
    }

    /// The terminal lost focus (`ESC[O`): the key may go up where we cannot see it, so unkey now.
    public mutating func focusLost(now: UInt64) -> [Event] {
        var events = advance(to: now)
        if transmitting { stop(.focusLost, &events) }
        phase = .idle
        return events
    }

    /// The transmission ended without the key: the floor was revoked, the request was refused, or the
    /// audio input ran out. Forgets it and unlatches, with no `stopTransmit` (there is nothing left to
    /// stop), so that the next press talks again rather than unlatching a transmission already gone. The
    /// rest of a legacy hold is swallowed, as after ``cancel(now:)``, so its repeats don't key up again.
    public mutating func transmissionEnded(now: UInt64) -> [Event] {
        cancel(now: now).filter { if case .stopTransmit = $0 { false } else { true } }
    }

    /// The floor was granted for the transmission the key started: its time limit, and the elapsed
    /// time shown, count from now. Time spent waiting for the floor (in the queue behind another
    /// talker) is not talk time.
    public mutating func transmissionGranted(now: UInt64) {
        if transmitting { transmitStartedAt = now }
    }

    /// A command key (Esc, quit, background): unkey and unlatch. In legacy mode the rest of a key hold is
    /// swallowed so that its repeats do not key up again.
    public mutating func cancel(now: UInt64) -> [Event] {
        var events = advance(to: now)
        let held: Phase = switch phase {
        case .pressed(let first): .settling(lastEvent: first, repeating: false)
        case .holding(let last): .settling(lastEvent: last, repeating: true)
        case .settling: phase
        case .idle, .latched, .down, .unsure: .idle
        }
        if transmitting { stop(.cancelled, &events) }
        phase = held
        return events
    }

    /// Applies every deadline up to `now`. Call it at (or after) ``nextDeadline``.
    public mutating func tick(now: UInt64) -> [Event] {
        advance(to: now)
    }

    /// Changes how key events arrive, e.g. to `.kitty` when a late probe reply turns the protocol on. A
    /// transmission in progress continues: a held key is then tracked in the new mode, a latch stays latched.
    public mutating func setMode(_ newMode: Mode, now: UInt64) -> [Event] {
        let events = advance(to: now)
        guard newMode != mode else { return events }
        mode = newMode
        switch (newMode, phase) {
        case (.kitty, .pressed), (.kitty, .holding): phase = .down
        case (.kitty, .settling), (.kitty, .unsure): phase = .idle
        case (.legacy, .down): phase = .holding(lastEvent: now)   // repeats keep it; silence ends it
        default: break
        }
        return events
    }

    // MARK: - Timing

    private var transmitDeadline: UInt64? {
        transmitStartedAt.map { $0 &+ configuration.maximumTransmitDuration }
    }

    private var phaseDeadline: UInt64? {
        switch phase {
        case .pressed(let first): first &+ tapWindow
        case .holding(let last): last &+ releaseGap
        case .settling(let last, let repeating): last &+ (repeating ? releaseGap : tapWindow)
        case .unsure(let at): at &+ releaseGap
        case .idle, .latched, .down: nil
        }
    }

    /// Fires deadlines in time order. Each firing ends the transmission or moves the phase to one with a
    /// later deadline or none, so the loop ends.
    private mutating func advance(to now: UInt64) -> [Event] {
        var events: [Event] = []
        while let deadline = nextDeadline, deadline <= now {
            if let limit = transmitDeadline, limit == deadline {
                let after: Phase = switch phase {
                case .pressed(let first): .settling(lastEvent: first, repeating: false)
                case .holding(let last): .settling(lastEvent: last, repeating: true)
                default: .idle
                }
                stop(.maxTransmitTime, &events)
                phase = after
                continue
            }
            switch phase {
            case .pressed: phase = .latched                 // no repeat in the window: it was a tap
            case .holding: stop(.repeatsEnded, &events)
            case .settling: phase = .idle
            case .unsure(let at):
                // No repeat followed: that byte was a press. Its transmission counts from the press.
                start(at: at, &events)
                phase = .pressed(at: at)
            case .idle, .latched, .down: break              // no phase deadline; unreachable
            }
        }
        return events
    }

    private mutating func start(at now: UInt64, _ events: inout [Event]) {
        transmitStartedAt = now
        events.append(.startTransmit)
    }

    private mutating func stop(_ reason: StopReason, _ events: inout [Event]) {
        transmitStartedAt = nil
        phase = .idle
        events.append(.stopTransmit(reason))
    }

    private func elapsed(from earlier: UInt64, to later: UInt64) -> UInt64 {
        later >= earlier ? later - earlier : 0
    }

    /// Once the repeat delay is known, a byte far sooner than it cannot be an auto-repeat: it is a new press.
    /// Half the delay leaves room for the press byte itself arriving late.
    private func isTooSoonForRepeat(_ gap: UInt64) -> Bool {
        guard let delay = learnedRepeatDelay else { return false }
        return gap < delay / 2
    }

    private mutating func learnDelay(_ gap: UInt64) {
        guard gap >= 100_000_000, gap <= configuration.tapWindow + configuration.networkMargin else { return }
        learnedRepeatDelay = learnedRepeatDelay.map { ($0 + gap) / 2 } ?? gap
    }

    private mutating func learnInterval(_ gap: UInt64) {
        // Bytes that arrive together (bunched by SSH or one read) say nothing about the interval.
        guard gap >= 10_000_000, gap <= 500_000_000 else { return }
        guard let current = learnedRepeatInterval else { learnedRepeatInterval = gap; return }
        learnedRepeatInterval = gap >= current ? current + (gap - current) / 4 : current - (current - gap) / 4
    }
}
