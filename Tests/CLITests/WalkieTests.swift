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

    /// squelchd killed just before the file's end and back before walkie's release check is over: the
    /// restarted server shows Ann not talking (it never heard the burst), which is no confirmation of
    /// the release, so the talk is not reported as sent. (It used to exit 0, and a cron announcement
    /// that the channel only half heard passed for delivered.)
    @Test func aServerRestartedAroundTheFilesEndDoesNotConfirmIt() async throws {
        let world = try await World()
        defer { world.finish() }
        let ann = try await world.talking("ann", seconds: 4)
        // Killed in the file's last 400 ms and started again after its end, so that the audio meets
        // no restarted server (which would end the transmission at once, a case already handled):
        // only the release, sent again and again, does.
        let sending = ContinuousClock.now
        try await Task.sleep(for: .milliseconds(3_600))
        kill(world.server.process.processIdentifier, SIGKILL)
        _ = await world.server.process.waitForExit(seconds: 10)
        try await Task.sleep(until: sending + .milliseconds(4_600))
        world.server = try await KillRestartTests().startServer(data: world.data, certs: world.certs, port: world.server.voicePort, reaper: world.reaper)
        #expect(await ann.process.waitForExit(seconds: 20))
        #expect(ann.process.terminationStatus == 3 && ann.err.contents.contains("did not confirm the end"), "\(ann.out.contents) \(ann.err.contents)")
    }

    /// A talk pre-empted by a member of higher priority says who and what to do, with the floor's exit
    /// code, not "taken back or the connection dropped" nor the burst limit.
    /// squelchd dies while the key is latched: once the connection is given up, the screen says the
    /// transmission was cut (it only dropped to Idle) and stops showing it as going on.
    @Test func aTransmissionCutByALostServerSaysSo() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        try tmux.start("bob", world.join("bob", pushPort: 0, input: try world.speechFile(seconds: 60)))
        #expect(try await tmux.wait("bob", for: "Bob (you)"), "\(tmux.screen("bob"))")
        try tmux.keys("bob", "Space")
        #expect(try await tmux.wait("bob", for: "LATCHED"), "\(tmux.screen("bob"))")
        kill(world.server.process.processIdentifier, SIGKILL)
        #expect(try await tmux.wait("bob", for: "Transmission cut: the connection to squelchd dropped", seconds: 45), "\(tmux.screen("bob"))")
        #expect(!tmux.screen("bob").contains("LATCHED"), "\(tmux.screen("bob"))")
    }

    /// A talker removed by an administrator in the middle of a burst: the listener's summary of
    /// that burst still names them (it used to say "heard a burst: 163 frames", nameless, because
    /// the roster had lost them by the burst's end).
    @Test func aBurstCutByTheTalkersRemovalIsStillNamed() async throws {
        let world = try await World()
        defer { world.finish() }
        let listener = try Running(["listen"] + world.arguments("bob") + ["--record", world.dir + "/heard.wav", "--duration", "8", "--push-port", "0"],
                                   reaper: world.reaper)
        #expect(await listener.out.wait(for: "listening", seconds: 20) != nil, "\(listener.err.contents)")
        let ann = try await world.talking("ann", seconds: 6)
        try await Task.sleep(for: .seconds(1.5))
        let adminKey = try String(contentsOfFile: world.data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let removed = try Executables.runShell("curl -s -o /dev/null -w '%{http_code}' -X DELETE -H 'Authorization: Bearer \(adminKey)' http://127.0.0.1:\(world.server.adminPort)/v1/channels/\(world.channel.uuidString)/members/ann")
        #expect(removed == "204", "\(removed)")
        #expect(await ann.process.waitForExit(seconds: 20) && ann.process.terminationStatus == 4, "\(ann.err.contents)")
        #expect(await listener.process.waitForExit(seconds: 20))
        #expect(listener.out.contents.contains("heard a burst from Ann: "), "\(listener.out.contents)")
    }

    @Test func aPreemptedTalkSaysWhoTookTheFloor() async throws {
        let world = try await World()
        defer { world.finish() }
        let boss = try Executables.run("squelchd", ["token", "issue", "--channel", world.channel.uuidString, "--user", "boss", "--name", "Boss",
                                                    "--priority", "200", "--data-dir", world.data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        let ann = try await world.talking("ann", seconds: 6)
        let bossTalk = try Executables.run("walkie", ["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", boss,
                                                      "--ca", world.certs + "/ca.pem", "--file", world.speech, "--push-port", "0"])
        #expect(bossTalk.status == 0, "\(bossTalk.err)")
        #expect(await ann.process.waitForExit(seconds: 20))
        #expect(ann.process.terminationStatus == 6 && ann.err.contents.contains("Boss has priority")
                && ann.err.contents.contains("send it again when they are done") && !ann.err.contents.contains("shorter parts"),
                "\(ann.out.contents) \(ann.err.contents)")
    }

    /// A talk that waits says where it waits; one that won't wait is refused without queueing; and
    /// one stopped by a signal (Ctrl-C, SIGTERM) lets go of the floor at once, so the next in the queue talks now rather
    /// than after the interrupted file's length or the server's 5 s silence limit.
    @Test func aQueuedTalkSaysSoAndAnInterruptedOneLetsGoOfTheFloor() async throws {
        let world = try await World()
        defer { world.finish() }
        let ann = try await world.talking("ann", seconds: 8)
        let bob = try Running(["talk"] + world.arguments("bob") + ["--file", world.speech, "--wait", "30", "--push-port", "0"], reaper: world.reaper)
        #expect(await bob.out.wait(for: #"queued: number 1 for the floor \(Ann is talking\); waiting up to 30 s"#, seconds: 20) != nil,
                "\(bob.out.contents) \(bob.err.contents)")
        let cat = try Executables.run("walkie", ["talk"] + world.arguments("cat") + ["--file", world.speech, "--push-port", "0"])
        #expect(cat.status == 6 && cat.err.contains("the floor is busy: Ann is talking; try again, or pass --wait 30 to queue"), "\(cat.err)")
        // SIGTERM rather than SIGINT: a test run started in the background inherits SIGINT ignored,
        // and walkie rightly leaves it so. Both take the same path.
        kill(ann.process.processIdentifier, SIGTERM)
        let interrupted = ContinuousClock.now
        #expect(await ann.process.waitForExit(seconds: 10))
        #expect(ann.process.terminationStatus == 143 && ann.err.contents.contains("interrupted (SIGTERM) after")
                && ann.err.contents.contains("the floor is released"), "\(ann.out.contents) \(ann.err.contents)")
        #expect(await bob.out.wait(for: "sending", seconds: 10) != nil, "\(bob.out.contents) \(bob.err.contents)")
        let handedOver = ContinuousClock.now - interrupted
        #expect(handedOver < .seconds(3), "Bob had the floor \(handedOver) after Ann's SIGTERM")
        #expect(await bob.process.waitForExit(seconds: 20))
        #expect(bob.process.terminationStatus == 0, "\(bob.out.contents) \(bob.err.contents)")
    }

    /// `walkie leave` with squelchd down forgets the channel here and keeps the leave; `walkie status`
    /// shows it, and the next `walkie leave` with squelchd back delivers it. (It used to say "leave
    /// again with squelchd up", which found no saved channel.)
    @Test func aLeaveSquelchdDidNotHearIsDeliveredLater() async throws {
        let world = try await World()
        defer { world.finish() }
        let talk = try Executables.run("walkie", ["talk"] + world.arguments("ann") + ["--file", world.speech, "--push-port", "0"])
        #expect(talk.status == 0, "\(talk.err)")
        #expect(try KillRestartTests().storedMembers(world.channel, data: world.data)["ann"] != nil)
        let state = world.dir + "/ann-state"
        let credentials = ChannelCredentials(host: "127.0.0.1", port: world.server.voicePort, caPath: world.certs + "/ca.pem", token: world.tokens["ann"]!)
        try RestorationStore(directory: state).save(RestorationRecord(channel: world.channel, descriptor: ChannelDescriptor(name: "Ops"),
                                                                      credentials: credentials, pushToken: nil))
        kill(world.server.process.processIdentifier, SIGKILL)
        _ = await world.server.process.waitForExit(seconds: 10)

        let offline = try Executables.run("walkie", ["leave", "--state-dir", state])
        #expect(offline.status == 3 && offline.out.contains("the leave is kept"), "\(offline.out) \(offline.err)")
        let status = try Executables.run("walkie", ["status", "--state-dir", state])
        #expect(status.status == 2 && status.out.contains("not yet heard by the server: the leave of channel \(world.channel)"), "\(status.out)")
        #expect(try KillRestartTests().storedMembers(world.channel, data: world.data)["ann"] != nil)

        world.server = try await KillRestartTests().startServer(data: world.data, certs: world.certs, port: world.server.voicePort, reaper: world.reaper)
        let online = try Executables.run("walkie", ["leave", "--state-dir", state])
        #expect(online.status == 0 && online.out.contains("left channel \(world.channel): the server heard it"), "\(online.out) \(online.err)")
        #expect(try KillRestartTests().storedMembers(world.channel, data: world.data)["ann"] == nil, "the server forgot Ann")
        let after = try Executables.run("walkie", ["status", "--state-dir", state])
        #expect(!after.out.contains("not yet heard"), "\(after.out)")
        let nothing = try Executables.run("walkie", ["leave", "--state-dir", state])
        #expect(nothing.status == 2 && nothing.out.contains("nothing to leave"), "\(nothing.out)")
    }

    /// `walkie status` says what will work from here: with the saved token expired, a join with a new
    /// one (plain `walkie` would only be refused), and for a directory given with --state-dir, commands
    /// that name it (plain `walkie` looks in the default one).
    @Test func statusAdvisesWhatWillWorkForThisDirectory() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("walkie-status-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let authority = try await TokenAuthority.loadOrCreate(in: dir + "/key")
        func saved(_ state: String, ttl: TimeInterval) async throws {
            let token = try await authority.issue(ParticipantClaims(userID: "ann", name: "Ann", channel: UUID(), capabilities: [.talk, .listen],
                                                                    priority: 0, expiresAt: Date().addingTimeInterval(ttl)))
            let credentials = ChannelCredentials(host: "127.0.0.1", port: 7700, caPath: "certs/ca.pem", token: token)
            try RestorationStore(directory: state).save(RestorationRecord(channel: UUID(), descriptor: ChannelDescriptor(name: "Ops"),
                                                                          credentials: credentials, pushToken: nil))
        }
        try await saved(dir + "/valid", ttl: 3_600)
        let valid = try Executables.run("walkie", ["status", "--state-dir", dir + "/valid"])
        #expect(valid.status == 0 && valid.out.contains("run 'walkie --state-dir \(dir)/valid' to rejoin"), "\(valid.out)")
        // A path the shell would split is double-quoted inside the single-quoted command.
        try await saved(dir + "/with space", ttl: 3_600)
        let spaced = try Executables.run("walkie", ["status", "--state-dir", dir + "/with space"])
        #expect(spaced.out.contains("run 'walkie --state-dir \"\(dir)/with space\"' to rejoin"), "\(spaced.out)")
        try await saved(dir + "/expired", ttl: -60)
        let expired = try Executables.run("walkie", ["status", "--state-dir", dir + "/expired"])
        #expect(expired.out.contains("the saved token has expired: rejoin with a new one, 'walkie join --server 127.0.0.1:7700 --token NEW --state-dir"),
                "\(expired.out)")
        #expect(!expired.out.contains("run 'walkie"), "\(expired.out)")
    }

    @Test func everyFailureIsOneLineWithItsExitCode() async throws {
        let world = try await World()
        defer { world.finish() }
        func check(_ arguments: [String], code: Int32, mentions: String, _ comment: Comment) throws {
            let run = try Executables.run("walkie", arguments)
            let lines = run.err.split(separator: "\n")
            #expect(run.status == code, "\(comment): status \(run.status): \(run.err)")
            #expect(lines.count == 1 && run.err.hasPrefix("walkie: ") && run.err.contains(mentions), "\(comment): \(run.err)")
        }
        try check(["talk", "--server", "127.0.0.1:70000", "--token", world.tokens["ann"]!, "--file", world.speech],
                  code: 2, mentions: "the port must be 1-65535", "port out of range")
        // A mistyped command: the one likely meant, not the default command's usage.
        try check(["tlak", "--file", "x.wav"], code: 2, mentions: "'tlak' is not a command; did you mean 'talk'?", "typo")
        // A token for another server (signed by another key): refused as forged.
        let forged = try await TokenAuthority.loadOrCreate(in: world.dir + "/elsewhere").issue(ParticipantClaims(
            userID: "eve", name: "Eve", channel: world.channel, capabilities: [.talk, .listen], expiresAt: Date().addingTimeInterval(3_600)))
        try check(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", forged, "--ca", world.certs + "/ca.pem",
                   "--file", world.speech, "--push-port", "0"], code: 4, mentions: "token", "forged token")
        // A CA that did not sign the server's certificate.
        let strangers = world.dir + "/stranger-certs"
        try Executables.makeDevCertificates(into: strangers)
        try check(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", world.tokens["ann"]!, "--ca", strangers + "/ca.pem",
                   "--file", world.speech, "--push-port", "0"], code: 5, mentions: "--ca", "wrong CA")
        // Nothing listening there.
        try check(["talk", "--server", "127.0.0.1:9", "--token", world.tokens["ann"]!, "--ca", world.certs + "/ca.pem",
                   "--file", world.speech, "--push-port", "0"], code: 3, mentions: "check that it runs", "unreachable")
        // Audio: a missing file, a missing device (checked before the terminal is touched).
        try check(["talk"] + world.arguments("ann") + ["--file", world.dir + "/nope.wav", "--push-port", "0"], code: 7, mentions: "nope.wav", "missing file")
        try check(["talk"] + world.arguments("ann") + ["--file", world.dir, "--push-port", "0"], code: 7, mentions: "is a directory", "a directory")
        // A CA file that isn't one: what it is, once, not a permission problem.
        try check(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", world.tokens["ann"]!, "--ca", world.speech,
                   "--file", world.speech, "--push-port", "0"], code: 5, mentions: "is not a PEM certificate (it isn't text); pass the CA", "CA not PEM")
        // The server's key given as the CA: the file's problem, not "the server sent a certificate".
        try check(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", world.tokens["ann"]!, "--ca", world.certs + "/server.key",
                   "--file", world.speech, "--push-port", "0"], code: 5, mentions: "but no CERTIFICATE: is it a key rather than the CA certificate?",
                  "a key as the CA")
        try check(["join"] + world.arguments("ann") + ["--input", "no-such-device", "--push-port", "0", "--state-dir", world.dir + "/s"],
                  code: 7, mentions: "walkie devices", "missing device")
        // The floor is busy while Ann talks for a while.
        let long = world.dir + "/long.wav"
        let sink = try WAVFileSink(path: long, pacer: VirtualPacer())
        let silence = [Int16](repeating: 300, count: PipelineAudio.periodFrames)
        for _ in 0..<500 { try silence.withUnsafeBufferPointer { _ = try sink.write($0) } }
        try sink.finish()
        let ann = try Running(["talk"] + world.arguments("ann") + ["--file", long, "--push-port", "0"], reaper: world.reaper)
        try await Task.sleep(for: .seconds(2))
        try check(["talk"] + world.arguments("bob") + ["--file", world.speech, "--push-port", "0"], code: 6, mentions: "Ann is talking", "floor busy")
        #expect(await ann.process.waitForExit(seconds: 20) && ann.process.terminationStatus == 0, "\(ann.err.contents)")
        // No channel saved: walkie with no command says how to join.
        try check(["--state-dir", world.dir + "/empty", "--push-port", "0"], code: 2, mentions: "walkie join", "nothing to restore")
        // The screen needs a terminal: said before anything joins, so nothing is saved and Cat is not
        // made a member by a command that could not run.
        let screenless = world.dir + "/screenless"
        let files = ["--input-file", world.speech, "--output-file", world.dir + "/screenless.wav"]
        try check(["join"] + world.arguments("cat") + files + ["--push-port", "0", "--state-dir", screenless], code: 2,
                  mentions: "needs a terminal", "no terminal")
        try check(["join"] + world.arguments("cat") + files + ["--push-port", "0", "--state-dir", screenless, "--key", "bogus"], code: 2,
                  mentions: "not a key name", "bad key")
        #expect(try Executables.run("walkie", ["status", "--state-dir", screenless]).status == 2, "a channel was saved")
        #expect(try KillRestartTests().storedMembers(world.channel, data: world.data)["cat"] == nil, "Cat joined")
        // Seconds beyond what Swift's durations hold: an error, not a crash.
        try check(["talk"] + world.arguments("ann") + ["--file", world.speech, "--wait", "1e300", "--push-port", "0"], code: 2,
                  mentions: "from 0 to 86400", "--wait 1e300")
        try check(["listen"] + world.arguments("bob") + ["--record", world.dir + "/long-listen.wav", "--duration", "1e20", "--push-port", "0"],
                  code: 2, mentions: "at most 43200", "--duration 1e20")
        try check(["join"] + world.arguments("cat") + files + ["--push-port", "0", "--state-dir", screenless, "--max-transmit", "1e19"],
                  code: 2, mentions: "at most 3600", "--max-transmit 1e19")
        // ArgumentParser's own usage errors exit 2 too, as --help promises (not its 64).
        let missing = try Executables.run("walkie", ["talk"] + world.arguments("ann"))
        #expect(missing.status == 2 && missing.err.contains("--file"), "\(missing.status): \(missing.err)")
        #expect(try Executables.run("walkie", ["bogus"]).status == 2)
        // A WAV without samples is not reported as sent.
        let empty = world.dir + "/empty.wav"
        try WAVFileSink(path: empty, pacer: VirtualPacer()).finish()
        try check(["talk"] + world.arguments("ann") + ["--file", empty, "--push-port", "0"], code: 7, mentions: "holds no audio", "empty file")
        // A recording needs a regular file: a device is refused, not replaced by one (as root,
        // /dev/full became a regular file), and nothing joins first.
        try check(["listen"] + world.arguments("bob") + ["--record", "/dev/null", "--push-port", "0"], code: 7,
                  mentions: "not a regular file", "record into a device")
        var status = stat()
        #expect(stat("/dev/null", &status) == 0 && status.st_mode & S_IFMT == S_IFCHR)
        try check(["listen"] + world.arguments("bob") + ["--record", "", "--push-port", "0"], code: 7, mentions: "can't write ''", "empty path")
        // Durations that aren't one: a usage error, not a trap.
        for bad in ["nan", "inf", "0", "-1"] {
            try check(["listen"] + world.arguments("bob") + ["--record", world.dir + "/d.wav", "--duration=\(bad)", "--push-port", "0"],
                      code: 2, mentions: "--duration", "--duration \(bad)")
        }
        try check(["talk"] + world.arguments("ann") + ["--file", world.speech, "--wait=nan", "--push-port", "0"], code: 2,
                  mentions: "--wait", "--wait nan")
        // A file that can be read only once (a pipe) is read once, and sent.
        let piped = try Executables.runShell("cat \(world.speech) | \(Executables.url("walkie").path) talk "
                                             + (world.arguments("ann") + ["--file", "/dev/stdin", "--push-port", "0"]).joined(separator: " ")
                                             + " 2>&1; echo exit $?")
        #expect(piped.contains("sending /dev/stdin") && piped.hasSuffix("exit 0\n"), "\(piped)")
    }

    /// tmux drives the full-screen UI: it has no key-release events, so this is the latch path.
    final class Tmux {
        let socket = "walkie-\(UUID().uuidString.prefix(8))"
        /// Runs tmux through the shell: `Process` waits on a pipe that the forked tmux server inherits and
        /// keeps open, so it would wait forever; `system` waits for the client only.
        func run(_ arguments: [String]) throws -> String {
            let output = FileManager.default.temporaryDirectory.appendingPathComponent("tmux-\(UUID()).out").path
            defer { try? FileManager.default.removeItem(atPath: output) }
            let line = (["tmux", "-L", socket] + arguments).map(Self.quote).joined(separator: " ")
            _ = system(line + " </dev/null >" + Self.quote(output) + " 2>&1")
            return (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        }
        static func quote(_ word: String) -> String { "'" + word.replacingOccurrences(of: "'", with: "'\\''") + "'" }
        func start(_ name: String, _ command: [String]) throws {
            let line = command.map(Self.quote).joined(separator: " ")
            _ = try run(["new-session", "-d", "-s", name, "-x", "90", "-y", "28", line + "; echo EXITED $?; sleep 30"])
        }
        func screen(_ name: String) -> String { (try? run(["capture-pane", "-p", "-t", name])) ?? "" }
        func keys(_ name: String, _ keys: String...) throws { _ = try run(["send-keys", "-t", name] + keys) }
        func wait(_ name: String, for text: String, seconds: Double = 20) async throws -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if screen(name).contains(text) { return true }
                try await Task.sleep(for: .milliseconds(100))
            }
            return false
        }
        /// Presses `b` until the walkie is in the background (its push channel may still be coming up,
        /// and until then `b` keeps it in the foreground); false if it never goes.
        func background(_ name: String) async throws -> Bool {
            for _ in 0 ..< 30 {
                try keys(name, "b")
                if try await wait(name, for: "BACKGROUND", seconds: 1) { return true }
            }
            return false
        }
        func stop() { _ = try? run(["kill-server"]) }
    }

    /// --background goes to the background once a push could wake walkie, and not without one.
    @Test func startingInTheBackgroundNeedsAPushChannel() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        let walkie = Executables.url("walkie").path
        func join(_ user: String, pushPort: Int) -> [String] {
            [walkie, "join"] + world.arguments(user) + ["--state-dir", world.dir + "/state-\(user)", "--push-port", "\(pushPort)",
                                                        "--input-file", world.speech, "--output-file", world.dir + "/\(user).wav", "--background"]
        }
        try tmux.start("bob", join("bob", pushPort: world.pushPort))
        #expect(try await tmux.wait("bob", for: "BACKGROUND"), "\(tmux.screen("bob"))")
        try tmux.start("cat", join("cat", pushPort: 0))
        #expect(try await tmux.wait("cat", for: "pushes are off"), "\(tmux.screen("cat"))")
        #expect(!tmux.screen("cat").contains("BACKGROUND"), "\(tmux.screen("cat"))")
        // A listen-only member's walkie needs no microphone (this machine has none, and no --input-file).
        let dan = try Executables.run("squelchd", ["token", "issue", "--channel", world.channel.uuidString, "--user", "dan", "--name", "Dan",
                                                   "--capability", "listen", "--data-dir", world.data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        try tmux.start("dan", [walkie, "join", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", dan, "--ca", world.certs + "/ca.pem",
                               "--state-dir", world.dir + "/state-dan", "--push-port", "0", "--output-file", world.dir + "/dan.wav",
                               "--input", "no-such-device"])
        #expect(try await tmux.wait("dan", for: "Dan (you)"), "\(tmux.screen("dan"))")
        // Cat is removed by an administrator: the screen ends with what happened and what to do, and
        // the exit code is the token's, as for a token refused at the join. Bob, removed while in the
        // background, learns it from squelchd's leave push: the same (it used to exit 1, "the channel
        // was left", as if he had left it himself).
        let adminKey = try String(contentsOfFile: world.data + "/admin-key", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        for user in ["cat", "bob"] {
            let removed = try Executables.runShell("curl -s -o /dev/null -w '%{http_code}' -X DELETE -H 'Authorization: Bearer \(adminKey)' http://127.0.0.1:\(world.server.adminPort)/v1/channels/\(world.channel.uuidString)/members/\(user)")
            #expect(removed == "204", "\(removed)")
            #expect(try await tmux.wait(user, for: "EXITED 4"), "\(user): \(tmux.screen(user))")
            #expect(tmux.screen(user).contains(user == "cat" ? "ask for a new token" : "squelchd ended your membership"), "\(tmux.screen(user))")
        }
    }

    /// The screen's own lines with more than one thing going on, which the other terminal tests
    /// don't reach: a press taken away by a higher priority says so, and the notice goes once the
    /// channel has been quiet for 5 s (it used to stay over "Idle" until the next key); and in a
    /// full-duplex channel, the speaker line names everyone talking at once.
    @Test func theScreenNamesEveryTalkerAndLetsAnOldFloorNoticeGo() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        try tmux.start("bob", world.join("bob", pushPort: 0, input: try world.speechFile(seconds: 20)))
        #expect(try await tmux.wait("bob", for: "Bob (you)"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("bob", for: "ready"), "\(tmux.screen("bob"))")

        // Half duplex: Bob latches; Boss (priority 200) takes the floor for the 2 s file.
        try tmux.keys("bob", "Space")
        #expect(try await tmux.wait("bob", for: "LATCHED"), "\(tmux.screen("bob"))")
        let boss = try Executables.run("squelchd", ["token", "issue", "--channel", world.channel.uuidString, "--user", "boss", "--name", "Boss",
                                                    "--priority", "200", "--data-dir", world.data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        let bossTalk = try Running(["talk", "--server", "127.0.0.1:\(world.server.voicePort)", "--token", boss, "--ca", world.certs + "/ca.pem",
                                    "--file", world.speech, "--push-port", "0"], reaper: world.reaper)
        #expect(try await tmux.wait("bob", for: "Floor taken away"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("bob", for: "Speaker: Boss"), "\(tmux.screen("bob"))")
        #expect(await bossTalk.process.waitForExit(seconds: 20) && bossTalk.process.terminationStatus == 0, "\(bossTalk.err.contents)")
        #expect(try await tmux.wait("bob", for: "Speaker: —"), "\(tmux.screen("bob"))")
        let quietAt = Date()
        #expect(tmux.screen("bob").contains("Floor taken away"), "the notice outlasts the burst that caused it: \(tmux.screen("bob"))")
        var gone = false
        while !gone, Date().timeIntervalSince(quietAt) < 15 {
            gone = !tmux.screen("bob").contains("Floor taken away")
            if !gone { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(gone, "the notice goes once the channel has been quiet a while: \(tmux.screen("bob"))")
        #expect(Date().timeIntervalSince(quietAt) >= 3, "it stays a few seconds after the channel goes quiet, to be read")

        // Full duplex (changed from the command line while Bob is in the channel): two talk at once,
        // and Bob's speaker line names both.
        let update = try Executables.run("squelchd", ["channel", "update", world.channel.uuidString, "--mode", "full", "--data-dir", world.data])
        #expect(update.status == 0, "\(update.err)")
        #expect(try await tmux.wait("bob", for: "full-duplex"), "the channel's new mode reached the screen: \(tmux.screen("bob"))")
        let ann = try await world.talking("ann", seconds: 6)
        let cat = try await world.talking("cat", seconds: 6)
        var both = false
        let deadline = Date().addingTimeInterval(20)
        while !both, Date() < deadline {
            let screen = tmux.screen("bob")
            both = screen.contains("Speaker: Ann, Cat") || screen.contains("Speaker: Cat, Ann")
            if !both { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(both, "\(tmux.screen("bob"))")
        #expect(await ann.process.waitForExit(seconds: 20) && ann.process.terminationStatus == 0, "\(ann.err.contents)")
        #expect(await cat.process.waitForExit(seconds: 20) && cat.process.terminationStatus == 0, "\(cat.err.contents)")
        #expect(try await tmux.wait("bob", for: "Speaker: —"), "\(tmux.screen("bob"))")

        // The channel is deleted: the screen ends with squelchd's own words for it (it said only
        // "removed you, revoked your token or deleted the channel"), and the token's exit code.
        let deleted = try Executables.run("squelchd", ["channel", "delete", world.channel.uuidString, "--yes", "--data-dir", world.data])
        #expect(deleted.status == 0, "\(deleted.err)")
        #expect(try await tmux.wait("bob", for: "EXITED 4"), "\(tmux.screen("bob"))")
        #expect(tmux.screen("bob").contains("deleted by an administrator"), "\(tmux.screen("bob"))")
    }

    @Test func twoTerminalsTalkThroughTheServerAndAKilledWalkieRestores() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        let walkie = Executables.url("walkie").path
        // The microphone outlasts every latch here: once its file ends, walkie releases the floor (the
        // end of this test checks that with a short file).
        let longSpeech = try world.speechFile(seconds: 20)
        func join(_ user: String) -> [String] { world.join(user, pushPort: world.pushPort, input: longSpeech) }
        try tmux.start("ann", join("ann"))
        try tmux.start("bob", join("bob"))
        // Each sees the channel, its readiness and both members.
        #expect(try await tmux.wait("bob", for: "Ann"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("ann", for: "Bob"), "\(tmux.screen("ann"))")
        #expect(tmux.screen("bob").contains("Ops"))
        // A tap of Space latches (no repeats follow): Ann transmits, Bob sees her as the speaker.
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("ann", for: "LATCHED"), "\(tmux.screen("ann"))")
        #expect(try await tmux.wait("bob", for: "Speaker: Ann"), "\(tmux.screen("bob"))")
        #expect(tmux.screen("bob").contains("RECEIVING"))
        try await Task.sleep(for: .seconds(1))
        // The next press unlatches; Bob's speaker clears.
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("bob", for: "Speaker: —"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("ann", for: "Idle"), "\(tmux.screen("ann"))")

        // b closes Bob's voice connection; Ann's next burst wakes him with a push, and he hears her.
        try tmux.keys("bob", "b")
        #expect(try await tmux.wait("bob", for: "BACKGROUND"), "\(tmux.screen("bob"))")
        #expect(await eventuallyTrue { let screen = tmux.screen("ann"); return screen.contains("offline") || screen.contains("reconnecting") },
                "Ann sees Bob's connection go: \(tmux.screen("ann"))")
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("ann", for: "LATCHED"), "\(tmux.screen("ann"))")
        let pushes = try Executables.runShell("curl -s http://127.0.0.1:\(world.pushPort)/v1/pushes")
        #expect(try await tmux.wait("bob", for: "Speaker: Ann"), "woken by the push: \(tmux.screen("bob")) pushes: \(pushes) \(world.server.log.contents.suffix(2000))")
        #expect(tmux.screen("bob").contains("RECEIVING"))
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("bob", for: "Speaker: —"), "\(tmux.screen("bob"))")

        // squelchd restarts (an upgrade): both walkies come back, the connection error gives way, and
        // Bob's push channel (the simulator inside squelchd) is registered again, so that in the
        // background he is still woken.
        world.server.process.terminate()
        world.server.process.waitUntilExit()
        #expect(try await tmux.wait("bob", for: "connecting"), "\(tmux.screen("bob"))")
        // A press while the server is away is held and said, not dropped in silence; when it can't
        // reach the server within its wait, the line says so and the key is free again.
        #expect(try await tmux.wait("ann", for: "connecting"), "\(tmux.screen("ann"))")
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("ann", for: "Not connected: talking as soon as the channel is back"), "\(tmux.screen("ann"))")
        #expect(try await tmux.wait("ann", for: "could not be rejoined"), "\(tmux.screen("ann"))")
        // (Ann's next tap, after the restart below, must talk rather than unlatch this one.)
        world.server = try await KillRestartTests().startServer(
            data: world.data, certs: world.certs, port: world.server.voicePort, adminPort: world.server.adminPort,
            extraArguments: ["--apns-simulator-control-port", "\(world.pushPort)"], reaper: world.reaper)
        // Their push channel (the simulator) comes back too, and its notice may follow and replace
        // the reconnection's on the one status line; either way the outage line is gone.
        for user in ["bob", "ann"] {
            #expect(await eventuallyTrue {
                let screen = tmux.screen(user)
                return screen.contains("ready") && (screen.contains("Connected to squelchd again") || screen.contains("push delivery is back"))
            }, "\(tmux.screen(user))")
        }
        // The saved channel carries the server's name for it, not the placeholder of the join.
        let status = try Executables.run("walkie", ["status", "--state-dir", world.dir + "/state-ann"])
        #expect(status.out.contains("channel   Ops ("), "\(status.out)")
        #expect(status.out.contains("open in a running walkie (pid "), "\(status.out)")
        #expect(try await tmux.background("bob"), "no push channel after the restart: \(tmux.screen("bob"))")
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("bob", for: "Speaker: Ann"), "woken after the restart: \(tmux.screen("bob"))")
        try tmux.keys("ann", "Space")
        #expect(try await tmux.wait("bob", for: "Speaker: —"), "\(tmux.screen("bob"))")

        // kill -9 Bob's walkie; 'walkie' with no command restores his channel.
        let pid = try tmux.run(["display-message", "-p", "-t", "bob", "#{pane_pid}"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let walkiePid = try Executables.runShell("pgrep -P \(pid) -f 'walkie join'").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(!walkiePid.isEmpty)
        kill(pid_t(walkiePid) ?? 0, SIGKILL)
        #expect(try await tmux.wait("bob", for: "EXITED"))
        _ = try tmux.run(["kill-session", "-t", "bob"])
        // Without --push-port: the restore wakes by push through the port the join was given (it
        // used to fall back to 2198, where nothing listens here, and could not go to the background).
        try tmux.start("bob2", [walkie, "--state-dir", world.dir + "/state-bob",
                                "--input-file", world.speech, "--output-file", world.dir + "/bob2-heard.wav"])
        #expect(try await tmux.wait("bob2", for: "Ann"), "\(tmux.screen("bob2"))")
        #expect(try await tmux.wait("bob2", for: "ready"), "\(tmux.screen("bob2"))")
        // (The killed walkie's lock on the state directory went with it.) A `walkie leave` beside this
        // one would make squelchd forget Bob while this walkie, pushed aside by the leave's connection,
        // took the channel back at its next press: it is refused while this one runs.
        let leave = try Executables.run("walkie", ["leave", "--state-dir", world.dir + "/state-bob"])
        #expect(leave.status == 1 && leave.err.contains("has this channel open") && leave.err.contains("pid "), "\(leave.err)")
        #expect(!tmux.screen("bob2").contains("stepped aside"), "\(tmux.screen("bob2"))")
        #expect(try await tmux.background("bob2"), "the restored walkie has no push channel: \(tmux.screen("bob2"))")
        try tmux.keys("bob2", "b")
        #expect(try await tmux.wait("bob2", for: "Connected to squelchd again"), "back in the foreground: \(tmux.screen("bob2"))")
        // Bob's microphone is the 2 s file. Latched past its end, walkie releases the floor itself
        // (rather than hold it in silence for 5 s), and the next tap talks again instead of only
        // unlatching a transmission that is over.
        try tmux.keys("bob2", "Space")
        #expect(try await tmux.wait("bob2", for: "LATCHED"), "\(tmux.screen("bob2"))")
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "\(tmux.screen("ann"))")
        let latchedAt = ContinuousClock.now
        #expect(try await tmux.wait("bob2", for: "input file ended"), "\(tmux.screen("bob2"))")
        #expect(try await tmux.wait("ann", for: "Speaker: —"), "\(tmux.screen("ann"))")
        #expect(ContinuousClock.now - latchedAt < .seconds(4.5), "released when the file ended, not by the server's 5 s silence limit")
        #expect(try await tmux.wait("bob2", for: "Idle"), "\(tmux.screen("bob2"))")
        try tmux.keys("bob2", "Space")
        #expect(try await tmux.wait("bob2", for: "LATCHED"), "one tap talks again: \(tmux.screen("bob2"))")
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "\(tmux.screen("ann"))")
        #expect(try await tmux.wait("bob2", for: "Idle"), "the file ends again: \(tmux.screen("bob2"))")

        // A one-shot as Bob pushes this walkie aside (one connection per member): it stays, with its
        // channel, and a press takes the channel back and talks.
        let oneShot = try Executables.run("walkie", ["talk"] + world.arguments("bob") + ["--file", world.speech, "--push-port", "0"])
        #expect(oneShot.status == 0, "\(oneShot.err)")
        #expect(try await tmux.wait("bob2", for: "BACKGROUND"), "\(tmux.screen("bob2"))")
        #expect(!tmux.screen("bob2").contains("EXITED"), "\(tmux.screen("bob2"))")
        #expect(try await tmux.wait("ann", for: "Speaker: —"), "the one-shot's burst is over: \(tmux.screen("ann"))")
        try tmux.keys("bob2", "Space")
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "the press took the channel back: \(tmux.screen("bob2"))")
        try tmux.keys("bob2", "q")
        #expect(try await tmux.wait("bob2", for: "EXITED 0"), "\(tmux.screen("bob2"))")
        // Ann's walkie is ended by SIGTERM (a service manager, `kill`): it quits as `q` would, and
        // what she heard is a complete WAV file.
        let annPane = try tmux.run(["display-message", "-p", "-t", "ann", "#{pane_pid}"]).trimmingCharacters(in: .whitespacesAndNewlines)
        let annPid = try Executables.runShell("pgrep -P \(annPane) -f 'walkie join'").trimmingCharacters(in: .whitespacesAndNewlines)
        kill(pid_t(annPid) ?? 0, SIGTERM)
        #expect(try await tmux.wait("ann", for: "EXITED 0"), "\(tmux.screen("ann"))")
        let heard = try Self.envelope(world.dir + "/ann-heard.wav")
        #expect(heard.filter { $0 > 0.01 }.count > 50, "Bob's bursts are in Ann's file: \(heard.count) periods")
        // Bob's walkie has quit: the leave goes through now.
        let left = try Executables.run("walkie", ["leave", "--state-dir", world.dir + "/state-bob"])
        #expect(left.status == 0 && left.out.contains("left the channel"), "\(left.out) \(left.err)")
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
