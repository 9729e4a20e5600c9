import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import Opus
import WireNIO

/// A dedicated thread that runs until asked to stop: the capture and playout loops block on their
/// devices, so they can't live on the cooperative pool.
final class MediaThread: Sendable {
    private struct Flags { var running = false; var stopRequested = false }
    private let flags = NIOLockedValueBox(Flags())
    let name: String

    init(name: String) { self.name = name }

    var isRunning: Bool { flags.withLockedValue { $0.running } }
    var stopRequested: Bool { flags.withLockedValue { $0.stopRequested } }

    /// Starts `body` on a new thread unless one is running; false if it was.
    @discardableResult
    func start(_ body: @escaping @Sendable () -> Void) -> Bool {
        let started = flags.withLockedValue { flags -> Bool in
            guard !flags.running else { return false }
            flags = Flags(running: true, stopRequested: false)
            return true
        }
        guard started else { return false }
        let thread = Thread { [flags] in
            body()
            flags.withLockedValue { $0.running = false }
        }
        thread.name = name
        thread.start()
        return true
    }

    /// Asks the loop to stop and returns once it has (it checks `stopRequested` once per frame).
    func stop() async {
        let running = flags.withLockedValue { flags -> Bool in
            flags.stopRequested = true
            return flags.running
        }
        guard running else { return }
        while isRunning { try? await Task.sleep(for: .milliseconds(2)) }
    }
}
