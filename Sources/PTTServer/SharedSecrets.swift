import ChannelStore
import Crypto
import Foundation
import KeyFiles
import Logging
import ParticipantTokens

/// The secrets every node of a cluster must hold alike, kept in the shared database: a token issued
/// on one node joins on any, and the admin key works on every node's API. The first node to start
/// stores them (its own key files, if it has some from single-node days, so nothing issued so far
/// stops working); the others read them. Whoever can read the database can read these, as whoever
/// can read a data directory can read its key files: give the database user to squelchd alone.
public enum SharedSecrets {
    /// The server-key names of the shared private token key and the shared admin key.
    static let tokenKeyRecordName = "token-private-key"
    static let adminKeyRecordName = "admin-key"

    /// The cluster's token key: stored once, from `seedFile` if that exists, else made new.
    public static func tokenAuthority(store: any ChannelStore, seedFile: String) async throws -> TokenAuthority {
        let seed = FileManager.default.fileExists(atPath: seedFile)
            ? try String(contentsOfFile: seedFile, encoding: .utf8)
            : P256.Signing.PrivateKey().pemRepresentation
        let stored = try await store.storeServerKeyIfAbsent(named: tokenKeyRecordName, value: Array(seed.utf8))
        return try await authority(stored)
    }

    /// The cluster's token key if a node has stored it: what the token commands sign and check with.
    public static func storedTokenAuthority(store: any ChannelStore) async throws -> TokenAuthority? {
        guard let stored = try await store.serverKey(named: tokenKeyRecordName) else { return nil }
        return try await authority(stored)
    }

    private static func authority(_ stored: [UInt8]) async throws -> TokenAuthority {
        do { return try await TokenAuthority(privateKeyPEM: String(decoding: stored, as: UTF8.self)) } catch {
            throw TokenKeyError(message: "the cluster's token key in the database ('\(tokenKeyRecordName)' in server_key) is not a P-256 private key in PEM; restore the database from a backup (every issued token is signed with it)")
        }
    }

    /// The cluster's admin key, also written to `file` (mode 0600) so that an operator on this node
    /// finds it where a single node keeps it. A file holding another key (this node's own, from
    /// before it joined the cluster) is replaced, and the log says so.
    static func adminKey(store: any ChannelStore, file: String, logger: Logger) async throws -> String {
        let own = (try? String(contentsOfFile: file, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        let seed = own.flatMap { $0.count >= ServerConfiguration.minimumAdminKeyLength ? $0 : nil } ?? ServerConfiguration.generateAdminKey()
        let key = String(decoding: try await store.storeServerKeyIfAbsent(named: adminKeyRecordName, value: Array(seed.utf8)), as: UTF8.self)
        guard key != own else { return key }
        if own != nil {
            logger.warning("the admin key in \(file) was this node's own; the cluster's key replaces it (every node's admin API takes the same key)")
            try? FileManager.default.removeItem(atPath: file)
        }
        do { _ = try KeyFiles.createOnce(at: file, contents: Array((key + "\n").utf8)) } catch {
            logger.warning("could not write the cluster's admin key to \(file): \(error.description)")
        }
        return key
    }
}
