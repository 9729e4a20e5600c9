import Audio
import Foundation
import ParticipantClaims
import ParticipantTokens
import PTTClient
import Testing

extension WalkieTests {
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
}
