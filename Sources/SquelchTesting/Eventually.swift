import Foundation

/// Polls `condition` every `every` until it holds or `seconds` have passed; whether it held. For
/// tests that wait on another task, process or socket, where no event says "now".
public func eventually(seconds: Double = 10, every interval: Duration = .milliseconds(10),
                       _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    repeat {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    } while Date() < deadline
    return false
}
