import Foundation
import Testing

extension WalkieTests {
    /// --suspend-after: an idle walkie closes its voice connection, a push wakes it for a call, and
    /// once the call is over it goes back to sleep; a usage mistake is refused at once.
    @Test func anIdleWalkieSleepsAndSleepsAgainAfterTheCallAPushWokeItFor() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        try tmux.start("bob", world.join("bob", pushPort: world.pushPort, input: world.speech) + ["--suspend-after", "2"])
        #expect(try await tmux.wait("bob", for: "Bob (you)"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("bob", for: "BACKGROUND"), "asleep after 2 s of quiet: \(tmux.screen("bob"))")
        #expect(tmux.screen("bob").contains("Asleep after 2 s of quiet"), "\(tmux.screen("bob"))")

        let ann = try await world.talking("ann", seconds: 3)
        #expect(try await tmux.wait("bob", for: "RECEIVING"), "woken by the push, and hearing Ann: \(tmux.screen("bob"))")
        #expect(await ann.process.waitForExit(seconds: 20) && ann.process.terminationStatus == 0, "\(ann.err.contents)")
        let endedAt = Date()
        #expect(try await tmux.wait("bob", for: "BACKGROUND"), "asleep again after the call: \(tmux.screen("bob"))")
        #expect(Date().timeIntervalSince(endedAt) >= 1.5, "not before 2 s of quiet")

        try tmux.start("bad", world.join("cat", pushPort: 0, input: world.speech) + ["--suspend-after", "0"])
        #expect(try await tmux.wait("bad", for: "EXITED 2"), "\(tmux.screen("bad"))")
        #expect(tmux.screen("bad").contains("--suspend-after 0.0 is not a number of seconds over 0"), "\(tmux.screen("bad"))")
    }
}
