import Crypto
import Foundation
import JWTKit
import Logging
import NIOCore

/// How to run an `APNsSimulator`.
public struct APNsSimulatorConfiguration: Sendable {
    /// Address both listeners bind.
    public var host: String
    /// APNs port: HTTP/2 over TLS. 0 picks a free port (`start()` returns it).
    public var port: Int
    /// Control API port: plain HTTP/1.1. 0 picks a free port.
    public var controlPort: Int
    /// PEM certificate chain the APNs port presents, leaf first (`certs/apns-sim.pem`).
    public var certificateChainPath: String
    /// PEM private key of the leaf (`certs/apns-sim.key`).
    public var privateKeyPath: String
    /// Provider keys whose JWTs are accepted.
    public var providerKeys: [APNsProviderKey]
    /// Topics a push may name; nil allows any.
    public var allowedTopics: Set<String>?
    /// MAX_CONCURRENT_STREAMS advertised once a connection has sent a valid JWT (1 before, as Apple does).
    public var maxConcurrentStreams: Int
    /// Accepted pushes kept in memory, and rejections likewise; the oldest go first.
    public var logCapacity: Int
    /// The clock the JWT rules read (`iat` age, the 20-minute rule) and records are stamped with.
    /// Tests replace it to cover hours without waiting.
    public var now: @Sendable () -> Date = { Date() }
    /// Where the simulator and its control API log. Quiet (warnings and up) unless replaced.
    public var logger: Logger = {
        var logger = Logger(label: "apns-sim")
        logger.logLevel = .warning
        return logger
    }()

    public init(certificateChainPath: String, privateKeyPath: String, providerKeys: [APNsProviderKey],
                host: String = "127.0.0.1", port: Int = 0, controlPort: Int = 0, allowedTopics: Set<String>? = nil,
                maxConcurrentStreams: Int = 1000, logCapacity: Int = 100_000) {
        self.certificateChainPath = certificateChainPath
        self.privateKeyPath = privateKeyPath
        self.providerKeys = providerKeys
        self.host = host
        self.port = port
        self.controlPort = controlPort
        self.allowedTopics = allowedTopics
        self.maxConcurrentStreams = maxConcurrentStreams
        self.logCapacity = logCapacity
    }
}

/// A provider signing key as APNs knows it: its ID, its team and the public half.
public struct APNsProviderKey: Sendable {
    /// The 10-character Key ID, the JWT's `kid`.
    public var keyID: String
    /// The 10-character Team ID, the JWT's `iss`.
    public var teamID: String
    public var publicKey: P256.Signing.PublicKey

    public init(keyID: String, teamID: String, publicKey: P256.Signing.PublicKey) {
        self.keyID = keyID
        self.teamID = teamID
        self.publicKey = publicKey
    }

    /// Reads an Apple-style .p8 (PKCS#8 PEM private key) and keeps its public half.
    public static func load(p8Path: String, keyID: String, teamID: String) throws -> APNsProviderKey {
        guard let data = FileManager.default.contents(atPath: p8Path) else {
            throw APNsSimulatorError.unreadableFile(what: "APNs provider key (.p8)", path: p8Path, underlying: "missing or not readable")
        }
        let pem = String(decoding: data, as: UTF8.self)
        do {
            return APNsProviderKey(keyID: keyID, teamID: teamID, publicKey: try P256.Signing.PrivateKey(pemRepresentation: pem).publicKey)
        } catch {
            throw APNsSimulatorError.invalidFile(what: "APNs provider key (.p8)", path: p8Path,
                                                 problem: "not a PEM P-256 private key (\(error))")
        }
    }
}

/// Why the simulator couldn't be made or started. Each message says what to do.
public enum APNsSimulatorError: Error, CustomStringConvertible, Sendable, Equatable {
    case unreadableFile(what: String, path: String, underlying: String)
    case invalidFile(what: String, path: String, problem: String)
    case invalidConfiguration(String)
    case alreadyStarted
    case bindFailed(what: String, host: String, port: Int, underlying: String)

    public var description: String {
        switch self {
        case .unreadableFile(let what, let path, let underlying):
            "cannot read the \(what) at \(path) (\(underlying)); make the development certificates with `make certs` (certs/make-dev-certs.sh)"
        case .invalidFile(let what, let path, let problem):
            "the \(what) at \(path) is unusable: \(problem); remake it with `./certs/make-dev-certs.sh --force`"
        case .invalidConfiguration(let message):
            message
        case .alreadyStarted:
            "the APNs simulator was already started; make a new one to start again"
        case .bindFailed(let what, let host, let port, let underlying):
            "cannot listen for the \(what) on \(host):\(port) (\(underlying)); pick another port or stop what uses it"
        }
    }

    /// What went wrong opening a socket, in words where the errno says enough (NIO's own text is
    /// "bind(descriptor:ptr:bytes:): Address already in use) (errno: 98)").
    static func bindReason(_ error: any Error) -> String {
        switch (error as? IOError)?.errnoCode {
        case EADDRINUSE?: "the port is in use, perhaps by another squelchd"
        case EACCES?: "permission denied: ports below 1024 need root or CAP_NET_BIND_SERVICE"
        case EADDRNOTAVAIL?: "this machine has no such address"
        default: "\(error)"
        }
    }
}

/// Checks ES256 signatures with jwt-kit, one key per `kid`.
struct JWTKitProviderTokenVerifier: ProviderTokenVerifying {
    private let keys: [String: (teamID: String, algorithm: any JWTAlgorithm)]

    /// jwt-kit hands out its verifiers only through the key collection actor, hence async; after this
    /// every check is a synchronous call on the event loop.
    static func make(_ providerKeys: [APNsProviderKey]) async throws -> JWTKitProviderTokenVerifier {
        let collection = JWTKeyCollection()
        var keys: [String: (teamID: String, algorithm: any JWTAlgorithm)] = [:]
        for key in providerKeys {
            let kid = JWKIdentifier(string: key.keyID)
            await collection.add(ecdsa: try ES256PublicKey(backing: key.publicKey), kid: kid)
            keys[key.keyID] = (key.teamID, try await collection.getKey(for: kid, alg: "ES256"))
        }
        return JWTKitProviderTokenVerifier(keys: keys)
    }

    func teamID(forKeyID keyID: String) -> String? { keys[keyID]?.teamID }

    func isValidSignature(_ signature: [UInt8], signingInput: ArraySlice<UInt8>, keyID: String) -> Bool {
        guard let algorithm = keys[keyID]?.algorithm else { return false }
        return (try? algorithm.verify(signature, signs: signingInput)) ?? false
    }
}
