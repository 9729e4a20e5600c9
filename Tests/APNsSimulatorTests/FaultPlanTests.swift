import APNsDevice
import Foundation
import Testing
@testable import APNsSimulator

@Suite struct FaultPlanTests {
    static let otherToken = String(repeating: "ff", count: 32)

    @Test func scriptedResponsesAreConsumedFirstMatchFirst() async throws {
        try await SimulatorFixture.with { fixture in
            fixture.simulator.setFaults(APNsFaultPlan(
                unregistered: [deviceToken: 1_700_000_000_000],
                scripted: [
                    APNsScriptedResponse(token: deviceToken, status: 429, reason: "TooManyRequests", count: 2),
                    APNsScriptedResponse(status: 500, reason: "InternalServerError", count: 1),
                ]))
            let client = try await fixture.connect()
            var answers: [String] = []
            for _ in 0..<3 { answers.append(try await fixture.push(on: client).reason ?? "200") }
            // The any-token entry is used up by the third request, so the other token goes through.
            answers.append(try await fixture.push(on: client, token: Self.otherToken).reason ?? "200")
            #expect(answers == ["TooManyRequests", "TooManyRequests", "InternalServerError", "200"])
            #expect(fixture.simulator.faults().scripted.isEmpty)
            // Scripted entries come before the unregistered list; once they are gone, that applies.
            #expect(try await fixture.push(on: client).reason == "Unregistered")

            let rejections = fixture.simulator.rejections()
            #expect(rejections.map(\.status) == [429, 429, 500, 410])
            #expect(rejections.allSatisfy { $0.injected && $0.token == deviceToken })
            #expect(fixture.simulator.acceptedPushes().map(\.token) == [Self.otherToken])
            #expect(fixture.simulator.stats().injected == 4)
            await client.close()
        }
    }

    @Test func unregisteredTokensGet410WithTheirTimestamp() async throws {
        try await SimulatorFixture.with { fixture in
            fixture.simulator.setFaults(APNsFaultPlan(unregistered: [deviceToken: 1_712_345_678_901]))
            let client = try await fixture.connect()
            let response = try await fixture.push(on: client)
            #expect(response.status == 410)
            #expect(response.reason == "Unregistered")
            #expect(response.timestamp == 1_712_345_678_901)
            #expect(response.header("apns-id") != nil)
            #expect(try await fixture.push(on: client, token: Self.otherToken).status == 200)
            // A malformed request is still refused for what it is, before any fault.
            var headers = fixture.validHeaders()
            headers.remove("apns-topic")
            #expect(try await client.send(path: "/3/device/\(deviceToken)", headers: headers, body: "{}").reason == "MissingTopic")
            #expect(fixture.simulator.rejections().map(\.injected) == [true, false])
            await client.close()
        }
    }

    @Test func theServiceUnavailableShareIsSeededAndRoughlyRight() async throws {
        try await SimulatorFixture.with { fixture in
            let client = try await fixture.connect()
            func run(_ share: Double, seed: UInt64 = 1) async throws -> [Int] {
                fixture.simulator.setFaults(APNsFaultPlan(serviceUnavailableShare: share, seed: seed))
                var statuses: [Int] = []
                for _ in 0..<40 { statuses.append(try await fixture.push(on: client).status) }
                return statuses
            }
            let half = try await run(0.5)
            let unavailable = half.filter { $0 == 503 }.count
            #expect((10...30).contains(unavailable), "\(unavailable) of 40 at share 0.5")
            #expect(Set(half) == [200, 503])
            #expect(try await run(0.5) == half, "the same seed gives the same sequence")
            #expect(try await run(0.5, seed: 99) != half)
            #expect(try await run(1).allSatisfy { $0 == 503 })
            #expect(try await run(0).allSatisfy { $0 == 200 })
            #expect(fixture.simulator.rejections().first?.reason == "ServiceUnavailable")
            await client.close()
        }
    }

    @Test func delayHoldsValidRequestsOnly() async throws {
        try await SimulatorFixture.with { fixture in
            fixture.simulator.setFaults(APNsFaultPlan(delayMilliseconds: 300, unregistered: [Self.otherToken: 1]))
            let client = try await fixture.connect()
            let clock = ContinuousClock()
            var response: H2Response?
            let valid = try await clock.measure { response = try await fixture.push(on: client) }
            #expect(response?.status == 200)
            #expect(valid >= .milliseconds(300))
            let faulted = try await clock.measure { response = try await fixture.push(on: client, token: Self.otherToken) }
            #expect(response?.status == 410)
            #expect(faulted >= .milliseconds(300), "faults are delayed too")
            var headers = fixture.validHeaders()
            headers.set("apns-priority", "2")
            let invalid = try await clock.measure {
                response = try await client.send(path: "/3/device/\(deviceToken)", headers: headers, body: "{}")
            }
            #expect(response?.reason == "BadPriority")
            #expect(invalid < .milliseconds(300), "a malformed request is answered at once")
            await client.close()
        }
    }

    @Test func goAwayAfterNRequestsFinishesTheStreamAndCloses() async throws {
        try await SimulatorFixture.with { fixture in
            fixture.simulator.setFaults(APNsFaultPlan(goAwayAfterRequests: 3))
            let client = try await fixture.connect()
            for _ in 0..<3 { #expect(try await fixture.push(on: client).status == 200, "the request that triggers GOAWAY is answered") }
            #expect(try await client.waitFor { $0.contains { if case .goAway = $0 { true } else { false } } })
            #expect(client.rootEvents.last == .goAway(lastStreamID: 5, errorCode: 0, debugData: #"{"reason":"Shutdown"}"#))
            try await client.channel.closeFuture.get()
            #expect(fixture.simulator.stats().goAwaysSent == 1)

            // Each connection gets its own count.
            let next = try await fixture.connect()
            #expect(try await fixture.push(on: next).status == 200)
            #expect(next.rootEvents.allSatisfy { if case .goAway = $0 { false } else { true } })
            #expect(fixture.simulator.acceptedPushes().map(\.connection) == [1, 1, 1, 2])
            await next.close()
        }
    }

    @Test func aStreamStillOpenAtGoAwayIsAnsweredBeforeTheConnectionCloses() async throws {
        try await SimulatorFixture.with { fixture in
            // The delay must outlast the wait for the GOAWAY below on a loaded machine (300 ms did not,
            // once, in a full parallel run), or the stream is answered and the connection gone by then.
            fixture.simulator.setFaults(APNsFaultPlan(delayMilliseconds: 2_000, goAwayAfterRequests: 2))
            let client = try await fixture.connect()
            #expect(try await fixture.push(on: client).status == 200)
            #expect(!client.rootEvents.contains { if case .goAway = $0 { true } else { false } })

            // The second request triggers GOAWAY at once, but its answer is 2 s away.
            let pending = Task { try await fixture.push(on: client) }
            #expect(try await client.waitFor { $0.contains { if case .goAway = $0 { true } else { false } } })
            #expect(client.rootEvents.last == .goAway(lastStreamID: 3, errorCode: 0, debugData: #"{"reason":"Shutdown"}"#))
            #expect(client.channel.isActive, "the connection stays up while a stream is open")
            #expect(try await pending.value.status == 200)
            try await client.channel.closeFuture.get()
            #expect(fixture.simulator.acceptedPushes().count == 2)
        }
    }

    @Test func faultPlanJSONMayOmitFieldsAndRejectsUnknownOnes() throws {
        let decoder = APNsSimulatorJSON.decoder()
        let plan = try decoder.decode(APNsFaultPlan.self, from: Data(#"{"delayMilliseconds":5,"scripted":[{"status":500,"reason":"InternalServerError"}]}"#.utf8))
        #expect(plan == APNsFaultPlan(delayMilliseconds: 5, scripted: [APNsScriptedResponse(status: 500, reason: "InternalServerError", count: 1)]))
        #expect(throws: DecodingError.self) { try decoder.decode(APNsFaultPlan.self, from: Data(#"{"delayMs":5}"#.utf8)) }
        let roundTrip = APNsFaultPlan(serviceUnavailableShare: 0.25, delayMilliseconds: 1, unregistered: ["ab": 2],
                                      scripted: [APNsScriptedResponse(token: "cd", status: 410, reason: "Unregistered", count: 2, timestamp: 3)],
                                      goAwayAfterRequests: 4, seed: 5)
        #expect(try decoder.decode(APNsFaultPlan.self, from: APNsSimulatorJSON.encoder().encode(roundTrip)) == roundTrip)
        #expect(APNsFaultPlan(serviceUnavailableShare: 1.5).problem?.contains("serviceUnavailableShare") == true)
        #expect(APNsFaultPlan(scripted: [APNsScriptedResponse(status: 200, reason: "OK")]).problem?.contains("400") == true)
        #expect(roundTrip.problem == nil)
    }
}
