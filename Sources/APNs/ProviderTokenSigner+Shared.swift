import Foundation

/// A cluster's one provider JWT: read from the share, minted by whichever node finds it due (at most one
/// wins the swap), and sent by each connection as `SharedTokenUse` allows.
extension ProviderTokenSigner {
    /// A connection that must not change its JWT yet and cannot keep the one it has (`SharedTokenUse`).
    struct RetireConnection: Error {}
    /// The share failed less than `shareRetryInterval` ago.
    struct ShareResting: Error, CustomStringConvertible {
        var description: String { "the share failed moments ago" }
    }
    static let shareRetryInterval: TimeInterval = 30

    func sharedToken(for connection: Int) async throws -> (jwt: String, generation: Int) {
        let current = try await sharedCurrent()
        switch SharedTokenUse.decide(uses[connection], current: current, now: now()) {
        case .send(let use):
            uses[connection] = use
            return (use.jwt, use.generation)
        case .retire:
            uses[connection] = nil
            throw RetireConnection()
        }
    }

    /// After APNs called the JWT of `generation` expired on `connection`: the cluster's JWT is replaced
    /// if it is that one (once, whichever node asks first), and the connection sends the new one.
    func replaceShared(generation: Int, for connection: Int) async throws -> (jwt: String, generation: Int) {
        var current = try await sharedCurrent()
        if current.generation == generation { current = try await refreshShared(rejecting: current.jwt) }
        let use = current.firstUsed(at: now())
        uses[connection] = use
        return (use.jwt, use.generation)
    }

    /// The cluster's JWT, read again once the one known is due.
    private func sharedCurrent() async throws -> SharedTokenUse {
        if let sharedRefresh { return try await sharedRefresh.value }
        let date = now()
        if let shared, date >= shared.issuedAt, date.timeIntervalSince(shared.issuedAt) < refreshAfter.seconds { return shared }
        return try await refreshShared(rejecting: nil)
    }

    /// Reads the share; mints and swaps in a new JWT if the stored one is due (or is `rejected`). One
    /// refresh at a time: pushes arriving meanwhile wait for it.
    private func refreshShared(rejecting rejected: String?) async throws -> SharedTokenUse {
        if let sharedRefresh { return try await sharedRefresh.value }
        let task = Task { () async throws -> SharedTokenUse in
            try await self.readOrMint(rejecting: rejected)
        }
        sharedRefresh = task
        defer { sharedRefresh = nil }
        return try await task.value
    }

    private func readOrMint(rejecting rejected: String?) async throws -> SharedTokenUse {
        guard let share else { preconditionFailure("shared tokens without a share") }
        let key = shareKey
        do {
            // After a failed read, pushes do not each wait for the database's timeout again.
            if let retry = shareRetryAt, now() < retry { throw ShareResting() }
            var stored = try await share.current(key: key)
            if stored == nil || stored!.age.seconds >= refreshAfter.seconds || stored?.jwt == rejected {
                stored = try await share.replace(key: key, replacing: stored?.jwt, with: try await sign(issuedAt: now()))
            }
            shareRetryAt = nil
            return adoptShared(stored!)
        } catch {
            if !(error is ShareResting) { shareRetryAt = now().addingTimeInterval(Self.shareRetryInterval) }
            // Pushes wake people: a database that does not answer must not stop them. A JWT still fit
            // to send is kept; otherwise this node mints its own until the share answers again.
            if let shared, now().timeIntervalSince(shared.issuedAt) < SharedTokenUse.usableAge, shared.jwt != rejected {
                if !(error is ShareResting) {
                    logger.warning("the shared APNs provider token could not be read; this node keeps its current one",
                                   metadata: ["error": "\(error)"])
                }
                return shared
            }
            logger.warning("the shared APNs provider token could not be read or stored; this node mints its own until the database answers (APNs may answer TooManyProviderTokenUpdates meanwhile)",
                           metadata: ["error": "\(error)"])
            return adoptShared(SharedProviderToken(jwt: try await sign(issuedAt: now()), age: .zero))
        }
    }

    private func adoptShared(_ stored: SharedProviderToken) -> SharedTokenUse {
        let date = now()
        if var same = shared, same.jwt == stored.jwt {
            // The age read now is the truth: this node's estimate may have run ahead of it.
            same.issuedAt = date.addingTimeInterval(-stored.age.seconds)
            shared = same
            return same
        }
        // Connections whose JWT is past an hour are gone or will change it: forget them.
        uses = uses.filter { date.timeIntervalSince($0.value.issuedAt) < 3_600 }
        let adopted = SharedTokenUse(jwt: stored.jwt, generation: (shared?.generation ?? 0) + 1,
                                     issuedAt: date.addingTimeInterval(-stored.age.seconds), firstUse: date)
        shared = adopted
        return adopted
    }
}
