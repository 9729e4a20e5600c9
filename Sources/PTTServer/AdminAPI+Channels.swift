import ChannelProtocol
import ChannelStore
import Foundation
import Hummingbird
import ParticipantClaims
import ParticipantTokens

extension AdminAPI {
    /// `/v1/channels` and `/v1/channels/:id`: list, create, read, change and delete channels.
    struct ChannelsController {
        let admin: AdminContext

        func addRoutes(to group: RouterGroup<BasicRequestContext>) {
            let admin = self.admin, store = admin.store
            group.get("channels") { _, _ in
                try json(try await store.channels().map(ChannelView.init))
            }

            group.post("channels") { request, _ in
                let body = try await decode(NewChannel.self, from: request)
                var channel = ChannelRecord(name: body.name.trimmingCharacters(in: .whitespacesAndNewlines), image: body.image,
                                            maxBurstSeconds: body.maxBurstSeconds ?? 60)
                if let mode = body.mode { channel.mode = try transmissionMode(mode) }
                try channel.validate()
                try await store.createChannel(channel)
                // The hub first: the trail's write (which may wait on a busy database) must not delay
                // what connected members see.
                await admin.hub?.channelChanged(channel.id)
                await admin.audit("channel created", channel: channel.id, ["name": channel.name, "mode": "\(channel.mode)",
                                                                           "max_burst_seconds": "\(channel.maxBurstSeconds)"])
                return try json(ChannelView(try await store.channel(channel.id) ?? channel), status: .created)
            }

            group.get("channels/:id") { _, context in
                try json(ChannelView(try await existingChannel(try channelID(context), in: store)))
            }

            group.patch("channels/:id") { request, context in
                let id = try channelID(context)
                let patch = try await decode(ChannelPatch.self, from: request)
                var channel = try await existingChannel(id, in: store)
                if let name = patch.name { channel.name = name.trimmingCharacters(in: .whitespacesAndNewlines) }
                if patch.imageSent { channel.image = patch.image }
                if let mode = patch.mode { channel.mode = try transmissionMode(mode) }
                if let burst = patch.maxBurstSeconds { channel.maxBurstSeconds = burst }
                try channel.validate()
                let updated = try await store.updateChannel(channel)
                await admin.hub?.channelChanged(id)
                await admin.audit("channel updated", channel: id, ["name": updated.name, "mode": "\(updated.mode)",
                                                                   "max_burst_seconds": "\(updated.maxBurstSeconds)", "image": updated.image == nil ? "none" : "set"])
                return try json(ChannelView(updated))
            }

            group.delete("channels/:id") { _, context in
                let id = try channelID(context)
                // Read first: once deleted, the trail's record is all that names the channel.
                let channel = try await existingChannel(id, in: store)
                try await store.deleteChannel(id)
                await admin.hub?.channelDeleted(id)
                await admin.audit("channel deleted", channel: id, ["name": channel.name])
                return Response(status: .noContent)
            }
        }
    }

    struct NewChannel: Decodable {
        static let fields = ["name", "image", "mode", "maxBurstSeconds"]
        var name: String
        var image: String?
        var mode: String?
        var maxBurstSeconds: Int?
    }

    /// A partial update: absent fields stay; `"image": null` clears the image.
    struct ChannelPatch: Decodable {
        static let fields = NewChannel.fields
        var name: String?
        var image: String?
        var imageSent = false
        var mode: String?
        var maxBurstSeconds: Int?

        enum CodingKeys: String, CodingKey { case name, image, mode, maxBurstSeconds }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decodeIfPresent(String.self, forKey: .name)
            mode = try container.decodeIfPresent(String.self, forKey: .mode)
            maxBurstSeconds = try container.decodeIfPresent(Int.self, forKey: .maxBurstSeconds)
            if container.contains(.image) {
                imageSent = true
                image = try container.decodeNil(forKey: .image) ? nil : try container.decode(String.self, forKey: .image)
            }
            if name == nil, !imageSent, mode == nil, maxBurstSeconds == nil {
                throw AdminError(.badRequest, "nothing to change; send one or more of \(Self.fields.joined(separator: ", "))")
            }
        }
    }

    /// A channel as the API shows it: `ChannelRecord`'s fields, with `image` always present (null when
    /// there is none).
    struct ChannelView: Encodable {
        var channel: ChannelRecord
        init(_ channel: ChannelRecord) { self.channel = channel }

        enum CodingKeys: String, CodingKey { case id, name, image, mode, maxBurstSeconds, createdAt, updatedAt }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(channel.id, forKey: .id)
            try container.encode(channel.name, forKey: .name)
            try container.encode(channel.image, forKey: .image)
            try container.encode(channel.mode, forKey: .mode)
            try container.encode(channel.maxBurstSeconds, forKey: .maxBurstSeconds)
            try container.encode(channel.createdAt, forKey: .createdAt)
            try container.encode(channel.updatedAt, forKey: .updatedAt)
        }
    }
}
