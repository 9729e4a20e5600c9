extension ControlLimits {
    /// Roster bytes one `joined` or `roster` message carries at most (an upper bound of the entries'
    /// JSON, `RosterMember.encodedSizeBound`): half of `maxMessageBytes`, so that nothing near the
    /// limit depends on the bound being tight.
    public static let rosterChunkBytes = maxMessageBytes / 2
}

/// Decides, one entry at a time, how many roster entries one `joined` or `roster` message carries:
/// at most `rosterChunk` entries and `rosterChunkBytes` of them (by `encodedSizeBound`). A count
/// alone isn't enough: 128 entries with user ids, names and roles at their limits would exceed
/// `maxMessageBytes`, a message over it is refused by the transport, and the joiner would never get
/// `joined`. The sender fills one chunk per message, as the connection has room for it.
public struct RosterChunker: Sendable {
    private var entries = 0
    private var bytes = 0
    private let limit: Int
    private let mayBeEmpty: Bool

    /// For `joined`'s chunk: at most `firstChunkBytes` too (what `joined` has room for besides its
    /// channel, with its image, and its talkers), so it may close empty.
    public init(firstChunkBytes: Int) {
        limit = min(ControlLimits.rosterChunkBytes, firstChunkBytes)
        mayBeEmpty = true
    }

    /// For a `roster` message's chunk, which takes at least one entry (one always fits
    /// `rosterChunkBytes`), so that sending moves on.
    public init() {
        limit = ControlLimits.rosterChunkBytes
        mayBeEmpty = false
    }

    /// Counts `entry` into the chunk if it fits; false if the chunk is full without it.
    public mutating func take(_ entry: RosterMember) -> Bool {
        let size = entry.encodedSizeBound
        if entries == ControlLimits.rosterChunk || bytes + size > limit, entries > 0 || mayBeEmpty { return false }
        entries += 1
        bytes += size
        return true
    }
}

extension RosterMember {
    /// Bytes of JSON this entry takes in a roster at most. The fixed part is measured once, with the
    /// longest values every other field can have; each byte of the user id, name, role and image counts as
    /// the most its escaping can make of it: 6 for a control character (`\u001f`), 2 for `"`, `\` and
    /// `/`, 3 for a byte of a character beyond ASCII (in case an encoder writes `\uXXXX`, or a pair of
    /// them), else 1.
    public var encodedSizeBound: Int {
        Self.fixedEncodedBytes + Self.escapedBound(userID) + Self.escapedBound(name) + Self.escapedBound(role ?? "")
            + Self.escapedBound(image ?? "")
    }

    static let fixedEncodedBytes: Int = {
        let codec = MessageCodec()
        let longest = RosterMember(slot: .max, userID: "", name: "", role: "", image: "", priority: .max, canTalk: false,
                                  canListen: false, connection: .reconnecting, talking: false, muted: false)
        // The comma between two entries is in it: two entries minus none, halved, rounded up.
        let none = codec.encode(.roster([])).count
        let two = codec.encode(.roster([longest, longest])).count
        return (two - none + 1) / 2
    }()

    static func escapedBound(_ text: String) -> Int {
        var total = 0
        for byte in text.utf8 {
            switch byte {
            case 0..<0x20: total += 6
            case 0x22, 0x5C, 0x2F: total += 2
            case 0x80...: total += 3
            default: total += 1
            }
        }
        return total
    }
}
