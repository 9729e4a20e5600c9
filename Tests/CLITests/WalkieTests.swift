import Audio
import Foundation
import ParticipantClaims
import ParticipantTokens
import PTTClient
import Testing

/// walkie as people run it: real processes against a real `squelchd serve` (dev certificates from the
/// real script, the embedded APNs simulator), WAV files for microphone and speaker (this machine has
/// no sound card), and tmux as the terminal for the full-screen UI.
@Suite(.serialized, .timeLimit(.minutes(3))) struct WalkieTests {
    /// One server with a channel, tokens for Ann and Bob, and a speech file.
    final class World {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("walkie-test-\(UUID())").path
        var certs: String { dir + "/certs" }
        var data: String { dir + "/data" }
        let reaper = KillRestartTests.Reaper()
        var server: KillRestartTests.Server!
        var pushPort = 0
        var channel = UUID()
        var tokens: [String: String] = [:]
        var speech: String { dir + "/speech.wav" }
        static let speechSeconds = 2.0

        init() async throws {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try Executables.makeDevCertificates(into: certs)
            let created = try Executables.run("squelchd", ["channel", "create", "--name", "Ops", "--data-dir", data])
            channel = try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)))
            for (user, name) in [("ann", "Ann"), ("bob", "Bob"), ("cat", "Cat")] {
                tokens[user] = try Executables.run("squelchd", ["token", "issue", "--channel", channel.uuidString, "--user", user,
                                                               "--name", name, "--data-dir", data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            server = try await KillRestartTests().startServer(data: data, certs: certs, reaper: reaper)
            let control = await server.log.wait(for: #"control=http://127\.0\.0\.1:\d+"#, seconds: 10)
            pushPort = control.flatMap { KillRestartTests.firstPort(in: $0) } ?? 0
            try Self.writeSpeech(seconds: Self.speechSeconds, to: speech)
        }

        /// A speech-like WAV file, the walkies' microphone.
        static func writeSpeech(seconds: Double, to path: String) throws {
            let sink = try WAVFileSink(path: path, pacer: VirtualPacer())
            let samples = TestSignal.speechLike(seconds: seconds)
            try samples.withUnsafeBufferPointer { all in
                for start in stride(from: 0, to: samples.count, by: PipelineAudio.periodFrames) {
                    try sink.write(UnsafeBufferPointer(rebasing: all[start ..< start + PipelineAudio.periodFrames]))
                }
            }
            try sink.finish()
        }

        func arguments(_ user: String) -> [String] {
            ["--server", "127.0.0.1:\(server.voicePort)", "--token", tokens[user]!, "--ca", certs + "/ca.pem"]
        }

        /// A speech file of `seconds`, written once, for a walkie's microphone.
        func speechFile(seconds: Int) throws -> String {
            let path = dir + "/speech-\(seconds)s.wav"
            if !FileManager.default.fileExists(atPath: path) { try Self.writeSpeech(seconds: Double(seconds), to: path) }
            return path
        }

        /// `walkie join` for a terminal, as `user`, with its own state directory, `input` as its
        /// microphone and what it hears recorded in `<user>-heard.wav`.
        func join(_ user: String, pushPort: Int, input: String) -> [String] {
            [Executables.url("walkie").path, "join"] + arguments(user)
                + ["--state-dir", dir + "/state-\(user)", "--push-port", "\(pushPort)", "--input-file", input, "--output-file", dir + "/\(user)-heard.wav"]
        }

        /// `walkie talk` as `user` with `seconds` of speech, running, once it says it is sending.
        func talking(_ user: String, seconds: Double) async throws -> Running {
            let file = dir + "/\(user)-\(Int(seconds))s.wav"
            try Self.writeSpeech(seconds: seconds, to: file)
            let talk = try Running(["talk"] + arguments(user) + ["--file", file, "--push-port", "0"], reaper: reaper)
            #expect(await talk.out.wait(for: "sending", seconds: 20) != nil, "\(talk.err.contents)")
            return talk
        }

        func finish() {
            reaper.killAll()
            try? FileManager.default.removeItem(atPath: dir)
        }
    }

    /// A walkie running in the background, its output collected.
    final class Running {
        let process = Process()
        let out: PipeCollector
        let err: PipeCollector
        init(_ arguments: [String], reaper: KillRestartTests.Reaper) throws {
            process.executableURL = Executables.url("walkie")
            process.arguments = arguments
            let o = Pipe(), e = Pipe()
            process.standardOutput = o
            process.standardError = e
            out = PipeCollector(o)
            err = PipeCollector(e)
            try process.run()
            reaper.processes.append(process)
        }
    }

    /// The loudness of each 10 ms period, for comparing what was said with what was heard.
    static func envelope(_ path: String) throws -> [Double] {
        let samples = try WAVAudio.read(path: path).pipelineSamples(resampler: Resampler())
        return stride(from: 0, to: samples.count - 480, by: 480).map { start in
            var sum = 0.0
            for s in samples[start ..< start + 480] { let v = Double(s) / 32768; sum += v * v }
            return (sum / 480).squareRoot()
        }
    }

    /// The best normalised correlation of `said` inside `heard` over every lag.
    static func bestCorrelation(_ said: [Double], in heard: [Double]) -> (correlation: Double, lag: Int) {
        var best = (correlation: -1.0, lag: 0)
        guard heard.count >= said.count else { return best }
        let meanS = said.reduce(0, +) / Double(said.count)
        for lag in 0...(heard.count - said.count) {
            let window = heard[lag ..< lag + said.count]
            let meanH = window.reduce(0, +) / Double(said.count)
            var num = 0.0, ds = 0.0, dh = 0.0
            for (a, b) in zip(said, window) { num += (a - meanS) * (b - meanH); ds += (a - meanS) * (a - meanS); dh += (b - meanH) * (b - meanH) }
            let c = ds > 0 && dh > 0 ? num / (ds * dh).squareRoot() : 0
            if c > best.correlation { best = (c, lag) }
        }
        return best
    }

    @Test func talkAndListenMoveAWavFileWithItsSpeechIntact() async throws {
        let world = try await World()
        defer { world.finish() }
        let heard = world.dir + "/heard.wav"
        let listener = try Running(["listen"] + world.arguments("bob") + ["--record", heard, "--duration", "6", "--push-port", "0"], reaper: world.reaper)
        #expect(await listener.out.wait(for: "listening", seconds: 20) != nil, "\(listener.err.contents)")
        let talk = try Executables.run("walkie", ["talk"] + world.arguments("ann") + ["--file", world.speech, "--push-port", "0"])
        #expect(talk.status == 0, "\(talk.err)")
        #expect(talk.out.contains("sending ") && talk.out.contains("sent "), "\(talk.out)")
        #expect(await listener.process.waitForExit(seconds: 20))
        #expect(listener.process.terminationStatus == 0, "\(listener.err.contents)")
        // Every frame sent is counted once, none lost on loopback, none made up while waiting.
        let sent = talk.out.firstMatch(of: /in (\d+) frames/).map { String($0.1) }
        #expect(sent != nil && listener.out.contents.contains("heard a burst from Ann: \(sent ?? "?") frames, 0 lost"),
                "talk: \(talk.out) listen: \(listener.out.contents)")
        // The speech's loudness contour is in the recording, intact: same shape, same length.
        let said = try Self.envelope(world.speech), got = try Self.envelope(heard)
        let match = Self.bestCorrelation(said, in: got)
        #expect(match.correlation > 0.9, "loudness contours correlate \(match.correlation) at \(match.lag * 10) ms")
        let loudSaid = said.filter { $0 > 0.01 }.count
        let loudHeard = got.filter { $0 > 0.01 }.count
        #expect(loudHeard >= loudSaid * 9 / 10 && loudHeard <= loudSaid + 10, "loud periods: said \(loudSaid), heard \(loudHeard)")

        // "--file -" reads standard input, as a pipe from sox or espeak would give it.
        let quoted = (["talk"] + world.arguments("ann") + ["--file", "-", "--push-port", "0"]).map { "'\($0)'" }.joined(separator: " ")
        let piped = try Executables.runShell("'\(Executables.url("walkie").path)' \(quoted) < '\(world.speech)'; echo \"exit=$?\"")
        #expect(piped.contains("sending -: ") && piped.contains("exit=0"), "\(piped)")

        // The terminal or ssh session goes away (SIGHUP): the recording is completed, not left with
        // the placeholder sizes that players read as empty.
        let hungUp = world.dir + "/hung-up.wav"
        let recorder = try Running(["listen"] + world.arguments("bob") + ["--record", hungUp, "--push-port", "0"], reaper: world.reaper)
        #expect(await recorder.out.wait(for: "listening", seconds: 20) != nil, "\(recorder.err.contents)")
        try await Task.sleep(for: .seconds(1))
        kill(recorder.process.processIdentifier, SIGHUP)
        #expect(await recorder.process.waitForExit(seconds: 20))
        #expect(recorder.process.terminationStatus == 0, "\(recorder.err.contents)")
        let kept = try Self.envelope(hungUp).count
        #expect(kept >= 50, "\(kept) periods of 10 ms in the file")
    }

    /// A recorder left running past its token's expiry keeps its session when a new token lands in
    /// its --token-file, and still hears the channel after the old token has run out.
    @Test func aListenerRenewsItsSessionFromItsTokenFile() async throws {
        let world = try await World()
        defer { world.finish() }
        func issue(_ ttl: String) throws -> String {
            try Executables.run("squelchd", ["token", "issue", "--channel", world.channel.uuidString, "--user", "bob", "--name", "Bob",
                                             "--ttl", ttl, "--data-dir", world.data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let tokenFile = world.dir + "/bob.token"
        try (try issue("10s") + "\n").write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let server = ["--server", "127.0.0.1:\(world.server.voicePort)", "--ca", world.certs + "/ca.pem", "--push-port", "0"]
        let heard = world.dir + "/heard.wav"
        let listener = try Running(["listen"] + server + ["--token-file", tokenFile, "--record", heard, "--duration", "22"], reaper: world.reaper)
        #expect(await listener.out.wait(for: "listening", seconds: 20) != nil, "\(listener.err.contents)")
        // Less than five minutes left: the server warns at once, and walkie says what to do.
        #expect(await listener.out.wait(for: "token expires at .*; put a new token in", seconds: 10) != nil, "\(listener.out.contents)")
        try issue("1h").write(toFile: tokenFile, atomically: true, encoding: .utf8)
        #expect(await listener.out.wait(for: "token renewed; valid until", seconds: 10) != nil, "\(listener.out.contents)")
        // A renewal job that writes garbage: said after a few seconds, while the current token goes on.
        let renewed = try String(contentsOfFile: tokenFile, encoding: .utf8)
        try "garbage".write(toFile: tokenFile, atomically: true, encoding: .utf8)
        #expect(await listener.out.wait(for: "the token file can't be used .*; the current token goes on until", seconds: 10) != nil,
                "\(listener.out.contents)")
        try renewed.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        // Put right with the token in use (no renewal to say so): said too, so the warning doesn't stand.
        #expect(await listener.out.wait(for: "holds the current token again", seconds: 5) != nil, "\(listener.out.contents)")
        try await Task.sleep(for: .seconds(2))  // the first token has expired by now
        let talk = try Executables.run("walkie", ["talk"] + world.arguments("ann") + ["--file", world.speech, "--push-port", "0"])
        #expect(talk.status == 0, "\(talk.err)")
        #expect(await listener.process.waitForExit(seconds: 20))
        #expect(listener.process.terminationStatus == 0, "\(listener.err.contents)")
        #expect(listener.out.contents.contains("heard a burst"), "\(listener.out.contents)")
        #expect(!listener.out.contents.contains("token expired"), "\(listener.out.contents)")

        // The option's own mistakes.
        let both = try Executables.run("walkie", ["listen"] + server + ["--token", "x", "--token-file", tokenFile, "--record", heard])
        #expect(both.status == 2 && both.err.contains("either --token or --token-file"), "\(both.err)")
        try "\n".write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let empty = try Executables.run("walkie", ["listen"] + server + ["--token-file", tokenFile, "--record", heard])
        #expect(empty.status == 4 && empty.err.contains("is empty"), "\(empty.err)")
        let missing = try Executables.run("walkie", ["listen"] + server + ["--token-file", world.dir + "/nothing", "--record", heard])
        #expect(missing.status == 2 && missing.err.contains("can't read the token file"), "\(missing.err)")
    }

    /// One-shots share the user's membership with the user's other connections: a `walkie talk` as
    /// Bob pushes Bob's running recorder aside (one connection per member), which stops and says so
    /// rather than record silence, and when done it closes rather than leave, so Bob stays a member.
    /// A recorder whose join fails leaves the file already at its path alone. A server killed
    /// mid-file: the talk is not reported as sent, and the recorder says its connection was down.
    @Test func oneShotsKeepTheMembershipAndReportWhatTheyCouldNotDo() async throws {
        let world = try await World()
        defer { world.finish() }
        let heard = world.dir + "/heard.wav"
        let keep = world.dir + "/keep.wav"
        try FileManager.default.copyItem(atPath: world.speech, toPath: keep)
        let unreachable = try Executables.run("walkie", ["listen", "--server", "127.0.0.1:9", "--token", world.tokens["bob"]!,
                                                         "--ca", world.certs + "/ca.pem", "--record", keep, "--push-port", "0"])
        #expect(unreachable.status == 3, "\(unreachable.err)")
        #expect(FileManager.default.contents(atPath: keep) == FileManager.default.contents(atPath: world.speech), "the file was touched")

        let recorder = try Running(["listen"] + world.arguments("bob") + ["--record", heard, "--duration", "30", "--push-port", "0"],
                                   reaper: world.reaper)
        #expect(await recorder.out.wait(for: "listening", seconds: 20) != nil, "\(recorder.err.contents)")
        let talk = try Executables.run("walkie", ["talk"] + world.arguments("bob") + ["--file", world.speech, "--push-port", "0"])
        #expect(talk.status == 0, "\(talk.err)")
        #expect(await recorder.process.waitForExit(seconds: 10), "the recorder went on after it was pushed aside")
        #expect(recorder.process.terminationStatus == 1 && recorder.err.contents.contains("another connection"), "\(recorder.err.contents)")
        #expect(recorder.out.contents.contains("cut short"), "\(recorder.out.contents)")
        #expect(try KillRestartTests().storedMembers(world.channel, data: world.data)["bob"] != nil, "the one-shot left Bob's membership")
        // Bob's own other connection takes the channel mid-file: said as such, not as squelchd's fault.
        let longer = world.dir + "/longer.wav"
        try World.writeSpeech(seconds: 6, to: longer)
        let first = try Running(["talk"] + world.arguments("bob") + ["--file", longer, "--push-port", "0"], reaper: world.reaper)
        #expect(await first.out.wait(for: "sending", seconds: 20) != nil, "\(first.err.contents)")
        _ = try Executables.run("walkie", ["talk"] + world.arguments("bob") + ["--file", world.speech, "--push-port", "0"])
        #expect(await first.process.waitForExit(seconds: 20))
        #expect(first.process.terminationStatus == 6 && first.err.contents.contains("another connection of this user"),
                "\(first.out.contents) \(first.err.contents)")
        // An announcer of its own asks to leave when done.
        let announcer = try Executables.run("walkie", ["talk"] + world.arguments("cat") + ["--file", world.speech, "--push-port", "0", "--leave"])
        #expect(announcer.status == 0, "\(announcer.err)")
        var catStored = true
        for _ in 0..<50 where catStored {
            catStored = try KillRestartTests().storedMembers(world.channel, data: world.data)["cat"] != nil
            if catStored { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(!catStored, "--leave left Cat a member")

        let long = world.dir + "/long.wav"
        try World.writeSpeech(seconds: 6, to: long)
        // Dan is removed by an administrator mid-file: told so, with the token's exit code, not
        // "send it again" (which can't work now).
        let dan = try Executables.run("squelchd", ["token", "issue", "--channel", world.channel.uuidString, "--user", "dan",
                                                   "--name", "Dan", "--data-dir", world.data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        let danTalk = try Running(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", dan, "--ca", world.certs + "/ca.pem",
                                   "--file", long, "--push-port", "0"], reaper: world.reaper)
        #expect(await danTalk.out.wait(for: "sending", seconds: 20) != nil, "\(danTalk.err.contents)")
        let adminKey = try String(contentsOfFile: world.data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let removed = try Executables.runShell("curl -s -o /dev/null -w '%{http_code}' -X DELETE -H 'Authorization: Bearer \(adminKey)' http://127.0.0.1:\(world.server.adminPort)/v1/channels/\(world.channel.uuidString)/members/dan")
        #expect(removed == "204", "\(removed)")
        #expect(await danTalk.process.waitForExit(seconds: 20))
        #expect(danTalk.process.terminationStatus == 4 && danTalk.err.contents.contains("administrator") && !danTalk.err.contents.contains("send it again"),
                "\(danTalk.out.contents) \(danTalk.err.contents)")

        // squelchd dies (kill -9) while Ann's file is still being sent.
        let ann = try Running(["talk"] + world.arguments("ann") + ["--file", long, "--push-port", "0"], reaper: world.reaper)
        #expect(await ann.out.wait(for: "sending", seconds: 20) != nil, "\(ann.err.contents)")
        try await Task.sleep(for: .milliseconds(500))
        kill(world.server.process.processIdentifier, SIGKILL)
        #expect(await ann.process.waitForExit(seconds: 20))
        #expect(ann.process.terminationStatus == 3 && ann.err.contents.contains("did not confirm the end"), "\(ann.out.contents) \(ann.err.contents)")

        // squelchd shuts down (SIGTERM, a restart) while Ann's file is being sent: said as such,
        // not as a server to go and look for.
        let stopping = try await KillRestartTests().startServer(data: world.data, certs: world.certs, reaper: world.reaper)
        let annAgain = try Running(["talk", "--server", "127.0.0.1:\(stopping.voicePort)", "--token", world.tokens["ann"]!, "--ca", world.certs + "/ca.pem",
                                    "--file", long, "--push-port", "0"], reaper: world.reaper)
        #expect(await annAgain.out.wait(for: "sending", seconds: 20) != nil, "\(annAgain.err.contents)")
        try await Task.sleep(for: .milliseconds(500))
        kill(stopping.process.processIdentifier, SIGTERM)
        #expect(await annAgain.process.waitForExit(seconds: 20))
        #expect(annAgain.process.terminationStatus == 3 && annAgain.err.contents.contains("squelchd shut down")
                && !annAgain.err.contents.contains("check that squelchd runs"), "\(annAgain.out.contents) \(annAgain.err.contents)")
        _ = await stopping.process.waitForExit(seconds: 10)

        // squelchd stops while Cat records: she is told at once (a dead one is noticed within 35 s),
        // and the recording's end is reported as possibly incomplete.
        let server = try await KillRestartTests().startServer(data: world.data, certs: world.certs, reaper: world.reaper)
        let cat = try Running(["listen", "--server", "127.0.0.1:\(server.voicePort)", "--token", world.tokens["cat"]!, "--ca", world.certs + "/ca.pem",
                               "--record", heard, "--duration", "6", "--push-port", "0"], reaper: world.reaper)
        #expect(await cat.out.wait(for: "listening", seconds: 20) != nil, "\(cat.err.contents)")
        kill(server.process.processIdentifier, SIGTERM)
        #expect(await cat.out.wait(for: "the channel is unavailable", seconds: 5) != nil, "\(cat.out.contents)")
        #expect(await cat.process.waitForExit(seconds: 20))
        #expect(cat.process.terminationStatus == 3 && cat.err.contents.contains("was unavailable from"), "\(cat.out.contents) \(cat.err.contents)")
    }
}

func eventuallyTrue(seconds: Double = 20, _ condition: () -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(100))
    }
    return false
}

extension Executables {
    static func runShell(_ command: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(decoding: data, as: UTF8.self)
    }
}
