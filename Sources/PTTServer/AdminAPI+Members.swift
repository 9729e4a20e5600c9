import ChannelProtocol
import ChannelStore
import Foundation
import Hummingbird
import ParticipantClaims
import ParticipantTokens

extension AdminAPI {
    /// A channel's members: the stored ones, the live roster, and an administrator's removal.
    struct MembersController {
        let admin: AdminContext

        func addRoutes(to group: RouterGroup<BasicRequestContext>) {
            let admin = self.admin, store = admin.store
            group.get("channels/:id/members") { _, context in
                let id = try channelID(context)
                _ = try await existingChannel(id, in: store)
                return try json(try await store.members(of: id).map(MemberView.init))
            }

            group.delete("channels/:id/members/:user") { _, context in
                let id = try channelID(context)
                // Path parameters arrive percent-encoded (a user id may hold any character).
                let raw = try context.parameters.require("user")
                let user = raw.removingPercentEncoding ?? raw
                _ = try await existingChannel(id, in: store)
                // The hub is asked too: a member that joined moments ago is live before the store writer
                // has written its row, and an administrator who sees it in the roster must be able to
                // remove it. The hub's removal then queues the row's deletion behind that write.
                var known = try await store.member(channel: id, user: user) != nil
                if !known, let hub = admin.hub { known = await hub.isMember(channel: id, user: user) }
                guard known else { throw StoreError.memberNotFound(channel: id, user: user) }
                // Revoked first, so that a rejoin racing the removal is refused: the tokens the member
                // holds stop working, and a token issued from the next millisecond on lets it back in.
                let revocation = try await store.revoke(.member(channel: id, user: user, at: Date(), reason: "removed by an administrator"))
                do { try await store.removeMember(channel: id, user: user) } catch StoreError.memberNotFound {}
                await admin.hub?.memberRemoved(channel: id, user: user, revocation: revocation)
                await admin.audit("member removed", channel: id, user: user)
                return Response(status: .noContent)
            }

            group.get("channels/:id/roster") { _, context in
                let id = try channelID(context)
                _ = try await existingChannel(id, in: store)
                return try json(await admin.hub?.roster(of: id) ?? [])
            }
        }
    }
}
