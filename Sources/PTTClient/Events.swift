import ChannelProtocol
import Foundation
import JitterBuffer
import Opus

/// What the manager reports beyond Apple's delegate: the state a UI draws (status, roster, speaker,
/// levels, network figures). Apple's apps get these from the system UI; a Linux app draws its own.
public enum ChannelManagerEvent: Sendable, Equatable {
    case serviceStatus(ServiceStatus)
    case transmissionMode(TransmissionMode)
    case channelInfo(ChannelInfo)
    case descriptor(ChannelDescriptor)
    case roster([RosterEntry])
    /// A member is in the channel: each one there when this member joins, then each who joins
    /// (IVS's `participantJoined`). Never this member itself.
    case participantJoined(RosterEntry)
    /// A member left the channel or was removed; after a reconnection, also one who left meanwhile
    /// (IVS's `participantLeft`). A dropped connection is not a leave: the roster shows it offline.
    case participantLeft(RosterEntry)
    /// A member began or stopped publishing, that is talking (IVS's publish state).
    case participantPublishState(userID: String, PublishState)
    /// This member began or stopped hearing a member, by its `SubscriptionStrategy` (IVS's subscribe state).
    case participantSubscribeState(userID: String, SubscribeState)
    case activeRemoteParticipant(Participant?)
    /// Waiting for the floor, at this place in the queue (1 is next).
    case floorQueued(position: Int)
    /// The floor request was withdrawn before it was granted.
    case transmitCancelled
    /// The server took the floor away (pre-emption, the burst limit).
    case transmissionRevoked(FloorCause?, String)
    /// The voice connection is closed to save power (true) or back (false).
    case suspended(Bool)
    /// Something worth a line in the UI.
    case notice(String)
    /// In a squelchd cluster, the node now serving the channel (nil: back to the entry point, while
    /// the channel finds its home).
    case homeNode(NodeAddress?)
    /// The audio input ran out (a WAV file ended). With `AudioConfiguration.endTransmissionWhenInputEnds`
    /// the transmission has ended with it; otherwise the app decides when to stop, and as nothing is
    /// sent meanwhile, squelchd takes the floor back after 5 s (`talkerSilenceLimit`).
    case inputEnded
    /// A received burst finished playing.
    case burstFinished(BurstStatistics)
    /// The audio output failed (a full disk, a file that can't be written) and playback stopped:
    /// nothing more is heard. A `notice` with the same text comes too. A device that fails is
    /// `outputDevice(.lost)` instead, and comes back.
    case outputFailed(String)
    /// The speaker (an audio device, not a file) went away or failed, and is opened again every
    /// second; the channel goes on meanwhile, unheard (`lost`), until it is back (`restored`).
    case outputDevice(AudioDeviceStatus)
    /// The microphone went away or failed, and is opened again every second; a transmission under way
    /// goes on, sending nothing meanwhile (squelchd ends it after its silence limit).
    case inputDevice(AudioDeviceStatus)
    /// The participant token expires at this time (the server's notice, five minutes ahead by
    /// default): fetch a new one and call `renewToken`, or the session ends then.
    case tokenExpiring(Date)
    /// The server took the token from `renewToken`; the session now lasts until this time.
    case tokenRenewed(Date)
    /// The server refused the token from `renewToken` (expired, forged, another user's, revoked…);
    /// the session carries on under the old token until it expires.
    case tokenRenewalFailed(RefusalCode, String)
    /// The token expired and the server ended the session. The channel stays joined but unavailable
    /// (the server keeps the membership and push token) until `renewToken` brings it back.
    case tokenExpired(String)
    /// The worst loss (percent) among the members who hear you, as the server reports it. From 2 %
    /// your encoder codes FEC, at 40 kbps or more; below 2 % it is back to the plain settings.
    case listenerLoss(Int)
    /// A leave the server had not heard (the channel was left while suspended or not connected) was
    /// delivered, or settled otherwise (`ChannelManager.owedLeaves`).
    case leaveSettled(UUID, OwedLeaveOutcome)
}

/// Figures for a UI's status line, read with `ChannelManager.statistics()`.
public struct ChannelStatistics: Sendable, Equatable {
    /// Smoothed round-trip time to the server, in milliseconds (nil before the first sample).
    public var roundTripMilliseconds: Double?
    /// Packets the transport declared lost, of those it sent that asked for an acknowledgement
    /// (control and keepalives; audio asks for none, and its loss is in `reception` and in the
    /// listeners' reports the server passes to a talker).
    public var packetsLost: Int
    public var packetsSent: Int
    /// The burst being played (live figures), if any.
    public var reception: BurstStatistics?
    /// The jitter buffer's current target delay.
    public var jitterTargetMilliseconds: Int
    /// The microphone's level over the last 20 ms frame, 0...1 (RMS), while transmitting.
    public var inputLevel: Double
    /// The loudest sample of that frame, 0...1.
    public var inputPeak: Double
    public var framesSent: Int
    /// The settings of the encoder sending now, nil while not transmitting: the configured ones,
    /// adapted to the listeners' loss (FEC and its bitrate on from 2 %;
    /// `OpusConfiguration.adapted(toListenerLoss:)`).
    public var encoder: OpusConfiguration?
    /// Audio datagrams from the server that are not audio as this client reads it (too short or too
    /// long, another kind, unknown flags), or whose sealed frame did not open with its burst's key
    /// (forged, damaged, or its key never came), since the manager was made. More than a handful
    /// means a server or network in the path is broken, or a server newer than this client.
    public var malformedDatagrams = 0
    /// Audio datagrams dropped because `Receiver.maxTracks` other talkers were already playing, since
    /// the manager was made: a full-duplex channel allowing more simultaneous talkers than this client
    /// mixes.
    public var droppedTooManyTalkers = 0
}
