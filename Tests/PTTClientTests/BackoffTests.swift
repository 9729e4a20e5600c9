@testable import PTTClient
import Testing

@Suite struct BackoffTests {
    /// The reconnect schedule doubles from 0.5 s to its 30 s ceiling, and a long outage stays there
    /// (the shift stops before it could overflow); the owed leave's does the same from 1 s to 60 s.
    @Test func delaysDoubleUpToTheirCeiling() {
        let reconnect = (0..<10).map { Backoff.milliseconds(first: 500, failuresBefore: $0, ceiling: 30_000) }
        #expect(reconnect == [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000, 30_000])
        #expect(Backoff.milliseconds(first: 500, failuresBefore: 10_000, ceiling: 30_000) == 30_000)
        let leave = (0..<8).map { Backoff.milliseconds(first: 1_000, failuresBefore: $0, ceiling: LeaveDelivery.maximumBackoffMilliseconds) }
        #expect(leave == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000])
    }

    /// Jitter keeps at least half of the delay and never adds to it; clients that failed together
    /// come back at different moments.
    @Test func jitterSpreadsWithinTheUpperHalf() {
        let waits = (0..<200).map { _ in Backoff.jittered(1_000) }
        #expect(waits.allSatisfy { (500...1_000).contains($0) }, "\(waits.filter { !(500...1_000).contains($0) })")
        #expect(Set(waits).count > 20, "the waits are spread, not one moment: \(Set(waits).count) distinct")
        #expect(Backoff.jittered(0) == 0, "no delay stays no delay")
    }
}
