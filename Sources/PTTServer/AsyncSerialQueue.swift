import NIOConcurrencyHelpers

/// Runs async operations one at a time, in the order they were submitted, each to its end (awaits
/// included). An actor would not do: its methods interleave at every `await`.
///
/// squelchd brings its hub in line with the store from two places: the admin API's hooks, right
/// after a change, and the once-a-second revision poll, which reads every channel and applies what
/// it read. Each is a read of the store followed by an apply on the event loop; if one ran inside
/// the other's gap, an older read could be applied last, undoing a newer change until the next poll.
final class AsyncSerialQueue: Sendable {
    private let tail = NIOLockedValueBox<Task<Void, Never>?>(nil)

    func run<T: Sendable>(_ operation: @escaping @Sendable () async -> T) async -> T {
        let task = tail.withLockedValue { tail in
            let previous = tail
            let task = Task<T, Never> {
                await previous?.value
                return await operation()
            }
            tail = Task { _ = await task.value }
            return task
        }
        return await task.value
    }

    func run<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await run { () async -> Result<T, any Error> in
            do { return .success(try await operation()) } catch { return .failure(error) }
        }.get()
    }
}
