/// The whole keyboard path in one sans-I/O value: bytes from the terminal in, actions for the app out.
///
/// It wires ``KeyInputParser`` → ``KeyboardProbe`` / ``KeyBindings`` → ``HoldToTalk`` the way walkie needs:
/// a kitty probe reply switches hold-to-talk to kitty mode and asks the app to push the flags; focus loss
/// unkeys; Esc cancels; quit, background and suspend unkey before they are reported, so the app never leaves a
/// transmission open behind a command; a lone ESC becomes the Escape key after ``escapeTimeout``.
///
/// The app's loop: wait for input until ``nextDeadline``, then call ``receive(_:now:)`` with whatever bytes
/// came (possibly none) and ``tick(now:)``, and perform the actions in order.
public struct KeyboardController: Sendable {
    public enum Action: Hashable, Sendable {
        case startTransmit
        case stopTransmit(HoldToTalk.StopReason)
        /// The terminal speaks the kitty protocol: call ``TerminalSession/enableKittyKeyboard(flags:)``.
        case enableKittyKeyboard
        /// `.quit`, `.background`, `.toggleMute`, `.suspend` or `.redraw` (push-to-talk and Esc are handled here).
        case command(KeyCommand)
    }

    public var bindings: KeyBindings
    /// How long a lone ESC waits for the rest of a sequence before it counts as the Escape key. 50 ms
    /// covers local terminals; raise it for slow SSH links.
    public var escapeTimeout: UInt64
    public private(set) var holdToTalk: HoldToTalk
    public private(set) var probe = KeyboardProbe()
    /// Whether the terminal window has focus, as last reported (true until told otherwise).
    public private(set) var focused = true
    private var parser = KeyInputParser()
    /// When the parser last received bytes while holding an incomplete sequence.
    private var pendingSince: UInt64?

    public init(bindings: KeyBindings = KeyBindings(),
                holdToTalk configuration: HoldToTalk.Configuration = HoldToTalk.Configuration(),
                escapeTimeout: UInt64 = 50_000_000) {
        self.bindings = bindings
        self.escapeTimeout = escapeTimeout
        self.holdToTalk = HoldToTalk(mode: .legacy, configuration: configuration)
    }

    /// When ``tick(now:)`` must run next (nil: only input can change anything).
    public var nextDeadline: UInt64? {
        let escape = pendingSince.map { $0 &+ escapeTimeout }
        return [escape, holdToTalk.nextDeadline].compactMap { $0 }.min()
    }

    /// Bytes read from the terminal at `now` (an empty array is fine).
    public mutating func receive(_ bytes: [UInt8], now: UInt64) -> [Action] {
        var actions: [Action] = []
        for event in parser.feed(bytes) { handle(event, now: now, into: &actions) }
        if !bytes.isEmpty { pendingSince = parser.hasPendingInput ? now : nil }
        return actions
    }

    /// Applies timeouts: the escape timeout, then the hold-to-talk deadlines.
    public mutating func tick(now: UInt64) -> [Action] {
        var actions: [Action] = []
        if let since = pendingSince, now >= since &+ escapeTimeout {
            pendingSince = nil
            for event in parser.flush() { handle(event, now: now, into: &actions) }
        }
        actions += holdToTalk.tick(now: now).map(Self.action)
        return actions
    }

    /// The floor was granted (``HoldToTalk/transmissionGranted(now:)``).
    public mutating func transmissionGranted(now: UInt64) {
        holdToTalk.transmissionGranted(now: now)
    }

    /// The transmission ended without the key (``HoldToTalk/transmissionEnded(now:)``).
    public mutating func transmissionEnded(now: UInt64) -> [Action] {
        holdToTalk.transmissionEnded(now: now).map(Self.action)
    }

    private mutating func handle(_ event: KeyInputEvent, now: UInt64, into actions: inout [Action]) {
        switch event {
        case .kittyFlags, .deviceAttributes:
            if probe.handle(event), probe.support == .kitty {
                actions.append(.enableKittyKeyboard)
                actions += holdToTalk.setMode(.kitty, now: now).map(Self.action)
            }
        case .focusIn:
            focused = true
        case .focusOut:
            focused = false
            actions += holdToTalk.focusLost(now: now).map(Self.action)
        case .key:
            guard let command = bindings.command(for: event) else { return }
            switch command {
            case .pushToTalk(let type):
                actions += holdToTalk.handle(type, now: now).map(Self.action)
            case .cancelTransmit:
                actions += holdToTalk.cancel(now: now).map(Self.action)
            case .quit, .background, .suspend:
                actions += holdToTalk.cancel(now: now).map(Self.action)
                actions.append(.command(command))
            case .toggleMute, .redraw:
                actions.append(.command(command))
            }
        }
    }

    private static func action(_ event: HoldToTalk.Event) -> Action {
        switch event {
        case .startTransmit: .startTransmit
        case .stopTransmit(let reason): .stopTransmit(reason)
        }
    }
}
