import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import MediaFrames
import NIOConcurrencyHelpers
import Opus
import WireNIO

/// Audio datagrams → jitter buffers → Opus (FEC, then concealment) → mixed → the output, paced by the
/// output: its blocking writes are the playout clock, so each buffer is asked for one frame per 20 ms
/// of audio actually played.
///
/// One jitter buffer and decoder per talker heard at once (up to `maxTracks`), mixed. In a full-duplex
/// channel several members talk together; a single buffer would switch to whichever talker's packet
/// came last and drop the other's as late. Packets are routed by burst (`State.track`): to the track
/// that holds the burst, a talker's next burst to its track, a new one to a free track, which waits
/// while this listener is still catching up on bursts that had ended before it began (so a listener
/// who is behind hears them first, one after the other, and then the talkers who began together,
/// together); with no free track, behind a catch-up burst (`JitterBuffer`'s deferral), else to a
/// track whose burst has its end marker; with none, the packet is dropped rather than cut a live
/// talker off.
final class Receiver: Sendable {
    /// Talkers mixed at once: as many as squelchd can be configured to let talk together, so that
    /// none is dropped unheard. (It was 4, the server's default, and a channel allowed 6 lost two
    /// talkers at every listener without a word.) An idle track costs its buffer's 35 KB and a
    /// decoder, and nothing per frame but a look.
    static let maxTracks = ChannelLimits.maxSimultaneousTalkers

    struct State {
        var tracks = [JitterBuffer]()
        /// Datagrams are taken into the tracks: from `arm` (the connection opens) or `start` until
        /// `stop`. Playout may start a little later (`didJoin`) and plays what was taken meanwhile.
        var accepting = false
        var muted = false
        /// The floor's tones (`Tone`), mixed over the talkers and silenced with them.
        var tones = TonePlayer(configuration: .standard)
        var lastStatistics: BurstStatistics?
        var malformed = 0

        /// Packets dropped because every track was playing another talker's burst.
        var tooManyTalkers = 0

        /// Per track, the bursts (`JitterBuffer.burstID`) it waits for before it plays; empty when it plays. A
        /// burst that began while this listener was still catching up on bursts that had ended waits
        /// for those (each began and ended before it began), but not for talkers who were still
        /// talking when it began: bursts that came one after the other are heard one after the other
        /// (the server replays a push-woken phone's missed bursts back to back, much faster than
        /// they were said), and in a full-duplex channel, members who talked together are heard
        /// together, from their first words, once the listener has caught up. (One `JitterBuffer`'s
        /// deferral queued them all behind the catch-up, one after the other, and split a talker's
        /// burst in two when its later packets found a free track.)
        var waitsFor: [[UInt32]] = []

        /// The track a packet of this burst goes to, nil when none can take it, and the bursts it is
        /// to wait for when it starts there.
        /// - The track that holds the burst (playing it, or its first packets behind another).
        /// - A talker's next burst follows its last on the same track (replacing a live one, or
        ///   behind a catch-up still going), unless that one is a replay that had ended.
        /// - While the listener is catching up (a track replays a burst that had ended), a free track
        ///   that waits for every such burst; with none free, behind one of them (its talker's own
        ///   if it is one).
        /// - Otherwise a free track, else one whose burst has its end marker (cutting its last
        ///   buffered frames). A live talker is never cut off.
        func track(slot: UInt16, burst: UInt16) -> (index: Int, waitFor: [UInt32])? {
            for i in tracks.indices where tracks[i].holds(slot: slot, burst: burst) { return (i, []) }
            for i in tracks.indices where tracks[i].activeSlot == slot && !tracks[i].isReplayingAnEndedBurst { return (i, []) }
            var behind: [UInt32] = []
            for i in tracks.indices where tracks[i].isReplayingAnEndedBurst {
                if let playing = tracks[i].playing { behind.append(JitterBuffer.burstID(slot: playing.slot, burst: playing.burst)) }
            }
            for i in tracks.indices where tracks[i].activeSlot == nil { return (i, behind) }
            if !behind.isEmpty {
                for i in tracks.indices where tracks[i].activeSlot == slot { return (i, []) }
                for i in tracks.indices where tracks[i].isReplayingAnEndedBurst { return (i, []) }
            }
            for i in tracks.indices where tracks[i].endKnown && waitsFor[i].isEmpty { return (i, []) }
            return nil
        }

        /// Lets a waiting track play once none of the bursts it waits for is on any track any more
        /// (each ended, or was dropped with the rest of a reset).
        mutating func releaseWaitingTracks() {
            for t in waitsFor.indices where !waitsFor[t].isEmpty {
                let stillThere = tracks.indices.contains { u in
                    guard u != t, let playing = tracks[u].playing else { return false }
                    return waitsFor[t].contains(JitterBuffer.burstID(slot: playing.slot, burst: playing.burst))
                }
                if !stillThere { waitsFor[t].removeAll() }
            }
        }
    }

    let state: NIOLockedValueBox<State>
    /// The bursts' keys, and frames waiting for theirs.
    let keyring = MediaKeyring()
    let thread = MediaThread(name: "squelch-playout")
    let configuration: AudioConfiguration
    let onEvent: @Sendable (ReceiverEvent) -> Void

    enum ReceiverEvent: Sendable {
        /// A burst started playing; `replayed` when it came (at first) as catch-up: one in progress
        /// at a join, or one that had ended (the server replays a burst a member missed, e.g. to a
        /// phone its push woke).
        case burstStarted(slot: UInt16, burst: UInt16, replayed: Bool)
        case burstFinished(BurstStatistics)
        /// A window of heard audio is complete: this share (percent) of its frames was missing on arrival.
        case receptionLoss(Int)
        case outputFailed(String)
        case outputDevice(AudioDeviceStatus)
    }

    init(configuration: AudioConfiguration, onEvent: @escaping @Sendable (ReceiverEvent) -> Void) {
        self.configuration = configuration
        self.onEvent = onEvent
        var state = State()
        state.tracks = (0..<Self.maxTracks).map { _ in JitterBuffer(configuration: configuration.jitterBuffer) }
        state.waitsFor = [[UInt32]](repeating: [], count: Self.maxTracks)
        state.tones = TonePlayer(configuration: configuration.tones)
        self.state = NIOLockedValueBox(state)
    }

    var isPlaying: Bool { configuration.makeOutput != nil && thread.isRunning }

    /// One audio datagram from the server. Called on the connection's event loop; `bytes` is valid
    /// only during the call.
    func receive(_ bytes: UnsafeRawBufferPointer, now: UInt64 = monotonicNanoseconds()) {
        guard configuration.makeOutput != nil else { return }
        guard let header = AudioHeader(parsing: bytes) else {
            state.withLockedValue { if $0.accepting { $0.malformed += 1 } }
            return
        }
        state.withLockedValue { state in
            guard state.accepting else { return }
            // A burst that ended on any track stays ended: its repeated end markers must not start it
            // again on a free one.
            for track in state.tracks.indices where state.tracks[track].hasFinished(slot: header.slot, burst: header.burst) { return }
            // Only a frame that opens with its burst's key is audio from the talker: the relay's
            // envelope itself proves nothing.
            keyring.open(bytes, now: now) { header, payload in
                guard let (track, waitFor) = state.track(slot: header.slot, burst: header.burst) else {
                    state.tooManyTalkers += 1
                    return
                }
                let starting = state.tracks[track].activeSlot == nil
                // A track that waits is behind: it takes its talker's packets as catch-up, played whole
                // from the first once it may play, with no jitter cushion and no skipping ahead.
                let waiting = !state.waitsFor[track].isEmpty || !waitFor.isEmpty
                _ = state.tracks[track].insert(slot: header.slot, burst: header.burst, sequence: header.sequence,
                                               endOfBurst: header.flags.contains(.endOfBurst),
                                               catchUp: header.flags.contains(.catchUp) || waiting,
                                               payload: payload, now: now)
                if starting, !waitFor.isEmpty, state.tracks[track].activeSlot == header.slot { state.waitsFor[track] = waitFor }
            }
        }
    }

    var statistics: (current: BurstStatistics?, target: Int, malformed: Int, tooManyTalkers: Int) {
        state.withLockedValue { state in
            for track in state.tracks.indices {
                if let current = state.tracks[track].current {
                    return (current, state.tracks[track].currentTargetMilliseconds, state.malformed + keyring.refused, state.tooManyTalkers)
                }
            }
            return (state.lastStatistics, state.tracks[0].currentTargetMilliseconds, state.malformed + keyring.refused, state.tooManyTalkers)
        }
    }

    /// A burst's key from the server: frames that came before it are received now.
    func addMediaKey(_ key: MediaKey) {
        let ready = keyring.add(key)
        for datagram in ready { datagram.withUnsafeBytes { receive($0) } }
    }

    /// A new session: its keys are numbered afresh.
    func forgetMediaKeys() { keyring.removeKeys() }

    func setMuted(_ muted: Bool) { state.withLockedValue { $0.muted = muted } }

    /// Queues a tone; nothing while the output is closed (it would play, late, when it next opens).
    func play(_ tone: Tone) {
        guard isPlaying else { return }
        state.withLockedValue { $0.tones.play(tone) }
    }

    func setTonesMuted(_ muted: Bool) { state.withLockedValue { $0.tones.setMuted(muted) } }
    /// Drops every track's audio and ended bursts; called with playout stopped (`stop`). (A flag for
    /// the loop, as this once was, stayed set past a stop and made the next start's first tick drop
    /// what arrived while the output was opening.)
    func discardAll() {
        state.withLockedValue { state in
            for t in state.tracks.indices { state.tracks[t].reset() }
            for t in state.waitsFor.indices { state.waitsFor[t].removeAll() }
            state.tones.stop()
        }
    }

    /// Takes datagrams from now on, without opening the output yet: the connection is opening, and
    /// the server's catch-up of a burst in progress follows its `joined` at once, before the join
    /// reaches the app (`didJoin`, when `start` opens the output). A join that fails opens nothing,
    /// so a file at the output's path is left alone.
    func arm() { state.withLockedValue { $0.accepting = true } }

    func start() {
        guard let makeOutput = configuration.makeOutput else { return }
        arm()
        thread.start { [self] in self.run(makeOutput: makeOutput) }
    }

    /// Stops taking datagrams and playout, and completes the output (a WAV file gets its header).
    func stop() async {
        state.withLockedValue { $0.accepting = false }
        await thread.stop()
    }

    private func run(makeOutput: @escaping @Sendable () throws -> any AudioSink) {
        let decoders: [OpusDecoder]
        do {
            decoders = try (0..<Self.maxTracks).map { _ in try OpusDecoder() }
        } catch {
            onEvent(.outputFailed("could not start the audio decoders: \(error)"))
            return
        }
        // A device that is gone (or fails later) is opened again every second, and the loop plays on
        // into nothing meanwhile, by its own clock: the bursts' events go on, and the jitter buffers
        // don't fill with what nobody hears. A file that fails stops playout, as it won't come back.
        var output = OutputDevice(open: makeOutput, onEvent: onEvent)
        guard output.openAtStart() else { return }
        let period = PipelineAudio.periodFrames
        let frame = 2 * period
        var pcm = [Int16](repeating: 0, count: decoders[0].maximumFrameSamples)
        var mix = [Int32](repeating: 0, count: frame)
        var out = [Int16](repeating: 0, count: frame)
        // Talkers at once (full duplex) add up past 16 bits: scaled down, not clipped.
        var limiter = MixLimiter()
        // Per track, reused every tick: what to do, the payload it needs, and a burst that just ended.
        enum Step { case decode, fec, conceal, silence }
        var steps = [Step](repeating: .silence, count: Self.maxTracks)
        var payloads = (0..<Self.maxTracks).map { _ in [UInt8](repeating: 0, count: AudioHeader.maxPayload) }
        var payloadCounts = [Int](repeating: 0, count: Self.maxTracks)
        var ended = [BurstStatistics?](repeating: nil, count: Self.maxTracks)
        // The burst each track is playing, to report each start once; and starts to report this tick.
        var playing = [(slot: UInt16, burst: UInt16)?](repeating: nil, count: Self.maxTracks)
        var started = [(slot: UInt16, burst: UInt16, replayed: Bool)?](repeating: nil, count: Self.maxTracks)
        // Bursts that ended last tick, reported after this tick's starts: a replay queued behind
        // another on the same track starts one tick after it ends, and the speaker must not blink off
        // in between.
        var finishing = [BurstStatistics?](repeating: nil, count: Self.maxTracks)
        var meter = ReceptionLossMeter(tracks: Self.maxTracks)
        var measuredLoss: Int?
        while !thread.stopRequested {
            let now = monotonicNanoseconds()
            let muted = state.withLockedValue { state -> Bool in
                state.releaseWaitingTracks()
                for t in state.tracks.indices {
                    guard state.waitsFor[t].isEmpty else {
                        steps[t] = .silence
                        continue
                    }
                    let decision = state.tracks[t].nextFrame(now: now)
                    switch decision {
                    case .play(let ref), .recoverWithFEC(next: let ref):
                        payloadCounts[t] = state.tracks[t].withPayload(of: ref) { bytes in
                            payloads[t].withUnsafeMutableBytes { $0.copyMemory(from: bytes) }
                            return bytes.count
                        }
                        if case .play = decision { steps[t] = .decode } else { steps[t] = .fec }
                    case .conceal: steps[t] = .conceal
                    case .silence, .idle, .waiting: steps[t] = .silence
                    case .ended(let statistics, _):
                        state.lastStatistics = statistics
                        ended[t] = statistics
                        // Right after its last frame, in the audio's own timeline: the floor's end
                        // on the control stream comes a jitter buffer's depth before it.
                        state.tones.play(.endOfBurst)
                        steps[t] = .silence
                        playing[t] = nil
                    }
                    if steps[t] != .silence, let now = state.tracks[t].playing,
                       playing[t].map({ $0.slot != now.slot || $0.burst != now.burst }) ?? true {
                        playing[t] = (now.slot, now.burst)
                        // Replayed: it began as catch-up. Whether it is still going live is the
                        // session's to say (it knows who holds the floor).
                        started[t] = (now.slot, now.burst, now.catchUp)
                    }
                    if let statistics = ended[t] {
                        measuredLoss = meter.observe(track: t, statistics, ended: true) ?? measuredLoss
                    } else {
                        measuredLoss = meter.observe(track: t, state.tracks[t].current) ?? measuredLoss
                    }
                }
                return state.muted
            }
            if let loss = measuredLoss {
                measuredLoss = nil
                onEvent(.receptionLoss(loss))
            }
            for t in 0..<Self.maxTracks {
                guard let start = started[t] else { continue }
                started[t] = nil
                onEvent(.burstStarted(slot: start.slot, burst: start.burst, replayed: start.replayed))
            }
            for t in 0..<Self.maxTracks {
                if let statistics = finishing[t] {
                    finishing[t] = nil
                    onEvent(.burstFinished(statistics))
                }
                guard let statistics = ended[t] else { continue }
                ended[t] = nil
                decoders[t].reset()
                finishing[t] = statistics
            }
            for i in 0..<frame { mix[i] = 0 }
            for t in 0..<Self.maxTracks where steps[t] != .silence {
                var produced = 0
                pcm.withUnsafeMutableBufferPointer { buffer in
                    let target = UnsafeMutableBufferPointer(rebasing: buffer[0..<frame])
                    let count = payloadCounts[t]
                    switch steps[t] {
                    case .decode where count > 0:
                        produced = (try? payloads[t].withUnsafeBytes { try decoders[t].decode(UnsafeRawBufferPointer(rebasing: $0[0..<count]), into: target) }) ?? 0
                    case .fec where count > 0:
                        produced = (try? payloads[t].withUnsafeBytes {
                            try decoders[t].decodeFEC(from: UnsafeRawBufferPointer(rebasing: $0[0..<count]), frameSamples: frame, into: target)
                        }) ?? 0
                    case .conceal, .decode, .fec:
                        produced = (try? decoders[t].decodeMissing(frameSamples: frame, into: target)) ?? 0
                    case .silence:
                        produced = 0
                    }
                }
                for i in 0..<min(produced, frame) { mix[i] += Int32(pcm[i]) }
            }
            if muted {
                for i in 0..<frame { out[i] = 0 }
            } else {
                state.withLockedValue { state in
                    guard !state.tones.isIdle else { return }
                    mix.withUnsafeMutableBufferPointer { state.tones.mix(into: UnsafeMutableBufferPointer(rebasing: $0[0..<frame])) }
                }
                mix.withUnsafeBufferPointer { sums in
                    out.withUnsafeMutableBufferPointer { limiter.process(UnsafeBufferPointer(rebasing: sums[0..<frame]), into: $0) }
                }
            }
            guard out.withUnsafeBufferPointer({ output.play(UnsafeBufferPointer(rebasing: $0[0..<frame]), period: period, now: now) }) else { return }
        }
        output.finish()
    }
}
