#if canImport(Glibc)
import Glibc
#endif
import Foundation
import InputDevices
import Synchronization
import Testing

/// A FIFO stands in for the device (this machine has no /dev/input and no /dev/uinput): the kernel's
/// `input_event` records are written into it, and closing it is the unplug.
struct PushToTalkButtonTests {
    final class Seen: Sendable {
        let log = Mutex<[String]>([])
        func add(_ line: String) { log.withLock { $0.append(line) } }
        var lines: [String] { log.withLock { $0 } }
        /// Waits until `line` has been seen `times` times in all.
        func wait(for line: String, times: Int = 1, seconds: Double = 10) async -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if lines.filter({ $0 == line }).count >= times { return true }
                try? await Task.sleep(for: .milliseconds(20))
            }
            return false
        }
    }

    struct NoReader: Error { var path: String }

    /// Opens the FIFO for writing once its reader has it open.
    static func writer(_ path: String) async throws -> Int32 {
        for _ in 0 ..< 200 {
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            if fd >= 0 { return fd }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw NoReader(path: path)
    }

    static func send(_ fd: Int32, _ events: [InputEvent]) {
        let bytes = events.flatMap(\.bytes)
        #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count)
    }

    static func key(_ code: UInt16, _ value: Int32) -> [InputEvent] {
        [InputEvent(type: 1, code: code, value: value), InputEvent(type: 0, code: 0, value: 0)]
    }

    @Test func pressesReleasesAndAnUnplugWhileHeld() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("ptt-\(UUID())").path
        #expect(mkfifo(path, 0o600) == 0)
        defer { unlink(path) }
        try PushToTalkButton.check(path)
        let seen = Seen()
        let button = PushToTalkButton(path: path, key: KeyCode(name: "KEY_F13"),
                                      onPress: { seen.add($0 ? "down" : "up") },
                                      onStatus: { status in
                                          switch status {
                                          case .open(let name): seen.add("open \(name)")
                                          case .lost(let reason): seen.add("lost \(reason)")
                                          }
                                      })
        button.start()
        defer { button.stop() }
        #expect(await seen.wait(for: "open \(path)"))
        var fd = try await Self.writer(path)
        Self.send(fd, Self.key(57, 1) + Self.key(57, 0))  // Space: not the key
        Self.send(fd, Self.key(183, 1) + Self.key(183, 2) + Self.key(183, 2))
        #expect(await seen.wait(for: "down"))
        Self.send(fd, Self.key(183, 0))
        #expect(await seen.wait(for: "up"))
        #expect(seen.lines == ["open \(path)", "down", "up"], "Space and the repeats did nothing")

        // Held down when the device goes: released, and said; gone from its path, it stays lost.
        Self.send(fd, Self.key(183, 1))
        #expect(await seen.wait(for: "down", times: 2))
        unlink(path)
        close(fd)
        #expect(await seen.wait(for: "lost disconnected"))
        #expect(seen.lines.suffix(2) == ["up", "lost disconnected"], "\(seen.lines)")
        #expect(await seen.wait(for: "lost not connected"))

        // Plugged in again: found within about a second, and it works.
        #expect(mkfifo(path, 0o600) == 0)
        #expect(await seen.wait(for: "open \(path)", times: 2))
        fd = try await Self.writer(path)
        defer { close(fd) }
        Self.send(fd, Self.key(183, 1))
        #expect(await seen.wait(for: "down", times: 3))
        button.stop()
        // Stopped while down: the press ends with it.
        #expect(await seen.wait(for: "up", times: 3) && seen.lines.last == "up", "\(seen.lines)")
    }

    @Test func aWrongPathIsRefusedBeforeAnythingStarts() throws {
        #expect(throws: InputDeviceError.self) { try PushToTalkButton.check("/dev/input/event99") }
        do {
            try PushToTalkButton.check("/dev/input/event99")
        } catch {
            #expect(error.description.contains("No such file") && error.description.contains("walkie devices"), "\(error)")
        }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("ptt-\(UUID())").path
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        defer { unlink(file) }
        do {
            try PushToTalkButton.check(file)
            Issue.record("a regular file was taken for a device")
        } catch {
            #expect(error.description.contains("is not an input device"), "\(error)")
        }
    }
}
