import Foundation
import Testing
@testable import APNsSimulator

/// One malformed request and what Apple answers to it.
struct ValidationCase: Sendable, CustomTestStringConvertible {
    var name: String
    var method = "POST"
    var path = "/3/device/\(deviceToken)"
    var edit: @Sendable (inout [(String, String)], SimulatorFixture) -> Void = { _, _ in }
    var body: String? = #"{"activeSpeaker":"Alice"}"#
    var status: Int
    var reason: String
    var testDescription: String { name }
}

extension Array where Element == (String, String) {
    mutating func set(_ name: String, _ value: String) {
        if let index = firstIndex(where: { $0.0 == name }) { self[index].1 = value } else { append((name, value)) }
    }

    mutating func remove(_ name: String) { removeAll { $0.0 == name } }
}

@Suite struct RequestValidationTests {
    static let allowedTopics: Set<String> = [ptTopic, "com.example.squelch"]

    static let cases: [ValidationCase] = [
        // 1. Method.
        ValidationCase(name: "GET", method: "GET", status: 405, reason: "MethodNotAllowed"),
        // 2. Path and token.
        ValidationCase(name: "path /3/devices/", path: "/3/devices/\(deviceToken)", status: 404, reason: "BadPath"),
        ValidationCase(name: "path /2/device/", path: "/2/device/\(deviceToken)", status: 404, reason: "BadPath"),
        ValidationCase(name: "empty token", path: "/3/device/", status: 400, reason: "MissingDeviceToken"),
        ValidationCase(name: "no token segment", path: "/3/device", status: 400, reason: "MissingDeviceToken"),
        ValidationCase(name: "odd-length token", path: "/3/device/abc", status: 400, reason: "BadDeviceToken"),
        ValidationCase(name: "one-character token", path: "/3/device/a", status: 400, reason: "BadDeviceToken"),
        ValidationCase(name: "non-hex token", path: "/3/device/zz\(deviceToken)", status: 400, reason: "BadDeviceToken"),
        ValidationCase(name: "202-character token", path: "/3/device/" + String(repeating: "ab", count: 101), status: 400, reason: "BadDeviceToken"),
        // 3. Repeated headers.
        ValidationCase(name: "two apns-topic", edit: { headers, _ in headers.append(("apns-topic", ptTopic)) }, status: 400, reason: "DuplicateHeaders"),
        // 4. Provider token.
        ValidationCase(name: "no authorization", edit: { headers, _ in headers.remove("authorization") }, status: 403, reason: "MissingProviderToken"),
        ValidationCase(name: "basic scheme", edit: { headers, f in headers.set("authorization", "basic \(f.jwt)") }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "not a JWT", edit: { headers, _ in headers.set("authorization", "bearer not-a-jwt") }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "signed by another key", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now, signer: .init()))
        }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "alg ES384", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now, alg: "ES384"))
        }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "unknown kid", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now, kid: "UNKNOWN000"))
        }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "iss of another team", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now, iss: f.otherTeamKey.teamID))
        }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "iat two minutes ahead", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now.addingTimeInterval(120)))
        }, status: 403, reason: "InvalidProviderToken"),
        ValidationCase(name: "iat 61 minutes old", edit: { headers, f in
            headers.set("authorization", "bearer " + f.key.jwt(issuedAt: f.clock.now.addingTimeInterval(-61 * 60)))
        }, status: 403, reason: "ExpiredProviderToken"),
        // 5. Push type.
        ValidationCase(name: "no push type", edit: { headers, _ in headers.remove("apns-push-type") }, status: 400, reason: "InvalidPushType"),
        ValidationCase(name: "push type ptt", edit: { headers, _ in headers.set("apns-push-type", "ptt") }, status: 400, reason: "InvalidPushType"),
        // 6. Topic.
        ValidationCase(name: "no topic", edit: { headers, _ in headers.remove("apns-topic") }, status: 400, reason: "MissingTopic"),
        ValidationCase(name: "topic not allowed", edit: { headers, _ in headers.set("apns-topic", "com.other.app.voip-ptt") }, status: 400, reason: "TopicDisallowed"),
        ValidationCase(name: "pushtotalk without .voip-ptt", edit: { headers, _ in headers.set("apns-topic", "com.example.squelch") }, status: 400, reason: "DeviceTokenNotForTopic"),
        // 7. Optional headers.
        ValidationCase(name: "priority 7", edit: { headers, _ in headers.set("apns-priority", "7") }, status: 400, reason: "BadPriority"),
        ValidationCase(name: "expiration -1", edit: { headers, _ in headers.set("apns-expiration", "-1") }, status: 400, reason: "BadExpirationDate"),
        ValidationCase(name: "expiration text", edit: { headers, _ in headers.set("apns-expiration", "tomorrow") }, status: 400, reason: "BadExpirationDate"),
        ValidationCase(name: "uppercase apns-id", edit: { headers, _ in headers.set("apns-id", UUID().uuidString) }, status: 400, reason: "BadMessageId"),
        ValidationCase(name: "short apns-id", edit: { headers, _ in headers.set("apns-id", "123") }, status: 400, reason: "BadMessageId"),
        ValidationCase(name: "65-byte collapse id", edit: { headers, _ in headers.set("apns-collapse-id", String(repeating: "c", count: 65)) }, status: 400, reason: "BadCollapseId"),
        // 8. Body.
        ValidationCase(name: "empty body", body: nil, status: 400, reason: "PayloadEmpty"),
        ValidationCase(name: "4097-byte body", body: #"{"p":""# + String(repeating: "x", count: 4097 - 8) + #""}"#, status: 413, reason: "PayloadTooLarge"),
        // The order: the earliest rule decides.
        ValidationCase(name: "GET, bad token, no auth", method: "GET", path: "/3/device/xyz", edit: { headers, _ in headers.remove("authorization") },
                       status: 405, reason: "MethodNotAllowed"),
        ValidationCase(name: "bad token, repeated header, no auth", path: "/3/device/xyz", edit: { headers, _ in
            headers.remove("authorization")
            headers.append(("apns-topic", ptTopic))
        }, status: 400, reason: "BadDeviceToken"),
        ValidationCase(name: "repeated header, no auth", edit: { headers, _ in
            headers.remove("authorization")
            headers.append(("apns-priority", "10"))
        }, status: 400, reason: "DuplicateHeaders"),
        ValidationCase(name: "no auth, bad push type", edit: { headers, _ in
            headers.remove("authorization")
            headers.set("apns-push-type", "nope")
        }, status: 403, reason: "MissingProviderToken"),
        ValidationCase(name: "bad push type, no topic", edit: { headers, _ in
            headers.set("apns-push-type", "nope")
            headers.remove("apns-topic")
        }, status: 400, reason: "InvalidPushType"),
        ValidationCase(name: "bad priority, empty body", edit: { headers, _ in headers.set("apns-priority", "0") }, body: nil,
                       status: 400, reason: "BadPriority"),
    ]

    @Test func everyRuleAnswersWithItsStatusAndReason() async throws {
        try await SimulatorFixture.with(allowedTopics: Self.allowedTopics) { fixture in
            for testCase in Self.cases {
                let client = try await fixture.connect()
                var headers = fixture.validHeaders()
                testCase.edit(&headers, fixture)
                let response = try await client.send(method: testCase.method, path: testCase.path, headers: headers, body: testCase.body)
                await client.close()
                #expect(response.status == testCase.status, "\(testCase.name)")
                #expect(response.reason == testCase.reason, "\(testCase.name): body \(response.body)")
                #expect(response.timestamp == nil, "\(testCase.name): only 410 carries a timestamp")
                #expect(response.header("content-type") == "application/json", "\(testCase.name)")
                let apnsID = try #require(response.header("apns-id"), "\(testCase.name): no apns-id")
                #expect(APNsRequestValidator.isCanonicalUUID(apnsID), "\(testCase.name): apns-id \(apnsID)")
                #expect(response.header("apns-unique-id") == nil, "\(testCase.name): apns-unique-id comes only with 200")
                let logged = try #require(fixture.simulator.rejections().last)
                #expect(logged.reason == testCase.reason && logged.status == testCase.status && !logged.injected, "\(testCase.name)")
                #expect(logged.apnsID == apnsID, "\(testCase.name)")
                #expect(logged.receivedAt == fixture.clock.now)
            }
            let stats = fixture.simulator.stats()
            #expect(stats.rejected == Self.cases.count)
            #expect(stats.accepted == 0)
            #expect(stats.injected == 0)
            #expect(fixture.simulator.acceptedPushes().isEmpty)
        }
    }

    @Test func rejectionsLogTheTokenLowercasedAndEchoAValidAPNsID() async throws {
        try await SimulatorFixture.with { fixture in
            let client = try await fixture.connect()
            let apnsID = UUID().uuidString.lowercased()
            var headers = fixture.validHeaders(apnsID: apnsID)
            headers.remove("apns-topic")
            let response = try await client.send(path: "/3/device/ABCDEF12", headers: headers, body: "{}")
            #expect(response.reason == "MissingTopic")
            #expect(response.header("apns-id") == apnsID)
            #expect(fixture.simulator.rejections() == [APNsRejection(status: 400, reason: "MissingTopic", token: "abcdef12", apnsID: apnsID,
                                                                     injected: false, receivedAt: fixture.clock.now)])
            await client.close()
        }
    }

    @Test func boundaryValuesAreAccepted() async throws {
        try await SimulatorFixture.with(allowedTopics: Self.allowedTopics) { fixture in
            let client = try await fixture.connect()
            let longToken = String(repeating: "0f", count: 100)
            let fullBody = #"{"p":""# + String(repeating: "x", count: 4096 - 8) + #""}"#
            #expect(fullBody.utf8.count == 4096)
            var headers = fixture.validHeaders()
            headers.set("apns-collapse-id", String(repeating: "c", count: 64))
            headers.set("apns-priority", "5")
            headers.set("apns-expiration", "1900000000")
            #expect(try await client.send(path: "/3/device/\(longToken)", headers: headers, body: fullBody).status == 200)

            headers = fixture.validHeaders()
            headers.set("apns-push-type", "alert")
            headers.set("apns-topic", "com.example.squelch")
            headers.set("apns-priority", "1")
            headers.remove("apns-expiration")
            #expect(try await client.send(path: "/3/device/AB", headers: headers, body: "[1, 2]").status == 200)

            let pushes = fixture.simulator.acceptedPushes()
            try #require(pushes.count == 2)
            #expect(pushes[0].token == longToken && pushes[0].body == fullBody && pushes[0].priority == 5)
            #expect(pushes[0].collapseID?.utf8.count == 64 && pushes[0].expiration == 1_900_000_000)
            #expect(pushes[1].token == "ab" && pushes[1].pushType == "alert" && pushes[1].priority == 1 && pushes[1].expiration == nil)
            // Apple takes a body that isn't a JSON object; the counter is how a test catches it.
            #expect(fixture.simulator.stats().malformedBodies == 1)
            await client.close()
        }
    }

    // The pure helpers the fuzz target leans on.
    @Test func base64URLDecodingMatchesFoundation() {
        for length in 0..<40 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let encoded = base64URL(Data(bytes))
            #expect(APNsRequestValidator.base64URLDecode(Array(encoded.utf8)) == bytes)
        }
        #expect(APNsRequestValidator.base64URLDecode(Array("abc=".utf8)) == nil)
        #expect(APNsRequestValidator.base64URLDecode(Array("a".utf8)) == nil)
        #expect(APNsRequestValidator.base64URLDecode(Array("ab+/".utf8)) == nil)
    }

    @Test func apnsIDMustBeCanonicalLowercase() {
        #expect(APNsRequestValidator.isCanonicalUUID("123e4567-e89b-12d3-a456-426614174000"))
        #expect(!APNsRequestValidator.isCanonicalUUID("123E4567-E89B-12D3-A456-426614174000"))
        #expect(!APNsRequestValidator.isCanonicalUUID("123e4567e89b12d3a456426614174000"))
        #expect(!APNsRequestValidator.isCanonicalUUID("123e4567-e89b-12d3-a456-42661417400g"))
    }

    @Test func bearerSchemeIsCaseInsensitiveAndNeedsAToken() {
        #expect(APNsRequestValidator.bearerToken("bearer a.b.c") == "a.b.c")
        #expect(APNsRequestValidator.bearerToken("Bearer a.b.c") == "a.b.c")
        #expect(APNsRequestValidator.bearerToken("bearer ") == nil)
        #expect(APNsRequestValidator.bearerToken("bearer a b") == nil)
        #expect(APNsRequestValidator.bearerToken("bearera.b.c") == nil)
    }
}
