/// A key or button of a Linux input device (`EV_KEY` events): a code from input-event-codes.h.
public struct KeyCode: Hashable, Sendable, CustomStringConvertible {
    /// The kernel's largest key code (KEY_MAX).
    public static let maximum: UInt16 = 0x2ff

    public let code: UInt16

    public init?(code: UInt16) {
        guard code <= Self.maximum else { return nil }
        self.code = code
    }

    /// A name as the kernel spells it (`KEY_F13`, `BTN_0`), in any case, with or without `KEY_`
    /// (`f13`, `playpause`), or a code (`183`, `0xb7`).
    public init?(name: String) {
        let upper = name.uppercased()
        if let code = Self.byName[upper] ?? Self.byName["KEY_" + upper] {
            self.code = code
            return
        }
        let number = upper.hasPrefix("0X") ? UInt16(upper.dropFirst(2), radix: 16) : UInt16(upper)
        guard let number, number <= Self.maximum else { return nil }
        code = number
    }

    /// The kernel's first name for the code (KEY_MUTE rather than its alias KEY_MIN_INTERESTING).
    public var description: String { Self.byCode[code] ?? "key code \(code)" }

    private static let byName: [String: UInt16] = Dictionary(table.map { ($0.name, $0.code) }, uniquingKeysWith: { first, _ in first })
    private static let byCode: [UInt16: String] = Dictionary(table.map { ($0.code, $0.name) }, uniquingKeysWith: { first, _ in first })
}
