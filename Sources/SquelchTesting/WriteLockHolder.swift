import Dispatch
import Foundation
import GRDB
import Synchronization

/// A second, real SQLite connection that holds the database's write lock until told to let go, as
/// another process could (the `squelchd channel` CLI in a long transaction, a backup tool). The
/// store's statements then really fail with SQLITE_BUSY once their busy timeout passes.
public final class WriteLockHolder: Sendable {
    private let release = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)

    public init(path: String) throws {
        let queue = try DatabaseQueue(path: path)
        let locked = DispatchSemaphore(value: 0)
        let failure = Mutex<(any Error)?>(nil)
        Thread { [release, done] in
            do {
                try queue.inDatabase { db in
                    try db.execute(sql: "BEGIN EXCLUSIVE")
                    locked.signal()
                    release.wait()
                    try db.execute(sql: "COMMIT")
                }
            } catch {
                failure.withLock { $0 = error }
                locked.signal()
            }
            done.signal()
        }.start()
        locked.wait()
        if let error = failure.withLock({ $0 }) { throw error }
    }

    public func unlock() {
        release.signal()
        done.wait()
    }
}
