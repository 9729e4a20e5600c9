#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Audio
import InputDevices
import SquelchTesting
import Testing

extension WalkieTests {
    /// A hardware button, `--ptt-device`: a FIFO stands in for /dev/input/eventN (this machine has
    /// none, and no /dev/uinput to make one), fed the kernel's `input_event` records. Bob talks with
    /// it, also with walkie in the background; pulled out while held, it lets go of the floor, and it
    /// works again once it is back.
    @Test func aHardwareButtonTalksAndComesBackAfterAnUnplug() async throws {
        let world = try await World()
        defer { world.finish() }
        let fifo = world.dir + "/ptt-button"
        #expect(mkfifo(fifo, 0o600) == 0)
        let tmux = Tmux()
        defer { tmux.stop() }
        let speech = try world.speechFile(seconds: 20)
        try tmux.start("ann", world.join("ann", pushPort: world.pushPort, input: speech))
        try tmux.start("bob", world.join("bob", pushPort: world.pushPort, input: speech) + ["--ptt-device", fifo, "--ptt-key", "KEY_F13"])
        #expect(try await tmux.wait("bob", for: "Ann"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("ann", for: "Bob"), "\(tmux.screen("ann"))")
        var button = try await Self.plugIn(fifo)

        // Another key of the device does nothing; F13 down talks, up stops.
        Self.press(button, code: 57, down: true)
        Self.press(button, code: 57, down: false)
        Self.press(button, code: 183, down: true)
        #expect(try await tmux.wait("bob", for: "TRANSMITTING"), "\(tmux.screen("bob"))")
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "\(tmux.screen("ann"))")
        Self.press(button, code: 183, down: false)
        #expect(try await tmux.wait("ann", for: "Speaker: —"), "\(tmux.screen("ann"))")
        #expect(try await tmux.wait("bob", for: "Idle"), "\(tmux.screen("bob"))")

        // In the background (voice connection closed), the button still talks, as a hands-free
        // accessory does on a phone: walkie reconnects and asks for the floor.
        #expect(try await tmux.background("bob"), "\(tmux.screen("bob"))")
        Self.press(button, code: 183, down: true)
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "talking from the background: \(tmux.screen("bob"))")

        // Pulled out while held: the floor is let go, and the screen says the button is gone.
        unlink(fifo)
        close(button)
        #expect(try await tmux.wait("ann", for: "Speaker: —"), "\(tmux.screen("ann"))")
        #expect(try await tmux.wait("bob", for: "PTT button not connected: trying it again every second"), "\(tmux.screen("bob"))")
        #expect(!tmux.screen("bob").contains("EXITED"), "\(tmux.screen("bob"))")

        // Plugged in again: found within a second or so, and it talks.
        #expect(mkfifo(fifo, 0o600) == 0)
        button = try await Self.plugIn(fifo)
        defer { close(button) }
        #expect(try await tmux.wait("bob", for: "PTT button ready (KEY_F13):"), "\(tmux.screen("bob"))")
        Self.press(button, code: 183, down: true)
        #expect(try await tmux.wait("ann", for: "Speaker: Bob"), "\(tmux.screen("ann"))")
        Self.press(button, code: 183, down: false)
        #expect(try await tmux.wait("ann", for: "Speaker: —"), "\(tmux.screen("ann"))")
        try tmux.keys("bob", "q")
        #expect(try await tmux.wait("bob", for: "EXITED 0"), "\(tmux.screen("bob"))")
        try tmux.keys("ann", "q")
        #expect(try await tmux.wait("ann", for: "EXITED 0"), "\(tmux.screen("ann"))")
        // The floor's tones, in the speaker files: Bob heard the talk-permit tone at each of his three
        // grants, Ann the end of each of his bursts (two or three: the one cut by the unplug may end
        // by the server's silence limit, with no end marker to play out).
        let bobHeard = try WAVAudio.read(path: world.dir + "/bob-heard.wav").pipelineSamples(resampler: Resampler())
        let annHeard = try WAVAudio.read(path: world.dir + "/ann-heard.wav").pipelineSamples(resampler: Resampler())
        #expect(TonePresence.windows(of: 1_200, in: bobHeard).count >= 6, "talk-permit tones in Bob's speaker")
        #expect(TonePresence.windows(of: 1_600, in: annHeard).count >= 6, "end-of-burst tones in Ann's speaker")
    }

    /// A mistyped device or key is a usage error before anything joins.
    @Test func aWrongButtonDeviceOrKeyIsRefusedAtOnce() async throws {
        let world = try await World()
        defer { world.finish() }
        let tmux = Tmux()
        defer { tmux.stop() }
        try tmux.start("dev", world.join("bob", pushPort: 0, input: world.speech) + ["--ptt-device", "/dev/input/event99"])
        #expect(try await tmux.wait("dev", for: "EXITED 2"), "\(tmux.screen("dev"))")
        #expect(tmux.screen("dev").contains("walkie devices"), "\(tmux.screen("dev"))")
        try tmux.start("key", world.join("bob", pushPort: 0, input: world.speech) + ["--ptt-device", world.speech, "--ptt-key", "KEY_BOGUS"])
        #expect(try await tmux.wait("key", for: "EXITED 2"), "\(tmux.screen("key"))")
        #expect(tmux.screen("key").contains("--ptt-key KEY_BOGUS is not a key name"), "\(tmux.screen("key"))")
        #expect(!FileManager.default.fileExists(atPath: world.dir + "/state-bob/channel.json"), "nothing was saved")
    }

    /// Opens the FIFO for writing once walkie has it open for reading: the device is plugged in.
    static func plugIn(_ path: String) async throws -> Int32 {
        for _ in 0 ..< 500 {
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            if fd >= 0 { return fd }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("walkie never opened \(path)")
        return -1
    }

    static func press(_ fd: Int32, code: UInt16, down: Bool) {
        let bytes = [InputEvent(type: InputEvent.key, code: code, value: down ? 1 : 0), InputEvent(type: 0, code: 0, value: 0)].flatMap(\.bytes)
        #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count)
    }
}
