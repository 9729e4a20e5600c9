/// The hub's timers, each named, in the order a timeout runs them (as quinn-proto's `TimerTable`
/// names a connection's). `ChannelHub.deadline(of:)` says when each is next due; `nextDeadline` is
/// the earliest of them.
enum HubTimer: CaseIterable {
    /// A channel's floor: maximum burst, disconnect grace, silence and first-audio limits.
    case floor
    /// Ended bursts kept for members who missed them stop being kept.
    case missedBursts
    /// Reconnecting members whose grace ran out go offline.
    case reconnecting
    /// Tokens of connected members expire, or are about to.
    case tokenExpiry
    /// The next catch-up packets to members being replayed bursts.
    case catchUp
    /// Roster entries held back by `HubConfiguration.rosterUpdateInterval` are due.
    case roster
}
