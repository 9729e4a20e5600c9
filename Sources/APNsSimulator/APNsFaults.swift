import Foundation
import SeededRandom

/// Failures the simulator injects into requests that are otherwise valid, to exercise a client's error
/// handling. Set with `APNsSimulator.setFaults(_:)` or `PUT /v1/faults`; every field is optional in JSON.
///
/// Order for each valid request: the first matching `scripted` entry, else `unregistered`, else the
/// `serviceUnavailableShare` draw; then `delayMilliseconds` (for faulted and accepted requests alike).
public struct APNsFaultPlan: Codable, Sendable, Equatable {
    /// This share (0…1) of valid requests gets 503 ServiceUnavailable. The draw uses a generator seeded
    /// with `seed` when the plan is set, so a run repeats exactly.
    public var serviceUnavailableShare: Double = 0
    /// Delay before answering each valid request.
    public var delayMilliseconds: Int = 0
    /// Token (lowercase hex) → answered 410 Unregistered with this `timestamp` (ms since 1970).
    public var unregistered: [String: Int64] = [:]
    /// Consumed first-match-first; each entry answers `count` matching requests and is then dropped.
    /// `GET /v1/faults` shows what is left.
    public var scripted: [APNsScriptedResponse] = []
    /// On each connection, once this many requests have arrived: GOAWAY (NO_ERROR, the highest stream
    /// seen as last stream ID, debug data `{"reason":"Shutdown"}`), answer the open streams, close.
    public var goAwayAfterRequests: Int? = nil
    /// Seed of the `serviceUnavailableShare` draw.
    public var seed: UInt64 = 1

    public init(serviceUnavailableShare: Double = 0, delayMilliseconds: Int = 0, unregistered: [String: Int64] = [:],
                scripted: [APNsScriptedResponse] = [], goAwayAfterRequests: Int? = nil, seed: UInt64 = 1) {
        self.serviceUnavailableShare = serviceUnavailableShare
        self.delayMilliseconds = delayMilliseconds
        self.unregistered = unregistered
        self.scripted = scripted
        self.goAwayAfterRequests = goAwayAfterRequests
        self.seed = seed
    }

    private enum CodingKeys: String, CodingKey, CaseIterable {
        case serviceUnavailableShare, delayMilliseconds, unregistered, scripted, goAwayAfterRequests, seed
    }

    // Written out so that JSON may leave fields out, and so that a misspelt field is an error rather
    // than a plan that silently does nothing.
    public init(from decoder: any Decoder) throws {
        try rejectUnknownKeys(in: decoder, known: CodingKeys.allCases.map(\.rawValue))
        let container = try decoder.container(keyedBy: CodingKeys.self)
        serviceUnavailableShare = try container.decodeIfPresent(Double.self, forKey: .serviceUnavailableShare) ?? 0
        delayMilliseconds = try container.decodeIfPresent(Int.self, forKey: .delayMilliseconds) ?? 0
        unregistered = try container.decodeIfPresent([String: Int64].self, forKey: .unregistered) ?? [:]
        scripted = try container.decodeIfPresent([APNsScriptedResponse].self, forKey: .scripted) ?? []
        goAwayAfterRequests = try container.decodeIfPresent(Int.self, forKey: .goAwayAfterRequests)
        seed = try container.decodeIfPresent(UInt64.self, forKey: .seed) ?? 1
    }

    /// Why this plan can't be used, or nil when it can.
    public var problem: String? {
        if !(0...1).contains(serviceUnavailableShare) {
            return "serviceUnavailableShare must be between 0 and 1, not \(serviceUnavailableShare)"
        }
        if delayMilliseconds < 0 || delayMilliseconds > 600_000 {
            return "delayMilliseconds must be 0…600000, not \(delayMilliseconds)"
        }
        if let goAwayAfterRequests, goAwayAfterRequests < 1 {
            return "goAwayAfterRequests must be at least 1 (or absent), not \(goAwayAfterRequests)"
        }
        for token in unregistered.keys where !APNsRequestValidator.isHexToken(token.utf8) || token.lowercased() != token {
            return "unregistered token '\(token)' is not lowercase hex (even length, 2…200 characters)"
        }
        for (index, entry) in scripted.enumerated() {
            if !(400...599).contains(entry.status) { return "scripted[\(index)].status must be 400…599, not \(entry.status)" }
            if entry.count < 1 { return "scripted[\(index)].count must be at least 1, not \(entry.count)" }
            if entry.reason.isEmpty { return "scripted[\(index)].reason must not be empty" }
            if let token = entry.token, !APNsRequestValidator.isHexToken(token.utf8) {
                return "scripted[\(index)].token '\(token)' is not hex (even length, 2…200 characters)"
            }
        }
        return nil
    }
}

/// One scripted answer: the next `count` valid requests for `token` (any token when nil) get `status`
/// and `{"reason": reason}` (plus `"timestamp"` when given).
public struct APNsScriptedResponse: Codable, Sendable, Equatable {
    /// Lowercase hex; nil matches every token.
    public var token: String?
    public var status: Int
    public var reason: String
    public var count: Int
    /// Added to the body as `"timestamp"` (ms since 1970), as Apple does for 410.
    public var timestamp: Int64?

    public init(token: String? = nil, status: Int, reason: String, count: Int = 1, timestamp: Int64? = nil) {
        self.token = token
        self.status = status
        self.reason = reason
        self.count = count
        self.timestamp = timestamp
    }

    private enum CodingKeys: String, CodingKey, CaseIterable {
        case token, status, reason, count, timestamp
    }

    public init(from decoder: any Decoder) throws {
        try rejectUnknownKeys(in: decoder, known: CodingKeys.allCases.map(\.rawValue))
        let container = try decoder.container(keyedBy: CodingKeys.self)
        token = try container.decodeIfPresent(String.self, forKey: .token)?.lowercased()
        status = try container.decode(Int.self, forKey: .status)
        reason = try container.decode(String.self, forKey: .reason)
        count = try container.decodeIfPresent(Int.self, forKey: .count) ?? 1
        timestamp = try container.decodeIfPresent(Int64.self, forKey: .timestamp)
    }
}

private struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

private func rejectUnknownKeys(in decoder: any Decoder, known: [String]) throws {
    let container = try decoder.container(keyedBy: AnyKey.self)
    for key in container.allKeys where !known.contains(key.stringValue) {
        throw DecodingError.dataCorrupted(DecodingError.Context(
            codingPath: decoder.codingPath,
            debugDescription: "unknown field '\(key.stringValue)'; known fields: \(known.joined(separator: ", "))"))
    }
}

/// An error answer the fault plan chose for a valid request.
struct InjectedFault: Sendable, Equatable {
    var status: Int
    var reason: String
    var timestamp: Int64?
}

/// Applies an `APNsFaultPlan`, consuming its scripted entries. Pure: the caller serialises access.
struct FaultInjector: Sendable {
    private(set) var plan: APNsFaultPlan
    private var random: SplitMix64

    init(plan: APNsFaultPlan = APNsFaultPlan()) {
        self.plan = plan
        random = SplitMix64(seed: plan.seed)
    }

    /// The fault for a valid request to `token` (lowercase hex), or nil to accept it.
    mutating func decide(token: String) -> InjectedFault? {
        if let index = plan.scripted.firstIndex(where: { $0.token == nil || $0.token == token }) {
            let entry = plan.scripted[index]
            plan.scripted[index].count -= 1
            if plan.scripted[index].count <= 0 { plan.scripted.remove(at: index) }
            return InjectedFault(status: entry.status, reason: entry.reason, timestamp: entry.timestamp)
        }
        if let timestamp = plan.unregistered[token] {
            return InjectedFault(status: 410, reason: "Unregistered", timestamp: timestamp)
        }
        if plan.serviceUnavailableShare > 0, random.unitInterval() < plan.serviceUnavailableShare {
            return InjectedFault(status: 503, reason: "ServiceUnavailable", timestamp: nil)
        }
        return nil
    }
}


