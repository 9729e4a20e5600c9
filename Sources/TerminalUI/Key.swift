/// A key as walkie sees it, whichever encoding the terminal used (legacy bytes or the kitty keyboard protocol).
///
/// Space, Enter, Escape, Tab and Backspace have their own cases because they are what people bind and
/// what the legacy encodings make ambiguous; every other printable key is `.character`.
public enum Key: Hashable, Sendable {
    case space
    case enter
    case escape
    case tab
    case backspace
    /// A printable key other than Space. Letters are lower case unless Shift was held (or the terminal sent
    /// the shifted character itself).
    case character(Character)
    case up, down, left, right
    case home, end, insert, delete, pageUp, pageDown
    /// F1 to F35 (kitty can report up to F35).
    case function(Int)
    /// A kitty key code this type does not name: keypad keys, media keys, modifier keys pressed alone, and
    /// so on (codes 57344 and up are kitty's private-use functional keys).
    case code(Int)

    /// True for keys that are only modifiers or locks (kitty reports them on their own with flag 8).
    /// Holding Shift while talking must not count as "another key".
    public var isModifierOnly: Bool {
        guard case .code(let code) = self else { return false }
        // Kitty's codes: 57358...57360 Caps/Scroll/Num Lock; 57441...57452 left/right Shift, Control, Alt,
        // Super, Hyper, Meta; 57453/57454 ISO level 3/5 shift.
        return (57358...57360).contains(code) || (57441...57454).contains(code)
    }

    /// A short human name for key hints ("Space", "F5", "t").
    public var name: String {
        switch self {
        case .space: "Space"
        case .enter: "Enter"
        case .escape: "Esc"
        case .tab: "Tab"
        case .backspace: "Backspace"
        case .character(let c): String(c)
        case .up: "Up"
        case .down: "Down"
        case .left: "Left"
        case .right: "Right"
        case .home: "Home"
        case .end: "End"
        case .insert: "Insert"
        case .delete: "Delete"
        case .pageUp: "PageUp"
        case .pageDown: "PageDown"
        case .function(let n): "F\(n)"
        case .code(let code): "key \(code)"
        }
    }

    /// Parses a key name as a user would give it on the command line (`--ptt-key space`, `t`, `f5`, `enter`).
    /// Returns nil for names it does not know, so the caller can print a usage error.
    public init?(name: String) {
        let lower = name.lowercased()
        switch lower {
        case "space", "spc", " ": self = .space
        case "enter", "return": self = .enter
        case "esc", "escape": self = .escape
        case "tab": self = .tab
        case "backspace": self = .backspace
        case "up": self = .up
        case "down": self = .down
        case "left": self = .left
        case "right": self = .right
        case "home": self = .home
        case "end": self = .end
        case "insert": self = .insert
        case "delete", "del": self = .delete
        case "pageup", "pgup": self = .pageUp
        case "pagedown", "pgdn": self = .pageDown
        default:
            if lower.count >= 2, lower.first == "f", let n = Int(lower.dropFirst()), (1...35).contains(n) {
                self = .function(n)
            } else if name.count == 1, let c = name.first, !c.isWhitespace, c.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F }) {
                self = .character(c)
            } else {
                return nil
            }
        }
    }
}

/// What happened to a key. Legacy terminals only ever report `.press` (an auto-repeat looks like another
/// press); with the kitty protocol's flag 2 the terminal also reports repeats and releases.
public enum KeyEventType: Hashable, Sendable {
    case press
    case `repeat`
    case release
}

/// Modifier state, with the kitty protocol's bit values (the wire value is 1 + these bits).
public struct KeyModifiers: OptionSet, Hashable, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    public static let shift = KeyModifiers(rawValue: 1)
    public static let alt = KeyModifiers(rawValue: 2)
    public static let ctrl = KeyModifiers(rawValue: 4)
    public static let `super` = KeyModifiers(rawValue: 8)
    public static let hyper = KeyModifiers(rawValue: 16)
    public static let meta = KeyModifiers(rawValue: 32)
    public static let capsLock = KeyModifiers(rawValue: 64)
    public static let numLock = KeyModifiers(rawValue: 128)

    /// The lock states are reported as modifiers by kitty but are not chords; bindings ignore them.
    public var withoutLocks: KeyModifiers { subtracting([.capsLock, .numLock]) }
}

/// One thing the terminal told us.
public enum KeyInputEvent: Hashable, Sendable {
    /// A key event. Modifiers default to none so tests and bindings can write `.key(.space, .press)`.
    case key(Key, KeyEventType, modifiers: KeyModifiers = [])
    /// Focus reporting (`ESC[?1004h`): the terminal window gained focus (`ESC[I`).
    case focusIn
    /// The terminal window lost focus (`ESC[O`): a hold-to-talk key may go up without us hearing about it.
    case focusOut
    /// Reply to the kitty keyboard protocol query `ESC[?u`: the protocol is supported, with these flags
    /// currently active. It may arrive late (after the DA reply); it still means "supported".
    case kittyFlags(Int)
    /// Reply to primary device attributes `ESC[c` (`ESC[?…c`). Every terminal answers this, so if it comes
    /// before any `.kittyFlags`, the kitty protocol is not supported.
    case deviceAttributes
}
