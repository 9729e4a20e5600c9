import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import NIOConcurrencyHelpers
import Opus
import WireNIO

/// Makes the audio devices (or files) the manager captures from and plays to. Called on the media
/// threads: `makeInput` at the start of each transmission, `makeOutput` once per joined channel.
public struct AudioConfiguration: Sendable {
    public var makeInput: (@Sendable () throws -> any AudioSource)?
    public var makeOutput: (@Sendable () throws -> any AudioSink)?
    public var opus: OpusConfiguration
    public var jitterBuffer: JitterBufferConfiguration
    /// For an input that runs out (a WAV file): when it does, the transmission it was feeding ends,
    /// as if the app had stopped it with the source that began it, so the floor isn't held in silence
    /// until the server's limit. Decided inside the manager, for that transmission only: an app that
    /// did it on the `inputEnded` event could stop the next one, begun meanwhile. `inputEnded` is still
    /// reported.
    public var endTransmissionWhenInputEnds = false
    /// The floor's tones (talk permit, busy, queued, end of burst), played into the output.
    public var tones: ToneConfiguration = .standard

    public init(makeInput: (@Sendable () throws -> any AudioSource)? = nil, makeOutput: (@Sendable () throws -> any AudioSink)? = nil,
                opus: OpusConfiguration = .pushToTalk, jitterBuffer: JitterBufferConfiguration = JitterBufferConfiguration()) {
        self.makeInput = makeInput
        self.makeOutput = makeOutput
        self.opus = opus
        self.jitterBuffer = jitterBuffer
    }

    /// No audio: the channel works (floor, roster, pushes) but nothing is captured or played.
    public static var none: AudioConfiguration { AudioConfiguration() }
}
