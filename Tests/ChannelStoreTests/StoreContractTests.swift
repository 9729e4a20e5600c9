import ChannelProtocol
@testable import ChannelStore
import Foundation
import Testing

/// A date the store keeps exactly: it stores whole milliseconds.
func ms(_ date: Date = Date()) -> Date {
    Date(timeIntervalSince1970: (date.timeIntervalSince1970 * 1000).rounded() / 1000)
}

/// Runs `body` and returns the `StoreError` it threw, or nil; any other error fails the test.
func storeError(_ body: () async throws -> Void) async -> StoreError? {
    do { try await body(); return nil } catch let error as StoreError { return error } catch {
        Issue.record("expected a StoreError, got \(error)")
        return nil
    }
}

func message(_ error: StoreError?) -> String {
    switch error {
    case .invalid(let text)?, .database(let text)?: return text
    default: return ""
    }
}

/// What every `ChannelStore` must do, checked against each of them: the embedded SQLite store and the
/// cluster's PostgreSQL store (a private server the tests start; see `PostgresTestServer`). Each test
/// runs once per store, on an empty database of its own.
@Suite struct StoreContractTests {
    func makeChannel(_ name: String = "Ops", mode: TransmissionMode = .halfDuplex) -> ChannelRecord {
        let now = ms()
        return ChannelRecord(name: name, image: "https://example.com/ops.png", mode: mode, maxBurstSeconds: 45,
                             createdAt: now, updatedAt: now)
    }

    // MARK: Channels

    @Test(arguments: StoreBackend.allCases) func channelCreateReadUpdateDelete(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        #expect(try await store.channel(channel.id) == channel)
        #expect(try await store.channels() == [channel])

        var edited = channel
        edited.name = "Ops 2"
        edited.image = nil
        edited.mode = .fullDuplex
        edited.maxBurstSeconds = 600
        edited.createdAt = ms(Date(timeIntervalSince1970: 0))  // an edit cannot move the creation time
        try await Task.sleep(for: .milliseconds(5))
        let updated = try await store.updateChannel(edited)
        #expect(updated.name == "Ops 2" && updated.image == nil && updated.mode == .fullDuplex && updated.maxBurstSeconds == 600)
        #expect(updated.createdAt == channel.createdAt)
        #expect(updated.updatedAt > channel.updatedAt)
        #expect(try await store.channel(channel.id) == updated)

        try await store.deleteChannel(channel.id)
        #expect(try await store.channel(channel.id) == nil)
        #expect(try await store.channels().isEmpty)
        #expect(await storeError { try await store.deleteChannel(channel.id) } == .channelNotFound(channel.id))
        #expect(await storeError { _ = try await store.updateChannel(channel) } == .channelNotFound(channel.id))
    }

    @Test(arguments: StoreBackend.allCases) func channelsAreListedByName(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        for name in ["bravo", "Alpha", "charlie"] { try await store.createChannel(makeChannel(name)) }
        #expect(try await store.channels().map(\.name) == ["Alpha", "bravo", "charlie"])
    }

    @Test(arguments: StoreBackend.allCases, [
        (ChannelRecord(name: "  "), "channel name"),
        (ChannelRecord(name: "Ops", maxBurstSeconds: 0), "maximum burst"),
        (ChannelRecord(name: "Ops", image: "ftp://example.com/a.png"), "http(s) URL"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + String(repeating: "A", count: ChannelRecord.maxImageBytes)),
         "at most"),
        (ChannelRecord(name: "Ops\u{1B}[2J"), "control characters"),
        (ChannelRecord(name: "Ops\nNight"), "control characters"),
        (ChannelRecord(name: "Ops \u{202E}thgin"), "bidirectional"),
        // One character as people count them, 64 KB of combining marks: with an inline image it
        // no longer fit a control message, and nobody could join the channel.
        (ChannelRecord(name: "Z" + String(repeating: "\u{301}", count: 32_000)), "bytes of UTF-8"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64,not base64!"), "not base64"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + Data("GIF89a, not a PNG at all.".utf8).base64EncodedString()), "not a PNG"),
        (ChannelRecord(name: "Ops", image: "data:image/png;base64," + png(width: 4_000, height: 16).base64EncodedString()), "4000×16 pixels"),
        (ChannelRecord(name: "Ops", image: "https://"), "not a valid URL"),
        (ChannelRecord(name: "Ops", image: "https://example.com/a b.png"), "not a valid URL"),
    ] as [(ChannelRecord, String)])
    func invalidChannelsAreRefused(backend: StoreBackend, refused: (channel: ChannelRecord, expected: String)) async throws {
        let (channel, expected) = refused
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let created = await storeError { try await store.createChannel(channel) }
        #expect(message(created).contains(expected), "\(String(describing: created))")
        #expect(try await store.channels().isEmpty)

        var valid = channel
        valid.name = "Ops"
        valid.image = nil
        valid.maxBurstSeconds = 60
        try await store.createChannel(valid)
        let updated = await storeError { _ = try await store.updateChannel(channel) }
        #expect(message(updated).contains(expected), "\(String(describing: updated))")
        #expect(try await store.channel(channel.id)?.name == "Ops")
    }

    @Test(arguments: StoreBackend.allCases) func aRealIconAndURLsAreAccepted(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let icon = "data:image/png;base64," + png(width: 64, height: 64).base64EncodedString()
        for image in [icon, "https://example.com/icons/ops.png", "http://intranet.local:8080/ops.png?v=2"] {
            let channel = ChannelRecord(name: "Ops — Night shift ☎", image: image)
            try await store.createChannel(channel)
            #expect(try await store.channel(channel.id)?.image == image)
        }
    }

    @Test(arguments: StoreBackend.allCases) func aDuplicateIDIsRefused(_ backend: StoreBackend) async throws {
        let fixture = try await StoreFixture(backend)
        let store = try await fixture.open()
        let channel = makeChannel()
        try await store.createChannel(channel)
        var twin = makeChannel("Twin")
        twin.id = channel.id
        let error = await storeError { try await store.createChannel(twin) }
        #expect(error == .invalid("a channel with id \(channel.id) exists"))
        #expect(try await store.channel(channel.id)?.name == "Ops")
    }
}

/// The first bytes of a PNG of this size: the signature and the IHDR chunk (8-bit RGBA), then an
/// IEND chunk. Enough for the store's check, which reads only the header.
func png(width: UInt32, height: UInt32) -> Data {
    func word(_ value: UInt32) -> [UInt8] { [24, 16, 8, 0].map { UInt8(truncatingIfNeeded: value >> $0) } }
    var bytes: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]
    bytes += word(13) + Array("IHDR".utf8) + word(width) + word(height) + [8, 6, 0, 0, 0] + word(0)
    bytes += word(0) + Array("IEND".utf8) + [0xAE, 0x42, 0x60, 0x82]
    return Data(bytes)
}
