import ChannelProtocol
import ChannelStore
import Foundation
import ParticipantClaims
import SFrame
import Testing
import Wire
@testable import ChannelHub

// The hub is sans-I/O: these tests drive it with links, bytes and time, and read what it wants sent.
// Token verification is the driver's job (tested in PTTServerTests); here `admit` stands for a token
// that checked out.

let ms: UInt64 = 1_000_000

extension HubConfiguration {
    /// The defaults without the limits on how often one member's roster entry, floor grants and
    /// wakes reach the others: most tests here cycle the floor faster than a person could, to test
    /// something else. `HubFloodTests` tests the limits, with the defaults.
    static var unpaced: HubConfiguration {
        var configuration = HubConfiguration()
        configuration.rosterUpdateInterval = 0
        configuration.floorGrantsPerMinute = 60_000
        configuration.floorGrantBurst = 1_000
        configuration.wakesPerMinute = 60_000
        configuration.wakeBurst = 1_000
        return configuration
    }
}

/// A hub with one channel, a clock, and a recorder for the audio it sends.
final class Harness {
    let hub: ChannelHub
    let channel = ChannelRecord(id: UUID(), name: "Ops", maxBurstSeconds: 60)
    var now = WireInstant(nanoseconds: 1_000 * ms)
    let epoch = Date(timeIntervalSince1970: 1_800_000_000)
    var sent: [(link: Link, bytes: [UInt8])] = []
    var messages: [(link: Link, message: ServerMessage)] = []
    var closes: [(Link, CloseCode)] = []
    var stored: [StoreOperation] = []
    var other: [HubOutput] = []
    private var nextIndex: UInt32 = 0

    init(mode: TransmissionMode = .halfDuplex, configuration: HubConfiguration = .unpaced) {
        hub = ChannelHub(configuration: configuration)
        var record = channel
        record.mode = mode
        hub.upsertChannel(record, at: time)
    }

    var time: HubTime { HubTime(instant: now, date: epoch.addingTimeInterval(Double(now.nanoseconds) / 1e9)) }

    func advance(_ nanoseconds: UInt64) {
        now = now + nanoseconds
        if let deadline = hub.nextDeadline, deadline <= now { hub.handleTimeout(at: time, send: record) }
        drain()
    }

    func record(_ packet: UnsafeRawBufferPointer, _ link: Link) -> Bool {
        sent.append((link, Array(packet)))
        return true
    }

    func drain() {
        for output in hub.takeOutputs() {
            switch output {
            case .send(let message, let links): for link in links { messages.append((link, message)) }
            case .close(let link, let code, _): closes.append((link, code))
            case .store(let operation): stored.append(operation)
            default: other.append(output)
            }
        }
    }

    /// Connects and admits a member; returns its link and slot.
    @discardableResult
    func join(_ user: String, capabilities: Set<Capability> = [.talk, .listen], priority: UInt8 = 0,
              channel: UUID? = nil, tokenID: String = UUID().uuidString, issuedAt: Date? = nil,
              expiresAt: Date? = nil, entered: Bool = false) -> (link: Link, slot: UInt16) {
        nextIndex += 1
        let link = Link(index: nextIndex, generation: 1)
        if entered { hub.entered(link) } else { hub.connected(link) }
        let target = channel ?? self.channel.id
        send(.join(token: "t", channel: target, reason: .developerRequest), from: link)
        hub.admit(link, claims: ParticipantClaims(userID: user, name: user.capitalized, channel: target,
                                                  capabilities: capabilities, priority: priority, issuedAt: issuedAt ?? time.date,
                                                  expiresAt: expiresAt ?? epoch.addingTimeInterval(3600), tokenID: tokenID),
                  reason: .developerRequest, at: time)
        drain()
        for case .joined(_, let you, _, _, _) in messages(to: link) { return (link, you) }
        return (link, 0)
    }

    /// Requests the floor for `link` and, once granted, sends the burst's first audio packet, which
    /// is what asks for its wake pushes. Returns the burst (nil: not granted).
    @discardableResult
    func talk(_ link: Link, payload: [UInt8] = [0]) -> UInt16? {
        send(.floorRequest(), from: link)
        guard let burst = grantedBurst(link) else { return nil }
        audio(from: link, burst: burst, sequence: 0, payload: payload)
        drain()
        return burst
    }

    func send(_ message: ClientMessage, from link: Link) {
        hub.control(link, bytes: MessageCodec().encode(message), at: time)
        drain()
    }

    /// Audio from `link`, as a talker seals it: behind an SFrame header naming the newest key the
    /// hub gave `link` for `burst` (key ID 0, which the hub never gives, without one), with a tag.
    /// The hub never opens frames, so the "ciphertext" here is the payload itself.
    func audio(from link: Link, burst: UInt16, sequence: UInt16, payload: [UInt8], flags: AudioHeader.Flags = []) {
        let datagram = AudioHeader(flags: flags, burst: burst, sequence: sequence).datagram(payload: Self.frame(payload, keyID: keyID(link, burst: burst)))
        _ = datagram.withUnsafeBytes { hub.receiveAudio(from: link, datagram: $0, at: time.instant, send: record) }
        hub.wakeOwedListeners(at: time.instant)  // as the driver does once the copies are out
    }

    static func frame(_ payload: [UInt8], keyID: UInt64) -> [UInt8] {
        var header = [UInt8](repeating: 0, count: SFrameHeader.maxSize)
        let size = header.withUnsafeMutableBytes { SFrameHeader(keyID: keyID, counter: 0).write(to: $0) }
        return header[..<size] + payload + [UInt8](repeating: 0xEE, count: SFrameKey.tagLength)
    }

    /// The payload inside a frame `frame` made.
    static func unframe(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        let size = Array(bytes).withUnsafeBytes { SFrameHeader.parse($0)!.size }
        return Array(bytes.dropFirst(size).dropLast(SFrameKey.tagLength))
    }

    func mediaKeys(to link: Link) -> [MediaKey] {
        messages(to: link).compactMap { if case .mediaKey(let key) = $0 { key } else { nil } }
    }

    func keyID(_ link: Link, burst: UInt16) -> UInt64 {
        mediaKeys(to: link).last { $0.burst == burst }?.keyID ?? 0
    }

    func messages(to link: Link) -> [ServerMessage] { messages.filter { $0.link == link }.map(\.message) }
    func lastMessage(to link: Link) -> ServerMessage? { messages(to: link).last }
    /// The `joined` a link got (the burst keys a member catching up gets follow it).
    func joinedMessage(to link: Link) -> ServerMessage? {
        messages(to: link).first { if case .joined = $0 { true } else { false } }
    }
    func floorEvents(to link: Link) -> [FloorEvent] {
        messages(to: link).compactMap { if case .floor(let event) = $0 { return event } else { return nil } }
    }
    func audio(to link: Link) -> [(header: AudioHeader, payload: [UInt8])] {
        sent.filter { $0.link == link }.map { packet in
            packet.bytes.withUnsafeBytes { (AudioHeader(parsing: $0)!, Self.unframe(packet.bytes[AudioHeader.size...])) }
        }
    }
    func grantedBurst(_ link: Link) -> UInt16? { floorEvents(to: link).last { $0.kind == .granted }?.burst }
}

extension ChannelHub {
    /// The revocations the hub holds for token checks under way (none once no check is).
    var revocationsDuringChecks: [RevocationRecord] { tokenChecks.revocations }
}
