import Foundation
import Logging
import ServiceLifecycle

/// The server certificate's expiry, said before it comes and after it came. squelchd checks the
/// certificate at start, but one that expires while it runs is refused by every client's handshake
/// from that moment, and nothing on the server would otherwise say why: the log gets a warning once
/// a day from `warningWindow` before, and an error every hour once it has expired; `/healthz` says
/// the same (`status(at:)`).
public struct CertificateExpiry: Sendable {
    public var subject: String
    public var notValidAfter: Date
    /// Two weeks: time for a renewal through whoever issues the certificate.
    public static let warningWindow: TimeInterval = 14 * 86_400

    public init(subject: String, notValidAfter: Date) {
        self.subject = subject
        self.notValidAfter = notValidAfter
    }

    public enum Status: Equatable, Sendable {
        case fine
        case expiresSoon(String)
        case expired(String)
    }

    public func status(at now: Date = Date()) -> Status {
        let left = notValidAfter.timeIntervalSince(now)
        let when = notValidAfter.formatted(.iso8601)
        if left <= 0 {
            return .expired("the server's certificate (\(subject)) expired at \(when): every client refuses the handshake. Install a renewed certificate (--cert and --key) and restart squelchd")
        }
        if left <= Self.warningWindow {
            let days = Int(left / 86_400)
            let within = days >= 1 ? "in \(days) day\(days == 1 ? "" : "s")" : "in \(Int(left / 3_600)) hours"
            return .expiresSoon("the server's certificate (\(subject)) expires at \(when), \(within); clients will refuse it from then on. Renew it and restart squelchd with it (--cert and --key)")
        }
        return .fine
    }

    /// How long until the log should speak again.
    func nextLook(at now: Date) -> TimeInterval {
        let left = notValidAfter.timeIntervalSince(now)
        if left <= 0 { return 3_600 }
        if left <= Self.warningWindow { return min(86_400, left) }
        return min(86_400, left - Self.warningWindow)
    }
}

/// Runs `CertificateExpiry`'s log lines until shutdown.
struct CertificateWatch: Service {
    let expiry: CertificateExpiry
    let logger: Logger

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                let now = Date()
                switch expiry.status(at: now) {
                case .fine: break
                case .expiresSoon(let text): logger.warning("\(text)")
                case .expired(let text): logger.error("\(text)")
                }
                try await Task.sleep(for: .seconds(expiry.nextLook(at: now)))
            }
        }
    }
}
