import Foundation

// The APNs request rules, sans-I/O: a request's method, path, header list and body plus the time go in,
// a verdict comes out. No NIO and no jwt-kit here (the signature check sits behind
// `ProviderTokenVerifying`), so `make fuzz-build` can compile this file alone into fuzz/bin/apns-request.

/// One request as it arrived on an HTTP/2 stream.
struct APNsRequest: Sendable {
    /// `:method`, or nil when the stream carried none.
    var method: String?
    /// `:path`, or nil when the stream carried none.
    var path: String?
    /// The regular (non-pseudo) header fields in arrival order, names as sent.
    var headers: [(name: String, value: String)]
    /// The body, or as much of it as the transport kept: `APNsLimits.storedBodyBytes` is enough to tell
    /// every verdict apart.
    var body: [UInt8]
    /// The body's full length, which may exceed `body.count`.
    var bodyLength: Int

    init(method: String?, path: String?, headers: [(name: String, value: String)], body: [UInt8], bodyLength: Int? = nil) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.bodyLength = bodyLength ?? body.count
    }
}

/// Apple's documented limits: payload size, header values, provider-token age.
enum APNsLimits {
    static let maxPayloadBytes = 4096
    /// One byte past the limit is all the validator needs to see.
    static let storedBodyBytes = maxPayloadBytes + 1
    static let maxCollapseIDBytes = 64
    static let minTokenCharacters = 2
    static let maxTokenCharacters = 200
    /// `iat` older than this gives ExpiredProviderToken.
    static let providerTokenLifetime: TimeInterval = 3600
    /// `iat` further ahead than this is taken for a forged or broken clock: InvalidProviderToken.
    static let providerTokenClockSkew: TimeInterval = 60
    /// A connection may switch to a new JWT only this long after the previous one's first use.
    static let providerTokenMinimumInterval: TimeInterval = 20 * 60
    /// Rejections keep at most this many characters of a token, so a hostile path can't bloat the log.
    static let maxLoggedTokenCharacters = 256
}

/// The `reason` strings of Apple's error responses the validator produces, with their statuses.
enum APNsReason: String, Sendable, CaseIterable {
    case methodNotAllowed = "MethodNotAllowed"
    case badPath = "BadPath"
    case missingDeviceToken = "MissingDeviceToken"
    case badDeviceToken = "BadDeviceToken"
    case duplicateHeaders = "DuplicateHeaders"
    case missingProviderToken = "MissingProviderToken"
    case invalidProviderToken = "InvalidProviderToken"
    case expiredProviderToken = "ExpiredProviderToken"
    case unrelatedKeyIdInToken = "UnrelatedKeyIdInToken"
    case tooManyProviderTokenUpdates = "TooManyProviderTokenUpdates"
    case invalidPushType = "InvalidPushType"
    case missingTopic = "MissingTopic"
    case topicDisallowed = "TopicDisallowed"
    case deviceTokenNotForTopic = "DeviceTokenNotForTopic"
    case badPriority = "BadPriority"
    case badExpirationDate = "BadExpirationDate"
    case badMessageId = "BadMessageId"
    case badCollapseId = "BadCollapseId"
    case payloadEmpty = "PayloadEmpty"
    case payloadTooLarge = "PayloadTooLarge"

    var status: Int {
        switch self {
        case .methodNotAllowed: 405
        case .badPath: 404
        case .missingProviderToken, .invalidProviderToken, .expiredProviderToken, .unrelatedKeyIdInToken: 403
        case .tooManyProviderTokenUpdates: 429
        case .payloadTooLarge: 413
        default: 400
        }
    }
}

/// A request that passed every rule.
struct APNsValidPush: Sendable, Equatable {
    /// Lowercase hex.
    var token: String
    var topic: String
    var pushType: String
    var priority: Int?
    var expiration: Int?
    var collapseID: String?
    var keyID: String
    var teamID: String
    /// False when the body is not a JSON object. Apple accepts such bodies without a reason, so the
    /// simulator does too, and counts them.
    var bodyIsJSONObject: Bool
}

/// What the validator decided.
enum APNsVerdict: Sendable, Equatable {
    case valid(APNsValidPush)
    /// `token` is the path's token lowercased, when the path had one, for the rejection log.
    case invalid(reason: APNsReason, token: String?)
}

/// The provider keys the simulator knows, and the ES256 signature check, kept behind a protocol so this
/// file doesn't need jwt-kit.
protocol ProviderTokenVerifying: Sendable {
    /// The team a key belongs to, or nil when no key has this ID.
    func teamID(forKeyID keyID: String) -> String?
    /// Whether `signature` (JWS form: raw r‖s) is a valid ES256 signature of `signingInput` by the key `keyID`.
    func isValidSignature(_ signature: [UInt8], signingInput: ArraySlice<UInt8>, keyID: String) -> Bool
}

/// A connection's provider-token state: Apple binds a connection to the team of its first key and
/// limits how often the JWT may change on it.
struct ProviderTokenSession: Sendable, Equatable {
    /// The team of the first key accepted on this connection.
    private(set) var teamID: String?
    /// The JWT in use (the last one accepted).
    private(set) var token: String?
    private(set) var keyID: String?
    private(set) var issuedAt: Int64 = 0
    /// When `token` was first accepted on this connection.
    private(set) var firstUse: Date?
    /// How many distinct JWTs this connection has accepted.
    private(set) var acceptedTokens = 0

    /// True once one valid JWT has been seen: Apple raises MAX_CONCURRENT_STREAMS then.
    var isAuthenticated: Bool { acceptedTokens > 0 }

    fileprivate mutating func adopt(token: String, keyID: String, teamID: String, issuedAt: Int64, now: Date) {
        self.teamID = self.teamID ?? teamID
        self.token = token
        self.keyID = keyID
        self.issuedAt = issuedAt
        self.firstUse = now
        acceptedTokens += 1
    }
}

/// The validator of one HTTP/2 connection: it holds that connection's provider-token session, since
/// three of the JWT rules depend on what came before on the same connection.
struct APNsRequestValidator: Sendable {
    /// What `apns-push-type` may be (Apple's list).
    static let pushTypes: Set<String> = [
        "alert", "background", "voip", "complication", "fileprovider", "mdm", "liveactivity", "location",
        "pushtotalk", "widgets",
    ]

    let verifier: any ProviderTokenVerifying
    /// nil allows every topic.
    let allowedTopics: Set<String>?
    private(set) var session = ProviderTokenSession()
    /// The session before the last JWT change, so an injected provider-token rejection can undo it.
    private var sessionBeforeLastChange: ProviderTokenSession?

    /// A fault plan answered the request with a provider-token error: to the client, APNs refused the JWT,
    /// so the connection must not count it as its accepted one (else the client's replacement JWT would
    /// meet the 20-minute rule, which real APNs would not apply).
    mutating func retractLastTokenChange() {
        guard let before = sessionBeforeLastChange else { return }
        session = before
        sessionBeforeLastChange = nil
    }

    init(verifier: any ProviderTokenVerifying, allowedTopics: Set<String>?) {
        self.verifier = verifier
        self.allowedTopics = allowedTopics
    }

    /// The request's `apns-id` when it is a canonical lowercase UUID, which is when the response echoes
    /// it (otherwise the simulator makes one up, as Apple does).
    static func echoableAPNsID(of request: APNsRequest) -> String? {
        guard let value = request.headers.first(where: { $0.name.lowercased() == "apns-id" })?.value,
              isCanonicalUUID(value) else { return nil }
        return value
    }

    /// Applies the rules in Apple's order (see the module's documentation); the first that fails decides.
    mutating func validate(_ request: APNsRequest, now: Date) -> APNsVerdict {
        let pathToken = Self.loggedToken(fromPath: request.path)
        func reject(_ reason: APNsReason) -> APNsVerdict { .invalid(reason: reason, token: pathToken) }

        // 1. Method.
        guard request.method == "POST" else { return reject(.methodNotAllowed) }

        // 2. Path and device token.
        guard let path = request.path else { return reject(.badPath) }
        let prefix = "/3/device"
        // Bytes, not Characters: a combining mark after the slash must not hide the prefix.
        guard path.utf8.starts(with: prefix.utf8) else { return reject(.badPath) }
        let rest = path.utf8.dropFirst(prefix.utf8.count)
        if rest.isEmpty || rest.elementsEqual("/".utf8) { return reject(.missingDeviceToken) }
        guard rest.first == UInt8(ascii: "/") else { return reject(.badPath) }
        let rawToken = rest.dropFirst()
        guard Self.isHexToken(rawToken) else { return reject(.badDeviceToken) }
        let token = String(decoding: rawToken, as: UTF8.self).lowercased()

        // 3. Repeated headers.
        var fields: [String: String] = [:]
        for (name, value) in request.headers {
            let key = name.lowercased()
            guard fields[key] == nil else { return reject(.duplicateHeaders) }
            fields[key] = value
        }

        // 4. Provider token.
        guard let authorization = fields["authorization"] else { return reject(.missingProviderToken) }
        let key: (id: String, team: String)
        switch checkProviderToken(authorization, now: now) {
        case .rejected(let reason): return reject(reason)
        case .accepted(let keyID, let teamID): key = (keyID, teamID)
        }

        // 5. Push type.
        guard let pushType = fields["apns-push-type"], Self.pushTypes.contains(pushType) else {
            return reject(.invalidPushType)
        }

        // 6. Topic.
        guard let topic = fields["apns-topic"], !topic.isEmpty else { return reject(.missingTopic) }
        if let allowedTopics, !allowedTopics.contains(topic) { return reject(.topicDisallowed) }
        if pushType == "pushtotalk", !topic.hasSuffix(".voip-ptt") { return reject(.deviceTokenNotForTopic) }

        // 7. Optional headers.
        var priority: Int?
        if let value = fields["apns-priority"] {
            guard value == "10" || value == "5" || value == "1" else { return reject(.badPriority) }
            priority = Int(value)
        }
        var expiration: Int?
        if let value = fields["apns-expiration"] {
            guard !value.isEmpty, value.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                  let seconds = Int(value) else { return reject(.badExpirationDate) }
            expiration = seconds
        }
        if let value = fields["apns-id"], !Self.isCanonicalUUID(value) { return reject(.badMessageId) }
        let collapseID = fields["apns-collapse-id"]
        if let collapseID, collapseID.utf8.count > APNsLimits.maxCollapseIDBytes { return reject(.badCollapseId) }

        // 8. Body.
        if request.bodyLength == 0 { return reject(.payloadEmpty) }
        if request.bodyLength > APNsLimits.maxPayloadBytes { return reject(.payloadTooLarge) }

        return .valid(APNsValidPush(
            token: token, topic: topic, pushType: pushType, priority: priority, expiration: expiration,
            collapseID: collapseID, keyID: key.id, teamID: key.team,
            bodyIsJSONObject: Self.isJSONObject(request.body)))
    }

    // MARK: Provider token (JWT)

    /// The header and claims this validator reads; anything else in them is ignored, as Apple does.
    private struct JOSEHeader: Decodable {
        var alg: String?
        var kid: String?
    }

    private struct Claims: Decodable {
        var iss: String?
        /// Decoded as a number of any form, then required to be whole seconds: Apple documents an
        /// integer, and jwt-kit writes `Date`s as fractional seconds unless the caller rounds them.
        var iat: Double?
    }

    private enum ProviderTokenCheck {
        case accepted(keyID: String, teamID: String)
        case rejected(APNsReason)
    }

    private mutating func checkProviderToken(_ authorization: String, now: Date) -> ProviderTokenCheck {
        guard let jwt = Self.bearerToken(authorization) else { return .rejected(.invalidProviderToken) }
        let nowSeconds = now.timeIntervalSince1970

        // The JWT in use was verified when it arrived; only its age can have changed since.
        sessionBeforeLastChange = nil
        if jwt == session.token, let keyID = session.keyID, let teamID = session.teamID {
            if nowSeconds - Double(session.issuedAt) > APNsLimits.providerTokenLifetime { return .rejected(.expiredProviderToken) }
            return .accepted(keyID: keyID, teamID: teamID)
        }

        let parts = jwt.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 3,
              let headerBytes = Self.base64URLDecode(parts[0]),
              let claimBytes = Self.base64URLDecode(parts[1]),
              let signature = Self.base64URLDecode(parts[2]), !signature.isEmpty else { return .rejected(.invalidProviderToken) }
        let decoder = JSONDecoder()
        guard let header = try? decoder.decode(JOSEHeader.self, from: Data(headerBytes)),
              let claims = try? decoder.decode(Claims.self, from: Data(claimBytes)),
              header.alg == "ES256", let keyID = header.kid,
              let teamID = verifier.teamID(forKeyID: keyID),
              let issuer = claims.iss, let iat = claims.iat, iat.rounded() == iat, abs(iat) < 1e15 else {
            return .rejected(.invalidProviderToken)
        }
        let issuedAt = Int64(iat)
        // The signing input is the first two parts and the dot between them, exactly as sent.
        let signingInput = Array(jwt.utf8).prefix(parts[0].count + 1 + parts[1].count)
        guard verifier.isValidSignature(signature, signingInput: signingInput, keyID: keyID), issuer == teamID else {
            return .rejected(.invalidProviderToken)
        }
        let age = nowSeconds - Double(issuedAt)
        if age < -APNsLimits.providerTokenClockSkew { return .rejected(.invalidProviderToken) }
        if age > APNsLimits.providerTokenLifetime { return .rejected(.expiredProviderToken) }
        if let boundTeam = session.teamID, boundTeam != teamID { return .rejected(.unrelatedKeyIdInToken) }
        if let firstUse = session.firstUse, now.timeIntervalSince(firstUse) < APNsLimits.providerTokenMinimumInterval {
            return .rejected(.tooManyProviderTokenUpdates)
        }
        sessionBeforeLastChange = session
        session.adopt(token: jwt, keyID: keyID, teamID: teamID, issuedAt: issuedAt, now: now)
        return .accepted(keyID: keyID, teamID: teamID)
    }

    /// The JWT of `bearer <JWT>` (scheme case-insensitive, as HTTP auth schemes are).
    static func bearerToken(_ authorization: String) -> String? {
        let scheme = "bearer "
        guard authorization.utf8.count > scheme.utf8.count,
              authorization.utf8.prefix(scheme.utf8.count).map({ $0 | 0x20 }).elementsEqual(scheme.utf8) else { return nil }
        let token = authorization.utf8.dropFirst(scheme.utf8.count).drop(while: { $0 == UInt8(ascii: " ") })
        guard !token.isEmpty, !token.contains(UInt8(ascii: " ")) else { return nil }
        return String(decoding: token, as: UTF8.self)
    }

    /// Base64url without padding (RFC 7515 §2); nil for any other character or an impossible length.
    static func base64URLDecode(_ text: some Collection<UInt8>) -> [UInt8]? {
        guard text.count % 4 != 1 else { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(text.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bits = 0
        for byte in text {
            let value: UInt8
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = byte - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = byte - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = byte - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"): value = 62
            case UInt8(ascii: "_"): value = 63
            default: return nil
            }
            accumulator = (accumulator << 6) | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
                accumulator &= (1 << UInt32(bits)) - 1
            }
        }
        return output
    }

    // MARK: Small rules

    /// Even length, 2…200 characters, hex digits only.
    static func isHexToken(_ token: some Collection<UInt8>) -> Bool {
        let count = token.count
        guard count >= APNsLimits.minTokenCharacters, count <= APNsLimits.maxTokenCharacters, count % 2 == 0 else { return false }
        return token.allSatisfy(isHexDigit)
    }

    /// 8-4-4-4-12 lowercase hex digits: the only form Apple accepts in `apns-id`.
    static func isCanonicalUUID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.count == 36 else { return false }
        for (index, byte) in bytes.enumerated() {
            if index == 8 || index == 13 || index == 18 || index == 23 {
                guard byte == UInt8(ascii: "-") else { return false }
            } else {
                guard (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f")) else {
                    return false
                }
            }
        }
        return true
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))
    }

    /// What a rejection logs as the token: whatever followed `/3/device/`, lowercased and capped.
    static func loggedToken(fromPath path: String?) -> String? {
        let prefix = "/3/device/"
        guard let path, path.utf8.starts(with: prefix.utf8) else { return nil }
        let token = String(decoding: path.utf8.dropFirst(prefix.utf8.count), as: UTF8.self).lowercased()
        guard !token.isEmpty else { return nil }
        // Capped after lowercasing, which can lengthen a string (İ becomes i + U+0307).
        return String(token.prefix(APNsLimits.maxLoggedTokenCharacters))
    }

    static func isJSONObject(_ body: [UInt8]) -> Bool {
        (try? JSONSerialization.jsonObject(with: Data(body))) is [String: Any]
    }
}
