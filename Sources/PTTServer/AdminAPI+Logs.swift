import ChannelProtocol
import ChannelStore
import Foundation
import Hummingbird
import ParticipantClaims
import ParticipantTokens

extension AdminAPI {
    /// The logs an operator reads: a channel's transmissions, and the audit trail.
    struct LogsController {
        let admin: AdminContext

        func addRoutes(to group: RouterGroup<BasicRequestContext>) {
            let admin = self.admin, store = admin.store
            group.get("channels/:id/transmissions") { request, context in
                let id = try channelID(context)
                let limit = try limitParameter(request)
                // The log outlives a deleted channel, so a deleted channel's bursts can still be read; a
                // channel that never had any and doesn't exist is a 404.
                let log = try await store.transmissions(of: id, limit: limit)
                if log.isEmpty { _ = try await existingChannel(id, in: store) }
                return try json(log)
            }

            group.get("audit") { request, _ in
                let limit = try limitParameter(request)
                var channel: UUID?
                if let text = request.uri.queryParameters.get("channel") {
                    guard let id = UUID(uuidString: text) else {
                        throw AdminError(.badRequest, "channel must be a channel UUID, not '\(text)'; GET /v1/channels lists them")
                    }
                    channel = id
                }
                // A deleted channel's records stay readable, as its transmission log does.
                return try json(try await store.auditRecords(channel: channel, limit: limit))
            }
        }
    }
}
