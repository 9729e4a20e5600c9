import APNs
import ChannelStorePostgres

/// The cluster's APNs provider JWT kept in PostgreSQL, for every node's APNs clients.
struct SharedProviderTokens: ProviderTokenShare {
    let store: PostgresChannelStore

    func current(key: String) async throws -> SharedProviderToken? {
        try await store.providerToken(key: key).map(Self.shared)
    }

    func replace(key: String, replacing: String?, with new: String) async throws -> SharedProviderToken {
        Self.shared(try await store.replaceProviderToken(key: key, replacing: replacing, with: new))
    }

    private static func shared(_ stored: PostgresChannelStore.StoredProviderToken) -> SharedProviderToken {
        SharedProviderToken(jwt: stored.jwt, age: .microseconds(stored.ageMicroseconds))
    }
}
