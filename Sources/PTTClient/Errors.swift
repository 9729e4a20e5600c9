import ChannelProtocol
import Foundation

/// A channel operation failed (`PTChannelError`), with Apple's codes and raw values.
public struct ChannelError: Error, Sendable, Hashable, CustomStringConvertible {
    public static let errorDomain = "org.squelch.pushtotalk.channel"

    public enum Code: Int, Sendable, CaseIterable {
        case unknown = 0
        /// No active channel has this UUID.
        case channelNotFound = 1
        /// A channel is already active: one at a time.
        case channelLimitReached = 2
        /// A (simulated) system call holds the audio.
        case callActive = 3
        /// A transmission is in progress: yours, or, for a floor request, someone else's.
        case transmissionInProgress = 4
        /// Stop without a transmission.
        case transmissionNotFound = 5
        /// Join or begin while the app declared itself in the background.
        case appNotForeground = 6
        /// Kept for Apple parity; Linux has no device management, so nothing raises it.
        case deviceManagementRestriction = 7
        /// Kept for Apple parity; Linux has no Screen Time, so nothing raises it.
        case screenTimeRestriction = 8
        /// The transmission mode (listen only, or the token's capabilities) or the service status forbids it.
        case transmissionNotAllowed = 9
    }

    public var code: Code
    /// What happened, in words a person can act on.
    public var message: String
    /// The server's refusal, when the server said no.
    public var refusal: RefusalCode?
    /// Why the server denied a floor request, when it did: `busy` and `queueFull` both come as
    /// `transmissionInProgress`, but only a busy floor is worth waiting in the queue for.
    public var floorCause: FloorCause?

    public init(_ code: Code, _ message: String, refusal: RefusalCode? = nil, floorCause: FloorCause? = nil) {
        self.code = code
        self.message = message
        self.refusal = refusal
        self.floorCause = floorCause
    }

    public var description: String { message }
}

/// Making the channel manager failed (`PTInstantiationError`), with Apple's codes and raw values.
public struct InstantiationError: Error, Sendable, Hashable, CustomStringConvertible {
    public static let errorDomain = "org.squelch.pushtotalk.instantiation"

    public enum Code: Int, Sendable, CaseIterable {
        case unknown = 0
        /// Apple: simulator or macOS. Here: the state directory can't be used.
        case invalidPlatform = 1
        /// Apple: no `push-to-talk` background mode. Kept for parity; nothing raises it on Linux.
        case missingBackgroundMode = 2
        /// Apple: no `aps-environment` entitlement. Here: a push transport without an environment.
        case missingPushServerEnvironment = 3
        /// Apple: no push-to-talk entitlement. Kept for parity; nothing raises it on Linux.
        case missingEntitlement = 4
        /// Another call to the factory for the same app is still running.
        case instantiationAlreadyInProgress = 5
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
