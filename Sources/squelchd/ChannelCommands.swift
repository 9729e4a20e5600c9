import ArgumentParser
import ChannelProtocol
import ChannelStore
import ChannelStoreSQLite
import Foundation
import Logging
import PTTServer

/// `squelchd channel …`: edits the channel database directly. A running server shares the file and
/// notices the change through `ChannelStore.revision()`, so no admin API round trip is needed.
struct Channel: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create, list, show, update and delete channels.",
        discussion: "Edits <data-dir>/\(SQLiteChannelStore.defaultFileName); a running server picks changes up by itself.",
        subcommands: [Create.self, List.self, Show.self, Update.self, Delete.self])

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a channel and print its id.",
            discussion: "Only the id goes to stdout, so 'id=$(squelchd channel create --name Ops)' works; the next step goes to stderr.")

        @Option(help: "Channel name (1-\(ChannelRecord.maxNameLength) characters).") var name: String
        @Option(help: "Channel image: an http(s) URL or a data:image/png;base64, URL.") var image: String?
        @Option(help: "half: one talker at a time; full: several at once.") var mode: ModeOption = .half
        // `.unconditional`: "--max-burst -5" reaches the range check rather than "missing value".
        @Option(parsing: .unconditional, help: "Longest talk burst in seconds (\(ChannelRecord.maxBurstRange.lowerBound)-\(ChannelRecord.maxBurstRange.upperBound)).")
        var maxBurst = 60
        @OptionGroup var store: StoreOptions

        func run() async throws {
            let channel = ChannelRecord(name: name, image: image, mode: mode.mode, maxBurstSeconds: maxBurst)
            try await store.withStore(creating: true) { db throws(StoreError) in
                try await db.createChannel(channel)
                await audit(db, "channel created", channel: channel.id, ["name": channel.name, "mode": "\(channel.mode)",
                                                                         "max_burst_seconds": "\(channel.maxBurstSeconds)"])
            }
            print(channel.id.uuidString)
            standardError("next: squelchd token issue --channel \(channel.id.uuidString) --user <user-id> --name <display-name>\(store.dataDirFlag)")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the channels.")

        @Flag(help: "Print JSON instead of a table.") var json = false
        @OptionGroup var store: StoreOptions

        func run() async throws {
            let entries = try await store.withStore { db throws(StoreError) in
                var entries: [ChannelJSON] = []
                for channel in try await db.channels() {
                    entries.append(ChannelJSON(channel, memberCount: try await db.members(of: channel.id).count))
                }
                return entries
            }
            if json { return try printJSON(entries) }
            guard !entries.isEmpty else {
                print("no channels; create one with 'squelchd channel create --name <name>\(store.dataDirFlag)'")
                return
            }
            print(table(["ID", "NAME", "MODE", "MAX BURST", "MEMBERS"], entries.map {
                [$0.id.uuidString, $0.name, ModeOption($0.mode).rawValue, "\($0.maxBurstSeconds) s", "\($0.memberCount)"]
            }))
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show a channel and its members.")

        @Argument(help: "Channel id.") var id: String
        @Flag(help: "Print JSON instead of text.") var json = false
        @OptionGroup var store: StoreOptions

        func run() async throws {
            let channelID = try parseChannelID(id)
            let (channel, members) = try await store.withStore { db throws(StoreError) in
                guard let channel = try await db.channel(channelID) else { throw StoreError.channelNotFound(channelID) }
                return (channel, try await db.members(of: channelID))
            }
            if json {
                var entry = ChannelJSON(channel, memberCount: members.count)
                entry.members = members.map(MemberSummary.init)
                return try printJSON(entry)
            }
            let dates = ISO8601DateFormatter()
            let rows: [(String, String)] = [
                ("id", channel.id.uuidString),
                ("name", channel.name),
                ("image", describeImage(channel.image)),
                ("mode", ModeOption(channel.mode).rawValue + " duplex"),
                ("max burst", "\(channel.maxBurstSeconds) s"),
                ("created", dates.string(from: channel.createdAt)),
                ("updated", dates.string(from: channel.updatedAt)),
                ("members", "\(members.count)"),
            ]
            for (label, value) in rows { print((label + ":").padding(toLength: 11, withPad: " ", startingAt: 0) + value) }
            guard !members.isEmpty else { return }
            print("")
            print(table(["USER", "NAME", "MAY", "PRIORITY", "ROLE", "LAST SEEN", "PUSH TOKEN"], members.map {
                let grant = $0.grant
                let may = grant.map { $0.capabilities.isEmpty ? "-" : $0.capabilities.joined(separator: ",") }
                return [$0.userID, $0.displayName, may ?? "?", grant.map { "\($0.priority)" } ?? "?",
                        grant?.role ?? "-", dates.string(from: $0.lastSeen),
                        $0.pushToken == nil ? "no" : "yes (\($0.pushEnvironment?.rawValue ?? "unknown environment"))"]
            }))
        }
    }

    struct Update: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change a channel's name, image, mode or maximum burst.")

        @Argument(help: "Channel id.") var id: String
        @Option(help: "New name.") var name: String?
        @Option(help: "New image: an http(s) URL or a data:image/png;base64, URL.") var image: String?
        @Flag(help: "Remove the image.") var clearImage = false
        @Option(help: "half or full.") var mode: ModeOption?
        @Option(parsing: .unconditional, help: "Longest talk burst in seconds.") var maxBurst: Int?
        @OptionGroup var store: StoreOptions

        func run() async throws {
            let channelID = try parseChannelID(id)
            guard name != nil || image != nil || clearImage || mode != nil || maxBurst != nil else {
                throw fail(.invalid("nothing to change; pass --name, --image, --clear-image, --mode or --max-burst"))
            }
            guard !(clearImage && image != nil) else { throw fail(.invalid("--image and --clear-image contradict each other; pass one")) }
            let updated = try await store.withStore { db throws(StoreError) in
                guard var channel = try await db.channel(channelID) else { throw StoreError.channelNotFound(channelID) }
                if let name { channel.name = name }
                if let image { channel.image = image }
                if clearImage { channel.image = nil }
                if let mode { channel.mode = mode.mode }
                if let maxBurst { channel.maxBurstSeconds = maxBurst }
                let updated = try await db.updateChannel(channel)
                await audit(db, "channel updated", channel: channelID, ["name": updated.name, "mode": "\(updated.mode)",
                                                                        "max_burst_seconds": "\(updated.maxBurstSeconds)", "image": updated.image == nil ? "none" : "set"])
                return updated
            }
            print("updated channel \(updated.id.uuidString) (\(updated.name))")
        }
    }

    struct Delete: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete a channel and its members (the transmission log is kept).",
            discussion: "Connected members are disconnected. Asks for --yes because it cannot be undone.")

        @Argument(help: "Channel id.") var id: String
        @Flag(help: "Really delete.") var yes = false
        @OptionGroup var store: StoreOptions

        func run() async throws {
            let channelID = try parseChannelID(id)
            let confirmed = yes
            let outcome = try await store.withStore { db throws(StoreError) -> (ChannelRecord, members: Int) in
                guard let channel = try await db.channel(channelID) else { throw StoreError.channelNotFound(channelID) }
                let members = try await db.members(of: channelID).count
                if confirmed {
                    try await db.deleteChannel(channelID)
                    await audit(db, "channel deleted", channel: channelID, ["name": channel.name])
                }
                return (channel, members)
            }
            guard confirmed else {
                throw fail(.invalid("deleting channel \(channelID.uuidString) (\(outcome.0.name)) also removes its \(outcome.members) member(s) and cannot be undone; add --yes to delete it"))
            }
            print("deleted channel \(channelID.uuidString) (\(outcome.0.name))")
        }
    }
}

/// Records a change a command made in the audit trail (`AuditRecord`), as the admin API records its
/// own: source `cli`, and the user and host that ran the command. A failure is said on stderr, and the
/// change stands: it is made, and running the command again would repeat it.
func audit(_ db: any ChannelStore, _ action: String, channel: UUID?, user: String? = nil, _ details: [String: String] = [:]) async {
    do {
        try await db.recordAudit(AuditRecord(source: AuditRecord.Source.cli, actor: AuditRecord.localActor, action: action,
                                             channelID: channel, userID: user, details: details))
    } catch {
        standardError("squelchd: warning: \(action), but that could not be recorded in the audit trail: \(error)")
    }
}

extension Channel {
    /// `--mode` as typed on the command line.
    enum ModeOption: String, ExpressibleByArgument, CaseIterable {
        case half, full

        init(_ mode: TransmissionMode) { self = mode == .halfDuplex ? .half : .full }

        var mode: TransmissionMode { self == .half ? .halfDuplex : .fullDuplex }
    }

    /// The server's data directory, found as the server finds it (flag, then `SQUELCH_DATA_DIR`, then
    /// the config file's `dataDirectory`), and opening the store in it.
    struct StoreOptions: ParsableArguments {
        @Option(help: ArgumentHelp("The server's JSON config file (env: \(ServerConfiguration.configFileEnvironment)), read for its data directory (and, by the token commands, its token keys, current and previous).",
                                   valueName: "path"))
        var config: String?

        @Option(help: ArgumentHelp(ServerConfiguration.help("dataDirectory", "Data directory holding the database (the server's --data-dir)."),
                                   valueName: "path"))
        var dataDir: String?

        @Option(help: ArgumentHelp(ServerConfiguration.help("database", "The cluster's PostgreSQL database (the server's --database)."),
                                   valueName: "url"))
        var database: String?

        init() {}

        /// The server's settings as far as these commands need them; a bad one exits 78, as the
        /// server would.
        func configuration(tokenKey: String? = nil, previousTokenKey: String? = nil) throws -> ServerConfiguration {
            var overrides = ConfigurationOverrides()
            overrides["dataDirectory"] = dataDir.map(SettingValue.text)
            overrides["database"] = database.map(SettingValue.text)
            overrides["tokenKeyPath"] = tokenKey.map(SettingValue.text)
            overrides["previousTokenKeyPath"] = previousTokenKey.map(SettingValue.text)
            do {
                return try ServerConfiguration.load(file: config, environment: ProcessInfo.processInfo.environment, overrides: overrides)
            } catch {
                standardError("squelchd: \(error)")
                throw ExitCode(78)
            }
        }

        /// The database file in `directory`.
        static func databasePath(in directory: String) -> String {
            URL(fileURLWithPath: directory).appendingPathComponent(SQLiteChannelStore.defaultFileName).path
        }

        /// Repeats a --data-dir or --config given on the command line in hints, so a copied command acts
        /// on the same database.
        var dataDirFlag: String {
            (config.map { " --config \($0)" } ?? "") + (dataDir.map { " --data-dir \($0)" } ?? "")
        }

        /// Opens the store, runs `body`, closes the store. Failures print one line and become the exit code.
        ///
        /// Only `creating` commands may make a new database: the default data directory is relative, and
        /// a `list` run from the wrong directory should say so rather than leave an empty database there.
        func withStore<T: Sendable>(creating: Bool = false,
                                    _ body: (any ChannelStore) async throws(StoreError) -> T) async throws -> T {
            let configuration = try configuration()
            if configuration.sharesDatabase {
                // The cluster's database: always there once a node has started, never made here.
                let store: any ChannelStore
                do { store = try await configuration.openStore(logger: Logger(label: "squelchd")) } catch let error as StoreError {
                    throw fail(error)
                }
                return try await run(body, on: store)
            }
            let directory = configuration.dataDirectory
            let file = Self.databasePath(in: directory)
            guard creating || FileManager.default.fileExists(atPath: file) else {
                throw fail(.database("no database at \(file); pass the server's --data-dir or --config (or set SQUELCH_DATA_DIR), or create a channel first"))
            }
            let isNew = !FileManager.default.fileExists(atPath: file)
            let store: SQLiteChannelStore
            do { store = try SQLiteChannelStore(directory: directory) } catch { throw fail(error) }
            if isNew {
                // The default data directory is relative: run from another directory than the server's,
                // this makes a database squelchd never reads, and the channel seems to vanish.
                let absolute = URL(fileURLWithPath: directory).standardizedFileURL.path
                standardError("squelchd: note: no database in \(absolute); made a new one. If squelchd keeps its data elsewhere, it will not see this: pass its --data-dir or --config (or set SQUELCH_DATA_DIR), and remove \(absolute) if it was made by mistake")
            }
            return try await run(body, on: store)
        }

        private func run<T: Sendable>(_ body: (any ChannelStore) async throws(StoreError) -> T, on store: any ChannelStore) async throws -> T {
            do {
                let result = try await body(store)
                // The writes are already durable; closing folds SQLite's WAL into the main file, or
                // closes PostgreSQL's connections.
                try? await store.close()
                return result
            } catch {
                try? await store.close()
                throw fail(error)
            }
        }
    }

    /// A channel as `--json` prints it. Push tokens are reduced to whether one is registered.
    struct ChannelJSON: Encodable {
        var id: UUID
        var name: String
        var image: String?
        var mode: TransmissionMode
        var maxBurstSeconds: Int
        var createdAt: Date
        var updatedAt: Date
        var memberCount: Int
        var members: [MemberSummary]?

        init(_ channel: ChannelRecord, memberCount: Int) {
            id = channel.id
            name = channel.name
            image = channel.image
            mode = channel.mode
            maxBurstSeconds = channel.maxBurstSeconds
            createdAt = channel.createdAt
            updatedAt = channel.updatedAt
            self.memberCount = memberCount
        }

        enum CodingKeys: String, CodingKey { case id, name, image, mode, maxBurstSeconds, createdAt, updatedAt, memberCount, members }

        /// `image` is always there, `null` when there is none, as the admin API writes it: a script
        /// reading either gets the same keys.
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(id, forKey: .id)
            try container.encode(name, forKey: .name)
            try container.encode(image, forKey: .image)
            try container.encode(mode, forKey: .mode)
            try container.encode(maxBurstSeconds, forKey: .maxBurstSeconds)
            try container.encode(createdAt, forKey: .createdAt)
            try container.encode(updatedAt, forKey: .updatedAt)
            try container.encode(memberCount, forKey: .memberCount)
            try container.encodeIfPresent(members, forKey: .members)
        }
    }
}

/// Prints `squelchd: <error>` on stderr and returns the exit code: 78 (EX_CONFIG) when the database
/// itself is the problem, 75 (EX_TEMPFAIL) when it could not take the command just now (locked by
/// the server for too long, disk full) and the same command can be run again, 1 for a missing channel
/// or a refused value.
func fail(_ error: StoreError) -> ExitCode {
    standardError("squelchd: \(error)")
    switch error {
    case .database: return ExitCode(78)
    case .unavailable, .fenced: return ExitCode(75)
    case .invalid, .channelNotFound, .memberNotFound: return ExitCode(1)
    }
}

func standardError(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

func parseChannelID(_ text: String) throws -> UUID {
    guard let id = UUID(uuidString: text) else {
        throw fail(.invalid("'\(text)' is not a channel id (a UUID); 'squelchd channel list' shows them"))
    }
    return id
}

func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    encoder.dateEncodingStrategy = .iso8601
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

/// An inline image is kilobytes of base64: say what it is instead of printing it.
private func describeImage(_ image: String?) -> String {
    guard let image else { return "(none)" }
    if image.lowercased().hasPrefix("data:") { return "inline PNG, \(image.utf8.count) bytes" }
    return image
}

/// Left-aligned columns two spaces apart.
func table(_ header: [String], _ rows: [[String]]) -> String {
    let all = [header] + rows
    let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
    return all.map { row in
        row.enumerated().map { column, cell in
            column == row.count - 1 ? cell : cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
        }.joined(separator: "  ")
    }.joined(separator: "\n")
}
