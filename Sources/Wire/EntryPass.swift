import Crypto
import Foundation

/// An entry pass (docs/protocol.md §7.8): what a cluster node hands a client it redirects, so that the
/// channel's home can answer the client's join in its first flight instead of a round trip after the
/// handshake. The ticket is sealed by the redirecting node with the cluster's shared key and names the
/// home (its audience); it carries the join itself. The key is the client's proof that the pass is
/// its own: the ClientHello carries the ticket and a binder, an HMAC under the key over the hello's
/// random and key share, so a ticket copied off the path is worth nothing with another key share, and
/// what the home answers is sealed to the client's key share anyway.
public struct EntryPass: Sendable, Equatable {
    public var ticket: [UInt8]
    public var key: [UInt8]

    public static let binderLength = TransportParameters.entryPassBinderLength
    static let binderLabel = Array("squelch-wire entry pass binder".utf8)

    public init(ticket: [UInt8], key: [UInt8]) {
        self.ticket = ticket
        self.key = key
    }

    static func binder(key: [UInt8], random: [UInt8], keyShare: [UInt8]) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: binderLabel + random + keyShare, using: SymmetricKey(data: key)))
    }

    /// Server: whether `binder` is the one `key` makes for this hello (in constant time).
    static func binderIsValid(_ binder: ArraySlice<UInt8>, key: [UInt8], random: [UInt8], keyShare: [UInt8]) -> Bool {
        HMAC<SHA256>.isValidAuthenticationCode(Array(binder), authenticating: binderLabel + random + keyShare, using: SymmetricKey(data: key))
    }

    /// The ClientHello's `entry_pass` value: the ticket, then the binder.
    func parameter(random: [UInt8], keyShare: [UInt8]) -> [UInt8] {
        ticket + Self.binder(key: key, random: random, keyShare: keyShare)
    }
}

/// What a server needs to issue and honour entry passes: the key every node of the cluster shares,
/// the name it answers to as an audience (its node id), and the wall clock tickets expire by (nodes
/// share no monotonic clock).
public struct EntryPasses: Sendable {
    public let key: SymmetricKey
    public let audience: [UInt8]
    public let lifetimeMilliseconds: UInt64
    let clock: @Sendable () -> UInt64

    /// `sharedKey`: the same on every node (squelchd derives it from the cluster's address-token key).
    public init(sharedKey: SymmetricKey, audience: String, lifetimeMilliseconds: UInt64 = 30_000,
                clock: @escaping @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1_000) }) {
        key = SymmetricKey(data: HKDF<SHA256>.deriveKey(inputKeyMaterial: sharedKey, info: Array("squelch-wire entry ticket".utf8),
                                                        outputByteCount: 32))
        self.audience = Array(audience.utf8.prefix(EntryTicketContents.maximumAudience))
        self.lifetimeMilliseconds = lifetimeMilliseconds
        self.clock = clock
    }

    /// A pass for the node `audience` that carries `payload` (squelchd: the join being redirected),
    /// for the client this node sees at `client` (its host, not its port, counts: the home takes a
    /// ClientHello from that host as from a validated address). Nil if sealing fails, the audience is
    /// over 64 bytes, or the pass would be too long for a ClientHello (a payload of about 4 KB: a
    /// join with a very long token): the client then joins at the home as without one.
    public func issue(payload: [UInt8], for audience: String, client: PathAddress) -> EntryPass? {
        let passKey = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        let contents = EntryTicketContents(expiresMilliseconds: clock() + lifetimeMilliseconds, key: passKey,
                                           host: Self.host(client), audience: Array(audience.utf8), payload: payload)
        guard let plain = contents.encoded(), let box = try? AES.GCM.seal(plain, using: key), let sealed = box.combined,
              sealed.count + EntryPass.binderLength <= TransportParameters.maximumEntryPass else { return nil }
        return EntryPass(ticket: Array(sealed), key: passKey)
    }

    /// A host as a ticket holds it: IPv6 flag, then the high and low 64 bits.
    static func host(_ address: PathAddress) -> [UInt8] {
        var bytes: [UInt8] = [address.isIPv6 ? 1 : 0]
        EntryTicketContents.append(address.high, to: &bytes)
        EntryTicketContents.append(address.low, to: &bytes)
        return bytes
    }

    /// The ticket's contents if it is this cluster's, for this node, and not expired. Spending it is
    /// separate (`SpentPasses`), after the binder has been checked.
    func open(_ ticket: ArraySlice<UInt8>) -> EntryTicketContents? {
        guard ticket.count > 12 + 16, let box = try? AES.GCM.SealedBox(combined: ticket),
              let plain = try? AES.GCM.open(box, using: key),
              let contents = EntryTicketContents(parsing: Array(plain)),
              contents.audience == audience, contents.expiresMilliseconds > clock() else { return nil }
        return contents
    }
}

/// Tickets that have opened a connection on this server, kept until they expire: a pass enters once
/// (a copy replayed with the client's own hello gets nothing, but would otherwise have its join
/// answered again). The address tokens' register (`SpentTokens`, by AES-GCM nonce, bounded: when
/// full a pass counts as spent, which costs its client a round trip), on the wall clock tickets
/// expire by. A class: owned by the endpoint and shared with its connections, on one thread.
final class SpentPasses {
    private var register: SpentTokens

    init(capacity: Int) { register = SpentTokens(capacity: capacity) }

    /// False when the ticket already entered, or there is no room to remember it.
    func spend(_ ticket: ArraySlice<UInt8>, expiresMilliseconds: UInt64, nowMilliseconds: UInt64) -> Bool {
        register.spend(Array(ticket.prefix(12)), expires: WireInstant(nanoseconds: expiresMilliseconds * 1_000_000),
                       now: WireInstant(nanoseconds: nowMilliseconds * 1_000_000))
    }
}
