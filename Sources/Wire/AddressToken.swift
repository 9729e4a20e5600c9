import Crypto

/// Address-validation tokens (docs/protocol.md §8): AES-256-GCM under the server's token key, so
/// the server keeps no state for them. A Retry token binds the client's exact address and original
/// destination ID and lives 10 s; a NEW_TOKEN token binds only the host (a mobile client's port
/// changes) and lives an hour.
enum AddressToken {
    static let retryLifetime: UInt64 = seconds(10)
    static let newTokenLifetime: UInt64 = seconds(3600)

    struct Contents {
        var isRetry: Bool
        var issued: WireInstant
        var address: PathAddress
        var original: ConnectionID?
        var retrySource: ConnectionID?
        var clockEpoch: UInt64
    }

    /// Plaintext bytes: kind, issue time, address (high, low, port, family), original and Retry source
    /// IDs, clock epoch.
    static let plainLength = 1 + 8 + 8 + 8 + 2 + 1 + 8 + 8 + 8

    static func seal(address: PathAddress, original: ConnectionID?, retrySource: ConnectionID? = nil,
                     secrets: ServerSecrets, now: WireInstant) -> [UInt8] {
        var plain: [UInt8] = [original == nil ? 1 : 0]
        func put(_ v: UInt64, _ n: Int) { for i in (0..<n).reversed() { plain.append(UInt8(truncatingIfNeeded: v >> UInt64(8 * i))) } }
        put(now.nanoseconds, 8)
        put(address.high, 8); put(address.low, 8); put(UInt64(address.port), 2); plain.append(address.isIPv6 ? 1 : 0)
        put(original?.value ?? 0, 8)
        put(retrySource?.value ?? 0, 8)
        put(secrets.clockEpoch, 8)
        guard let box = try? AES.GCM.seal(plain, using: secrets.tokenKey), let combined = box.combined else { return [] }
        return Array(combined)
    }

    static func open(_ token: [UInt8], secrets: ServerSecrets) -> Contents? {
        guard token.count == 12 + plainLength + 16, let box = try? AES.GCM.SealedBox(combined: token),
              let plain = try? AES.GCM.open(box, using: secrets.tokenKey) else { return nil }
        let p = Array(plain)
        guard p.count == plainLength else { return nil }
        func get(_ at: Int, _ n: Int) -> UInt64 { p[at..<(at + n)].reduce(0) { $0 << 8 | UInt64($1) } }
        let isRetry = p[0] == 0
        var address = PathAddress(ipv4: 0, port: UInt16(get(25, 2)))
        address.high = get(9, 8); address.low = get(17, 8); address.isIPv6 = p[27] == 1
        return Contents(isRetry: isRetry, issued: WireInstant(nanoseconds: get(1, 8)), address: address,
                        original: isRetry ? ConnectionID(get(28, 8)) : nil,
                        retrySource: isRetry ? ConnectionID(get(36, 8)) : nil, clockEpoch: get(44, 8))
    }

    /// When a token with `contents` stops being valid.
    static func expiry(of contents: Contents) -> WireInstant {
        contents.issued + (contents.isRetry ? retryLifetime : newTokenLifetime)
    }

    /// Whether `token` is valid for a client at `address` now. Retry tokens also give back the
    /// original destination ID and the Retry's source ID.
    static func validate(_ token: [UInt8], address: PathAddress, secrets: ServerSecrets, now: WireInstant) -> Contents? {
        guard let contents = open(token, secrets: secrets), contents.clockEpoch == secrets.clockEpoch, contents.issued <= now else { return nil }
        let age = now.since(contents.issued)
        if contents.isRetry {
            guard age <= retryLifetime, contents.address == address else { return nil }
        } else {
            guard age <= newTokenLifetime, contents.address.sameHost(as: address) else { return nil }
        }
        return contents
    }
}

/// Tokens that have opened a connection, kept until they expire: each token opens one connection
/// (docs/protocol.md §8.3). A NEW_TOKEN token travels in clear and binds only the host, so anyone on
/// the path could otherwise copy it and, for an hour, open connections in the client's name that
/// skip the Retry. Bounded: once `capacity` unexpired tokens are kept, a token counts as spent,
/// which costs its client at most a Retry round trip (the state is per process: in a cluster a
/// token may open one connection on each node).
struct SpentTokens {
    /// A token's AES-GCM nonce: random, 12 bytes, unique to the token.
    struct Nonce: Hashable { var high: UInt64; var low: UInt32 }

    let capacity: Int
    var expiries: [Nonce: WireInstant] = [:]
    /// When expired entries were last swept; sweeps happen when full, at most once a second.
    var lastSweep = WireInstant(nanoseconds: 0)

    init(capacity: Int) { self.capacity = capacity }

    /// Records `token` as spent. False when it already was, or when there is no room to remember it.
    mutating func spend(_ token: [UInt8], expires: WireInstant, now: WireInstant) -> Bool {
        guard token.count >= 12 else { return false }
        let nonce = Nonce(high: token[0..<8].reduce(0) { $0 << 8 | UInt64($1) }, low: token[8..<12].reduce(0) { $0 << 8 | UInt32($1) })
        if let expiry = expiries[nonce], expiry > now { return false }
        if expiries.count >= capacity, now.since(lastSweep) >= seconds(1) {
            lastSweep = now
            expiries = expiries.filter { $0.value > now }
        }
        guard expiries.count < capacity else { return false }
        expiries[nonce] = expires
        return true
    }
}

/// The Retry integrity tag (RFC 9001 §5.8 shape, our own fixed key): AES-128-GCM with a public key
/// over the original destination ID and the Retry packet. It only stops off-path tampering; the
/// handshake's transport parameters authenticate the Retry for real.
enum RetryIntegrity {
    /// First 16 bytes of SHA-256("squelch-wire v1 retry integrity"), and the next 12 as the nonce.
    static let key = SymmetricKey(data: [0xad, 0xc5, 0xcc, 0x9e, 0x68, 0x94, 0x20, 0x47, 0x7c, 0xc8, 0xde, 0xaf, 0xbf, 0xc0, 0x41, 0x61] as [UInt8])
    static let nonce: [UInt8] = [0xd9, 0x18, 0x19, 0xe1, 0xa8, 0xb1, 0x16, 0xd4, 0x7d, 0x52, 0x08, 0xff]

    static func tag(original: ConnectionID, retryPacketWithoutTag: some Collection<UInt8>) -> [UInt8] {
        var pseudo: [UInt8] = [UInt8(ConnectionID.length)] + original.bytes
        pseudo += retryPacketWithoutTag
        guard let nonce = try? AES.GCM.Nonce(data: Self.nonce),
              let box = try? AES.GCM.seal([UInt8](), using: key, nonce: nonce, authenticating: pseudo) else { return [] }
        return Array(box.tag)
    }
}
