import APNsSimulator
import APNsSimulatorEmbedding
import ChannelProtocol
import ChannelStore
import Foundation
import PTTServer
import ServerTesting
import SquelchTesting
import Testing
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The wake path end to end: squelchd with its embedded APNs simulator (real HTTP/2 over TLS on
/// 127.0.0.1), real members over UDP, pushes checked in the simulator's log.
@Suite(.serialized, .timeLimit(.minutes(2))) struct PushWakeTests {
    /// Requests the floor and, once granted, sends the burst's first audio packet: the wakes go
    /// with it (a burst without audio wakes nobody). Returns the grant.
    func talk(_ member: TestMember, after mark: Int = 0) async throws -> FloorEvent? {
        try await member.send(.floorRequest())
        guard let granted = await member.waitForFloor(.granted, after: mark), let burst = granted.burst else { return nil }
        _ = await member.sendAudio(burst: burst, sequence: 0, payload: [1, 2, 3])
        return granted
    }

    func waitForPushes(_ simulator: APNsSimulator, count: Int, seconds: Double = 5) async -> [APNsAcceptedPush] {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            let pushes = simulator.acceptedPushes()
            if pushes.count >= count { return pushes }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return simulator.acceptedPushes()
    }

    /// Joins `user` and registers its push token.
    func registered(_ user: String, token: String, environment: PushEnvironment = .production,
                    _ fixture: ServerFixture, port: Int) async throws -> TestMember {
        let member = try await fixture.member(user, port: port)
        try await member.send(.registerPushToken(token: token, environment: environment))
        #expect(await member.waitFor { $0 == .pushTokenRegistered } != nil)
        return member
    }

    /// Disconnects `member` and waits until `watcher` sees it gone: asleep, as far as the server knows.
    func putToSleep(_ member: TestMember, user: String, seenBy watcher: TestMember) async {
        await member.close()
        #expect(await watcher.waitFor { if case .participant(let p) = $0 { return p.userID == user && p.connection != .connected } else { return false } } != nil)
    }

    func body(_ push: APNsAcceptedPush) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(push.body.utf8)) as? [String: Any]) ?? [:]
    }

    /// The server links no simulator: a program that hands it none (as squelchd does) can't start
    /// one, and is told what to do instead.
    @Test func aServerThatEmbedsNoSimulatorRefusesApnsSimulatorAndSaysWhatToDo() async throws {
        let fixture = try await ServerFixture()
        let configuration = TestServer.configuration(dataDirectory: fixture.dataDirectory, pushCertificates: DevCertificates.directory)
        let server = try SquelchServer(configuration: configuration, identity: fixture.identity)
        let error = await #expect(throws: ServerConfiguration.ConfigurationError.self) {
            try await server.run(onReady: { _ in Issue.record("started without a simulator") })
        }
        let text = String(describing: error.map { $0 } as Any)
        #expect(text.contains("embeds no APNs simulator") && text.contains("squelchd apns-sim"), "\(text)")
    }

    @Test func aBurstWakesOfflineMembersAndAnAdminRemovalSendsALeavePush() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)

        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await registered("bob", token: "B0B0B0B0B0B0", environment: .sandbox, fixture, port: listening.voicePort)
        let cat = try await registered("cat", token: "ca7ca7", fixture, port: listening.voicePort)
        await putToSleep(bob, user: "bob", seenBy: ann)

        // Bob is asleep, Cat is connected: only Bob gets a wake, and Ann (the talker) never does.
        let granted = try #require(await talk(ann))
        let wakes = await waitForPushes(simulator, count: 1)
        #expect(wakes.count == 1)
        let wake = try #require(wakes.first)
        #expect(wake.token == "b0b0b0b0b0b0")
        #expect(wake.pushType == "pushtotalk" && wake.priority == 10 && wake.expiration == 0)
        #expect(wake.topic == ServerConfiguration().apnsTopic)
        #expect(body(wake)["activeSpeaker"] as? String == "Ann")
        #expect(body(wake)["channel"] as? String == fixture.channel.id.uuidString.lowercased())
        _ = granted

        // No push when the burst ends.
        try await ann.send(.floorRelease)
        #expect(await cat.waitForFloor(.idle) != nil)
        try await Task.sleep(for: .milliseconds(300))
        #expect(simulator.acceptedPushes().count == 1)

        // An administrator removes Bob: his device is told to leave.
        #expect(try await fixture.admin(listening, "DELETE", "/members/bob").status == 204)
        let all = await waitForPushes(simulator, count: 2)
        let leave = try #require(all.count == 2 ? all[1] : nil)
        #expect(leave.token == "b0b0b0b0b0b0")
        #expect(body(leave)["activeSpeaker"] == nil)
        #expect(body(leave)["leave"] as? Bool == true)
        #expect(simulator.rejections().isEmpty, "every request squelchd made was well formed")
        #expect(simulator.stats().malformedBodies == 0)

        // Every push is counted by outcome and reason.
        try await Task.sleep(for: .milliseconds(100))
        let text = try await fixture.metrics(listening)
        #expect(text.contains(#"squelch_pushes_total{outcome="delivered",reason="Success"} 1"#), "\(text.split(separator: "\n").filter { $0.contains("pushes") })")
        #expect(text.contains(#"squelch_pushes_total{outcome="delivered_leave",reason="Success"} 1"#))

        await listening.shutdown()
        _ = await task.result
    }

    /// Whether each member of the fixture's channel has a push token, by user, from the admin API.
    func pushTokens(_ fixture: ServerFixture, _ listening: SquelchServer.Listening) async throws -> [String: Bool] {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(listening.adminPort)/v1/channels/\(fixture.channel.id)/members")!)
        request.setValue("Bearer \(TestServer.adminKey)", forHTTPHeaderField: "Authorization")
        let (data, _) = try await URLSession.shared.data(for: request)
        let members = try JSONSerialization.jsonObject(with: data) as? [[String: Any]] ?? []
        var tokens: [String: Bool] = [:]
        for member in members {
            if let user = member["userID"] as? String { tokens[user] = member["hasPushToken"] as? Bool }
        }
        return tokens
    }

    @Test func aTokenAPNsCallsDeadIsForgotten() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)

        // A first burst whose wake goes through: until APNs has accepted one push, a token it calls
        // bad may be the topic's fault and is kept (aWrongTopicKeepsEveryToken).
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let eve = try await registered("eve", token: "e0e0e0", fixture, port: listening.voicePort)
        await putToSleep(eve, user: "eve", seenBy: ann)
        #expect(try await talk(ann) != nil)
        #expect(await waitForPushes(simulator, count: 1).count == 1)
        var mark = ann.messages.count
        try await ann.send(.floorRelease)
        #expect(await ann.waitForFloor(.idle, after: mark) != nil)

        simulator.setFaults(APNsFaultPlan(scripted: [APNsScriptedResponse(token: "dead01", status: 400, reason: "BadDeviceToken", count: 1)]))
        let dan = try await registered("dan", token: "dead01", fixture, port: listening.voicePort)
        await putToSleep(dan, user: "dan", seenBy: ann)
        mark = ann.messages.count
        #expect(try await talk(ann, after: mark) != nil)
        // The rejection arrives, then the token is cleared in the store.
        let deadline = ContinuousClock.now + .seconds(5)
        var cleared = false
        while ContinuousClock.now < deadline, !cleared {
            try await Task.sleep(for: .milliseconds(50))
            cleared = try await pushTokens(fixture, listening)["dan"] == false
        }
        #expect(cleared, "the dead token is gone from the membership")
        #expect(try await pushTokens(fixture, listening)["eve"] == true)
        #expect(simulator.rejections().map(\.reason) == ["BadDeviceToken"])

        // The next burst sends nothing to it.
        // Marked before sending: the grant (and the roster updates after it) may arrive before the
        // next line runs, and counting then would skip past it.
        mark = ann.messages.count
        try await ann.send(.floorRelease)
        #expect(try await talk(ann, after: mark) != nil)
        try await Task.sleep(for: .milliseconds(1_300))
        #expect(simulator.rejections().count == 1)
        #expect(!simulator.acceptedPushes().contains { $0.token == "dead01" })

        await listening.shutdown()
        _ = await task.result
    }

    /// A mistyped topic (bundle ID) gets DeviceTokenNotForTopic for every token from Apple; the
    /// simulator is scripted to answer so. Dropping the tokens would leave every member unwakeable until
    /// each device registered again, long after the setting was fixed.
    @Test func aWrongTopicKeepsEveryToken() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)
        simulator.setFaults(APNsFaultPlan(scripted: [APNsScriptedResponse(status: 400, reason: "DeviceTokenNotForTopic", count: 100)]))

        let ann = try await fixture.member("ann", port: listening.voicePort)
        for (user, token) in [("bob", "b0b0b0"), ("cat", "ca7ca7"), ("dan", "da7da7")] {
            let member = try await registered(user, token: token, fixture, port: listening.voicePort)
            await putToSleep(member, user: user, seenBy: ann)
        }
        #expect(try await talk(ann) != nil)
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, simulator.rejections().count < 3 {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(simulator.rejections().map(\.reason) == ["DeviceTokenNotForTopic", "DeviceTokenNotForTopic", "DeviceTokenNotForTopic"])
        try await Task.sleep(for: .milliseconds(200))
        #expect(try await pushTokens(fixture, listening) == ["ann": false, "bob": true, "cat": true, "dan": true])
        let text = try await fixture.metrics(listening)
        #expect(text.contains(#"squelch_pushes_total{outcome="failed",reason="DeviceTokenNotForTopic"} 3"#),
                "\(text.split(separator: "\n").filter { $0.contains("pushes") })")
        // Every wake failing for the server's own setting (three tokens, so not one stale token):
        // /healthz says so, still 200 (the members
        // who are connected are served), and says what to check.
        let failing = try await fixture.health(listening)
        #expect(failing.status == 200)
        #expect(failing.health.status == "degraded")
        #expect(failing.health.pushes?.status == "failing")
        #expect(failing.health.pushes?.failuresSinceLastDelivery == 3)
        #expect(failing.health.reason?.contains("DeviceTokenNotForTopic") == true, "\(failing.health)")
        #expect(failing.health.reason?.contains("topic") == true)
        // Without the admin key: the same status, no detail.
        let anonymous = try await fixture.health(listening, anonymous: true)
        #expect(anonymous.status == 200 && anonymous.health.status == "degraded" && anonymous.health.pushes?.status == "failing")
        #expect(anonymous.health.pushes?.reason == nil && anonymous.health.reason?.contains("DeviceTokenNotForTopic") == false,
                "\(anonymous.health)")
        #expect(text.contains("squelch_push_failing 1"))

        // The setting is fixed (the script cleared): the kept tokens wake their devices again.
        simulator.setFaults(APNsFaultPlan())
        try await Task.sleep(for: .milliseconds(1_000))  // each member's wakes are a second apart
        let mark = ann.messages.count
        try await ann.send(.floorRelease)
        #expect(try await talk(ann, after: mark) != nil)
        #expect(Set(await waitForPushes(simulator, count: 3).map(\.token)) == ["b0b0b0", "ca7ca7", "da7da7"])
        // A delivery ends it (the simulator logs a push before squelchd reads the answer).
        var recovered = try await fixture.health(listening)
        _ = try await eventually(seconds: 5) {
            recovered = try await fixture.health(listening)
            return recovered.health.status == "ok"
        }
        #expect(recovered.health.status == "ok")
        #expect(recovered.health.reason == nil)
        #expect(recovered.health.pushes?.status == "ok")
        #expect(recovered.health.pushes?.lastDelivered != nil)
        #expect(try await fixture.metrics(listening).contains("squelch_push_failing 0"))

        await listening.shutdown()
        _ = await task.result
    }

    @Test func rapidBurstsWakeASleepingMemberAboutOnceASecondNotOncePerBurst() async throws {
        let fixture = try await ServerFixture()
        // Eight grants in a row: more than a member may have by default.
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory, floorGrantsPerMinute: 600)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)
        let ann = try await fixture.member("ann", port: listening.voicePort)
        await putToSleep(try await registered("bob", token: "b0b0b0", fixture, port: listening.voicePort), user: "bob", seenBy: ann)

        // Eight bursts back to back: each one starts a wake for Bob.
        let started = ContinuousClock.now
        for _ in 0..<8 {
            let mark = ann.messages.count
            #expect(try await talk(ann, after: mark) != nil)
            try await ann.send(.floorRelease)
            #expect(await ann.waitForFloor(.idle, after: mark) != nil)
        }
        let elapsed = ContinuousClock.now - started
        let first = await waitForPushes(simulator, count: 1)
        #expect(first.count == 1, "the first wake goes at once")
        try await Task.sleep(for: .milliseconds(1500))
        // One at once and one at the end of each second the bursts went on (or only one, if every
        // later burst came while the first wake was still waiting and replaced it).
        let pushes = simulator.acceptedPushes()
        let allowed = 2 + Int((elapsed / .seconds(1)).rounded(.down))
        #expect(pushes.count >= 1 && pushes.count <= allowed, "\(pushes.count) pushes for 8 bursts in \(elapsed)")
        #expect(pushes.allSatisfy { $0.token == "b0b0b0" })
        #expect(simulator.rejections().isEmpty)

        // The replaced wakes are counted.
        let text = try await fixture.metrics(listening)
        #expect(text.contains(#"squelch_pushes_total{outcome="coalesced",reason="NewerPush"}"#))

        await listening.shutdown()
        _ = await task.result
    }

    /// The wake's purpose end to end: Ann says a few words while Bob's phone sleeps; the push
    /// arrives, and his app joins after Ann has let go. He hears what she said, byte for byte.
    @Test func aWokenMemberHearsTheShortBurstThatWokeIt() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await registered("bob", token: "b0b0b0", fixture, port: listening.voicePort)
        await putToSleep(bob, user: "bob", seenBy: ann)

        try await ann.send(.floorRequest())
        let burst = try #require(await ann.waitForFloor(.granted)?.burst)
        for sequence in 0 ..< 25 as Range<UInt16> {
            await ann.sendAudio(burst: burst, sequence: sequence, payload: [UInt8(sequence), 0xB0])
            try await Task.sleep(for: .milliseconds(20))
        }
        let mark = ann.messages.count
        try await ann.send(.floorRelease)
        #expect(await ann.waitForFloor(.idle, after: mark) != nil)
        #expect(await waitForPushes(simulator, count: 1).map(\.token) == ["b0b0b0"])

        // The push woke the phone; the app joins a moment after the burst ended.
        try await Task.sleep(for: .milliseconds(500))
        let woken = try await fixture.member("bob", port: listening.voicePort)
        let received = await woken.waitForAudio(count: 25)
        let parsed = received.compactMap { packet in packet.withUnsafeBytes { AudioHeader(parsing: $0) } }
        #expect(parsed.map(\.sequence) == (0 ..< 25).map { UInt16($0) })
        #expect(parsed.allSatisfy { $0.flags.contains(.catchUp) && $0.burst == burst })
        #expect(received.map { Array($0[AudioHeader.size...]) } == (0 ..< 25).map { [UInt8($0), 0xB0] })
        let text = try await fixture.metrics(listening, containing: "squelch_missed_burst_replays_total 1")
        #expect(text.contains("squelch_missed_burst_replays_total 1"), "\(text.split(separator: "\n").filter { $0.contains("missed") })")
        await listening.shutdown()
        _ = await task.result
    }

    /// Bob unsubscribed from Ann; then his phone slept and squelchd restarted. Ann's next burst wakes
    /// Cat but not Bob: his choice was kept with his membership, not only in the old process's memory.
    @Test func aTalkerUnsubscribedFromBeforeARestartDoesNotWakeTheMember() async throws {
        let fixture = try await ServerFixture()
        var (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let bob = try await registered("bob", token: "b0b0b0", fixture, port: listening.voicePort)
        let cat = try await registered("cat", token: "ca7ca7", fixture, port: listening.voicePort)
        try await bob.send(.setSubscriptions(unheard: ["ann"]))
        #expect(await bob.waitFor { $0 == .subscriptions(unheard: ["ann"]) } != nil)
        for member in [ann, bob, cat] { await member.close() }
        await listening.shutdown()
        _ = await task.result

        (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)
        let talker = try await fixture.member("ann", port: listening.voicePort)
        #expect(try await talk(talker) != nil)
        #expect(await waitForPushes(simulator, count: 1).map(\.token) == ["ca7ca7"])
        // Bob's would have been made with Cat's; a moment more shows it isn't coming.
        try await Task.sleep(for: .milliseconds(300))
        #expect(simulator.acceptedPushes().map(\.token) == ["ca7ca7"])
        await listening.shutdown()
        _ = await task.result
    }

    @Test func aConnectedMemberSilentPastTheWindowIsWokenToo() async throws {
        let fixture = try await ServerFixture()
        let (task, listening) = try await fixture.start(pushCertificates: DevCertificates.directory, wakeSilence: 0.3)
        defer { task.cancel() }
        let simulator = try #require(listening.apnsSimulator)
        let ann = try await fixture.member("ann", port: listening.voicePort)
        let eve = try await fixture.member("eve", port: listening.voicePort)
        try await eve.send(.registerPushToken(token: "e7e7e7", environment: .production))
        #expect(await eve.waitFor { $0 == .pushTokenRegistered } != nil)
        // Eve's connection stays open but says nothing (her keepalive is 15 s): an app in the background.
        try await Task.sleep(for: .milliseconds(600))
        #expect(try await talk(ann) != nil)
        let pushes = await waitForPushes(simulator, count: 1)
        #expect(pushes.map(\.token) == ["e7e7e7"])
        await listening.shutdown()
        _ = await task.result
    }
}
