/// Turns the bytes a terminal sends on stdin into key, focus and probe-reply events.
///
/// Sans-I/O: feed it whatever `read(2)` returned, in any chunking; an escape sequence split across reads
/// is kept until the rest arrives. It understands the legacy encodings (plain bytes, control characters,
/// `ESC`-prefixed Alt keys, `CSI`/`SS3` cursor and function keys), the kitty keyboard protocol
/// (`CSI code[:alt] ; mods[:event] [; text] u`, plus event types on the legacy `CSI` forms), focus reports
/// and the replies to the keyboard probe `ESC[?u ESC[c`.
///
/// A lone `ESC` is ambiguous in the legacy encoding: it is either the Escape key or the start of a
/// sequence whose next bytes are still on the way. The parser keeps it pending; the caller decides how long
/// to wait (typically 25–50 ms without new bytes, longer over SSH) and then calls ``flush()``, which turns it
/// into the Escape key. With the kitty protocol active, Escape arrives as `ESC[27u` and needs no timeout.
///
/// Garbage never traps: unknown or malformed sequences are dropped and parsing resumes at the next byte
/// that can start something.
public struct KeyInputParser: Sendable {
    /// Bytes received but not yet turned into events (an incomplete sequence or UTF-8 character).
    private var pending: [UInt8] = []
    /// Inside an over-long escape sequence: its remaining parameter and intermediate bytes, and its final
    /// byte, are dropped as they arrive (so the outcome does not depend on how reads split the input).
    private var discardingSequence = false

    /// Longest escape sequence kept while waiting for its final byte. Real key and reply sequences are under
    /// 32 bytes; anything longer is garbage and is dropped rather than buffered without bound.
    public static let maximumSequenceLength = 64

    public init() {}

    /// True while bytes are held back waiting for the rest of a sequence: the caller should call
    /// ``flush()`` if nothing more arrives within its escape timeout.
    public var hasPendingInput: Bool { !pending.isEmpty }

    /// Adds bytes read from the terminal and returns the events they complete, in order.
    public mutating func feed(_ bytes: some Sequence<UInt8>) -> [KeyInputEvent] {
        pending.append(contentsOf: bytes)
        return drain(atEnd: false)
    }

    /// Declares that no more bytes are coming for now: a pending lone `ESC` becomes the Escape key, `ESC`
    /// followed by one byte becomes that key with Alt, and any other incomplete sequence is dropped.
    public mutating func flush() -> [KeyInputEvent] {
        defer { discardingSequence = false }                // a pause ends even an over-long sequence
        return drain(atEnd: true)
    }

    // MARK: - Scanning

    private enum Step {
        /// One event, and where the next unit starts.
        case event(KeyInputEvent, next: Int)
        /// Nothing to report (unknown or malformed input); resume at `next`.
        case skip(next: Int)
        /// The unit starting here needs more bytes.
        case incomplete
        /// An escape sequence too long to be real: drop up to `next` and the rest of it as it arrives.
        case discard(next: Int)
    }

    private mutating func drain(atEnd: Bool) -> [KeyInputEvent] {
        var events: [KeyInputEvent] = []
        var index = 0
        scanning: while index < pending.count {
            if discardingSequence {
                let byte = pending[index]
                if (0x20...0x3F).contains(byte) { index += 1; continue }
                discardingSequence = false
                if (0x40...0x7E).contains(byte) { index += 1; continue }
            }
            switch step(at: index, atEnd: atEnd) {
            case .discard(let next):
                discardingSequence = true
                index = next
            case .event(let event, let next):
                events.append(event)
                index = next
            case .skip(let next):
                index = next
            case .incomplete:
                break scanning
            }
        }
        pending.removeFirst(index)
        return events
    }

    /// Parses one unit (a byte, a UTF-8 character or an escape sequence) starting at `i`.
    /// Every `.event`, `.skip` and `.discard` moves forward, and `.incomplete` is never returned when
    /// `atEnd`, so `drain` always terminates.
    private func step(at i: Int, atEnd: Bool) -> Step {
        guard pending[i] == 0x1B else { return plainKey(at: i, atEnd: atEnd, modifiers: []) }
        guard i + 1 < pending.count else {
            return atEnd ? .event(.key(.escape, .press), next: i + 1) : .incomplete
        }
        switch pending[i + 1] {
        case UInt8(ascii: "["):
            return controlSequence(at: i, atEnd: atEnd)
        case UInt8(ascii: "O"):
            guard i + 2 < pending.count else {
                return atEnd ? .event(.key(.character("O"), .press, modifiers: .alt), next: i + 2) : .incomplete
            }
            // Not a final byte (say, the ESC of the next sequence): it was Alt+O, and that byte is parsed afresh.
            guard (0x40...0x7E).contains(pending[i + 2]) else {
                return .event(.key(.character("O"), .press, modifiers: .alt), next: i + 2)
            }
            return singleShift(final: pending[i + 2], next: i + 3)
        case 0x1B:
            // ESC ESC: the first one was the Escape key; the second starts something new.
            return .event(.key(.escape, .press), next: i + 1)
        default:
            // The legacy Alt encoding: ESC then the key's own bytes.
            switch plainKey(at: i + 1, atEnd: atEnd, modifiers: .alt) {
            case .incomplete: return .incomplete
            case .event(let event, let next): return .event(event, next: next)
            case .skip, .discard: return .event(.key(.escape, .press), next: i + 1)
            }
        }
    }

    /// A key that is not an escape sequence: ASCII, a control character or one UTF-8 encoded character.
    private func plainKey(at i: Int, atEnd: Bool, modifiers: KeyModifiers) -> Step {
        let byte = pending[i]
        func key(_ key: Key, _ extra: KeyModifiers = []) -> Step {
            .event(.key(key, .press, modifiers: modifiers.union(extra)), next: i + 1)
        }
        switch byte {
        case 0x00: return key(.space, .ctrl)                // Ctrl-Space
        case 0x08, 0x7F: return key(.backspace)             // 0x08 is Ctrl-H on some terminals' Backspace
        case 0x09: return key(.tab)
        case 0x0A, 0x0D: return key(.enter)                 // raw mode leaves CR as CR; LF is Ctrl-J
        case 0x01...0x1A: return key(.character(Character(Unicode.Scalar(byte + 0x60))), .ctrl)
        case 0x1C...0x1F: return key(.character(Character(Unicode.Scalar(byte + 0x40))), .ctrl)
        case 0x20: return key(.space)
        case 0x21...0x7E: return key(.character(Character(Unicode.Scalar(byte))))
        default: return utf8Character(at: i, atEnd: atEnd, modifiers: modifiers)
        }
    }

    private func utf8Character(at i: Int, atEnd: Bool, modifiers: KeyModifiers) -> Step {
        let lead = pending[i]
        let length: Int
        var value: UInt32
        switch lead {
        case 0xC2...0xDF: length = 2; value = UInt32(lead & 0x1F)
        case 0xE0...0xEF: length = 3; value = UInt32(lead & 0x0F)
        case 0xF0...0xF4: length = 4; value = UInt32(lead & 0x07)
        default: return .skip(next: i + 1)                  // stray continuation byte or invalid lead
        }
        for k in 1..<length {
            guard i + k < pending.count else { return atEnd ? .skip(next: pending.count) : .incomplete }
            let byte = pending[i + k]
            guard byte & 0xC0 == 0x80 else { return .skip(next: i + k) }
            value = value << 6 | UInt32(byte & 0x3F)
        }
        // Reject overlong forms (the lead-byte ranges already exclude 2-byte ones) and values past U+10FFFF;
        // Unicode.Scalar rejects surrogates.
        let minimum: UInt32 = length == 3 ? 0x800 : length == 4 ? 0x10000 : 0x80
        guard value >= minimum, value <= 0x10FFFF, let scalar = Unicode.Scalar(value), value >= 0xA0 else {
            return .skip(next: i + length)                  // also drops C1 controls (U+0080...U+009F)
        }
        return .event(.key(.character(Character(scalar)), .press, modifiers: modifiers), next: i + length)
    }

    /// `ESC O x`: cursor and F1–F4 keys in application mode.
    private func singleShift(final: UInt8, next: Int) -> Step {
        let key: Key? = switch final {
        case UInt8(ascii: "A"): .up
        case UInt8(ascii: "B"): .down
        case UInt8(ascii: "C"): .right
        case UInt8(ascii: "D"): .left
        case UInt8(ascii: "H"): .home
        case UInt8(ascii: "F"): .end
        case UInt8(ascii: "M"): .enter                      // keypad Enter
        case UInt8(ascii: "P"): .function(1)
        case UInt8(ascii: "Q"): .function(2)
        case UInt8(ascii: "R"): .function(3)
        case UInt8(ascii: "S"): .function(4)
        default: nil
        }
        guard let key else { return .skip(next: next) }
        return .event(.key(key, .press), next: next)
    }

    /// `ESC [ params intermediates final`, with ECMA-48's byte classes: parameters 0x30–0x3F,
    /// intermediates 0x20–0x2F, final 0x40–0x7E. Any other byte aborts the sequence and is parsed afresh,
    /// so a stray ESC or key after a broken sequence is not lost.
    private func controlSequence(at i: Int, atEnd: Bool) -> Step {
        var j = i + 2
        let parametersStart = j
        while j < pending.count, (0x30...0x3F).contains(pending[j]) { j += 1 }
        let parametersEnd = j
        while j < pending.count, (0x20...0x2F).contains(pending[j]) { j += 1 }
        guard j - i < Self.maximumSequenceLength else { return .discard(next: j) }
        guard j < pending.count else {
            if !atEnd { return .incomplete }
            // "ESC [" alone is Alt+[ in the legacy encoding; a longer fragment is a broken sequence.
            return j == i + 2 ? .event(.key(.character("["), .press, modifiers: .alt), next: j) : .skip(next: j)
        }
        let final = pending[j]
        guard (0x40...0x7E).contains(final) else { return .skip(next: j) }
        guard parametersEnd == j else { return .skip(next: j + 1) }   // intermediates: nothing we use
        let parameters = pending[parametersStart..<parametersEnd]
        guard let event = Self.interpret(parameters: parameters, final: final) else { return .skip(next: j + 1) }
        return .event(event, next: j + 1)
    }

    // MARK: - Interpreting a complete CSI sequence

    private static func interpret(parameters: ArraySlice<UInt8>, final: UInt8) -> KeyInputEvent? {
        let text = String(decoding: parameters, as: UTF8.self)
        if let prefix = text.first, "?<=>".contains(prefix) {
            let rest = text.dropFirst()
            switch (prefix, final) {
            case ("?", UInt8(ascii: "u")):
                return Int(rest).map { .kittyFlags($0) }
            case ("?", UInt8(ascii: "c")):
                return .deviceAttributes
            default:
                return nil                                  // e.g. secondary DA or something we never asked for
            }
        }
        let fields = text.split(separator: ";", omittingEmptySubsequences: false)
        let first = fields.first.map { $0.split(separator: ":", omittingEmptySubsequences: false) } ?? []
        let number = first.first.flatMap { Int($0) }
        guard let (modifiers, type) = modifiersAndType(fields.count > 1 ? fields[1] : nil) else { return nil }

        let key: Key?
        switch final {
        case UInt8(ascii: "u"):
            guard let number else { return nil }
            key = kittyKey(code: number, shifted: modifiers.contains(.shift))
        case UInt8(ascii: "~"):
            guard let number else { return nil }
            key = tildeKey(number)
        case UInt8(ascii: "A"): key = .up
        case UInt8(ascii: "B"): key = .down
        case UInt8(ascii: "C"): key = .right
        case UInt8(ascii: "D"): key = .left
        case UInt8(ascii: "H"): key = .home
        case UInt8(ascii: "F"): key = .end
        case UInt8(ascii: "P"): key = .function(1)
        case UInt8(ascii: "Q"): key = .function(2)
        case UInt8(ascii: "S"): key = .function(4)
        case UInt8(ascii: "Z"):
            return .key(.tab, type, modifiers: modifiers.union(.shift))
        case UInt8(ascii: "I") where text.isEmpty:
            return .focusIn
        case UInt8(ascii: "O") where text.isEmpty:
            return .focusOut
        default:
            // Includes "CSI … R": F3 in that form would collide with the cursor position report, so terminals
            // (kitty included) send "CSI 13 ~" for F3, and a position report is nothing we asked for.
            key = nil
        }
        return key.map { .key($0, type, modifiers: modifiers) }
    }

    /// Parses "mods[:event]"; absent means no modifiers and a press. Nil for values out of range.
    private static func modifiersAndType(_ field: Substring?) -> (KeyModifiers, KeyEventType)? {
        guard let field, !field.isEmpty else { return ([], .press) }
        let parts = field.split(separator: ":", omittingEmptySubsequences: false)
        let encoded = parts[0].isEmpty ? 1 : Int(parts[0])
        guard let encoded, (1...256).contains(encoded) else { return nil }
        let type: KeyEventType
        switch parts.count > 1 ? Int(parts[1]) : 1 {
        case 1: type = .press
        case 2: type = .repeat
        case 3: type = .release
        default: return nil
        }
        return (KeyModifiers(rawValue: encoded - 1), type)
    }

    private static func kittyKey(code: Int, shifted: Bool) -> Key? {
        switch code {
        case 9: return .tab
        case 13, 57414: return .enter                       // 57414: keypad Enter
        case 27: return .escape
        case 8, 127: return .backspace
        case 32: return .space
        case 57376...57398: return .function(code - 57376 + 13)   // F13–F35
        case 57344...63743: return .code(code)              // kitty's private-use functional keys
        case 0x21...0x7E, 0xA0...0x10FFFF:
            guard let scalar = Unicode.Scalar(UInt32(code)) else { return .code(code) }
            // Without flag 4 (alternate keys) kitty reports the unshifted key plus Shift; shifting ASCII
            // letters here keeps "Q" distinct from "q" as it would be in the legacy encoding.
            if shifted, (0x61...0x7A).contains(code), let upper = Unicode.Scalar(UInt32(code - 0x20)) {
                return .character(Character(upper))
            }
            return .character(Character(scalar))
        case 1...0x10FFFF: return .code(code)
        default: return nil
        }
    }

    private static func tildeKey(_ number: Int) -> Key? {
        switch number {
        case 1, 7: .home
        case 2: .insert
        case 3: .delete
        case 4, 8: .end
        case 5: .pageUp
        case 6: .pageDown
        case 11...15: .function(number - 10)
        case 17...21: .function(number - 11)
        case 23, 24: .function(number - 12)
        default: nil                                        // includes 200/201, bracketed paste markers
        }
    }
}
