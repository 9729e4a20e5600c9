import Audio
import Foundation

/// An audio device's state after it failed: a USB headset unplugged, a Bluetooth one out of range, a
/// device another program took. Devices come and go; a file that fails does not come back, and stops.
public enum AudioDeviceStatus: Sendable, Equatable {
    /// Gone or failing, and why; opened again every second.
    case lost(String)
    /// Open and working again.
    case restored
}

/// How the media threads treat a failing device: what counts as one, and when a lost one is tried
/// again. One per device, on its thread.
struct AudioDeviceRetry {
    /// A second between attempts, as a radio looks for its accessory: soon enough to be heard again
    /// within a sentence, and a failed open (which can block ALSA for a moment) stays rare.
    static let intervalNanoseconds: UInt64 = 1_000_000_000
    private var dueAt: UInt64 = 0

    /// The device was lost (or an attempt failed) at `now`: the next attempt is a second later.
    mutating func lost(at now: UInt64) { dueAt = now + Self.intervalNanoseconds }

    /// Opens the device if an attempt is due; nil when none is, or when it failed.
    mutating func reopen<Device>(at now: UInt64, _ open: () throws -> Device) -> Device? {
        guard now >= dueAt else { return nil }
        if let device = try? open() { return device }
        lost(at: now)
        return nil
    }

    /// Whether `error` is a device's (which may come back) rather than a file's (which won't).
    static func isDevice(_ error: any Error) -> Bool {
        switch error as? AudioError {
        case .device?, .deviceFailed?: true
        default: false
        }
    }
}

/// The receiver's output as a device that may go and come back: the sink while it works; while it
/// is lost, an attempt to open it every second, and the playout loop paced by the clock instead of
/// the device's blocking writes.
struct OutputDevice {
    let open: @Sendable () throws -> any AudioSink
    let onEvent: @Sendable (Receiver.ReceiverEvent) -> Void
    private var sink: (any AudioSink)?
    private var retry = AudioDeviceRetry()
    /// When the frame after this one is due, while there is no device to pace the loop.
    private var clock: UInt64 = 0
    static let frameNanoseconds: UInt64 = 20_000_000

    init(open: @escaping @Sendable () throws -> any AudioSink, onEvent: @escaping @Sendable (Receiver.ReceiverEvent) -> Void) {
        self.open = open
        self.onEvent = onEvent
    }

    /// Opens the output; false when playout can't start at all (a file that can't be written).
    mutating func openAtStart() -> Bool {
        do {
            sink = try open()
        } catch where AudioDeviceRetry.isDevice(error) {
            lose(error, now: monotonicNanoseconds())
        } catch {
            onEvent(.outputFailed("could not open the audio output: \(error); check --output, or use --output-file"))
            return false
        }
        return true
    }

    /// Plays one frame of two periods, or paces it while the device is lost; false when playout must
    /// stop (a file failed).
    mutating func play(_ frame: UnsafeBufferPointer<Int16>, period: Int, now: UInt64) -> Bool {
        if sink == nil, let reopened = retry.reopen(at: now, open) {
            sink = reopened
            onEvent(.outputDevice(.restored))
        }
        guard let device = sink else {
            clock = max(clock + Self.frameNanoseconds, now - 5 * Self.frameNanoseconds)
            if clock > now { usleep(UInt32((clock - now) / 1000)) }
            return true
        }
        do {
            try device.write(UnsafeBufferPointer(rebasing: frame[0..<period]))
            try device.write(UnsafeBufferPointer(rebasing: frame[period...]))
            return true
        } catch where AudioDeviceRetry.isDevice(error) {
            try? device.finish()  // releases it; what it still held is lost with it
            sink = nil
            lose(error, now: now)
            return true
        } catch {
            onEvent(.outputFailed("the audio output failed: \(error)"))
            return false
        }
    }

    /// Plays out what is queued and completes the output (a WAV file gets its sizes).
    mutating func finish() {
        guard let sink else { return }
        do { try sink.finish() } catch { onEvent(.outputFailed("could not finish the audio output: \(error)")) }
    }

    private mutating func lose(_ error: any Error, now: UInt64) {
        onEvent(.outputDevice(.lost("\(error)")))
        retry.lost(at: now)
        clock = now
    }
}
