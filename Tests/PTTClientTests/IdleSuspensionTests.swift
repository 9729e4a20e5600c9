import PTTClient
import Testing

struct IdleSuspensionTests {
    @Test func sleepsAfterQuietAndAgainAfterAWokenBurst() {
        var idle = IdleSuspension(after: 10_000_000_000, now: 0)
        func sleeps(at seconds: UInt64, busy: Bool = false, suspended: Bool = false, wakeable: Bool = true) -> Bool {
            idle.tick(now: seconds * 1_000_000_000, busy: busy, suspended: suspended, wakeable: wakeable)
        }
        #expect(!sleeps(at: 9))
        #expect(sleeps(at: 10))
        // Asleep, then woken by a push at 60 s: the burst plays until 64 s, and 10 s of quiet after it
        // it sleeps again.
        #expect(!sleeps(at: 30, suspended: true))
        #expect(!sleeps(at: 60, suspended: true))
        #expect(!sleeps(at: 61, busy: true))
        #expect(!sleeps(at: 64, busy: true))
        #expect(!sleeps(at: 73))
        #expect(sleeps(at: 74))
        // Never without a push channel, as it would miss the next call; once a push can wake it, yes.
        idle = IdleSuspension(after: 1_000_000_000, now: 0)
        #expect(!sleeps(at: 5, wakeable: false))
        #expect(sleeps(at: 6))
    }
}
