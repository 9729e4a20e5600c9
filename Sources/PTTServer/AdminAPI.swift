import Foundation
import Hummingbird
import SquelchInfo

/// The admin HTTP API. For now: health and version; channels, tokens and metrics join it in issue 4.
public enum AdminAPI {
    /// `GET /healthz` body. `status` is "ok" while the server can serve.
    public struct Health: ResponseCodable, Sendable, Equatable {
        public var status: String
        public var version: String
        public var uptimeSeconds: Double
        public var certificate: String
    }

    /// Builds the router. `started` is the server's start time, for uptime.
    public static func router(identitySummary: String, started: Date = Date()) -> Router<BasicRequestContext> {
        let router = Router()
        router.get("/healthz") { _, _ in
            Health(status: "ok", version: SquelchInfo.version, uptimeSeconds: Date().timeIntervalSince(started),
                   certificate: identitySummary)
        }
        router.get("/version") { _, _ in SquelchInfo.version + "\n" }
        return router
    }
}
