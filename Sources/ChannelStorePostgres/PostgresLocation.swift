import ChannelStore
import Foundation
import NIOSSL
import PostgresNIO

/// Where a PostgreSQL database is, read from the URL an operator gives `--database`:
/// `postgres://user:password@host:5432/squelch?sslmode=require`, or a Unix socket directory with
/// `postgres://user@/squelch?host=/run/postgresql` (libpq's spelling, so the URL a team already uses
/// for psql works here too).
public struct PostgresLocation: Sendable, Equatable, CustomStringConvertible {
    public enum Endpoint: Sendable, Equatable {
        case tcp(host: String, port: Int)
        case unixSocket(directory: String, port: Int)
    }

    /// libpq's `sslmode` values that mean something without client certificates.
    public enum TLSMode: String, Sendable, Equatable, CaseIterable {
        /// Plain TCP.
        case disable
        /// TLS if the server offers it, unverified (libpq's default).
        case prefer
        /// TLS or nothing, unverified: protects from eavesdroppers, not from an impostor.
        case require
        /// TLS with the server's certificate checked against the system's roots and its host name.
        case verifyFull = "verify-full"
    }

    public var endpoint: Endpoint
    public var username: String
    public var password: String?
    public var database: String
    public var tls: TLSMode

    public init(endpoint: Endpoint, username: String, password: String? = nil, database: String, tls: TLSMode = .prefer) {
        self.endpoint = endpoint
        self.username = username
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// Parses a `postgres://` (or `postgresql://`) URL; the error says what is wrong with it.
    public init(url text: String) throws(StoreError) {
        let example = "e.g. postgres://squelch:secret@db.example.com:5432/squelch"
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            throw .invalid("the database URL '\(Self.redacted(text))' is not a URL; \(example)")
        }
        guard scheme == "postgres" || scheme == "postgresql" else {
            throw .invalid("the database URL must start with postgres:// (got \(scheme)://); \(example), or leave --database out to use SQLite in the data directory")
        }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] { query[item.name] = item.value ?? "" }
        let known: Set<String> = ["sslmode", "host", "port", "user", "password", "dbname"]
        if let unknown = query.keys.sorted().first(where: { !known.contains($0) }) {
            throw .invalid("the database URL has an unknown parameter '\(unknown)'; known: \(known.sorted().joined(separator: ", "))")
        }
        let port: Int
        if let given = query["port"] ?? components.port.map(String.init) {
            guard let value = Int(given), (1...65_535).contains(value) else {
                throw .invalid("the database URL's port '\(given)' is not a port number (1-65535)")
            }
            port = value
        } else {
            port = 5432
        }
        guard let username = query["user"] ?? components.user, !username.isEmpty else {
            throw .invalid("the database URL names no user; \(example)")
        }
        let database = query["dbname"] ?? String(components.path.drop(while: { $0 == "/" }))
        guard !database.isEmpty, !database.contains("/") else {
            throw .invalid("the database URL names no database (the path after the host); \(example)")
        }
        let tls: TLSMode
        if let mode = query["sslmode"] {
            guard let parsed = TLSMode(rawValue: mode) else {
                throw .invalid("the database URL's sslmode '\(mode)' is not one of \(TLSMode.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            tls = parsed
        } else {
            tls = .prefer
        }
        var host = query["host"] ?? components.host ?? ""
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host.hasPrefix("/") {
            endpoint = .unixSocket(directory: host, port: port)
        } else {
            guard !host.isEmpty else {
                throw .invalid("the database URL names no host; \(example), or ?host=/run/postgresql for a Unix socket")
            }
            endpoint = .tcp(host: host, port: port)
        }
        self.username = username
        self.password = query["password"] ?? components.password
        self.database = database
        self.tls = tls
    }

    /// The URL without its password: what logs and error messages show.
    public var description: String {
        let user = username + (password == nil ? "" : ":***")
        switch endpoint {
        case .tcp(let host, let port):
            return "postgres://\(user)@\(host.contains(":") ? "[\(host)]" : host):\(port)/\(database)?sslmode=\(tls.rawValue)"
        case .unixSocket(let directory, let port):
            return "postgres://\(user)@/\(database)?host=\(directory)&port=\(port)"
        }
    }

    /// The URL itself, password included: what a configuration holds. Never log it; log `description`.
    public var url: String {
        var components = URLComponents()
        components.scheme = "postgres"
        components.user = username
        components.password = password
        components.path = "/" + database
        var query = [URLQueryItem(name: "sslmode", value: tls.rawValue)]
        switch endpoint {
        case .tcp(let host, let port):
            components.host = host.contains(":") ? "[\(host)]" : host
            components.port = port
        case .unixSocket(let directory, let port):
            query += [URLQueryItem(name: "host", value: directory), URLQueryItem(name: "port", value: "\(port)")]
        }
        components.queryItems = query
        return components.string ?? description
    }

    /// `text` with any password replaced, for messages about a URL that did not parse.
    static func redacted(_ text: String) -> String {
        text.replacingOccurrences(of: #"://([^:/@]*):[^@]*@"#, with: "://$1:***@", options: .regularExpression)
    }

    /// The TLS settings for `tls`: the server's certificate is checked only with `verify-full`, as
    /// libpq does (`require` encrypts without checking who answers).
    var tlsConfiguration: TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        if tls != .verifyFull { configuration.certificateVerification = .none }
        return configuration
    }

    /// The configuration of a single connection (LISTEN needs one of its own).
    func connectionConfiguration() throws -> PostgresConnection.Configuration {
        switch endpoint {
        case .tcp(let host, let port):
            let mode: PostgresConnection.Configuration.TLS = switch tls {
            case .disable: .disable
            case .prefer: .prefer(try NIOSSLContext(configuration: tlsConfiguration))
            case .require, .verifyFull: .require(try NIOSSLContext(configuration: tlsConfiguration))
            }
            return .init(host: host, port: port, username: username, password: password, database: database, tls: mode)
        case .unixSocket(let directory, let port):
            return .init(unixSocketPath: "\(directory)/.s.PGSQL.\(port)", username: username, password: password, database: database)
        }
    }

    /// The client configuration postgres-nio takes.
    func clientConfiguration() -> PostgresClient.Configuration {
        var configuration: PostgresClient.Configuration
        switch endpoint {
        case .tcp(let host, let port):
            let mode: PostgresClient.Configuration.TLS = switch tls {
            case .disable: .disable
            case .prefer: .prefer(tlsConfiguration)
            case .require, .verifyFull: .require(tlsConfiguration)
            }
            configuration = .init(host: host, port: port, username: username, password: password, database: database, tls: mode)
        case .unixSocket(let directory, let port):
            // The server's socket is named after its port, as libpq finds it.
            configuration = .init(unixSocketPath: "\(directory)/.s.PGSQL.\(port)", username: username, password: password,
                                  database: database)
        }
        configuration.options.connectTimeout = .seconds(5)
        // A node stopped (SIGSTOP, a long stall) in the middle of a transaction keeps its row locks
        // while the database still sees its connection: the server ends such a session after 2 s,
        // and no statement waits more than 2 s for a lock, so another node taking over a channel is
        // never held up by it for long. Every transaction here is a few short statements.
        configuration.options.additionalStartupParameters = [
            ("idle_in_transaction_session_timeout", "2000"), ("lock_timeout", "2000"),
        ]
        return configuration
    }
}
