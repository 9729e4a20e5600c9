import Foundation

/// A push payload: the JSON object APNs delivered, as values the app can read without casting `Any`.
public enum PushValue: Sendable, Hashable {
    case string(String)
    case number(Double)
    case bool(Bool)
    case null
    case array([PushValue])
    case object([String: PushValue])

    public var stringValue: String? { if case .string(let s) = self { return s } else { return nil } }
    public var boolValue: Bool? { if case .bool(let b) = self { return b } else { return nil } }
    public var objectValue: [String: PushValue]? { if case .object(let o) = self { return o } else { return nil } }

    /// Parses a push body; nil unless it is a JSON object.
    public static func payload(from body: Data) -> [String: PushValue]? {
        (try? JSONDecoder().decode(PushValue.self, from: body))?.objectValue
    }
}

extension PushValue: Codable {
    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        // Bool before Double: JSONDecoder refuses to read `1` as a Bool, but would read `true` as nothing else.
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let n = try? c.decode(Double.self) { self = .number(n) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([PushValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: PushValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .string(let s): try c.encode(s)
        case .number(let n): try c.encode(n)
        case .bool(let b): try c.encode(b)
        case .null: try c.encodeNil()
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }
}

extension Dictionary where Key == String, Value == PushValue {
    /// A service update (`{"aps":{"ptt-push-type":"service-update"}}`, as Apple names it) rather than a
    /// push that wakes the audio path.
    public var isServiceUpdatePayload: Bool {
        self["aps"]?.objectValue?["ptt-push-type"]?.stringValue == "service-update"
    }
}
