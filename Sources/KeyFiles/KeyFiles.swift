import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Creates the secret files a server makes for itself on first run (the token key, the admin key).
public enum KeyFiles {
    public enum Outcome: Equatable, Sendable {
        /// This call created the file with the given contents.
        case created
        /// The file was already there (another process may have made it a moment ago): read it instead.
        case exists
    }

    /// Why the file couldn't be made, as text an operator can act on.
    public struct Failure: Error, Equatable, CustomStringConvertible, Sendable {
        public let description: String
    }

    /// The mode of `path` (as "0644") if users other than its owner may read or write it, nil if only
    /// the owner may (or it can't be read). A key made here is 0600; one restored from a backup, copied
    /// with the wrong umask or mounted from a secret volume may not be, and whoever reads a token key
    /// can sign tokens.
    public static func looseMode(of path: String) -> String? {
        var info = stat()
        guard stat(path, &info) == 0, info.st_mode & 0o077 != 0 else { return nil }
        let mode = info.st_mode & 0o7777
        return "0" + String(mode, radix: 8)
    }

    /// Writes `contents` to `path` (mode 0600) unless a file is there already; never replaces one.
    ///
    /// The contents go to a temporary file next to `path`, are synced, and the temporary file is linked
    /// to `path`. `link` fails if `path` exists, so of two processes starting at once exactly one key wins
    /// and the other reads it whole: a reader never sees a half-written file, which an exclusive create
    /// followed by a write would allow.
    public static func createOnce(at path: String, contents: [UInt8]) throws(Failure) -> Outcome {
        let temporary = path + ".new-\(getpid())-\(UInt32.random(in: .min ... .max))"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw Failure(description: "cannot create \(temporary) (\(String(cString: strerror(errno)))); check that the data directory exists and is writable")
        }
        defer { unlink(temporary) }
        let written = contents.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == contents.count, synced else {
            throw Failure(description: "cannot write \(temporary); check that the data directory is writable and not full")
        }
        guard link(temporary, path) == 0 else {
            let code = errno
            if code == EEXIST { return .exists }
            throw Failure(description: "cannot create \(path) (\(String(cString: strerror(code)))); check that the data directory is writable")
        }
        // The new name must survive a power cut too: a key that vanished would be replaced by a new
        // one at the next start, and every token signed with the old one would stop working.
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) }.map { $0.isEmpty ? "/" : $0 } ?? "."
        let directoryDescriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryDescriptor >= 0 {
            _ = fsync(directoryDescriptor)
            close(directoryDescriptor)
        }
        return .created
    }
}

extension KeyFiles {
    /// Why a key file (or the directory for it) could not be read or made, in words an operator can
    /// act on: Foundation's own are "NSCocoaErrorDomain error 512" for a path through a file, or 256
    /// for a directory read as a file.
    public static func problem(_ error: any Error, at path: String) -> String {
        let ns = error as NSError
        if let posix = ns.userInfo[NSUnderlyingErrorKey] as? NSError, posix.domain == NSPOSIXErrorDomain {
            if posix.code == Int(ENOTDIR) { return fileInTheWay(of: path) ?? "a part of the path is a file, not a directory" }
            return String(cString: strerror(Int32(posix.code))).lowercased()
        }
        if let blocker = fileInTheWay(of: path) { return blocker }
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue { return "it is a directory" }
        guard ns.domain == NSCocoaErrorDomain else { return ns.localizedDescription }
        switch ns.code {
        case NSFileReadNoPermissionError, NSFileWriteNoPermissionError: return "permission denied"
        case NSFileReadNoSuchFileError: return "no such file"
        case NSFileReadInapplicableStringEncodingError: return "it is not text"
        default: return ns.localizedDescription
        }
    }

    /// The first part of `path` above it that exists and is a file, said so.
    static func fileInTheWay(of path: String) -> String? {
        var url = URL(fileURLWithPath: path).deletingLastPathComponent()
        while url.path != "/" && !url.path.isEmpty {
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) {
                return isDirectory.boolValue ? nil : "\(url.path) is a file, not a directory"
            }
            url = url.deletingLastPathComponent()
        }
        return nil
    }
}
