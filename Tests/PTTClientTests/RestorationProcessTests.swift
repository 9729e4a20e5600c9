import APNsSimulatorEmbedding
import Foundation
import NIOConcurrencyHelpers
import PTTClient
import SquelchTesting
import Testing

/// Restoration across a real process restart: `ptt-example` (an app on the public API) joins, is
/// killed with SIGKILL, and started again with no channel given; it must rejoin with reason
/// `channelRestoration` from its saved record.
@Suite(.serialized, .timeLimit(.minutes(2))) struct RestorationProcessTests {
    static func executable(_ name: String) -> URL {
        var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent(name).path), dir.path != "/" { dir.deleteLastPathComponent() }
        return dir.appendingPathComponent(name)
    }

    /// A child process whose stdout lines are collected as they come.
    final class Child: Sendable {
        let process = Process()
        let lines = NIOLockedValueBox<[String]>([])
        let pending = NIOLockedValueBox("")

        init(_ arguments: [String]) throws {
            process.executableURL = RestorationProcessTests.executable("ptt-example")
            process.arguments = arguments
            let pipe = Pipe()
            process.standardOutput = pipe
            let lines = self.lines, pending = self.pending
            pipe.fileHandleForReading.readabilityHandler = { handle in
                let text = String(decoding: handle.availableData, as: UTF8.self)
                pending.withLockedValue { buffer in
                    buffer += text
                    while let end = buffer.firstIndex(of: "\n") {
                        let line = String(buffer[..<end])
                        lines.withLockedValue { $0.append(line) }
                        buffer = String(buffer[buffer.index(after: end)...])
                    }
                }
            }
            try process.run()
        }

        func wait(for prefix: String, seconds: Double = 20) async -> String? {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if let line = lines.withLockedValue({ $0.first { $0.hasPrefix(prefix) } }) { return line }
                try? await Task.sleep(for: .milliseconds(20))
            }
            return nil
        }
    }

    @Test func aKilledAppRestoresItsChannelOnTheNextStart() async throws {
        let fixture = try await ClientFixture()
        let state = fixture.stateDirectory("process")
        let id = fixture.channel.id
        let token = try await fixture.token("dan")
        let first = try Child(["--host", "127.0.0.1", "--port", "\(fixture.listening.voicePort)", "--ca", fixture.caPath,
                               "--token", token, "--channel", id.uuidString, "--state-dir", state, "--run-seconds", "60",
                               "--push-control-port", "\(fixture.listening.apnsSimulatorEndpoints!.controlPort)"])
        #expect(await first.wait(for: "didJoin \(id) reason=developerRequest") != nil)
        #expect(await first.wait(for: "pushToken 32 bytes") != nil)
        // The record is written before didJoin returns to the app; kill -9 gives the process no chance to tidy up.
        #expect(await eventually { FileManager.default.fileExists(atPath: state + "/channel.json") })
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        #expect(first.process.terminationReason == .uncaughtSignal)

        let record = try #require(try RestorationStore(directory: state).load())
        #expect(record.channel == id && record.pushToken?.count == 32)
        let second = try Child(["--state-dir", state, "--run-seconds", "1", "--push-control-port", "\(fixture.listening.apnsSimulatorEndpoints!.controlPort)"])
        #expect(await second.wait(for: "didJoin \(id) reason=channelRestoration") != nil, "\(second.lines.withLockedValue { $0 })")
        #expect(await second.wait(for: "exit") != nil)
        second.process.waitUntilExit()
        #expect(second.process.terminationStatus == 0)
        // The restored device kept its push token: no new one was handed out.
        #expect(!second.lines.withLockedValue { $0 }.contains { $0.hasPrefix("pushToken") })

        // A join the server refuses ends the app at once with status 1, even when it was to talk.
        let refused = try Child(["--host", "127.0.0.1", "--port", "\(fixture.listening.voicePort)", "--ca", fixture.caPath,
                                 "--token", try await fixture.token("eve", ttl: -60), "--channel", id.uuidString,
                                 "--state-dir", fixture.stateDirectory("refused"), "--talk-seconds", "1", "--run-seconds", "60"])
        #expect(await refused.wait(for: "failedToJoin") != nil, "\(refused.lines.withLockedValue { $0 })")
        refused.process.waitUntilExit()
        #expect(refused.process.terminationStatus == 1)
        await fixture.stop()
    }

    /// Nothing answers at --port: the run ends with exit 1 and says so. It used to print only `exit`
    /// and exit 0, as if it had joined.
    @Test func aRunThatNeverJoinedExitsOneAndSaysWhy() async throws {
        let fixture = try await ClientFixture(pushes: false)
        // A UDP port a socket holds and never reads: nothing answers there.
        let held = try #require(HeldPort(tcpListening: false))
        let port = held.port
        let child = try Child(["--host", "127.0.0.1", "--port", "\(port)", "--ca", fixture.caPath, "--token", try await fixture.token("fay"),
                               "--channel", fixture.channel.id.uuidString, "--state-dir", fixture.stateDirectory("never"),
                               "--run-seconds", "2"])
        child.process.waitUntilExit()
        let lines = child.lines.withLockedValue { $0 }
        #expect(child.process.terminationStatus == 1, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("not joined within 2.0 s: no answer from 127.0.0.1:\(port)") }, "\(lines)")
        withExtendedLifetime(held) {}
        await fixture.stop()
    }

    /// Wrong options end the app with 64 and say which option, before anything is joined: a number
    /// beyond what Swift's durations hold used to crash it, and a bad port or record path went unsaid.
    @Test func wrongOptionsAreSaidWithTheirName() throws {
        let state = FileManager.default.temporaryDirectory.appendingPathComponent("ptt-example-options-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: state) }
        let channel = ["--channel", UUID().uuidString, "--token", "t", "--state-dir", state]
        for (arguments, mentions) in [(channel + ["--talk-seconds", "1e300"], "--talk-seconds 1e300"),
                                      (channel + ["--run-seconds", "ten"], "--run-seconds ten"),
                                      (channel + ["--port", "99999"], "--port 99999"),
                                      (channel + ["--push-control-port", "0"], "--push-control-port 0"),
                                      (channel + ["--record", "/no-such-directory/heard.wav"], "can't write in /no-such-directory"),
                                      (["--channel", "ops", "--token", "t", "--state-dir", state], "--channel ops is not a channel id"),
                                      (["--channel", UUID().uuidString, "--state-dir", state], "needs --token"),
                                      (channel + ["--bogus"], "--bogus is not an option"),
                                      (channel + ["--run-seconds"], "--run-seconds needs a value")] {
            let process = Process()
            process.executableURL = Self.executable("ptt-example")
            process.arguments = arguments
            let err = Pipe()
            process.standardError = err
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            let said = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            #expect(process.terminationReason == .exit && process.terminationStatus == 64 && said.contains(mentions), "\(arguments): \(said)")
        }
        #expect(!FileManager.default.fileExists(atPath: state + "/channel.json"), "a channel was joined")
    }
}
