import Foundation
import Testing
@testable import ChannelProtocol

@Suite struct ChannelProtocolTests {
    let codec = MessageCodec()

    @Test func clientMessagesRoundTripWithATypeMember() throws {
        let channel = UUID()
        let messages: [ClientMessage] = [
            .join(token: "abc.def.ghi", channel: channel, reason: .channelRestoration), .leave, .floorRequest(),
            .floorRequest(request: 0), .floorRequest(request: .max), .floorRequest(request: 2, queue: false), .floorRelease,
            .setMuted(true), .registerPushToken(token: "00aaff", environment: .sandbox), .setSubscriptions(unheard: ["ann", "bob"]),
            .renewToken(token: "abc.def.ghj"), .receptionReport(lossPercent: 0), .receptionReport(lossPercent: 100),
        ]
        for message in messages { #expect(try codec.decodeClientMessage(codec.encode(message)) == message) }
        let json = String(decoding: codec.encode(ClientMessage.floorRequest()), as: UTF8.self)
        #expect(json == #"{"type":"floorRequest"}"#)
        #expect(String(decoding: codec.encode(ClientMessage.floorRequest(request: 12)), as: UTF8.self) == #"{"request":12,"type":"floorRequest"}"#)
        // `queue` goes out only when false, so that older servers read what they always did.
        #expect(String(decoding: codec.encode(ClientMessage.floorRequest(request: 12, queue: false)), as: UTF8.self)
                == #"{"queue":false,"request":12,"type":"floorRequest"}"#)
        #expect(try codec.decodeClientMessage(Array(#"{"type":"floorRequest","queue":true}"#.utf8)) == .floorRequest())
        // A number outside 0...2^32-1 is a bad message, not a trap or a silent wrap.
        for bad in [#"{"type":"floorRequest","request":-1}"#, #"{"type":"floorRequest","request":4294967296}"#,
                    #"{"type":"floorRequest","request":"1"}"#] {
            #expect(throws: MessageError.self) { try codec.decodeClientMessage(Array(bad.utf8)) }
        }
    }

    @Test func serverMessagesRoundTrip() throws {
        let info = ChannelInfo(id: UUID(), name: "Ops", image: "https://example.com/ops.png", mode: .fullDuplex, maxBurstSeconds: 30)
        let messages: [ServerMessage] = [
            .joined(channel: info, you: 3, roster: [RosterMember(slot: 3, userID: "u", name: "U", role: "medic", priority: 9)],
                    talkers: [Talker(slot: 1, burst: 7)]),
            .refused(code: .tokenExpired, reason: "expired"), .participant(RosterMember(slot: 1, userID: "a", name: "A")),
            .participantLeft(slot: 2, userID: "b"), .roster([RosterMember(slot: 4, userID: "d", name: "D", connection: .offline)]), .floor(FloorEvent(kind: .queued, slot: 2, position: 1)),
            .floor(FloorEvent(kind: .granted, slot: 2, burst: 9, maxBurstSeconds: 60, request: 4_000_000_000)),
            .descriptor(info), .serviceStatus(.unavailable, reason: "shutting down"), .serviceStatus(.ready, reason: nil),
            .pushTokenRegistered, .subscriptions(unheard: ["ann"]), .error(code: .notJoined, reason: "join first"),
            .error(code: .tokenWrongUser, reason: "not yours"), .tokenExpiring(expiresAt: Date(timeIntervalSince1970: 1_795_000_000)),
            .tokenRenewed(expiresAt: Date(timeIntervalSince1970: 1_795_043_200)), .receptionLoss(lossPercent: 12),
            .redirect(home: NodeAddress(node: "node-b", host: "10.0.0.2", port: 7700, epoch: 3)),
            .move(home: NodeAddress(node: "node-c", host: "voice-c.example.com", port: 7701, epoch: 4)),
        ]
        for message in messages { #expect(try codec.decodeServerMessage(codec.encode(message)) == message) }
    }

    /// `joined` says what the server understands; an older server's has no `features`, and a name this
    /// side doesn't know (a newer server's) is kept, not refused.
    @Test func joinedFeaturesRoundTripAndMayBeAbsentOrUnknown() throws {
        let info = ChannelInfo(id: UUID(), name: "Ops", image: nil, mode: .halfDuplex, maxBurstSeconds: 60)
        let with = ServerMessage.joined(channel: info, you: 1, roster: [], talkers: [], features: [.receptionReport])
        let without = ServerMessage.joined(channel: info, you: 1, roster: [], talkers: [])
        #expect(try codec.decodeServerMessage(codec.encode(with)) == with)
        #expect(try codec.decodeServerMessage(codec.encode(without)) == without)
        #expect(String(decoding: codec.encode(with), as: UTF8.self).contains(#""features":["receptionReport"]"#))
        #expect(!String(decoding: codec.encode(without), as: UTF8.self).contains("features"), "absent, as from an older server")
        let id = info.id.uuidString
        let old = #"{"type":"joined","channel":{"id":"\#(id)","name":"Ops","mode":"halfDuplex","maxBurstSeconds":60},"you":1,"roster":[],"talkers":[]}"#
        #expect(try codec.decodeServerMessage(Array(old.utf8)) == without)
        let newer = #"{"type":"joined","channel":{"id":"\#(id)","name":"Ops","mode":"halfDuplex","maxBurstSeconds":60},"you":1,"roster":[],"talkers":[],"features":["teleport","receptionReport"]}"#
        #expect(try codec.decodeServerMessage(Array(newer.utf8))
                == .joined(channel: info, you: 1, roster: [], talkers: [], features: [ProtocolFeature(rawValue: "teleport"), .receptionReport]))
    }

    /// A cluster's redirect names a node no node would advertise only when damaged or forged: refused.
    @Test func aRedirectToNowhereIsRefused() throws {
        let home = #""node":"b","host":"10.0.0.2","port":7700,"epoch":3"#
        #expect(try codec.decodeServerMessage(Array(#"{"type":"redirect","home":{\#(home)}}"#.utf8))
                == .redirect(home: NodeAddress(node: "b", host: "10.0.0.2", port: 7700, epoch: 3)))
        for bad in [#"{"type":"redirect","home":{"node":"b","host":"","port":7700,"epoch":3}}"#,
                    #"{"type":"move","home":{"node":"b","host":"h","port":0,"epoch":3}}"#,
                    #"{"type":"move","home":{"node":"","host":"h","port":1,"epoch":3}}"#,
                    #"{"type":"redirect","home":{"node":"b","host":"h","port":70000,"epoch":3}}"#,
                    #"{"type":"redirect","home":{"node":"b","host":"h","port":1,"epoch":-1}}"#,
                    #"{"type":"redirect"}"#] {
            #expect(throws: MessageError.self, "\(bad)") { try codec.decodeServerMessage(Array(bad.utf8)) }
        }
    }

    @Test func lossFiguresAreWholePercentages() throws {
        #expect(String(decoding: codec.encode(ClientMessage.receptionReport(lossPercent: 7)), as: UTF8.self)
            == #"{"loss":7,"type":"receptionReport"}"#)
        #expect(String(decoding: codec.encode(ServerMessage.receptionLoss(lossPercent: 7)), as: UTF8.self)
            == #"{"loss":7,"type":"receptionLoss"}"#)
        for bad in [#"{"type":"receptionReport","loss":101}"#, #"{"type":"receptionReport","loss":-1}"#,
                    #"{"type":"receptionReport","loss":7.5}"#, #"{"type":"receptionReport"}"#] {
            #expect(throws: MessageError.self) { try codec.decodeClientMessage(Array(bad.utf8)) }
        }
        #expect(throws: MessageError.self) { try codec.decodeServerMessage(Array(#"{"type":"receptionLoss","loss":1000}"#.utf8)) }
    }

    @Test func tokenTimesTravelAsWholeUnixSeconds() throws {
        let text = String(decoding: codec.encode(ServerMessage.tokenExpiring(expiresAt: Date(timeIntervalSince1970: 1_795_000_000.9))), as: UTF8.self)
        #expect(text == #"{"expiresAt":1795000000,"type":"tokenExpiring"}"#)
        #expect(try codec.decodeServerMessage(Array(#"{"type":"tokenRenewed","expiresAt":1795043200.0}"#.utf8))
            == .tokenRenewed(expiresAt: Date(timeIntervalSince1970: 1_795_043_200)))
        for bad in [#"{"type":"tokenRenewed"}"#, #"{"type":"tokenRenewed","expiresAt":"soon"}"#,
                    #"{"type":"tokenExpiring","expiresAt":99999999999999}"#] {
            #expect(throws: MessageError.self) { try codec.decodeServerMessage(Array(bad.utf8)) }
        }
        let long = "{\"type\":\"renewToken\",\"token\":\"" + String(repeating: "t", count: ControlLimits.maxTokenBytes + 1) + "\"}"
        #expect(throws: MessageError("renewToken token is \(ControlLimits.maxTokenBytes + 1) bytes; at most \(ControlLimits.maxTokenBytes)")) {
            try codec.decodeClientMessage(Array(long.utf8))
        }
    }

    /// A cause added by a later server must not make an older client drop the whole floor event.
    @Test func anUnknownFloorCauseReadsAsAbsent() throws {
        let text = #"{"event":{"cause":250,"kind":"revoked","reason":"a new reason","slot":3},"type":"floor"}"#
        #expect(try codec.decodeServerMessage(Array(text.utf8))
            == .floor(FloorEvent(kind: .revoked, slot: 3, reason: "a new reason")))
        #expect(try codec.decodeServerMessage(Array(#"{"event":{"cause":106,"kind":"revoked"},"type":"floor"}"#.utf8))
            == .floor(FloorEvent(kind: .revoked, cause: .channelChanged)))
        #expect(throws: MessageError.self) {
            try codec.decodeServerMessage(Array(#"{"event":{"cause":"soon","kind":"revoked"},"type":"floor"}"#.utf8))
        }
    }

    @Test func badMessagesAreRefusedWithAReason() {
        let cases: [(String, String)] = [
            ("", "bad control message"), ("{}", "missing field 'type'"), (#"{"type":"fly"}"#, "unknown client message type 'fly'"),
            (#"{"type":"join","token":"x"}"#, "missing field 'channel'"),
            (#"{"type":"registerPushToken","token":"xyz","environment":"sandbox"}"#, "hex digits"),
            (#"{"type":"registerPushToken","token":"abc","environment":"sandbox"}"#, "hex digits"),
            (#"{"type":"setMuted","muted":"yes"}"#, "wrong type at 'muted'"),
            ("{\"type\":\"setSubscriptions\",\"unheard\":[" + Array(repeating: "\"u\"", count: 1025).joined(separator: ",") + "]}", "at most 1024"),
            ("{\"type\":\"setSubscriptions\",\"unheard\":[\"" + String(repeating: "u", count: 300) + "\"]}", "at most 256"),
        ]
        for (text, expected) in cases {
            #expect(throws: MessageError.self) { try codec.decodeClientMessage(Array(text.utf8)) }
            do { _ = try codec.decodeClientMessage(Array(text.utf8)) } catch {
                #expect(error.description.contains(expected), "\(text): \(error)")
            }
        }
        let huge = [UInt8](repeating: 0x20, count: ControlLimits.maxMessageBytes + 1)
        #expect(throws: MessageError("control message is \(huge.count) bytes; at most \(ControlLimits.maxMessageBytes)")) {
            try codec.decodeClientMessage(huge)
        }
    }

    @Test func audioHeaderRoundTripsAndRejectsWhatIsNotAudio() {
        let header = AudioHeader(flags: [.endOfBurst, .catchUp], slot: 0x1234, burst: 0xBEEF, sequence: 0x0102)
        let datagram = header.datagram(payload: [9, 9])
        #expect(datagram == [0x41, 0x03, 0x12, 0x34, 0xBE, 0xEF, 0x01, 0x02, 9, 9])
        #expect(datagram.withUnsafeBytes { AudioHeader(parsing: $0) } == header)
        let bad: [[UInt8]] = [[], [0x41, 0, 0, 0, 0, 0, 0], [0x42, 0, 0, 0, 0, 0, 0, 0], [0x41, 0x80, 0, 0, 0, 0, 0, 0],
                              [0x41, 0, 0, 0, 0, 0, 0, 0] + [UInt8](repeating: 0, count: AudioHeader.maxPayload + 1)]
        for bytes in bad { #expect(bytes.withUnsafeBytes { AudioHeader(parsing: $0) } == nil) }
    }

    /// `roster` cut as the hub sends it: `joined`'s chunk, then `roster` messages' chunks.
    func rosterChunks(_ roster: [RosterMember], firstChunkBytes: Int = ControlLimits.rosterChunkBytes) -> [ArraySlice<RosterMember>] {
        var chunks: [ArraySlice<RosterMember>] = []
        var chunker = RosterChunker(firstChunkBytes: firstChunkBytes)
        var start = roster.startIndex
        for index in roster.indices where !chunker.take(roster[index]) {
            chunks.append(roster[start..<index])
            start = index
            chunker = RosterChunker()
            _ = chunker.take(roster[index])
        }
        chunks.append(roster[start...])
        return chunks
    }

    /// Entries with every text field at its limit, and full of the characters JSON escapes: each chunk
    /// still fits a control message, the first next to an image that escapes to twice its size, and
    /// no entry is lost or moved.
    @Test func rosterChunksFitAControlMessageWhateverTheEntries() throws {
        let nasty = String(repeating: "/\"\\\u{1}é", count: 200)
        func clipped(_ text: String, _ bytes: Int) -> String {
            var out = ""
            for character in text where out.utf8.count + String(character).utf8.count <= bytes { out.append(character) }
            return out
        }
        let roster = (1...400).map { index in
            RosterMember(slot: UInt16(index), userID: clipped("\(index)" + nasty, ControlLimits.maxUserIDBytes),
                        name: clipped(nasty, 64), role: clipped(nasty, 64), image: clipped("https://example.org/" + nasty, 512),
                        priority: 255, canTalk: false, canListen: false,
                        connection: .reconnecting)
        }
        // A 16 KB image URL that JSON escapes to twice its size: joined's own share is measured, as
        // the hub does, and its roster chunk is smaller for it.
        let image = "https://example.com/" + String(repeating: "\"", count: 16_000)
        let info = ChannelInfo(id: UUID(), name: String(repeating: "n", count: 64), image: image, mode: .halfDuplex, maxBurstSeconds: 60)
        let head = codec.encode(.joined(channel: info, you: 1, roster: [], talkers: [])).count
        #expect(head > 32_000)
        let chunks = rosterChunks(roster, firstChunkBytes: ControlLimits.maxMessageBytes - head - 1_024)
        #expect(chunks.count > 4, "the old rule, 128 a message, would have made 4 of over 64 KiB each")
        #expect(Array(chunks.joined()) == roster)
        for (index, chunk) in chunks.enumerated() {
            let bound = chunk.reduce(0) { $0 + $1.encodedSizeBound }
            let rosterBytes = codec.encode(.roster(Array(chunk))).count
            #expect(rosterBytes <= bound + 40, "the bound holds: \(rosterBytes) bytes against \(bound)")
            let message: ServerMessage = index == 0 ? .joined(channel: info, you: 1, roster: Array(chunk), talkers: [])
                                                    : .roster(Array(chunk))
            let bytes = codec.encode(message)
            #expect(bytes.count < ControlLimits.maxMessageBytes, "chunk \(index): \(bytes.count) bytes")
            #expect(try codec.decodeServerMessage(bytes) == message)
        }
        // Ordinary entries still go 128 to a message.
        let plain = (1...300).map { RosterMember(slot: UInt16($0), userID: "member-\($0)", name: "Member \($0)") }
        #expect(rosterChunks(plain).map(\.count) == [128, 128, 44])
        #expect(rosterChunks([]).map(\.count) == [0])
        // No room in joined at all: its roster is empty and everyone follows in roster messages.
        #expect(rosterChunks(plain, firstChunkBytes: 100).map(\.count) == [0, 128, 128, 44])
    }
}
