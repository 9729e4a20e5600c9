import ArgumentParser
import ChannelStore
import ChannelStoreSQLite
import Foundation
import Logging
import ParticipantClaims
import ParticipantTokens
import PTTServer

/// `squelchd token …`: participant tokens, signed with the server's token key, found as the server
/// finds it (`--token-key`, `SQUELCH_TOKEN_KEY` or the config file's `tokenKeyPath`; else
/// `<data-dir>/token-key.pem`).
struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Issue, inspect and revoke participant tokens.",
        subcommands: [Issue.self, Inspect.self, Revoke.self, NewKey.self])

    struct Issue: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a participant token (an ES256 JWT signed with the server's token key).",
            discussion: """
                Signs with the server's token key: --token-key (or SQUELCH_TOKEN_KEY, or "tokenKeyPath" in --config), else \
                <data-dir>/token-key.pem. That one is made here on first use if the data directory already holds the server's \
                database (after 'squelchd channel create' or a first 'squelchd serve'), and never anywhere else, so a token \
                is not signed with a stray key by mistake. The channel must exist in that database (when there is one here). \
                Give the token to the member's app; it joins with it.
                """)

        @Option(help: "Channel UUID the token admits to.") var channel: String
        @Option(help: "User id (the token's subject, 1-\(ParticipantClaims.maxUserIDBytes) bytes).") var user: String
        @Option(help: "Display name (1-\(ParticipantClaims.maxNameBytes) bytes).") var name: String
        @Option(help: "Capabilities, comma-separated: talk, listen.") var capability = "talk,listen"
        // `.unconditional` here and on the other numbers: ArgumentParser takes "-1" for an option and would
        // answer "--priority -1" with "missing value"; the range check says what is wrong instead.
        @Option(parsing: .unconditional, help: "Floor priority 0-255; a higher one pre-empts a lower one.") var priority = 0
        @Option(help: "Role attribute (free text up to \(ParticipantClaims.maxRoleBytes) bytes, e.g. dispatcher).") var role: String?
        @Option(help: "The participant's picture: an https URL, shown by listeners' apps with the speaker.") var image: String?
        @Option(parsing: .unconditional, help: "Lifetime: 90s, 30m, 12h, 7d; at most 30d.") var ttl = "12h"
        @OptionGroup var store: Channel.StoreOptions
        @Option(help: ArgumentHelp(ServerConfiguration.help("tokenKeyPath", "The server's token key (PEM), if not in the data directory."), valueName: "path"))
        var tokenKey: String?

        func run() async throws {
            guard let channelID = UUID(uuidString: channel) else {
                throw ValidationError("--channel '\(channel)' is not a UUID; 'squelchd channel list' shows channel ids")
            }
            guard (0...255).contains(priority) else { throw ValidationError("--priority must be 0-255, not \(priority)") }
            guard let lifetime = parseLifetime(ttl) else { throw ValidationError("--ttl '\(ttl)' is not a lifetime; use e.g. 90s, 30m, 12h or 7d") }
            guard lifetime <= ParticipantClaims.maxLifetime else {
                throw ValidationError("--ttl \(ttl) is longer than \(Int(ParticipantClaims.maxLifetime / 86_400))d, the longest squelchd issues; give a shorter one and issue a new token (or renew in the app) before it expires")
            }
            var capabilities = Set<Capability>()
            for name in capability.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) {
                guard let parsed = Capability(rawValue: name) else {
                    throw ValidationError("unknown capability '\(name)'; use talk, listen or both (talk,listen)")
                }
                capabilities.insert(parsed)
            }
            let now = Date()
            // Trimmed as the admin API trims: a pasted name's stray newline is not part of it.
            let role = self.role?.trimmingCharacters(in: .whitespacesAndNewlines)
            let claims = ParticipantClaims(userID: user.trimmingCharacters(in: .whitespacesAndNewlines),
                                           name: name.trimmingCharacters(in: .whitespacesAndNewlines), channel: channelID,
                                           capabilities: capabilities, role: role?.isEmpty == true ? nil : role,
                                           image: image?.trimmingCharacters(in: .whitespacesAndNewlines), priority: UInt8(priority), issuedAt: now, expiresAt: now.addingTimeInterval(lifetime))
            do throws(InvalidClaims) { try claims.validateForIssue() } catch { throw ValidationError(error.message) }
            let configuration = try store.configuration(tokenKey: tokenKey)
            // A token for a channel the server doesn't have is refused at every join, long after the
            // typo; the check needs the database, which a host holding only the key (--token-key) lacks.
            // Before the key is loaded, which may make it: a mistyped command leaves nothing behind.
            let database = configuration.sharesDatabase
                || FileManager.default.fileExists(atPath: Channel.StoreOptions.databasePath(in: configuration.dataDirectory))
            if database {
                try await store.withStore { db throws(StoreError) in
                    guard try await db.channel(channelID) != nil else { throw StoreError.channelNotFound(channelID) }
                }
            }
            let token = try await loadAuthority(configuration, forIssue: true).issue(claims)
            // Recorded where the database is; a host holding only the key has no trail to add to. The
            // token is signed and valid either way, so it is printed even if the trail can't be written.
            if database {
                do {
                    try await store.withStore { db throws(StoreError) in
                        await audit(db, "token issued", channel: channelID, user: claims.userID, AuditRecord.tokenDetails(claims))
                    }
                } catch {
                    // `withStore` has said why the database could not be opened.
                    standardError("squelchd: warning: the token below is issued and valid, but the audit trail could not be opened to record it")
                }
            }
            print(token)
        }
    }

    struct Inspect: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show what a participant token holds, and whether it would be let in now.",
            discussion: "Checks the signature with the token key in the data directory, then the times and the revocations in its database. Exits 0 if the token would be let in now; 3 if it would not (expired, not yet valid, revoked, or its channel is gone), after the report; 1 if it can't be read (forged, malformed).")

        @Argument(help: "The token.") var token: String
        @Flag(help: "Print JSON instead of lines.") var json = false
        @OptionGroup var store: Channel.StoreOptions
        @Option(help: ArgumentHelp(ServerConfiguration.help("tokenKeyPath", "The server's token key (PEM), if not in the data directory."), valueName: "path"))
        var tokenKey: String?
        @Option(help: ArgumentHelp(ServerConfiguration.help("previousTokenKeyPath", "During a key rotation, the key used before it: its tokens are read too, as the server accepts them."), valueName: "path"))
        var previousTokenKey: String?

        struct Report: Encodable {
            var tokenID: String
            var channel: UUID
            var user: String
            var name: String
            var capabilities: [String]
            var role: String?
            var image: String?
            var priority: Int
            var issuedAt: Date
            var expiresAt: Date
            /// "valid", "expired", "notYetValid", "revoked" or "noChannel" (its channel is not in the
            /// database: deleted, or the token is for another server).
            var status: String
            var revocation: RevocationRecord?
        }

        func run() async throws {
            let configuration = try store.configuration(tokenKey: tokenKey, previousTokenKey: previousTokenKey)
            let authority = try await loadAuthority(configuration, forIssue: false)
            let claims: ParticipantClaims
            do throws(TokenError) { claims = try await authority.inspect(token) } catch {
                standardError("squelchd: \(inspectionFailure(error, rotating: configuration.previousTokenKeyPath != nil))")
                throw ExitCode(1)
            }
            let (revocation, channelExists) = try await storedState(claims)
            let now = Date()
            let status = revocation != nil ? "revoked"
                : !channelExists ? "noChannel"
                : claims.expiresAt <= now ? "expired"
                : claims.issuedAt > now.addingTimeInterval(authority.clockSkew) ? "notYetValid" : "valid"
            let report = Report(tokenID: claims.tokenID, channel: claims.channel, user: claims.userID, name: claims.name,
                                capabilities: claims.capabilities.sorted().map(\.rawValue), role: claims.role, image: claims.image,
                                priority: Int(claims.priority), issuedAt: claims.issuedAt, expiresAt: claims.expiresAt,
                                status: status, revocation: revocation)
            if json { try printJSON(report) } else { print("""
                token id      \(report.tokenID)
                channel       \(report.channel.uuidString)
                user          \(report.user) (\(report.name))
                capabilities  \(report.capabilities.joined(separator: ", "))
                role          \(report.role ?? "(none)")
                image         \(report.image ?? "(none)")
                priority      \(report.priority)
                issued        \(report.issuedAt.formatted(.iso8601))
                expires       \(report.expiresAt.formatted(.iso8601))
                status        \(status)\(revocation.map { " at \($0.revokedAt.formatted(.iso8601)): \($0.reason)" } ?? "")\(channelExists ? "" : " (no such channel in this data directory: deleted, or the token is for another server; 'squelchd channel list' shows the channels)")
                """) }
            // Scripts check a token by the exit code, as the server would judge it.
            if status != "valid" { throw ExitCode(3) }
        }

        /// The revocation voiding `claims`, and whether its channel exists, if the database does (a
        /// token can be read without one: then nothing is known against it).
        func storedState(_ claims: ParticipantClaims) async throws -> (revocation: RevocationRecord?, channelExists: Bool) {
            guard FileManager.default.fileExists(atPath: Channel.StoreOptions.databasePath(in: try store.configuration().dataDirectory)) else {
                return (nil, true)
            }
            return try await store.withStore { db throws(StoreError) in
                (try await db.revocation(channel: claims.channel, user: claims.userID, tokenID: claims.tokenID, issuedAt: claims.issuedAt),
                 try await db.channel(claims.channel) != nil)
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Revoke one participant token, so it no longer joins.",
            discussion: """
                Give the token itself (--token), or its channel and id (--channel and --id; the admin API's issue answer has the id, \
                and 'squelchd channel show ID --json' each member's last one). \
                A member connected with it is removed within a second by a running server. To remove a member and every token \
                it holds, use the admin API: DELETE /v1/channels/<id>/members/<user>.
                """)

        @Option(help: "The token to revoke.") var token: String?
        @Option(help: "Channel UUID of the token (with --id).") var channel: String?
        @Option(help: "Token id, the token's jti (with --channel).") var id: String?
        @Option(help: "Why, for the log and the member (up to \(RevocationRecord.maxReasonBytes) bytes).") var reason = "revoked by an administrator"
        @OptionGroup var store: Channel.StoreOptions
        @Option(help: ArgumentHelp(ServerConfiguration.help("tokenKeyPath", "The server's token key (PEM), if not in the data directory."), valueName: "path"))
        var tokenKey: String?
        @Option(help: ArgumentHelp(ServerConfiguration.help("previousTokenKeyPath", "During a key rotation, the key used before it: its tokens are read too, as the server accepts them."), valueName: "path"))
        var previousTokenKey: String?

        func validate() throws {
            switch (token, channel, id) {
            case (_?, nil, nil), (nil, _?, _?): break
            default: throw ValidationError("give --token, or both --channel and --id")
            }
            if let id, !RevocationRecord.isIssuedTokenID(id) {
                throw ValidationError("--id '\(id.prefix(64))' is not a token id: it is a UUID ('squelchd channel show ID --json' lists each member's tokenID; 'squelchd token inspect TOKEN' shows a token's)")
            }
        }

        func run() async throws {
            let revocation: RevocationRecord
            let now = Date()
            if let token {
                let configuration = try store.configuration(tokenKey: tokenKey, previousTokenKey: previousTokenKey)
                let authority = try await loadAuthority(configuration, forIssue: false)
                let claims: ParticipantClaims
                do throws(TokenError) { claims = try await authority.inspect(token) } catch {
                    standardError("squelchd: \(inspectionFailure(error, rotating: configuration.previousTokenKeyPath != nil))")
                    throw ExitCode(1)
                }
                guard claims.expiresAt > now else {
                    // Stored, its revocation would be pruned at once (and a second revoke told "new").
                    print("token \(claims.tokenID) expired at \(claims.expiresAt.formatted(.iso8601)), so it can't join anyway; nothing was revoked")
                    return
                }
                revocation = .token(claims.tokenID, channel: claims.channel, user: claims.userID, expiresAt: claims.expiresAt,
                                    at: now, reason: reason)
            } else {
                revocation = .token(id ?? "", channel: try parseChannelID(channel ?? ""), user: nil, expiresAt: nil, at: now, reason: reason)
            }
            // The reason goes into the suggested command too, quoted for the shell, unless it is the default.
            let reasonFlag = reason == "revoked by an administrator" ? "" : " --reason '\(reason.replacingOccurrences(of: "'", with: "'\\''"))'"
            let stored: RevocationRecord
            let holder: String?
            let isNew: Bool
            let outcome = try await store.withStore { db throws(StoreError) in
                let outcome = try await db.revokeToken(revocation, byIDAlone: token == nil)
                if case .revoked(let record, let isNew, _) = outcome {
                    await audit(db, isNew ? "token revoked" : "token revocation repeated", channel: record.channelID, user: record.userID,
                                AuditRecord.revocationDetails(record, requestedReason: reason))
                }
                return outcome
            }
            switch outcome {
            case .otherChannel(let channel, let member):
                standardError("squelchd: token \(revocation.tokenID ?? "") is the one member '\(member)' of channel \(channel.uuidString) last joined with, not a token for channel \(revocation.channelID.uuidString); nothing was revoked. Run: squelchd token revoke --channel \(channel.uuidString) --id \(revocation.tokenID ?? "")\(reasonFlag)\(store.dataDirFlag)")
                throw ExitCode(1)
            case .revoked(let record, let new, let member):
                (stored, isNew, holder) = (record, new, member)
            }
            if !isNew {
                // The first revocation stands; saying "revoked" with today's reason would misstate the record.
                print("token \(stored.tokenID ?? "") on channel \(stored.channelID.uuidString) was already revoked at \(stored.revokedAt.formatted(.iso8601)): \(stored.reason)")
                return
            }
            print("revoked token \(stored.tokenID ?? "") on channel \(stored.channelID.uuidString)")
            if token == nil {
                // By id alone nothing checks the id: a typo revokes nothing real, silently.
                if let holder {
                    print("it is the token member '\(holder)' last joined with; a running server removes that member within a second")
                } else {
                    standardError("note: no member of the channel last joined with token id \(stored.tokenID ?? ""); if it was never used that is expected, otherwise check the id ('squelchd channel show --json' lists each member's tokenID)")
                }
            }
        }
    }
}

extension Token {
    /// The way out when the token key is lost for good: squelchd refuses to start without it rather
    /// than make a new one in silence, so making one is a decision an administrator takes here.
    struct NewKey: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "new-key",
            abstract: "Make a new token key in the data directory, when the old one is lost for good.",
            discussion: "Every participant token issued so far was signed with the old key and is refused as forged from then on: issue every member a new one. Restore the old key from a backup instead if you can. To change keys without breaking the tokens out there, rotate: start squelchd with the new key and --previous-token-key. Run it with squelchd stopped.")

        @OptionGroup var store: Channel.StoreOptions
        @Flag(help: "Confirm that every token issued so far stops working.") var everyTokenStopsWorking = false

        func run() async throws {
            let configuration = try store.configuration(tokenKey: nil, previousTokenKey: nil)
            guard !configuration.sharesDatabase else {
                standardError("squelchd: a cluster keeps its token key in its database, and loses it only with the database: restore the database from a backup. To change keys without breaking the tokens out there, rotate (start the nodes with --token-key and --previous-token-key)")
                throw ExitCode(78)
            }
            let path = configuration.resolvedTokenKeyPath
            let database = Channel.StoreOptions.databasePath(in: configuration.dataDirectory)
            guard FileManager.default.fileExists(atPath: database) else {
                standardError("squelchd: there is no server database at \(database); pass the server's --data-dir. (A new server makes its key when it first starts.)")
                throw ExitCode(78)
            }
            guard !FileManager.default.fileExists(atPath: path) else {
                standardError("squelchd: there is a token key at \(path) already; nothing was changed. To change keys, rotate (start squelchd with the new key and --previous-token-key) so that issued tokens keep working")
                throw ExitCode(78)
            }
            guard everyTokenStopsWorking else {
                standardError("squelchd: a new token key makes every participant token issued so far fail as forged; restore \(path) from a backup if you can. To go ahead, pass --every-token-stops-working")
                throw ExitCode(1)
            }
            let lock: DataDirectoryLock
            do { lock = try DataDirectoryLock(directory: configuration.dataDirectory) } catch {
                standardError("squelchd: \(error); stop it, then run this again")
                throw ExitCode(1)
            }
            defer { withExtendedLifetime(lock) {} }
            let authority = try await TokenAuthority.loadOrCreate(at: path)
            try await store.withStore { db throws(StoreError) in
                try await db.setServerKey(named: TokenAuthority.publicKeyRecordName, value: Array(authority.publicKeyPEM.utf8))
                await audit(db, "token key replaced", channel: nil, ["path": path])
            }
            print("made a new token key at \(path); every token issued before it is refused as forged from now on: issue new ones with 'squelchd token issue'")
        }
    }
}

/// Why `inspect` or `revoke --token` could not read a token, with the way out when it may be an old
/// key's: after a rotation the server still accepts those, and they are often the ones to revoke.
func inspectionFailure(_ error: TokenError, rotating: Bool) -> String {
    guard error == .forged, !rotating else { return "\(error)" }
    return "\(error) (if the token key was rotated and this token is from before, pass the old key with --previous-token-key)"
}

/// The server's token key. A broken or missing one is a configuration error (exit 78) with its fix.
///
/// Only `issue` may make the default key, and only beside the server's database: run from the wrong
/// directory, or without the server's `SQUELCH_DATA_DIR`, it would otherwise print a token signed by
/// a key of its own that the server refuses as forged, with nothing to say why. The other commands
/// (`forIssue` false) also accept the previous key of a rotation, as the server does.
func loadAuthority(_ configuration: ServerConfiguration, forIssue: Bool) async throws -> TokenAuthority {
    let path = configuration.resolvedTokenKeyPath
    if configuration.sharesDatabase, configuration.tokenKeyPath == nil {
        return try await loadClusterAuthority(configuration, forIssue: forIssue)
    }
    let database = Channel.StoreOptions.databasePath(in: configuration.dataDirectory)
    let elsewhere = "pass the server's --data-dir or --config (or set SQUELCH_DATA_DIR as the server has it)"
    do {
        // The key squelchd last started with (nil: no database yet, or no server start since the
        // server began recording it).
        let serverKey = try FileManager.default.fileExists(atPath: database)
            ? SQLiteChannelStore.recordedServerKey(named: TokenAuthority.publicKeyRecordName, inDirectory: configuration.dataDirectory)
                .map { String(decoding: $0, as: UTF8.self) }
            : nil
        let authority: TokenAuthority
        if let configured = configuration.tokenKeyPath {
            guard FileManager.default.fileExists(atPath: configured) else {
                throw TokenKeyError(message: "there is no token key at \(configured); point --token-key (or SQUELCH_TOKEN_KEY, or \"tokenKeyPath\" in the config file) at the server's key")
            }
            authority = try await TokenAuthority.load(from: configured)
        } else {
            // The default key counts only beside the server's database: a key file alone may be a stray
            // one from a command run in the wrong directory.
            guard FileManager.default.fileExists(atPath: database) else {
                throw TokenKeyError(message: "there is no server database at \(database), so \(path) is not known to be the server's token key; \(elsewhere). On a new server, create a channel first ('squelchd channel create')")
            }
            if FileManager.default.fileExists(atPath: path) {
                authority = try await TokenAuthority.load(from: path)
            } else if serverKey != nil {
                // The server signs with a key kept elsewhere (its tokenKeyPath): a new default key here
                // would only make tokens it refuses.
                throw TokenKeyError(message: "squelchd was served with a token key that is not at \(path). If it keeps its key elsewhere, pass the server's --token-key or the --config it runs with. If the file was lost: \(SquelchServer.lostTokenKeyAdvice(path: path, dataDirectory: configuration.dataDirectory))")
            } else if forIssue {
                authority = try await TokenAuthority.loadOrCreate(at: path)
            } else {
                throw TokenKeyError(message: "there is no token key at \(path) (the server makes it when it first starts); if the server keeps its key elsewhere, pass its --token-key or --config")
            }
        }
        if let serverKey, serverKey != authority.publicKeyPEM {
            throw TokenKeyError(message: "the token key at \(configuration.tokenKeyPath ?? path) is not the one squelchd last started with, so the server would refuse its tokens as forged; pass the server's --token-key, or the --config it runs with (if you have just given the server a new key, restart squelchd first)")
        }
        // During a rotation the server still accepts the previous key's tokens, so inspect and revoke
        // must read them too (a leaked old token is often why the key is rotated). Issue never signs
        // with it.
        if !forIssue, let previous = configuration.previousTokenKeyPath {
            return try await authority.accepting(previousKeyAt: previous)
        }
        return authority
    } catch {
        standardError("squelchd: \(error)")
        throw ExitCode(78)
    }
}

/// The cluster's token key, from its database (`SharedSecrets`): `issue` stores one if no node has
/// yet, as the first node would; the others need a node to have started.
private func loadClusterAuthority(_ configuration: ServerConfiguration, forIssue: Bool) async throws -> TokenAuthority {
    do {
        let store = try await configuration.openStore(logger: Logger(label: "squelchd"))
        defer { Task { try? await store.close() } }
        let stored = forIssue
            ? try await SharedSecrets.tokenAuthority(store: store, seedFile: configuration.resolvedTokenKeyPath)
            : try await SharedSecrets.storedTokenAuthority(store: store)
        guard let authority = stored else {
            throw TokenKeyError(message: "the cluster's database holds no token key yet (the first node stores it when it starts); start a node with this --database first")
        }
        if !forIssue, let previous = configuration.previousTokenKeyPath {
            return try await authority.accepting(previousKeyAt: previous)
        }
        return authority
    } catch {
        standardError("squelchd: \(error)")
        throw ExitCode(78)
    }
}
