import Foundation

/// A test or one of its waits ran past its time.
public struct TimedOut: Error, CustomStringConvertible {
    public var description: String
    public init(description: String) { self.description = description }
}

/// Fails if `body` takes longer than `seconds`. Everything the tests await is cancellable or
/// completes on its own, so cancelling `body` ends it.
public func withTimeout(_ seconds: Double, _ body: @escaping @Sendable () async throws -> Void) async throws {
    try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask { try await body() }
        tasks.addTask {
            try await Task.sleep(for: .seconds(seconds))
            throw TimedOut(description: "test still running after \(seconds) s")
        }
        try await tasks.next()
        tasks.cancelAll()
    }
}
