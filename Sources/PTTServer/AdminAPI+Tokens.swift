import ChannelProtocol
import ChannelStore
import Foundation
import Hummingbird
import ParticipantClaims
import ParticipantTokens

extension AdminAPI {
    /// Participant tokens of a channel: issuing them, and revoking them.
    struct TokensController {
        let admin: AdminContext

        func addRoutes(to group: RouterGroup<BasicRequestContext>) {
            let admin = self.admin, store = admin.store
            group.post("channels/:id/tokens") { request, context in
                let id = try channelID(context)
                _ = try await existingChannel(id, in: store)
                let body = try await decode(TokenRequest.self, from: request)
                let claims = try body.claims(channel: id, now: Date())
                do throws(InvalidClaims) { try claims.validateForIssue() } catch { throw AdminError(.badRequest, error.message) }
                let token: String
                do { token = try await admin.tokens.issue(claims) } catch {
                    throw AdminError(.internalServerError, "could not sign the token (\(error)); check the token key in the data directory")
                }
                await admin.audit("token issued", channel: id, user: claims.userID, AuditRecord.tokenDetails(claims))
                return try json(IssuedToken(token: token, tokenID: claims.tokenID, channel: id, user: claims.userID,
                                            expiresAt: claims.expiresAt), status: .created)
            }

            group.post("channels/:id/revocations") { request, context in
                let id = try channelID(context)
                _ = try await existingChannel(id, in: store)
                let body = try await decode(RevocationRequest.self, from: request)
                let revocation = try await body.revocation(channel: id, tokens: admin.tokens, now: Date())
                let stored: RevocationRecord
                let isNew: Bool
                switch try await store.revokeToken(revocation, byIDAlone: body.token == nil) {
                case .otherChannel(let channel, let holder):
                    throw AdminError(.badRequest, "token \(revocation.tokenID ?? "") is the one member '\(holder)' of channel \(channel) last joined with, not a token for this channel; revoke it there")
                case .revoked(let record, let new, _):
                    (stored, isNew) = (record, new)
                }
                await admin.hub?.tokenRevoked(stored)
                await admin.audit(isNew ? "token revoked" : "token revocation repeated", channel: id, user: stored.userID,
                                  AuditRecord.revocationDetails(stored, requestedReason: revocation.reason))
                // Revoked before: the first revocation stands (its time and reason), so nothing was created.
                return try json(stored, status: isNew ? .created : .ok)
            }

            group.get("channels/:id/revocations") { _, context in
                let id = try channelID(context)
                _ = try await existingChannel(id, in: store)
                return try json(try await store.revocations(after: 0, channel: id))
            }
        }
    }

    /// `POST /v1/channels/:id/tokens` answer.
    public struct IssuedToken: Codable, Sendable, Equatable {
        public var token: String
        public var tokenID: String
        public var channel: UUID
        public var user: String
        public var expiresAt: Date
    }

    struct TokenRequest: Decodable {
        static let fields = ["user", "name", "capabilities", "priority", "role", "image", "ttlSeconds"]
        var user: String
        var name: String
        var capabilities: [String]?
        var priority: Int?
        var role: String?
        /// An https URL of the participant's picture.
        var image: String?
        var ttlSeconds: Int?

        func claims(channel: UUID, now: Date) throws(AdminError) -> ParticipantClaims {
            // Lengths and characters are `ParticipantClaims.validateForIssue`'s, as for the CLI.
            let user = self.user.trimmingCharacters(in: .whitespacesAndNewlines)
            let name = self.name.trimmingCharacters(in: .whitespacesAndNewlines)
            var capabilities = Set<Capability>()
            for text in self.capabilities ?? ["talk", "listen"] {
                guard let capability = Capability(rawValue: text) else {
                    throw AdminError(.badRequest, "unknown capability '\(text)'; use \"talk\", \"listen\" or both")
                }
                capabilities.insert(capability)
            }
            guard !capabilities.isEmpty else {
                throw AdminError(.badRequest, "capabilities is empty; give \"talk\", \"listen\" or both")
            }
            let priority = self.priority ?? 0
            guard (0...255).contains(priority) else {
                throw AdminError(.badRequest, "priority must be 0-255, not \(priority)")
            }
            let ttl = ttlSeconds ?? defaultTokenLifetimeSeconds
            guard (1...maxTokenLifetimeSeconds).contains(ttl) else {
                throw AdminError(.badRequest, "ttlSeconds must be 1-\(maxTokenLifetimeSeconds) (30 days), not \(ttl)")
            }
            let role = role?.trimmingCharacters(in: .whitespacesAndNewlines)
            return ParticipantClaims(userID: user, name: name, channel: channel, capabilities: capabilities,
                                     role: role?.isEmpty == true ? nil : role, image: image?.trimmingCharacters(in: .whitespacesAndNewlines),
                                     priority: UInt8(priority),
                                     issuedAt: now, expiresAt: now.addingTimeInterval(TimeInterval(ttl)))
        }
    }

    /// `POST /v1/channels/:id/revocations`: one token, by its id (`tokenID` from the issue answer) or
    /// whole (`token`, whose expiry then bounds how long the revocation is kept).
    struct RevocationRequest: Decodable {
        static let fields = ["tokenID", "token", "reason"]
        var tokenID: String?
        var token: String?
        var reason: String?

        func revocation(channel: UUID, tokens: TokenAuthority, now: Date) async throws(AdminError) -> RevocationRecord {
            // Lengths are checked by `RevocationRecord.validate()` when the store takes it (a 400).
            let reason = (reason?.trimmingCharacters(in: .whitespacesAndNewlines)).flatMap { $0.isEmpty ? nil : $0 } ?? "revoked by an administrator"
            switch (tokenID, token) {
            case (let id?, nil):
                guard RevocationRecord.isIssuedTokenID(id) else {
                    throw AdminError(.badRequest, "tokenID '\(id.prefix(64))' is not a token id (a UUID: the tokenID of the issue answer, or of the member in GET /v1/channels/:id/members); or send the token itself as token")
                }
                return .token(id, channel: channel, user: nil, expiresAt: nil, at: now, reason: reason)
            case (nil, let token?):
                let claims: ParticipantClaims
                do throws(TokenError) { claims = try await tokens.inspect(token) } catch {
                    throw AdminError(.badRequest, "token: \(error)")
                }
                guard claims.channel == channel else {
                    throw AdminError(.badRequest, "the token is for channel \(claims.channel), not \(channel); revoke it there")
                }
                // Its revocation would be pruned as soon as stored (it outlives the token by nothing),
                // and a second request would be told "new" again: say what is true instead.
                guard claims.expiresAt > now else {
                    throw AdminError(.conflict, "the token expired at \(claims.expiresAt.formatted(.iso8601)), so it can't join anyway; nothing was revoked")
                }
                return .token(claims.tokenID, channel: channel, user: claims.userID, expiresAt: claims.expiresAt, at: now, reason: reason)
            default:
                throw AdminError(.badRequest, "send either tokenID (from the token's issue answer) or token (the token itself)")
            }
        }
    }
}
