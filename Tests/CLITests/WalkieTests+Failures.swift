import Audio
import Foundation
import ParticipantClaims
import ParticipantTokens
import PTTClient
import Testing

extension WalkieTests {
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
            // The warning about a token on the command line is a line of its own before the failure.
            let lines = run.err.split(separator: "\n").filter { !$0.hasPrefix("walkie: warning: a token on the command line") }
            #expect(run.status == code, "\(comment): status \(run.status): \(run.err)")
            #expect(lines.count == 1 && lines[0].hasPrefix("walkie: ") && run.err.contains(mentions), "\(comment): \(run.err)")
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
}
