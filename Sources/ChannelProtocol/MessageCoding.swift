import Foundation

// JSON coding of the control messages: {"type": "<case>", <fields>…}. Written out by hand (rather than
// Swift's synthesized enum coding, which nests every case in its own object) so that the wire format
// reads like the table in docs/protocol.md §16 and stays stable if a Swift case is renamed.

private enum Keys: String, CodingKey {
    case type, token, channel, reason, muted, environment, you, roster, talkers, code, participant, slot,
         userID, event, descriptor, status, participants, unheard, expiresAt, loss, request, queue, features, home, media, pass
}

extension ClientMessage: Codable {
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        switch try c.decode(String.self, forKey: .type) {
        case "join":
            self = .join(token: try c.decode(String.self, forKey: .token), channel: try c.decode(UUID.self, forKey: .channel),
                         reason: try c.decodeIfPresent(JoinReason.self, forKey: .reason) ?? .developerRequest)
        case "leave": self = .leave
        case "floorRequest":
            self = .floorRequest(request: try c.decodeIfPresent(UInt32.self, forKey: .request),
                                 queue: try c.decodeIfPresent(Bool.self, forKey: .queue) ?? true)
        case "floorRelease": self = .floorRelease
        case "setMuted": self = .setMuted(try c.decode(Bool.self, forKey: .muted))
        case "registerPushToken":
            self = .registerPushToken(token: try c.decode(String.self, forKey: .token),
                                      environment: try c.decode(PushEnvironment.self, forKey: .environment))
        case "setSubscriptions": self = .setSubscriptions(unheard: try c.decode([String].self, forKey: .unheard))
        case "renewToken": self = .renewToken(token: try c.decode(String.self, forKey: .token))
        case "receptionReport": self = .receptionReport(lossPercent: try decodePercent(c))
        case let other:
            throw DecodingError.dataCorruptedError(forKey: .type, in: c, debugDescription: "unknown client message type '\(other)'")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .join(let token, let channel, let reason):
            try c.encode("join", forKey: .type)
            try c.encode(token, forKey: .token)
            try c.encode(channel, forKey: .channel)
            try c.encode(reason, forKey: .reason)
        case .leave: try c.encode("leave", forKey: .type)
        case .floorRequest(let request, let queue):
            try c.encode("floorRequest", forKey: .type)
            try c.encodeIfPresent(request, forKey: .request)
            // Only when false: what older servers read is unchanged.
            if !queue { try c.encode(false, forKey: .queue) }
        case .floorRelease: try c.encode("floorRelease", forKey: .type)
        case .setMuted(let muted):
            try c.encode("setMuted", forKey: .type)
            try c.encode(muted, forKey: .muted)
        case .registerPushToken(let token, let environment):
            try c.encode("registerPushToken", forKey: .type)
            try c.encode(token, forKey: .token)
            try c.encode(environment, forKey: .environment)
        case .setSubscriptions(let unheard):
            try c.encode("setSubscriptions", forKey: .type)
            try c.encode(unheard, forKey: .unheard)
        case .renewToken(let token):
            try c.encode("renewToken", forKey: .type)
            try c.encode(token, forKey: .token)
        case .receptionReport(let lossPercent):
            try c.encode("receptionReport", forKey: .type)
            try c.encode(lossPercent, forKey: .loss)
        }
    }
}

extension ServerMessage: Codable {
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        switch try c.decode(String.self, forKey: .type) {
        case "joined":
            self = .joined(channel: try c.decode(ChannelInfo.self, forKey: .channel), you: try c.decode(UInt16.self, forKey: .you),
                           roster: try c.decode([RosterMember].self, forKey: .roster),
                           talkers: try c.decode([Talker].self, forKey: .talkers),
                           features: try c.decodeIfPresent([ProtocolFeature].self, forKey: .features) ?? [])
        case "refused":
            self = .refused(code: try c.decode(RefusalCode.self, forKey: .code), reason: try c.decode(String.self, forKey: .reason))
        case "participant": self = .participant(try c.decode(RosterMember.self, forKey: .participant))
        case "roster": self = .roster(try c.decode([RosterMember].self, forKey: .participants))
        case "participantLeft":
            self = .participantLeft(slot: try c.decode(UInt16.self, forKey: .slot), userID: try c.decode(String.self, forKey: .userID))
        case "floor": self = .floor(try c.decode(FloorEvent.self, forKey: .event))
        case "descriptor": self = .descriptor(try c.decode(ChannelInfo.self, forKey: .descriptor))
        case "serviceStatus":
            self = .serviceStatus(try c.decode(ServerStatus.self, forKey: .status),
                                  reason: try c.decodeIfPresent(String.self, forKey: .reason))
        case "pushTokenRegistered": self = .pushTokenRegistered
        case "subscriptions": self = .subscriptions(unheard: try c.decode([String].self, forKey: .unheard))
        case "error":
            self = .error(code: try c.decode(RefusalCode.self, forKey: .code), reason: try c.decode(String.self, forKey: .reason))
        case "tokenExpiring": self = .tokenExpiring(expiresAt: try Self.decodeTime(c))
        case "tokenRenewed": self = .tokenRenewed(expiresAt: try Self.decodeTime(c))
        case "receptionLoss": self = .receptionLoss(lossPercent: try decodePercent(c))
        case "redirect": self = .redirect(home: try decodeHome(c), pass: try c.decodeIfPresent(HomePass.self, forKey: .pass))
        case "move": self = .move(home: try decodeHome(c))
        case "mediaKey": self = .mediaKey(try c.decode(MediaKey.self, forKey: .media))
        case let other:
            throw DecodingError.dataCorruptedError(forKey: .type, in: c, debugDescription: "unknown server message type '\(other)'")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .joined(let channel, let you, let roster, let talkers, let features):
            try c.encode("joined", forKey: .type)
            try c.encode(channel, forKey: .channel)
            try c.encode(you, forKey: .you)
            try c.encode(roster, forKey: .roster)
            try c.encode(talkers, forKey: .talkers)
            // Absent rather than empty: an announcement of nothing reads as an older server's `joined`.
            if !features.isEmpty { try c.encode(features, forKey: .features) }
        case .refused(let code, let reason):
            try c.encode("refused", forKey: .type)
            try c.encode(code, forKey: .code)
            try c.encode(reason, forKey: .reason)
        case .participant(let participant):
            try c.encode("participant", forKey: .type)
            try c.encode(participant, forKey: .participant)
        case .roster(let participants):
            try c.encode("roster", forKey: .type)
            try c.encode(participants, forKey: .participants)
        case .participantLeft(let slot, let userID):
            try c.encode("participantLeft", forKey: .type)
            try c.encode(slot, forKey: .slot)
            try c.encode(userID, forKey: .userID)
        case .floor(let event):
            try c.encode("floor", forKey: .type)
            try c.encode(event, forKey: .event)
        case .descriptor(let info):
            try c.encode("descriptor", forKey: .type)
            try c.encode(info, forKey: .descriptor)
        case .serviceStatus(let status, let reason):
            try c.encode("serviceStatus", forKey: .type)
            try c.encode(status, forKey: .status)
            try c.encodeIfPresent(reason, forKey: .reason)
        case .pushTokenRegistered: try c.encode("pushTokenRegistered", forKey: .type)
        case .subscriptions(let unheard):
            try c.encode("subscriptions", forKey: .type)
            try c.encode(unheard, forKey: .unheard)
        case .error(let code, let reason):
            try c.encode("error", forKey: .type)
            try c.encode(code, forKey: .code)
            try c.encode(reason, forKey: .reason)
        case .tokenExpiring(let expiresAt):
            try c.encode("tokenExpiring", forKey: .type)
            try c.encode(Self.unixSeconds(expiresAt), forKey: .expiresAt)
        case .tokenRenewed(let expiresAt):
            try c.encode("tokenRenewed", forKey: .type)
            try c.encode(Self.unixSeconds(expiresAt), forKey: .expiresAt)
        case .receptionLoss(let lossPercent):
            try c.encode("receptionLoss", forKey: .type)
            try c.encode(lossPercent, forKey: .loss)
        case .redirect(let home, let pass):
            try c.encode("redirect", forKey: .type)
            try c.encode(home, forKey: .home)
            try c.encodeIfPresent(pass, forKey: .pass)
        case .move(let home):
            try c.encode("move", forKey: .type)
            try c.encode(home, forKey: .home)
        case .mediaKey(let key):
            try c.encode("mediaKey", forKey: .type)
            try c.encode(key, forKey: .media)
        }
    }

    /// Times travel as whole Unix seconds, like a JWT's `exp` (JSONEncoder's default for `Date`, seconds
    /// since 2001 as a float, means nothing outside Foundation).
    static func unixSeconds(_ date: Date) -> Int64 {
        let seconds = date.timeIntervalSince1970.rounded(.down)
        return seconds.isFinite ? Int64(max(min(seconds, 1e12), -1e12)) : 0
    }

    private static func decodeTime(_ c: KeyedDecodingContainer<Keys>) throws -> Date {
        let seconds = try c.decode(Int64.self, forKey: .expiresAt)
        guard abs(seconds) <= 1_000_000_000_000 else {
            throw DecodingError.dataCorruptedError(forKey: .expiresAt, in: c, debugDescription: "expiresAt \(seconds) is not a plausible Unix time")
        }
        return Date(timeIntervalSince1970: TimeInterval(seconds))
    }
}

/// A loss figure: a whole percentage, 0 to 100.
private func decodePercent(_ c: KeyedDecodingContainer<Keys>) throws -> Int {
    let percent = try c.decode(Int.self, forKey: .loss)
    guard (0...100).contains(percent) else {
        throw DecodingError.dataCorruptedError(forKey: .loss, in: c, debugDescription: "loss \(percent) is not a percentage (0 to 100)")
    }
    return percent
}

/// A cluster node to join at, refused if no node would advertise it.
private func decodeHome(_ c: KeyedDecodingContainer<Keys>) throws -> NodeAddress {
    let home = try c.decode(NodeAddress.self, forKey: .home)
    if let problem = home.problem { throw DecodingError.dataCorruptedError(forKey: .home, in: c, debugDescription: problem) }
    return home
}

/// Encodes and decodes control messages. Decoding checks the size first, and turns every failure
/// into a `MessageError` that names the problem, never a crash.
public struct MessageCodec: Sendable {
    public init() {}

    public func encode(_ message: ServerMessage) -> [UInt8] { Self.encodeValue(message) }
    public func encode(_ message: ClientMessage) -> [UInt8] { Self.encodeValue(message) }

    public func decodeClientMessage(_ bytes: [UInt8]) throws(MessageError) -> ClientMessage {
        let message: ClientMessage = try Self.decodeValue(bytes)
        switch message {
        case .join(let token, _, _) where token.utf8.count > ControlLimits.maxTokenBytes:
            throw MessageError("join token is \(token.utf8.count) bytes; at most \(ControlLimits.maxTokenBytes)")
        case .renewToken(let token) where token.utf8.count > ControlLimits.maxTokenBytes:
            throw MessageError("renewToken token is \(token.utf8.count) bytes; at most \(ControlLimits.maxTokenBytes)")
        case .registerPushToken(let token, _):
            guard (2...ControlLimits.maxPushTokenHexLength).contains(token.utf8.count), token.utf8.count % 2 == 0,
                  token.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) || (0x41...0x46).contains($0) })
            else { throw MessageError("push token must be an even number (2-\(ControlLimits.maxPushTokenHexLength)) of hex digits") }
        case .setSubscriptions(let unheard):
            guard unheard.count <= ControlLimits.maxUnheard else {
                throw MessageError("setSubscriptions lists \(unheard.count) members; at most \(ControlLimits.maxUnheard)")
            }
            if let long = unheard.first(where: { $0.utf8.count > ControlLimits.maxUserIDBytes }) {
                throw MessageError("user id of \(long.utf8.count) bytes in setSubscriptions; at most \(ControlLimits.maxUserIDBytes)")
            }
        default: break
        }
        return message
    }

    public func decodeServerMessage(_ bytes: [UInt8]) throws(MessageError) -> ServerMessage { try Self.decodeValue(bytes) }

    private static func encodeValue<T: Encodable>(_ value: T) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Every field is a plain string, number, bool, UUID or array of them: encoding cannot fail.
        return (try? Array(encoder.encode(value))) ?? []
    }

    private static func decodeValue<T: Decodable>(_ bytes: [UInt8]) throws(MessageError) -> T {
        guard bytes.count <= ControlLimits.maxMessageBytes else {
            throw MessageError("control message is \(bytes.count) bytes; at most \(ControlLimits.maxMessageBytes)")
        }
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch let error as DecodingError {
            throw MessageError("bad control message: \(Self.describe(error))")
        } catch {
            throw MessageError("bad control message: \(error)")
        }
    }

    private static func describe(_ error: DecodingError) -> String {
        switch error {
        case .dataCorrupted(let context): return context.debugDescription
        case .keyNotFound(let key, _): return "missing field '\(key.stringValue)'"
        case .typeMismatch(_, let context), .valueNotFound(_, let context):
            return "wrong type at '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        @unknown default: return "\(error)"
        }
    }
}
