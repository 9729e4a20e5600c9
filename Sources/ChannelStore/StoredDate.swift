import ChannelProtocol
import Foundation

extension Date {
    /// Whole milliseconds since 1970: how every store keeps a date, and so the precision at which
    /// `RevocationRecord.voids` compares an issue time with a revocation's.
    public var unixMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded()) }

    /// The date a store kept as `unixMilliseconds`.
    public init(unixMilliseconds: Int64) { self.init(timeIntervalSince1970: Double(unixMilliseconds) / 1000) }
}
