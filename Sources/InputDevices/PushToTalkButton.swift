#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

/// Why a push-to-talk device can't be used at all: said before walkie joins anything.
public struct InputDeviceError: Error, CustomStringConvertible {
    public var description: String
}

/// Reads a push-to-talk button from a Linux input device (evdev: a USB PTT switch, a foot pedal, a
/// headset's button, or a key of a keyboard) on a thread of its own, whatever window has the focus.
///
/// A device that goes away (unplugged, a Bluetooth headset out of range) is opened again every second
/// until it is back; a button held down at that moment counts as released, so the floor is not held
/// by a button that no longer exists.
public final class PushToTalkButton: Sendable {
    public enum Status: Equatable, Sendable {
        /// Reading; `name` is the device's own (or the path, for a FIFO).
        case open(name: String)
        /// Not readable now, and why; tried again every second.
        case lost(reason: String)
    }

    public let path: String
    public let key: KeyCode?
    private let onPress: @Sendable (Bool) -> Void
    private let onStatus: @Sendable (Status) -> Void
    private let stopped = Atomic<Bool>(false)
    /// How long the reader sleeps in `poll` between looks at `stopped`.
    private static let pollMilliseconds: Int32 = 100
    static let reopenNanoseconds: UInt64 = 1_000_000_000

    /// - Parameters:
    ///   - key: nil: any key of the device (a pedal or a PTT switch is nothing but its button).
    ///   - onPress: true when the button goes down, false when it goes up; on the reader's thread.
    ///   - onStatus: each change of the device's state; on the reader's thread.
    public init(path: String, key: KeyCode?, onPress: @escaping @Sendable (Bool) -> Void,
                onStatus: @escaping @Sendable (Status) -> Void) {
        self.path = path
        self.key = key
        self.onPress = onPress
        self.onStatus = onStatus
    }

    /// Checks that `path` can be read as an input device now: a missing or forbidden device at the
    /// start is a mistake in the command (or a missing group), not an unplugged device.
    public static func check(_ path: String) throws(InputDeviceError) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw InputDeviceError(description: "--ptt-device \(path): \(String(cString: strerror(errno))); 'walkie devices' lists the input devices with keys")
        }
        let kind = info.st_mode & S_IFMT
        guard kind == S_IFCHR || kind == S_IFIFO else {
            throw InputDeviceError(description: "--ptt-device \(path) is not an input device (a /dev/input/event node); 'walkie devices' lists them")
        }
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let why = String(cString: strerror(errno))
            if errno == EACCES || errno == EPERM {
                throw InputDeviceError(description: "--ptt-device \(path): \(why); add yourself to the group that owns it ('sudo usermod -aG input $USER', then log in again) or give the device a udev rule")
            }
            throw InputDeviceError(description: "--ptt-device \(path): \(why)")
        }
        close(fd)
    }

    public func start() {
        let thread = Thread { [self] in run() }
        thread.name = "walkie-ptt-button"
        thread.start()
    }

    /// Stops reading within a tenth of a second; a button held down is released first.
    public func stop() { stopped.store(true, ordering: .releasing) }

    private var isStopped: Bool { stopped.load(ordering: .acquiring) }

    private func run() {
        var events = InputEventStream()
        var button = PushToTalkKeyState(key: key)
        var buffer = [UInt8](repeating: 0, count: InputEvent.size * 64)
        var lastStatus: Status?
        func report(_ status: Status) {
            guard status != lastStatus else { return }
            lastStatus = status
            onStatus(status)
        }
        func lose(_ fd: inout Int32, _ reason: String) {
            close(fd)
            fd = -1
            events.reset()
            if button.releaseAll() { onPress(false) }
            report(.lost(reason: reason))
            pause(Self.reopenNanoseconds)
        }
        var fd: Int32 = -1
        while !isStopped {
            if fd < 0 {
                fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
                guard fd >= 0 else {
                    let reason = errno == ENOENT || errno == ENODEV ? "not connected" : String(cString: strerror(errno))
                    report(.lost(reason: reason))
                    pause(Self.reopenNanoseconds)
                    continue
                }
                report(.open(name: InputDeviceList.name(of: path) ?? path))
            }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Self.pollMilliseconds)
            guard ready > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count > 0 {
                for event in buffer.withUnsafeBytes({ events.feed(UnsafeRawBufferPointer(rebasing: $0[..<count])) }) {
                    if let pressed = button.apply(event) { onPress(pressed) }
                }
            } else if count == 0 {
                // A FIFO whose writer went away; a device never reads 0.
                lose(&fd, "disconnected")
            } else if errno != EAGAIN && errno != EINTR {
                lose(&fd, errno == ENODEV ? "unplugged" : String(cString: strerror(errno)))
            }
        }
        if fd >= 0 { close(fd) }
        if button.releaseAll() { onPress(false) }
    }

    /// Sleeps up to `nanoseconds`, waking early when stopped.
    private func pause(_ nanoseconds: UInt64) {
        var left = nanoseconds
        while left > 0, !isStopped {
            let step = min(left, UInt64(Self.pollMilliseconds) * 1_000_000)
            usleep(UInt32(step / 1000))
            left -= step
        }
    }
}
