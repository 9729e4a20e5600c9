import ChannelProtocol
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import SquelchTesting
import Testing
import Wire

/// squelchd survives `kill -9`: everything a user set up before the crash (the channel, its members,
/// a push token, the token key, the transmission log, the transport's reset key) is there after a
/// restart on the same ports and data directory. Real processes, real UDP on 127.0.0.1, real certs.
@Suite(.timeLimit(.minutes(2))) struct KillRestartTests {
    /// A running `squelchd serve` and the ports it bound.
    struct Server {
        let process: Process
        let log: PipeCollector
        let voicePort: Int
        let adminPort: Int
    }

    /// Kills every process it was given when the test ends, however it ends.
    final class Reaper {
        var processes: [Process] = []
        func killAll() {
            for process in processes where process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
        }
    }

    /// Starts `squelchd serve` and waits until both listeners have logged their ports.
    func startServer(data: String, certs: String, port: Int = 0, adminPort: Int = 0, extraArguments: [String] = [],
                     reaper: Reaper) async throws -> Server {
        let process = Process()
        process.executableURL = Executables.url("squelchd")
        process.arguments = ["serve", "--data-dir", data, "--port", "\(port)", "--admin-port", "\(adminPort)",
                             "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"]
            + Executables.simulatorArguments(certs: certs) + extraArguments
        process.standardOutput = FileHandle.nullDevice
        let err = Pipe()
        process.standardError = err
        let log = PipeCollector(err)
        try process.run()
        reaper.processes.append(process)
        // "… address=[IPv4]127.0.0.1/127.0.0.1:PORT channels=1 [PTTServer] voice transport listening"
        let voice = await log.wait(for: #"127\.0\.0\.1:\d+[^\n]*voice transport listening"#, seconds: 20)
        let admin = await log.wait(for: #"admin API listening on http://127\.0\.0\.1:\d+"#, seconds: 20)
        let voicePort = try #require(voice.flatMap { Self.firstPort(in: $0) }, "no voice port in the log: \(log.contents)")
        let boundAdmin = try #require(admin.flatMap { Self.firstPort(in: $0) }, "no admin port in the log: \(log.contents)")
        return Server(process: process, log: log, voicePort: voicePort, adminPort: boundAdmin)
    }

    /// A fresh directory with certificates from the real script and an empty data directory, and a
    /// client configuration that trusts the certificates' CA. `cleanUp` removes the directory.
    struct Workspace {
        let root: URL
        let certs: String
        let data: String
        let client: ClientConfiguration

        init(_ prefix: String) throws {
            root = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID())")
            certs = root.appendingPathComponent("certs").path
            data = root.appendingPathComponent("data").path
            try Executables.makeDevCertificates(into: certs)
            let ca = try String(contentsOfFile: certs + "/ca.pem", encoding: .utf8)
            client = ClientConfiguration(serverName: "127.0.0.1", validator: try CertificateValidator(caPEM: ca))
        }

        func cleanUp() { try? FileManager.default.removeItem(at: root) }
    }

    /// The number after the first "127.0.0.1:" in `text`.
    static func firstPort(in text: String) -> Int? {
        guard let range = text.range(of: #"127\.0\.0\.1:\d+"#, options: .regularExpression) else { return nil }
        return text[range].split(separator: ":").last.flatMap { Int($0) }
    }

    func squelchd(_ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        try Executables.run("squelchd", arguments)
    }

    /// `squelchd channel show ID --json`'s members, keyed by user id.
    func storedMembers(_ channel: UUID, data: String) throws -> [String: [String: Any]] {
        let shown = try squelchd(["channel", "show", channel.uuidString, "--json", "--data-dir", data])
        #expect(shown.status == 0, "\(shown.err)")
        let object = try JSONSerialization.jsonObject(with: Data(shown.out.utf8)) as? [String: Any]
        let members = object?["members"] as? [[String: Any]] ?? []
        var byUser: [String: [String: Any]] = [:]
        for member in members { if let user = member["userID"] as? String { byUser[user] = member } }
        return byUser
    }

    /// `GET /v1/channels/ID/transmissions` from the admin API.
    func transmissions(_ channel: UUID, adminPort: Int, key: String) async throws -> [[String: Any]] {
        let url = try #require(URL(string: "http://127.0.0.1:\(adminPort)/v1/channels/\(channel.uuidString)/transmissions"))
        var request = URLRequest(url: url)
        request.setValue("Bearer \(key)", forHTTPHeaderField: "Authorization")
        let (body, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200, "\(String(decoding: body, as: UTF8.self))")
        return try JSONSerialization.jsonObject(with: body) as? [[String: Any]] ?? []
    }

    /// A connected member that sent `join`; returns its answer.
    func join(_ token: String, channel: UUID, port: Int, configuration: ClientConfiguration) async throws -> (TestMember, ServerMessage?) {
        let member = try TestMember(port: port, configuration: configuration)
        try await member.connect()
        return (member, try await member.join(token: token, channel: channel))
    }

    /// `talker` takes the floor, sends `count` distinct audio packets and releases; every packet must
    /// reach `listener` byte for byte, stamped with the talker's slot and burst.
    func talk(_ talker: TestMember, slot: UInt16, to listener: TestMember, count: Int, seed: UInt8) async throws {
        let before = listener.messages.count
        try await talker.send(.floorRequest())
        let granted = try #require(await talker.waitForFloor(.granted), "\(talker.messages)")
        let burst = try #require(granted.burst)
        #expect(await listener.waitForFloor(.taken, after: before)?.slot == slot)
        let payloads = (0..<count).map { index in (0..<120).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ index &* 31 &+ Int(seed)) } }
        let received0 = listener.audio.count
        for (sequence, payload) in payloads.enumerated() {
            #expect(await talker.sendAudio(burst: burst, sequence: UInt16(sequence), payload: payload))
        }
        let received = Array(await listener.waitForAudio(count: received0 + count).dropFirst(received0))
        #expect(received.count == count, "\(received.count) of \(count) audio packets arrived")
        var bySequence: [UInt16: [UInt8]] = [:]
        for packet in received {
            let header = try #require(packet.withUnsafeBytes { AudioHeader(parsing: $0) })
            #expect(header.slot == slot && header.burst == burst && header.flags == [], "\(header)")
            bySequence[header.sequence] = Array(packet[AudioHeader.size...])
        }
        for (sequence, payload) in payloads.enumerated() {
            #expect(bySequence[UInt16(sequence)] == payload, "packet \(sequence) differs")
        }
        try await talker.send(.floorRelease)
        #expect(await listener.waitForFloor(.idle, after: before) != nil)
    }

    @Test func squelchdKeepsChannelsMembersPushTokensAndTheLogThroughKill9() async throws {
        let started = Date()
        // 1. Certificates from the real script.
        let workspace = try Workspace("kill-restart")
        defer { workspace.cleanUp() }
        let (certs, data, configuration) = (workspace.certs, workspace.data, workspace.client)
        let reaper = Reaper()
        defer { reaper.killAll() }

        // 2. A channel and two tokens, with the CLI.
        let created = try squelchd(["channel", "create", "--name", "Ops", "--data-dir", data])
        #expect(created.status == 0, "\(created.err)")
        let channel = try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)), "stdout: \(created.out)")
        func issue(_ user: String, _ name: String) throws -> String {
            let issued = try squelchd(["token", "issue", "--channel", channel.uuidString, "--user", user, "--name", name, "--data-dir", data])
            #expect(issued.status == 0, "\(issued.err)")
            return issued.out.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let annToken = try issue("ann", "Ann")
        let bobToken = try issue("bob", "Bob")

        // 3. The first server, on ports it picks.
        let first = try await startServer(data: data, certs: certs, reaper: reaper)
        let adminKey = try String(contentsOfFile: data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!adminKey.isEmpty)

        // 4. ann and bob join; ann registers a push token and talks; bob hears every packet.
        let (ann, annJoined) = try await join(annToken, channel: channel, port: first.voicePort, configuration: configuration)
        guard case .joined(_, let annSlot, _, _, _)? = annJoined else { Issue.record("ann was not admitted: \(String(describing: annJoined))"); return }
        let (bob, bobJoined) = try await join(bobToken, channel: channel, port: first.voicePort, configuration: configuration)
        guard case .joined? = bobJoined else { Issue.record("bob was not admitted: \(String(describing: bobJoined))"); return }
        try await ann.send(.registerPushToken(token: "a1b2c3d4", environment: .sandbox))
        #expect(await ann.waitFor { $0 == .pushTokenRegistered } != nil, "\(ann.messages)")
        try await talk(ann, slot: annSlot, to: bob, count: 12, seed: 1)

        // The store writes at once; wait (bounded) until both the push token and the burst are in the
        // database, so the kill tests durability, not a race with the writer.
        let stored = try await eventually {
            let hasPushToken = try storedMembers(channel, data: data)["ann"]?["hasPushToken"] as? Bool == true
            let bursts = try await transmissions(channel, adminPort: first.adminPort, key: adminKey)
            return hasPushToken && bursts.count == 1 && bursts.first?["endReason"] as? String == "released"
        }
        #expect(stored, "the push token or the burst did not reach the database: \(first.log.contents)")

        // Bob starts talking; the burst is in the log as it starts, so the kill below can't erase it,
        // and its length so far is brought up to date every second.
        try await bob.send(.floorRequest())
        let bobBurst = await bob.waitForFloor(.granted)?.burst
        #expect(bobBurst != nil)
        let grantedAt = ContinuousClock.now
        _ = await bob.sendAudio(burst: bobBurst ?? 0, sequence: 0, payload: [UInt8](repeating: 0x5A, count: 80))
        func bobsLength() async throws -> Int? {
            try await transmissions(channel, adminPort: first.adminPort, key: adminKey).first {
                $0["userID"] as? String == "bob" && $0["endReason"] as? String == "inProgress"
            }?["durationMilliseconds"] as? Int
        }
        #expect(try await eventually { try await bobsLength() != nil }, "bob's burst was not logged as it started")
        // Up to date within about two seconds (the driver's tick is a second): it was the first
        // second, then every 5 s, and a 4.5 s burst cut by the kill was logged as 1.9 s.
        let uptoDate = try await eventually(seconds: 8) { try await bobsLength() ?? 0 >= 2_000 }
        let after = ContinuousClock.now - grantedAt
        let length = try await bobsLength()
        #expect(uptoDate && after < .seconds(4.5), "bob's length so far: \(String(describing: length)) after \(after)")

        // 5. kill -9.
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        #expect(first.process.terminationReason == .uncaughtSignal && first.process.terminationStatus == SIGKILL)
        #expect(!first.log.contents.contains("database flushed and closed"), "a SIGKILL must not shut down gracefully")

        // 6. The same data directory on the same ports.
        let second = try await startServer(data: data, certs: certs, port: first.voicePort, adminPort: first.adminPort, reaper: reaper)
        #expect(second.voicePort == first.voicePort && second.adminPort == first.adminPort)

        // ann's old client learns at once that the server forgot its session: the reset key survived.
        try? await ann.send(.floorRelease)
        let reset = await ann.waitForEvent { $0 == .reconnecting(.statelessReset) }
        #expect(reset != nil, "no stateless reset from the restarted server: \(ann.events)")
        await ann.close()
        await bob.close()

        // What was stored before the kill, while nobody is connected: both members, ann's push token, the burst.
        let members = try storedMembers(channel, data: data)
        #expect(Set(members.keys) == ["ann", "bob"], "\(members)")
        #expect(members["ann"]?["hasPushToken"] as? Bool == true && members["ann"]?["pushEnvironment"] as? String == "sandbox", "\(members)")
        #expect(members["bob"]?["hasPushToken"] as? Bool == false, "\(members)")
        let log = try await transmissions(channel, adminPort: second.adminPort, key: adminKey)
        #expect(log.count == 2, "\(log)")
        #expect(log.last?["userID"] as? String == "ann" && log.last?["endReason"] as? String == "released", "\(log)")
        // Bob's burst, cut by the kill: kept, and marked as the server never ending it.
        #expect(log.first?["userID"] as? String == "bob" && log.first?["endReason"] as? String == "interrupted", "\(log)")
        #expect((log.first?["durationMilliseconds"] as? Int ?? 0) >= 2_000, "its length as last written: \(log)")

        // The tokens issued before the kill still verify: the token key survived. bob sees ann as a
        // stored, offline member.
        let (bob2, bobAgain) = try await join(bobToken, channel: channel, port: second.voicePort, configuration: configuration)
        guard case .joined(let info, let bobSlot, let roster, let talkers, _)? = bobAgain else {
            Issue.record("bob was not admitted after the restart: \(String(describing: bobAgain))"); return
        }
        #expect(info.id == channel && info.name == "Ops")
        #expect(Set(roster.map(\.userID)) == ["ann", "bob"] && roster.count == 2, "\(roster)")
        #expect(roster.first { $0.userID == "ann" }?.connection == .offline, "\(roster)")
        #expect(roster.first { $0.userID == "bob" }.map { $0.connection == .connected && $0.slot == bobSlot } == true, "\(roster)")
        #expect(talkers.isEmpty, "\(talkers)")

        let before = bob2.messages.count
        let (ann2, annAgain) = try await join(annToken, channel: channel, port: second.voicePort, configuration: configuration)
        guard case .joined(_, let annSlot2, let annRoster, _, _)? = annAgain else {
            Issue.record("ann was not admitted after the restart: \(String(describing: annAgain))"); return
        }
        #expect(annRoster.first { $0.userID == "ann" }?.connection == .connected, "\(annRoster)")
        let online = await bob2.waitFor(after: before) {
            if case .participant(let p) = $0 { return p.userID == "ann" && p.connection == .connected } else { return false }
        }
        #expect(online != nil, "bob was not told ann is back: \(bob2.messages)")
        try await talk(ann2, slot: annSlot2, to: bob2, count: 12, seed: 2)

        // 7. The new burst joins the old one in the log; ann still has her push token.
        let logged = try await eventually {
            let log = try await transmissions(channel, adminPort: second.adminPort, key: adminKey)
            return log.count == 3 && log.first?["endReason"] as? String == "released"
        }
        #expect(logged, "the second burst was not logged")
        let finalLog = try await transmissions(channel, adminPort: second.adminPort, key: adminKey)
        #expect(finalLog.filter { $0["userID"] as? String == "ann" }.map { $0["endReason"] as? String } == ["released", "released"], "\(finalLog)")
        #expect(try storedMembers(channel, data: data)["ann"]?["hasPushToken"] as? Bool == true)

        // 8. SIGTERM: a clean exit that flushes the database.
        await ann2.close()
        await bob2.close()
        second.process.terminate()
        let exited = await second.process.waitForExit(seconds: 10)
        #expect(exited, "squelchd did not stop within 10 s of SIGTERM")
        #expect(second.process.terminationReason == .exit && second.process.terminationStatus == 0,
                "status \(second.process.terminationStatus): \(second.log.contents)")
        #expect(await second.log.wait(for: "database flushed and closed", seconds: 2) != nil, "\(second.log.contents)")
        print("KillRestartTests: \(String(format: "%.2f", Date().timeIntervalSince(started))) s")
    }

    /// SIGHUP (the session that started it closed, a script's `kill -HUP`) used to kill squelchd at once:
    /// no goodbye to members, the WAL left unmerged. It stops the graceful way now.
    @Test func aHangUpStopsGracefully() async throws {
        let workspace = try Workspace("hang-up")
        defer { workspace.cleanUp() }
        let reaper = Reaper()
        defer { reaper.killAll() }
        let server = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        kill(server.process.processIdentifier, SIGHUP)
        #expect(await server.process.waitForExit(seconds: 10), "squelchd did not stop after SIGHUP")
        #expect(server.process.terminationReason == .exit && server.process.terminationStatus == 0,
                "\(server.process.terminationReason == .uncaughtSignal ? "killed by signal" : "status") \(server.process.terminationStatus)")
        #expect(await server.log.wait(for: "database flushed and closed", seconds: 2) != nil, "\(server.log.contents)")
    }

    /// An operator whose stop hangs sends the signal again: the first SIGTERM starts the graceful
    /// stop (which a stalled admin client holds up to the 30 s limit), the second stops at once, and
    /// the database is still closed properly.
    @Test func aSecondSignalStopsAtOnce() async throws {
        let workspace = try Workspace("second-signal")
        defer { workspace.cleanUp() }
        let reaper = Reaper()
        defer { reaper.killAll() }
        let created = try squelchd(["channel", "create", "--name", "Ops", "--data-dir", workspace.data])
        #expect(created.status == 0, "\(created.err)")
        let server = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        let adminKey = try String(contentsOfFile: workspace.data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let stalled = StalledRequest(port: server.adminPort, authorization: "Bearer \(adminKey)")
        #expect(stalled != nil)
        defer { withExtendedLifetime(stalled) {} }
        try await Task.sleep(for: .milliseconds(200))

        kill(server.process.processIdentifier, SIGTERM)
        #expect(await server.log.wait(for: "send it again to stop at once", seconds: 5) != nil, "\(server.log.contents)")
        try await Task.sleep(for: .seconds(1.5))
        #expect(server.process.isRunning, "the stalled request holds the graceful stop")
        let second = ContinuousClock.now
        kill(server.process.processIdentifier, SIGTERM)
        #expect(await server.process.waitForExit(seconds: 10), "squelchd did not stop after a second SIGTERM")
        #expect(ContinuousClock.now - second < .seconds(5), "at once, not at the 30 s limit")
        #expect(server.process.terminationReason == .exit && server.process.terminationStatus == 0,
                "status \(server.process.terminationStatus): \(server.log.contents)")
        #expect(server.log.contents.contains("received again: stopping at once"))
        // Hummingbird's 'Server shutdown error: Already closed' and the like mean only that it was stopped.
        #expect(!server.log.contents.contains("error squelchd: [HummingbirdCore]"), "\(server.log.contents)")
        #expect(await server.log.wait(for: "database flushed and closed", seconds: 2) != nil, "\(server.log.contents)")
        // Nothing stored was lost.
        let listed = try squelchd(["channel", "list", "--data-dir", workspace.data])
        #expect(listed.status == 0 && listed.out.contains("Ops"), "\(listed.out) \(listed.err)")
    }

    /// A data directory restored from a backup without its token key: squelchd refuses to start
    /// rather than make a new key that calls every issued token forged, and says how to restore it;
    /// a new key is an administrator's decision (`token new-key`, confirmed, with squelchd stopped).
    @Test func aLostTokenKeyStopsTheStartAndANewOneIsAnAdministratorsDecision() async throws {
        let workspace = try Workspace("lost-key")
        defer { workspace.cleanUp() }
        let reaper = Reaper()
        defer { reaper.killAll() }
        let first = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        let key = workspace.data + "/token-key.pem"
        let old = try String(contentsOfFile: key, encoding: .utf8)
        let whileRunning = try squelchd(["token", "new-key", "--data-dir", workspace.data, "--every-token-stops-working"])
        #expect(whileRunning.status == 78 && whileRunning.err.contains("already"), "\(whileRunning.err)")
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        try FileManager.default.removeItem(atPath: key)
        let serve = ["serve", "--data-dir", workspace.data, "--port", "0", "--admin-port", "0",
                     "--cert", workspace.certs + "/server-chain.pem", "--key", workspace.certs + "/server.key", "--apns", "off"]
        let refused = try squelchd(serve)
        #expect(refused.status == 78 && refused.err.contains("token-key.pem is missing, but this data directory's database was served with one")
                && refused.err.contains("token new-key"), "\(refused.err)")
        #expect(!FileManager.default.fileExists(atPath: key), "no key made in silence")
        let unconfirmed = try squelchd(["token", "new-key", "--data-dir", workspace.data])
        #expect(unconfirmed.status == 1 && unconfirmed.err.contains("--every-token-stops-working"), "\(unconfirmed.err)")
        #expect(!FileManager.default.fileExists(atPath: key))
        let made = try squelchd(["token", "new-key", "--data-dir", workspace.data, "--every-token-stops-working"])
        #expect(made.status == 0 && made.out.contains("made a new token key"), "\(made.err)")
        #expect(try String(contentsOfFile: key, encoding: .utf8) != old)
        let again = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        #expect(again.process.isRunning)
        let audit = try squelchd(["audit", "--data-dir", workspace.data])
        #expect(audit.out.contains("token key replaced"), "\(audit.out)")
    }

    /// Two servers on one data directory would split its members between them: the second is refused
    /// at once, naming the first; after the first is killed (`kill -9`, no clean-up), one starts again.
    @Test func aSecondServerOnTheSameDataDirectoryIsRefused() async throws {
        let workspace = try Workspace("data-lock")
        defer { workspace.cleanUp() }
        let reaper = Reaper()
        defer { reaper.killAll() }
        let first = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        let second = try squelchd(["serve", "--data-dir", workspace.data, "--port", "0", "--admin-port", "0",
                                   "--cert", workspace.certs + "/server-chain.pem", "--key", workspace.certs + "/server.key"]
                                  + Executables.simulatorArguments(certs: workspace.certs))
        #expect(second.status == 78, "\(second.err)")
        #expect(second.err.contains("squelchd: another squelchd (pid \(first.process.processIdentifier)) is serving the data directory"),
                "\(second.err)")
        #expect(first.process.isRunning)

        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        let again = try await startServer(data: workspace.data, certs: workspace.certs, reaper: reaper)
        #expect(again.process.isRunning)

        // A database that isn't one: a line that says so, and EX_IOERR, not a usage error.
        let damaged = workspace.root.appendingPathComponent("damaged").path
        try FileManager.default.createDirectory(atPath: damaged, withIntermediateDirectories: true)
        try Data(repeating: 0x5A, count: 8_192).write(to: URL(fileURLWithPath: damaged + "/squelch.sqlite"))
        let refused = try squelchd(["serve", "--data-dir", damaged, "--port", "0", "--admin-port", "0",
                                    "--cert", workspace.certs + "/server-chain.pem", "--key", workspace.certs + "/server.key", "--apns", "off"])
        #expect(refused.status == 74, "\(refused.err)")
        #expect(refused.err.hasPrefix("squelchd: database error") || refused.err.contains("\nsquelchd: database error"), "\(refused.err)")
        #expect(!refused.err.contains("Error: "), "\(refused.err)")
    }

    /// A token revoked with the CLI (another process than the server) ends its live session within
    /// the server's one-second poll, and stays revoked through `kill -9`, as does a removed member's.
    @Test func revocationsReachTheRunningServerAndSurviveKill9() async throws {
        let workspace = try Workspace("revoke")
        defer { workspace.cleanUp() }
        let (certs, data, configuration) = (workspace.certs, workspace.data, workspace.client)
        let reaper = Reaper()
        defer { reaper.killAll() }
        let created = try squelchd(["channel", "create", "--name", "Ops", "--data-dir", data])
        let channel = try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)), "\(created.err)")
        func issue(_ user: String) throws -> String {
            let issued = try squelchd(["token", "issue", "--channel", channel.uuidString, "--user", user, "--name", user.capitalized, "--data-dir", data])
            #expect(issued.status == 0, "\(issued.err)")
            return issued.out.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        func refusal(_ message: ServerMessage?) -> RefusalCode? { if case .refused(let code, _)? = message { code } else { nil } }
        let annToken = try issue("ann"), bobToken = try issue("bob")

        let first = try await startServer(data: data, certs: certs, reaper: reaper)
        let adminKey = try String(contentsOfFile: data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let (ann, annJoined) = try await join(annToken, channel: channel, port: first.voicePort, configuration: configuration)
        guard case .joined? = annJoined else { Issue.record("ann not admitted: \(String(describing: annJoined))"); return }
        let (bob, bobJoined) = try await join(bobToken, channel: channel, port: first.voicePort, configuration: configuration)
        guard case .joined(_, let bobSlot, _, _, _)? = bobJoined else { Issue.record("bob not admitted: \(String(describing: bobJoined))"); return }

        // The CLI revokes bob's token in the database; the running server finds it and ends his session.
        let revoked = try squelchd(["token", "revoke", "--token", bobToken, "--reason", "phone lost", "--data-dir", data])
        #expect(revoked.status == 0 && revoked.out.contains("revoked token"), "\(revoked.err)")
        let told = await bob.waitFor(seconds: 5) { if case .refused(.tokenRevoked, let why) = $0 { why.contains("phone lost") } else { false } }
        #expect(told != nil, "bob's session outlived the revocation: \(bob.messages)")
        #expect(await ann.waitFor { $0 == .participantLeft(slot: bobSlot, userID: "bob") } != nil, "\(ann.messages)")
        let inspected = try squelchd(["token", "inspect", bobToken, "--json", "--data-dir", data])
        #expect(inspected.status == 3 && inspected.out.contains("\"status\" : \"revoked\""), "\(inspected.out) \(inspected.err)")

        // An admin removes ann over the API.
        var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(first.adminPort)/v1/channels/\(channel.uuidString)/members/ann")))
        request.httpMethod = "DELETE"
        request.setValue("Bearer \(adminKey)", forHTTPHeaderField: "Authorization")
        let (_, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 204)
        #expect(await ann.waitFor { if case .refused(.removedByAdmin, _) = $0 { true } else { false } } != nil, "\(ann.messages)")
        await ann.close()
        await bob.close()

        // kill -9, restart: both old tokens stay out; a token issued now gets ann back in.
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        let second = try await startServer(data: data, certs: certs, reaper: reaper)
        let (_, bobAgain) = try await join(bobToken, channel: channel, port: second.voicePort, configuration: configuration)
        #expect(refusal(bobAgain) == .tokenRevoked, "\(String(describing: bobAgain))")
        let (_, annAgain) = try await join(annToken, channel: channel, port: second.voicePort, configuration: configuration)
        #expect(refusal(annAgain) == .tokenRevoked, "\(String(describing: annAgain))")
        let (annBack, back) = try await join(try issue("ann"), channel: channel, port: second.voicePort, configuration: configuration)
        guard case .joined? = back else { Issue.record("a new token did not admit ann: \(String(describing: back))"); return }
        await annBack.close()
        second.process.terminate()
        _ = await second.process.waitForExit(seconds: 10)

        // By id alone: `channel show --json` gives each member's token id; a revocation by it names the
        // member, and one by an id nobody joined with (a typo, most likely) says so.
        let annTokenID = try #require(try storedMembers(channel, data: data)["ann"]?["tokenID"] as? String)
        let byID = try squelchd(["token", "revoke", "--channel", channel.uuidString, "--id", annTokenID, "--data-dir", data])
        #expect(byID.status == 0 && byID.out.contains("member 'ann' last joined with"), "\(byID.out) \(byID.err)")
        // The same id in lower case (as many tools print UUIDs) names the same token, already revoked:
        // the first revocation stands and is what is shown.
        let lower = try squelchd(["token", "revoke", "--channel", channel.uuidString, "--id", annTokenID.lowercased(),
                                  "--reason", "second thoughts", "--data-dir", data])
        #expect(lower.status == 0 && lower.out.contains("token \(annTokenID) on channel \(channel.uuidString) was already revoked at")
                && !lower.out.contains("second thoughts"), "\(lower.out) \(lower.err)")
        // On another channel it would void nothing: refused, and the right command given.
        let other = try squelchd(["channel", "create", "--name", "Other", "--data-dir", data])
        let otherID = other.out.trimmingCharacters(in: .whitespacesAndNewlines)
        let misplaced = try squelchd(["token", "revoke", "--channel", otherID, "--id", annTokenID, "--data-dir", data])
        #expect(misplaced.status == 1 && misplaced.err.contains("is the one member 'ann' of channel \(channel.uuidString) last joined with")
                && misplaced.err.contains("squelchd token revoke --channel \(channel.uuidString) --id \(annTokenID)"), "\(misplaced.out) \(misplaced.err)")
        let typo = try squelchd(["token", "revoke", "--channel", channel.uuidString, "--id", annTokenID + "x", "--data-dir", data])
        #expect(typo.status == 64 && typo.err.contains("is not a token id"), "\(typo.out) \(typo.err)")
        let unused = try squelchd(["token", "revoke", "--channel", channel.uuidString, "--id", UUID().uuidString, "--data-dir", data])
        #expect(unused.status == 0 && unused.err.contains("note: no member of the channel last joined with token id"), "\(unused.out) \(unused.err)")
    }
}
