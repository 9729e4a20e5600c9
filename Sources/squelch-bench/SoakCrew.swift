import ChannelProtocol
import Foundation
import ImpairmentKit
import NIOConcurrencyHelpers
import NIOCore
import SquelchTesting
import Wire

/// The soak's real members: `perChannel` on each channel, each channel's crew behind an impairment
/// proxy of its own (loss both ways) whose upstream sockets use a loopback source of their own
/// (127.1.x.y), so the server sees each crew as one address, as a site behind one NAT, and never
/// shares a source with the attacker. Members only count the audio they receive.
final class SoakCrew: Sendable {
    /// Members 0 ..< talkers of each channel take turns talking; the churn picks among the others.
    static let talkers = 3

    let channels: [UUID]
    let perChannel: Int
    let proxies: [ImpairmentProxy]
    let proxyPorts: [Int]
    let client: ClientConfiguration
    let tokens: [[String]]
    private let state = NIOLockedValueBox(State())

    struct State {
        var members: [[TestMember?]] = []
        /// Audio counted by members that have since left (churn).
        var retiredAudio = 0
        var joinsSucceeded = 0
        var joinsFailed: [String] = []
        var turnsGranted = 0
        var turnsNotGranted = 0
        var framesSent = 0
    }

    init(channels: [UUID], perChannel: Int, proxies: [ImpairmentProxy], proxyPorts: [Int], client: ClientConfiguration, tokens: [[String]]) {
        self.channels = channels
        self.perChannel = perChannel
        self.proxies = proxies
        self.proxyPorts = proxyPorts
        self.client = client
        self.tokens = tokens
        state.withLockedValue { $0.members = Array(repeating: Array(repeating: nil, count: perChannel), count: channels.count) }
    }

    var snapshot: State { state.withLockedValue { $0 } }

    /// Audio datagrams every member has received, those that left included.
    var audioReceived: Int {
        state.withLockedValue { state in state.retiredAudio + state.members.joined().reduce(0) { $0 + ($1?.audioCount ?? 0) } }
    }

    /// Joins everyone: the channels at once, each channel's crew one after another (the crew's
    /// source has a handshake rate limit, as a site's NAT address would).
    func joinAll() async {
        await withTaskGroup(of: Void.self) { crews in
            for channel in channels.indices {
                crews.addTask {
                    for slot in 0 ..< self.perChannel { await self.join(channel, slot) }
                }
            }
        }
    }

    /// One member (re)joins its slot; a failure is counted with its reason and leaves the slot empty.
    func join(_ channel: Int, _ slot: Int) async {
        do {
            let member = try TestMember(port: proxyPorts[channel], configuration: client, keepsAudio: false)
            try await member.connect()
            let answer = try await member.join(token: tokens[channel][slot], channel: channels[channel], seconds: 15)
            guard case .joined? = answer else {
                await member.close()
                state.withLockedValue { $0.joinsFailed.append("channel \(channel) member \(slot): \(answer.map { "\($0)" } ?? "no answer in 15 s")") }
                return
            }
            state.withLockedValue {
                $0.members[channel][slot] = member
                $0.joinsSucceeded += 1
            }
        } catch {
            state.withLockedValue { $0.joinsFailed.append("channel \(channel) member \(slot): \(error)") }
        }
    }

    /// One listener leaves and joins again, every `interval`, as people do all day.
    func churn(every interval: Duration, until deadline: ContinuousClock.Instant) async {
        guard perChannel > Self.talkers else { return }
        var random = SystemRandomNumberGenerator()
        while ContinuousClock.now + interval < deadline {
            try? await Task.sleep(for: interval)
            let channel = Int.random(in: 0 ..< channels.count, using: &random)
            let slot = Int.random(in: Self.talkers ..< perChannel, using: &random)
            if let member = state.withLockedValue({ $0.members[channel][slot] }) {
                try? await member.send(.leave)
                // Audio the server sent before it read the leave arrives first.
                try? await Task.sleep(for: .milliseconds(300))
                await member.close()
                state.withLockedValue {
                    $0.retiredAudio += member.audioCount
                    $0.members[channel][slot] = nil
                }
            }
            await join(channel, slot)
        }
    }

    /// A channel's talkers take turns: a pause of 1–5 s, then the floor, `burst` of 20 ms frames
    /// (80-byte payloads, as Opus at 32 kbit/s), and a release.
    func talk(on channel: Int, burst: Duration, until deadline: ContinuousClock.Instant) async {
        var random = SystemRandomNumberGenerator()
        var turn = Int.random(in: 0 ..< Self.talkers, using: &random)
        let frames = Int(burst / .milliseconds(20))
        while true {
            try? await Task.sleep(for: .milliseconds(Int.random(in: 1_000 ... 5_000, using: &random)))
            guard ContinuousClock.now + burst < deadline else { return }
            turn += 1
            guard let talker = state.withLockedValue({ $0.members[channel][turn % Self.talkers] }) else { continue }
            let mark = talker.messages.count
            try? await talker.send(.floorRequest())
            guard let grant = await talker.waitForFloor(.granted, after: mark, seconds: 3), let id = grant.burst else {
                state.withLockedValue { $0.turnsNotGranted += 1 }
                try? await talker.send(.floorRelease)  // withdraw a queued request
                continue
            }
            state.withLockedValue { $0.turnsGranted += 1 }
            let start = ContinuousClock.now
            let payload = [UInt8](repeating: 0x5A, count: 80)
            for sequence in 0 ..< frames {
                try? await Task.sleep(until: start + .milliseconds(20 * sequence))
                await talker.sendAudio(burst: id, sequence: UInt16(truncatingIfNeeded: sequence), payload: payload)
            }
            state.withLockedValue { $0.framesSent += frames }
            try? await talker.send(.floorRelease)
        }
    }

    func closeAll() async {
        for member in state.withLockedValue({ $0.members.joined().compactMap { $0 } }) { await member.close() }
    }
}
