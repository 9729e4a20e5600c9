import Foundation
import Wire

/// A member's transport connection, as the endpoint names it.
public typealias Link = Endpoint.Handle

/// The hub's two clocks: monotonic time for timers, and the wall clock for what is stored (last
/// seen, the transmission log). The hub reads neither; callers pass both.
public struct HubTime: Sendable {
    public var instant: WireInstant
    public var date: Date
    public init(instant: WireInstant, date: Date) {
        self.instant = instant
        self.date = date
    }
}
