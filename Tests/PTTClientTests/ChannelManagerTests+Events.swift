import Foundation
import NIOConcurrencyHelpers
@testable import PTTClient
import SquelchTesting
import Testing

extension ChannelManagerTests {
    /// Two consumers of one manager's events (a stage renderer and a status bar) each see every
    /// per-person event: Bob joining, talking and leaving; his own leave from the "system" is
    /// `userRequest`.
    @Test func twoConsumersEachSeeEveryoneJoinTalkAndLeave() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "ev-ann", annDelegate, pushes: false)
        let bob = try await manager(fixture, "ev-bob", bobDelegate, audio: speech(1.0), pushes: false)
        final class Seen: Sendable {
            let lines = NIOLockedValueBox<[String]>([])
            let task: Task<Void, Never>
            init(_ stream: AsyncStream<ChannelManagerEvent>) {
                let lines = self.lines
                task = Task {
                    for await event in stream {
                        let line: String? = switch event {
                        case .participantJoined(let e): "joined \(e.userID)"
                        case .participantLeft(let e): "left \(e.userID)"
                        case .participantPublishState(let user, let state): "\(user) \(state.rawValue)"
                        default: nil
                        }
                        if let line { lines.withLockedValue { $0.append(line) } }
                    }
                }
            }
            var all: [String] { lines.withLockedValue { $0 } }
        }
        let renderer = Seen(ann.makeEventStream()), statusBar = Seen(ann.makeEventStream())
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("bob")))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await eventually { renderer.all.contains("joined bob") })
        bob.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { renderer.all.contains("bob published") })
        bob.stopTransmitting(channelUUID: id)
        #expect(await eventually { renderer.all.contains("bob notPublished") })
        bob.userLeftChannel(channelUUID: id)
        #expect(await bobDelegate.wait(for: .didLeave(.userRequest)))
        #expect(await eventually { renderer.all.contains("left bob") })
        let expected = ["joined bob", "bob published", "bob notPublished", "left bob"]
        #expect(renderer.all == expected, "\(renderer.all)")
        #expect(await eventually { statusBar.all == expected }, "the second consumer sees the same: \(statusBar.all)")
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }
}
