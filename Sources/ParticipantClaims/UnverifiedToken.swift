import Foundation

/// What a participant token says, read without checking its signature: for a client comparing two
/// tokens it holds before it sends one, never for deciding anything (the server verifies every
/// token with `TokenAuthority`, in ParticipantTokens). It needs no JWT library: the payload is the
/// middle of three base64url parts, JSON (RFC 7519).
public enum UnverifiedToken {
    /// The token's user (`sub`), or nil when it is not a JWT with one.
    public static func subject(of token: String) -> String? {
        struct Subject: Decodable { let sub: String }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = base64URLDecoded(parts[1]) else { return nil }
        return (try? JSONDecoder().decode(Subject.self, from: payload))?.sub
    }

    static func base64URLDecoded(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}
