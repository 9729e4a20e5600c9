import Foundation

/// What the manager keeps to rejoin its channel after a restart: the channel, how it looks, where it
/// lives with the credentials to get in, and the push token the server knows the device by (so that a
/// push sent while the app was dead still reaches it).
public struct RestorationRecord: Sendable, Equatable, Codable {
    public var version = 1
    public var channel: UUID
    /// Nil if the record was written without one; the restoration delegate then supplies it.
    public var descriptor: ChannelDescriptor?
    public var credentials: ChannelCredentials
    public var pushToken: [UInt8]?

    public init(channel: UUID, descriptor: ChannelDescriptor?, credentials: ChannelCredentials, pushToken: [UInt8]?) {
        self.channel = channel
        self.descriptor = descriptor
        self.credentials = credentials
        self.pushToken = pushToken
    }
}

/// Which of the files in a restoration directory an error is about.
public enum RestorationFile: Sendable, Equatable {
    /// The channel to restore (`RestorationRecord`).
    case channel
    /// The leaves not yet delivered to a server (`OwedLeave`).
    case owedLeaves
    /// An app's own file beside them (`saveValue(_:named:)`), by its name.
    case app(String)
}

/// Why the restoration record could not be used.
public enum RestorationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file was unreadable or not a record; it was moved aside to `movedTo`.
    case corrupt(RestorationFile, path: String, movedTo: String, why: String)
    case unwritable(RestorationFile, path: String, why: String)

    /// The file the error is about.
    public var file: RestorationFile {
        switch self {
        case .corrupt(let file, _, _, _), .unwritable(let file, _, _): file
        }
    }

    public var description: String {
        switch self {
        case .corrupt(.owedLeaves, let path, let movedTo, let why):
            "the leaves not yet delivered to the server, in \(path), could not be read (\(why)); the file was moved to \(movedTo); the server may still list you in those channels until an administrator removes you"
        case .unwritable(.owedLeaves, let path, let why):
            "could not save a leave for later delivery in \(path) (\(why)); if the app stops before the server hears it, it keeps listing you; check the directory's permissions"
        case .corrupt(.channel, let path, let movedTo, let why):
            "the saved channel in \(path) could not be read (\(why)); it was moved to \(movedTo) and the channel was not restored; join it again"
        case .unwritable(.channel, let path, let why):
            "could not save the channel for restoration in \(path) (\(why)); check the directory's permissions or set XDG_STATE_HOME"
        case .corrupt(.app, let path, let movedTo, let why):
            "the saved settings in \(path) could not be read (\(why)); the file was moved to \(movedTo) and the defaults apply"
        case .unwritable(.app, let path, let why):
            "could not save settings in \(path) (\(why)); check the directory's permissions or set XDG_STATE_HOME"
        }
    }
}

/// The restoration record on disk, one JSON file under the XDG state directory, written atomically
/// (a temporary file renamed over the old one) so that a crash mid-write leaves the old record whole.
/// The file holds a participant token, so it is readable by the owner only.
public struct RestorationStore: Sendable {
    public let directory: String
    public var path: String { (directory as NSString).appendingPathComponent("channel.json") }

    public init(directory: String) { self.directory = directory }

    /// `$XDG_STATE_HOME/squelch/<app>`, or `~/.local/state/squelch/<app>` (XDG Base Directory spec).
    public static func defaultDirectory(app: String, environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        let base: String
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") {
            base = state
        } else {
            base = ((environment["HOME"] ?? NSHomeDirectory()) as NSString).appendingPathComponent(".local/state")
        }
        return ((base as NSString).appendingPathComponent("squelch") as NSString).appendingPathComponent(app)
    }

    /// The saved record; nil if there is none. A file that can't be read is moved aside (never
    /// deleted: it may be worth a look) and reported.
    public func load() throws(RestorationError) -> RestorationRecord? {
        try read(RestorationRecord.self, .channel, from: path)
    }

    public func save(_ record: RestorationRecord) throws(RestorationError) {
        try write(record, .channel, to: path)
    }

    /// Where the leaves the server has not heard yet are kept (`OwedLeave`): apart from the record,
    /// which a join of another channel replaces while a leave may still be owed for the old one.
    public var owedLeavesPath: String { (directory as NSString).appendingPathComponent(Self.owedLeavesFile) }
    static let owedLeavesFile = "owed-leaves.json"

    /// The leaves still owed to servers, oldest first; empty if there are none. A file that can't be
    /// read is moved aside and reported, as the record is.
    public func loadOwedLeaves() throws(RestorationError) -> [OwedLeave] {
        try read([OwedLeave].self, .owedLeaves, from: owedLeavesPath) ?? []
    }

    /// Replaces the owed leaves on disk; an empty list removes the file.
    public func saveOwedLeaves(_ leaves: [OwedLeave]) throws(RestorationError) {
        if leaves.isEmpty {
            try? FileManager.default.removeItem(atPath: owedLeavesPath)
            return
        }
        try write(leaves, .owedLeaves, to: owedLeavesPath)
    }

    /// An app's own value, kept in `file` beside the record (settings the record doesn't hold), read
    /// as the record is; nil if there is none.
    public func loadValue<Value: Decodable>(_ type: Value.Type, named file: String) throws(RestorationError) -> Value? {
        try read(type, .app(file), from: (directory as NSString).appendingPathComponent(file))
    }

    /// Saves an app's own value in `file` beside the record, as the record is saved: in one step,
    /// readable by this user only.
    public func saveValue<Value: Encodable>(_ value: Value, named file: String) throws(RestorationError) {
        try write(value, .app(file), to: (directory as NSString).appendingPathComponent(file))
    }

    private func read<Value: Decodable>(_ type: Value.Type, _ file: RestorationFile, from path: String) throws(RestorationError) -> Value? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        do {
            return try JSONDecoder().decode(Value.self, from: data)
        } catch {
            let aside = path + ".corrupt-\(Int(Date().timeIntervalSince1970))"
            try? FileManager.default.removeItem(atPath: aside)
            try? FileManager.default.moveItem(atPath: path, toPath: aside)
            throw .corrupt(file, path: path, movedTo: aside, why: Self.describe(error))
        }
    }

    private func write<Value: Encodable>(_ value: Value, _ file: RestorationFile, to path: String) throws(RestorationError) {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            let data = try encoder.encode(value)
            let temporary = path + ".tmp-\(ProcessInfo.processInfo.processIdentifier)"
            guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600]) else {
                throw CocoaError(.fileWriteUnknown)
            }
            // rename(2) replaces the old file in one step: readers see the old contents or the new.
            guard rename(temporary, path) == 0 else {
                let why = String(cString: strerror(errno))
                try? FileManager.default.removeItem(atPath: temporary)
                throw RestorationError.unwritable(file, path: path, why: why)
            }
        } catch let error as RestorationError {
            throw error
        } catch {
            throw .unwritable(file, path: path, why: Self.describe(error))
        }
    }

    public func remove() { try? FileManager.default.removeItem(atPath: path) }

    static func describe(_ error: any Error) -> String {
        if let decoding = error as? DecodingError {
            switch decoding {
            case .dataCorrupted(let c): return "not JSON: \(c.debugDescription)"
            case .keyNotFound(let key, _): return "missing '\(key.stringValue)'"
            case .typeMismatch(_, let c), .valueNotFound(_, let c):
                return "wrong value at '\(c.codingPath.map(\.stringValue).joined(separator: "."))'"
            @unknown default: return "\(decoding)"
            }
        }
        return "\(error)"
    }
}
