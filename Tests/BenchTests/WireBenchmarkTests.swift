import SquelchTesting
import Testing
import WireTesting
@testable import squelch_bench

@Suite struct WireBenchmarkTests {
    @Test func benchmarkEntryPointMeasuresBothDirections() async throws {
        let pki = try TestPKI()
        let secrets = try pki.secrets()
        try await withTimeout(30) {
            // `loopback` makes and shuts down its own event loops.
            let result = try await WireBenchmark.loopback(secrets: secrets, client: pki.client(), count: 2_000)
            #expect(result.uplink.sent == 2_000 && result.downlink.sent == 2_000)
            #expect(result.uplink.delivered > 0 && result.downlink.delivered > 0)
            #expect(result.uplink.delivered <= 2_000 && result.downlink.delivered <= 2_000)
            #expect(result.uplink.seconds > 0 && result.downlink.seconds > 0)
        }
    }
}
