/// Where the channel's participant tokens stand: the one the session runs on (kept in
/// `ChannelSession.credentials`) and a newer one from the app (`renewToken`) on its way to the
/// server. Two enums rather than four flags and optionals: which token an answer is about, and what
/// a refusal means, follow from the state, and states that mean nothing can't be held.
struct TokenRenewal {
    /// The session's own token.
    enum Standing: Equatable {
        /// Taken by the server, or not yet offered to it.
        case current
        /// The join under way uses it though the server has not taken it yet, tried because the one
        /// before was refused: if it is refused too, the channel waits for another rather than ending.
        case tryingNew
        /// The server ended the session because it expired: no connection is tried until the app
        /// hands over a new one (`renewToken`), since every join would be refused.
        case expired
    }

    /// The newest token from `renewToken` that the server has not taken yet. The credentials keep the
    /// token the server last accepted until it takes this one, so that a token it refuses (forged,
    /// another user's) never replaces one that works, in memory or in the restoration record.
    enum Offer: Equatable {
        /// To be sent once joined; or kept after the server could not check it, until a reconnect (or
        /// the old token's refusal) gives it another try.
        case waiting(String)
        /// Sent and not yet answered: one at a time, so each answer is known to be its answer.
        /// `newer`: a token handed over since, offered once this one is answered.
        case sent(String, newer: String?)
    }

    private(set) var standing = Standing.current
    private(set) var offer: Offer?

    /// The newest token the server has not taken yet.
    var pending: String? {
        switch offer {
        case nil: nil
        case .waiting(let token)?: token
        case .sent(let token, let newer)?: newer ?? token
        }
    }

    var isExpired: Bool { standing == .expired }

    /// A renewal is sent and its answer not in yet.
    var awaitsAnswer: Bool {
        if case .sent = offer { true } else { false }
    }

    /// The app handed over `token`, to be offered to the server.
    mutating func newToken(_ token: String) {
        switch offer {
        case nil, .waiting?: offer = .waiting(token)
        case .sent(let sent, _)?: offer = .sent(sent, newer: token == sent ? nil : token)
        }
    }

    /// The token to send with `renewToken` now, if one waits and none is in flight; marked sent.
    mutating func next() -> String? {
        guard case .waiting(let token) = offer else { return nil }
        offer = .sent(token, newer: nil)
        return token
    }

    /// The server took the token in flight: it is the session's now. Returns it.
    mutating func accepted() -> String? {
        guard case .sent(let token, let newer) = offer else { return nil }
        offer = newer.map(Offer.waiting)
        return token
    }

    /// The server refused the token in flight, or could not check it (`checked` false: its database
    /// failed), which keeps it waiting. True if a newer one waits to be sent now.
    mutating func refused(checked: Bool) -> Bool {
        guard case .sent(let token, let newer) = offer else { return false }
        if let newer {
            offer = .waiting(newer)
            return true
        }
        offer = checked ? nil : .waiting(token)
        return false
    }

    /// The renewal in flight got no answer and never will (its connection is gone, or the server
    /// dropped it for the rate): the newest token waits to be offered again.
    mutating func answerLost() {
        guard case .sent(let token, let newer) = offer else { return }
        offer = .waiting(newer ?? token)
    }

    /// The next join tries a token the server has not taken (the app's newest, after the old one was
    /// refused or ran out): nothing is left to offer.
    mutating func joinsWithNew() {
        standing = .tryingNew
        offer = nil
    }

    /// A join was accepted. True if it was with a new token, now the one to restore.
    mutating func joined() -> Bool {
        guard standing == .tryingNew else { return false }
        standing = .current
        return true
    }

    /// The server ended the session for the token's expiry.
    mutating func expired() { standing = .expired }
}
