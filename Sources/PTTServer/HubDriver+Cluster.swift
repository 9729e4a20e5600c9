import ChannelHub
import ChannelProtocol
import ChannelStore
import Foundation
import NIOCore
import Wire

// A join on a cluster node: the token is checked as on a single node, then the channel's placement
// decides where the member goes (ClusterNode.place): here, or to the home with a `redirect`.
extension HubDriver {
    func verifyJoin(_ link: Link, token: String, channel: UUID, reason: JoinReason) {
        let tokens = self.tokens
        let store = writer.store
        let logger = self.logger
        let cluster = self.cluster
        let this = NIOLoopBound(self, eventLoop: eventLoop)
        let loop = eventLoop
        Task {
            let outcome = await HubDriver.check(token, channel: channel, with: tokens, store: store, logger: logger)
            var placement: ClusterNode.Placement?
            var members: [MemberRecord] = []
            if case .success = outcome, let cluster {
                placement = await cluster.place(channel)
                if case .serve(_, takenUp: true)? = placement {
                    // The members as the channel's earlier homes left them, for the roster.
                    do { members = try await store.members(of: channel) } catch {
                        placement = .unavailable("could not read the channel's members (\(error)); try again shortly")
                    }
                }
            }
            let (placed, stored) = (placement, members)
            loop.execute {
                let driver = this.value
                driver.joinChecked(link, outcome, placement: placed, members: stored, token: token, reason: reason)
                driver.flush()
            }
        }
    }

    private func joinChecked(_ link: Link, _ outcome: Result<Checked, Refusal>, placement: ClusterNode.Placement?,
                             members: [MemberRecord], token: String, reason: JoinReason) {
        let checked: Checked
        switch outcome {
        case .failure(let refusal):
            hub.refuse(link, code: refusal.code, reason: refusal.reason)
            return
        case .success(let value):
            checked = value
        }
        let now = HubDriver.now()
        switch placement {
        case nil:
            hub.channelSeenByCheck(checked.channel, at: now)
        case .serve(let validUntil, let takenUp)?:
            if takenUp || hub.channel(checked.channel.id) == nil {
                hub.takeUp(checked.channel, members: members, until: validUntil, at: now)
            } else {
                hub.leaseHeld(checked.channel.id, until: validUntil)
            }
        case .redirect(let home)?:
            // What the home's entry pass carries: the join itself.
            let join = codec.encode(ClientMessage.join(token: token, channel: checked.channel.id, reason: reason))
            let client = server?.endpoint.connection(link)?.remoteAddress
            let pass = client.flatMap { entryPasses?.issue(payload: join, for: home.node, client: $0) }
                .map { HomePass(ticket: Data($0.ticket), key: Data($0.key)) }
            hub.redirect(link, to: home, pass: pass)
            return
        case .unavailable(let why)?:
            hub.refuse(link, code: .serverBusy, reason: why)
            return
        }
        hub.admit(link, claims: checked.claims, reason: reason, at: now)
    }

    /// A connection that came with an entry pass (`ConnectionEvent.entered`): it is connected, and
    /// what the pass carries (the join this node's peer redirected here) is taken as its first
    /// control message, answered before the client's Finished arrives.
    func entered(_ handle: Link, carrying join: [UInt8]) {
        hub.entered(handle)
        enteredEarly.insert(handle)
        cluster?.metrics.entries.increment()
        hub.control(handle, bytes: join, at: Self.now())
    }

    /// What the cluster node tells the hub, on the event loop.
    static func clusterHooks(_ box: NIOLoopBoundBox<HubDriver>, on loop: any EventLoop) -> ClusterNode.Hooks {
        ClusterNode.Hooks(
            held: { validity in
                try? await loop.submit {
                    for (channel, until) in validity { box.value.hub.leaseHeld(channel, until: until) }
                }.get()
            },
            fenced: { channels, why in
                try? await loop.submit {
                    let now = HubDriver.now()
                    for channel in channels { box.value.hub.fence(channel, reason: why, at: now) }
                    box.value.flush()
                }.get()
            })
    }

    /// What a draining cluster node asks of the hub, on the event loop.
    static func drainHooks(_ box: NIOLoopBoundBox<HubDriver>, on loop: any EventLoop) -> ClusterNode.DrainHooks {
        ClusterNode.DrainHooks(
            isTalking: { channel in (try? await loop.submit { box.value.hub.isTalking(in: channel) }.get()) ?? false },
            endTenure: { channel in try? await loop.submit { box.value.hub.endTenure(channel) }.get() },
            move: { channel, home in
                try? await loop.submit {
                    box.value.hub.move(channel, to: home, at: HubDriver.now())
                    box.value.flush()
                }.get()
            })
    }
}
