import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import NIOCore
import Wire
import WireNIO

// The push transport: registering the channel's token and taking its pushes.
extension ManagerEngine {
    /// Receives pushes for the channel's token until the channel is left (`pushTask` cancelled). A
    /// transport that fails (the APNs simulator inside a squelchd that restarted, a push channel
    /// that dropped) is registered again with the same token, after 1 s and then up to every 15 s:
    /// a walkie-talkie in the background that stopped listening for pushes for good would miss every
    /// call after a server upgrade, with nothing to show it. The token is announced on the first
    /// registration, and again only if the transport hands out another.
    func startPushes(token: Data?, channel: UUID) {
        guard let transport = configuration.pushTransport else { return }
        // A task left from before (a channel that ended without a token, a registration still
        // retrying) gives way: this session needs its token announced to it.
        stopPushes()
        // The task reads the session's credentials from the snapshot: current before it starts.
        updateSnapshot()
        let sink = commandSink
        let snapshot = self.snapshot
        let generation = snapshot.withLockedValue { snap -> Int in
            snap.pushGeneration += 1
            return snap.pushGeneration
        }
        // Only the newest task speaks for the flag: a cancelled one still inside `register` must not
        // clear what its successor set.
        @Sendable func canBeWoken(_ value: Bool) {
            snapshot.withLockedValue { if $0.pushGeneration == generation { $0.canBeWokenByPush = value } }
        }
        pushTask = Task {
            defer { canBeWoken(false) }
            var current = token
            var announced = false
            var delay: Duration = .seconds(1)
            var lostSince: Date?
            // After a failure at the home, the next try goes to the entry point, and back: a home
            // that died while the app slept is where its voice connection would go next too, but
            // any node of a cluster passes a push on to the stream.
            var atEntry = false
            while !Task.isCancelled {
                var why = "the push channel closed"
                do {
                    // The credentials as they are now: a renewed participant token opens the next stream.
                    let credentials = snapshot.withLockedValue { atEntry ? $0.entryCredentials : $0.credentials }
                    let (issued, pushes) = try await transport.register(token: current,
                                                                        for: credentials.map { PushChannel(id: channel, credentials: $0) })
                    if !announced || issued != current { sink.yield(.pushToken(issued, channel)) }
                    announced = true
                    current = issued
                    if lostSince != nil {
                        sink.yield(.notice("push delivery is back; the channel can be woken again"))
                        lostSince = nil
                    }
                    delay = .seconds(1)
                    canBeWoken(true)
                    let opened = ContinuousClock.now
                    for try await push in pushes { sink.yield(.push(push)) }
                    // The server ended the stream (squelchd's device push service does at the
                    // participant token's expiry): the next opens at once, with the token there is
                    // now, and nothing is said unless it fails. One that ends as soon as it opens is
                    // a failure, retried with the backoff.
                    if ContinuousClock.now - opened > .seconds(5) { continue }
                } catch is CancellationError {
                    return
                } catch {
                    why = "\(Self.describePushFailure(error))"
                }
                guard !Task.isCancelled else { return }
                if transport.followsChannelServer, snapshot.withLockedValue({ $0.credentials?.address != $0.entryCredentials?.address }) {
                    atEntry.toggle()
                }
                canBeWoken(false)
                if lostSince == nil {
                    lostSince = Date()
                    sink.yield(.notice("push delivery lost (\(why)); trying again, and until it is back the channel can't be woken while suspended"))
                }
                do { try await Task.sleep(for: delay) } catch { return }
                delay = min(delay * 2, .seconds(15))
                // The channel ended meanwhile without a token to invalidate (none was issued, or a
                // restored one was refused): nothing is left to wake.
                guard snapshot.withLockedValue({ $0.activeChannelUUID }) == channel else { return }
            }
        }
    }

    /// A transport that takes pushes from the channel's server follows the voice connection to
    /// another server (a cluster's redirect to the channel's home, or to its new home after a
    /// failover): pushes go out from the home, and a stream there takes them without a trip through
    /// the cluster's database to another node.
    func followChannelServer(to credentials: ChannelCredentials) {
        defer { lastConnectAddress = credentials.address }
        guard configuration.pushTransport?.followsChannelServer == true, pushTask != nil,
              let previous = lastConnectAddress, previous != credentials.address,
              let token = session.pushToken, let channel = session.channel else { return }
        startPushes(token: token, channel: channel)
    }

    func stopPushes() {
        pushTask?.cancel()
        pushTask = nil
        snapshot.withLockedValue { snap in
            snap.pushGeneration += 1
            snap.canBeWokenByPush = false
        }
    }

    /// A push transport's failure in words: NIO's connection errors print as nested structures.
    static func describePushFailure(_ error: any Error) -> String {
        let text = "\(error)"
        if text.contains("connectionRefused") || text.contains("Connection refused") || text.contains("SingleConnectionFailure") {
            return "nothing answers on the push port; is the push service running (squelchd's device push service, or the APNs simulator's --apns-simulator-control-port)?"
        }
        return text.count > 160 ? String(text.prefix(160)) + "…" : text
    }
}
