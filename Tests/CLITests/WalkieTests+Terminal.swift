import Audio
import Foundation
import ParticipantClaims
import ParticipantTokens
import PTTClient
import Testing

extension WalkieTests {
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
