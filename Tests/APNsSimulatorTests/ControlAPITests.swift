import APNsDevice
import PushStream
import Foundation
import Testing
@testable import APNsSimulator

@Suite struct ControlAPITests {
    private struct Pushes: Decodable { var pushes: [APNsAcceptedPush] }
    private struct Rejections: Decodable { var rejections: [APNsRejection] }
    private struct Failure: Decodable { var error: String }

    @Test func healthPushesRejectionsAndStatsOverHTTP() async throws {
        try await SimulatorFixture.with { fixture in
            let health = try await Control.request(fixture.controlURL("/healthz"))
            #expect(health.status == 200)
            #expect(String(decoding: health.body, as: UTF8.self) == #"{"status":"ok"}"#)

            let client = try await fixture.connect()
            let other = String(repeating: "0a", count: 16)
            #expect(try await fixture.push(on: client).status == 200)
            #expect(try await fixture.push(on: client, token: other).status == 200)
            var headers = fixture.validHeaders()
            headers.remove("apns-push-type")
            #expect(try await client.send(path: "/3/device/\(other)", headers: headers, body: "{}").status == 400)
            await client.close()

            let all = try await Control.request(fixture.controlURL("/v1/pushes"))
            #expect(all.status == 200)
            // Dates included: what comes over HTTP equals what the simulator holds.
            #expect(try Control.decode(Pushes.self, all.body).pushes == fixture.simulator.acceptedPushes())
            let filtered = try await Control.request(fixture.controlURL("/v1/pushes?token=\(other.uppercased())"))
            #expect(try Control.decode(Pushes.self, filtered.body).pushes.map(\.token) == [other])

            let rejections = try await Control.request(fixture.controlURL("/v1/rejections"))
            #expect(try Control.decode(Rejections.self, rejections.body).rejections.map(\.reason) == ["InvalidPushType"])

            let stats = try Control.decode(APNsSimulatorStats.self, try await Control.request(fixture.controlURL("/v1/stats")).body)
            #expect(stats == fixture.simulator.stats())
            #expect(stats.accepted == 2 && stats.rejected == 1 && stats.rejectedByReason == ["InvalidPushType": 1])

            let deleted = try await Control.request(fixture.controlURL("/v1/pushes"), method: "DELETE")
            #expect(deleted.status == 204)
            #expect(fixture.simulator.acceptedPushes().isEmpty && fixture.simulator.rejections().isEmpty)
            #expect(fixture.simulator.stats().accepted == 0)
            #expect(try Control.decode(Pushes.self, try await Control.request(fixture.controlURL("/v1/pushes")).body).pushes.isEmpty)
        }
    }

    @Test func faultsCanBeReadAndReplacedOverHTTP() async throws {
        try await SimulatorFixture.with { fixture in
            #expect(try Control.decode(APNsFaultPlan.self, try await Control.request(fixture.controlURL("/v1/faults")).body) == APNsFaultPlan())

            let body = Data(#"{"unregistered":{"\#(deviceToken)":1700000000000},"scripted":[{"status":503,"reason":"Shutdown","count":1}]}"#.utf8)
            let put = try await Control.request(fixture.controlURL("/v1/faults"), method: "PUT", body: body)
            #expect(put.status == 200)
            let expected = APNsFaultPlan(unregistered: [deviceToken: 1_700_000_000_000],
                                         scripted: [APNsScriptedResponse(status: 503, reason: "Shutdown", count: 1)])
            #expect(fixture.simulator.faults() == expected)
            #expect(try Control.decode(APNsFaultPlan.self, put.body) == expected)

            // The plan works on real pushes, and GET shows the scripted entry used up.
            let client = try await fixture.connect()
            #expect(try await fixture.push(on: client).reason == "Shutdown")
            #expect(try await fixture.push(on: client).reason == "Unregistered")
            await client.close()
            let after = try Control.decode(APNsFaultPlan.self, try await Control.request(fixture.controlURL("/v1/faults")).body)
            #expect(after.scripted.isEmpty && after.unregistered.count == 1)

            for (text, mention) in [("{not json", "not valid JSON"), (#"{"delay":5}"#, "unknown field 'delay'"),
                                    (#"{"serviceUnavailableShare":2}"#, "serviceUnavailableShare"),
                                    (#"{"delayMilliseconds":"5"}"#, "delayMilliseconds")] {
                let refused = try await Control.request(fixture.controlURL("/v1/faults"), method: "PUT", body: Data(text.utf8))
                #expect(refused.status == 400, "\(text)")
                let message = try Control.decode(Failure.self, refused.body).error
                #expect(message.contains(mention), "\(text): \(message)")
            }
            #expect(fixture.simulator.faults() == after, "a refused plan changes nothing")
        }
    }

    @Test func aSubscribedDeviceReceivesItsPushesAndSeesTheEnd() async throws {
        try await SimulatorFixture.with { fixture in
            let stream = try await APNsSimulatedDevice.subscribe(host: "127.0.0.1", controlPort: fixture.endpoints.controlPort,
                                                                 token: deviceToken.uppercased())
            #expect(fixture.simulator.core.subscriberCount() == 1)
            let client = try await fixture.connect()
            #expect(try await fixture.push(on: client, token: String(repeating: "ee", count: 32)).status == 200)
            #expect(try await fixture.push(on: client, body: #"{"activeSpeaker":"Bob"}"#).status == 200)
            fixture.simulator.setFaults(APNsFaultPlan(unregistered: [deviceToken: 1]))
            #expect(try await fixture.push(on: client).status == 410)
            fixture.simulator.setFaults(APNsFaultPlan())
            #expect(try await fixture.push(on: client, body: #"{"activeSpeaker":"Carol"}"#).status == 200)
            await client.close()

            let expected = fixture.simulator.acceptedPushes().filter { $0.token == deviceToken }.map {
                APNsDeliveredPush(apnsID: $0.apnsID, topic: $0.topic, body: $0.body, receivedAt: $0.receivedAt, priority: $0.priority)
            }
            try #require(expected.count == 2)
            var received: [APNsDeliveredPush] = []
            for try await push in stream {
                received.append(push)
                if received.count == expected.count { break }
            }
            #expect(received == expected)
        }
    }

    @Test func aDeviceStreamEndsWhenTheSimulatorStops() async throws {
        try await SimulatorFixture.with { fixture in
            let stream = try await APNsSimulatedDevice.subscribe(host: "127.0.0.1", controlPort: fixture.endpoints.controlPort, token: deviceToken)
            let ended = Task {
                var count = 0
                for try await _ in stream { count += 1 }
                return count
            }
            try await fixture.simulator.stop()
            #expect(try await ended.value == 0)
        }
    }

    @Test func aBadDeviceTokenIsRefused() async throws {
        try await SimulatorFixture.with { fixture in
            let error = await #expect(throws: APNsSimulatedDeviceError.self) {
                _ = try await APNsSimulatedDevice.subscribe(host: "127.0.0.1", controlPort: fixture.endpoints.controlPort, token: "xyz")
            }
            guard case .refused(let status, let message) = error else { Issue.record("expected a refusal, got \(String(describing: error))"); return }
            #expect(status == 400 && message.contains("not a device token"))
        }
    }

    @Test func linesSplitAcrossReadsAreReassembled() {
        var splitter = NDJSONLineSplitter()
        let text = Array(#"{"subscribed":"ab"}"#.utf8) + [10] + Array(#"{"apnsID":"x"}"#.utf8) + [13, 10, 10]
        var lines: [[UInt8]] = []
        // One byte per read: every line is split across reads.
        for byte in text { lines += splitter.append([byte]) }
        #expect(lines.map { String(decoding: $0, as: UTF8.self) } == [#"{"subscribed":"ab"}"#, #"{"apnsID":"x"}"#, ""])
        #expect(splitter.append(Array("partial".utf8)).isEmpty)
        #expect(splitter.append([10]) == [Array("partial".utf8)])
    }
}
