import ChannelProtocol
import Foundation

/// A delegate callback the session wants made, in order.
enum DelegateCall: Sendable, Equatable {
    case didJoin(UUID, ChannelJoinReason)
    case didLeave(UUID, ChannelLeaveReason)
    case didBeginTransmitting(UUID, ChannelTransmitRequestSource)
    case didEndTransmitting(UUID, ChannelTransmitRequestSource)
    case receivedPushToken(Data)
    case didActivate(AudioSession)
    case didDeactivate(AudioSession)
    case failedToJoin(UUID, ChannelError)
    case failedToLeave(UUID, ChannelError)
    case failedToBegin(UUID, ChannelError)
    case failedToStop(UUID, ChannelError)
}

/// Everything the session asks of the world. The driver carries these out in order.
enum SessionOutput: Sendable, Equatable {
    case delegate(DelegateCall)
    /// Open a voice connection and handshake; answer with `transportConnected` or `transportFailed`.
    /// `cluster`: with the liveness a cluster's failover needs (a dead home noticed in seconds).
    /// `pass`: the home's entry pass from the redirect that named it; the join it carries is then
    /// answered without being sent (`transportConnected(entered: true)`).
    case connect(ChannelCredentials, cluster: Bool = false, pass: HomePass? = nil)
    /// Close the voice connection (`leaving`: for good, with CLOSE code normal).
    case disconnect
    case send(ClientMessage)
    /// Start capturing and sending audio stamped with `burst`.
    case startSending(burst: UInt16)
    /// Stop capturing; send the end-of-burst marker (three times) before anything that follows.
    case stopSending
    /// The worst loss among this member's listeners (percent): the encoder adds FEC from 2 %.
    case adaptToListenerLoss(Int)
    /// Mute or unmute playback (a system call holds the audio).
    case mutePlayback(Bool)
    /// Drop whatever is buffered for playback (leaving a channel).
    case flushPlayback
    /// Try the connection again after at most this long (the engine waits a random time between half
    /// and all of it); answer with `reconnectDue`.
    case scheduleReconnect(milliseconds: Int)
    /// A press made while not connected waits this long for the channel to be rejoined; answer with
    /// `transmitWaitDue(request:)`.
    case scheduleTransmitWait(milliseconds: Int, request: UInt32)
    /// The server dropped control messages for their rate; answer with `resyncDue` after this long, to
    /// say again what may have been lost.
    case scheduleResync(milliseconds: Int)
    /// The roster after a rejoin has had no new chunk for this long; answer with
    /// `rosterSettled(generation:)`.
    case scheduleRosterSettle(milliseconds: Int, generation: Int)
    /// Ask the push transport for an ephemeral token; answer with `pushTokenIssued`.
    case requestPushToken(UUID)
    /// The token is dead (the channel was left).
    case invalidatePushToken(Data)
    case save(RestorationRecord)
    case forgetRestoration
    /// The channel was left while not joined: the server has not heard the leave. Deliver it on a
    /// connection of its own, now and after restarts, until the server takes it (`OwedLeave`).
    case oweLeave(UUID, ChannelCredentials)
    case event(ChannelManagerEvent)
    /// Play a floor tone (`Tone`); the receiver plays the end of a heard burst itself.
    case tone(Tone)
}
