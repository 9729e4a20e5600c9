#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// One `squelchd serve` per data directory. Two servers on one directory would both take joins and
/// write the same database, each with its own view of the channels: members connected to one would
/// not hear members connected to the other, and each would overwrite the other's member rows. The
/// CLI (`channel …`, `token …`) shares the database with a running server by design and takes no lock.
///
/// An advisory `flock` on `<data-dir>/squelchd.lock`, held for as long as the server runs. The kernel
/// drops it when the process exits however it exits (`kill -9` included), so there is never a stale
/// lock to clean up; the file keeps the holder's pid only to name it in the message.
public final class DataDirectoryLock: Sendable {
    public static let fileName = "squelchd.lock"
    private let descriptor: Int32

    /// The data directory is served by another process.
    public struct InUse: Error, CustomStringConvertible {
        public var directory: String
        /// The holder's pid, as it wrote it (nil if the file didn't say).
        public var holder: Int32?
        public var description: String {
            let who = holder.map { "another squelchd (pid \($0))" } ?? "another squelchd"
            return "\(who) is serving the data directory \(directory); two servers on one directory would split its members between them. Stop that one first, or give this one its own directory with --data-dir"
        }
    }

    /// The lock file could not be opened or locked for a reason other than another holder.
    public struct Failure: Error, CustomStringConvertible {
        public var path: String
        public var reason: String
        public var description: String {
            "can't lock \(path): \(reason); check that the data directory is writable by this user"
        }
    }

    /// Takes the lock, or throws `InUse` at once (it never waits for the other server to stop).
    public init(directory: String) throws {
        let path = directory + "/" + Self.fileName
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw Failure(path: path, reason: String(cString: strerror(errno))) }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let error = errno
            let holder = Self.readPID(descriptor)
            close(descriptor)
            if error == EWOULDBLOCK { throw InUse(directory: directory, holder: holder) }
            throw Failure(path: path, reason: String(cString: strerror(error)))
        }
        let pid = Array("\(getpid())\n".utf8)
        // Only for the message another server shows; a failure here doesn't weaken the lock.
        if ftruncate(descriptor, 0) == 0 { _ = pid.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) } }
        self.descriptor = descriptor
    }

    private static func readPID(_ descriptor: Int32) -> Int32? {
        var bytes = [UInt8](repeating: 0, count: 16)
        let count = bytes.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { return nil }
        return Int32(String(decoding: bytes[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Closing the descriptor releases the lock. The file stays: removing it would let a server that
    /// opened it just before lock a file no longer in the directory while a third locks a new one.
    deinit { close(descriptor) }
}
