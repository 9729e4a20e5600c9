/// What a key means to walkie's interactive screen.
public enum KeyCommand: Hashable, Sendable {
    /// The push-to-talk key, with its event type; feed it to ``HoldToTalk/handle(_:now:)``.
    case pushToTalk(KeyEventType)
    /// Unkey and unlatch without doing anything else (Esc): ``HoldToTalk/cancel(now:)``.
    case cancelTransmit
    /// Leave: `q`, Ctrl-C, Ctrl-D, Ctrl-\ (raw mode turns the latter into keys instead of signals).
    case quit
    /// Go to the background: suspend the voice connection and wait for pushes (`b`; again to come back).
    case background
    case toggleMute
    /// Stop the process like a shell's Ctrl-Z would (``TerminalSession/suspend()``).
    case suspend
    /// Repaint everything (Ctrl-L), for when something else scribbled on the screen.
    case redraw
}

/// Maps keys to commands. Only presses trigger commands, except for the push-to-talk key, whose repeats and
/// releases matter; modifier-only keys (kitty reports Shift and friends on their own) never mean anything.
public struct KeyBindings: Hashable, Sendable {
    /// The hold-to-talk key (default Space). It wins over every other binding.
    public var pushToTalk: Key
    public var quit: Set<Key>
    public var background: Set<Key>
    public var toggleMute: Set<Key>

    public init(pushToTalk: Key = .space,
                quit: Set<Key> = [.character("q")],
                background: Set<Key> = [.character("b")],
                toggleMute: Set<Key> = [.character("m")]) {
        self.pushToTalk = pushToTalk
        self.quit = quit
        self.background = background
        self.toggleMute = toggleMute
    }

    /// The command for a parsed key event, or nil if the key means nothing here.
    public func command(for key: Key, type: KeyEventType, modifiers: KeyModifiers = []) -> KeyCommand? {
        if key.isModifierOnly { return nil }
        // Match the PTT key whatever the modifiers: the release must unkey even if Shift went down meanwhile.
        if key == pushToTalk { return .pushToTalk(type) }
        guard type == .press else { return nil }
        let chord = modifiers.withoutLocks
        if chord == .ctrl, case .character(let c) = key {
            switch c {
            case "c", "d", "\\": return .quit
            case "z": return .suspend
            case "l": return .redraw
            default: return nil
            }
        }
        guard chord.isSubset(of: .shift) else { return nil }
        if key == .escape { return .cancelTransmit }
        if quit.contains(key) { return .quit }
        if background.contains(key) { return .background }
        if toggleMute.contains(key) { return .toggleMute }
        return nil
    }

    /// Convenience for a parser event; nil for anything that is not a bound key.
    public func command(for event: KeyInputEvent) -> KeyCommand? {
        guard case .key(let key, let type, let modifiers) = event else { return nil }
        return command(for: key, type: type, modifiers: modifiers)
    }
}

/// Follows the answers to the keyboard probe `ESC[?u ESC[c`.
///
/// Terminals answer in order, so a DA reply with no kitty reply before it means "not supported". A kitty
/// reply that comes later anyway (some multiplexers forward it late) still turns the protocol on: don't rely
/// on a timeout.
public struct KeyboardProbe: Hashable, Sendable {
    public enum Support: Hashable, Sendable {
        case unknown
        /// The terminal answered `ESC[?<flags>u`.
        case kitty
        case legacy
    }

    public private(set) var support: Support = .unknown

    public init() {}

    /// Updates the state from a parser event. Returns true when `support` changed; on a change to
    /// `.kitty` the caller pushes the flags (``TerminalSession/enableKittyKeyboard(flags:)``) and switches
    /// ``HoldToTalk`` to `.kitty`.
    public mutating func handle(_ event: KeyInputEvent) -> Bool {
        let before = support
        switch event {
        case .kittyFlags: support = .kitty
        case .deviceAttributes where support == .unknown: support = .legacy
        default: break
        }
        return support != before
    }
}
