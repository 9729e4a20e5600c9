import Foundation
@testable import PTTClient
import SquelchTesting
import Testing

extension ChannelManagerTests {
    /// A speaker's picture end to end: from Bob's token, through squelchd's roster, to Ann's roster
    /// entry and her active remote participant; a picture Ann's app sets instead stays through the
    /// floor events that follow.
    @Test func aSpeakersPictureTravelsFromTheTokenToTheListener() async throws {
        let fixture = try await ClientFixture(pushes: false)
        let id = fixture.channel.id
        let annDelegate = RecordingDelegate(), bobDelegate = RecordingDelegate()
        let ann = try await manager(fixture, "img-ann", annDelegate, pushes: false)
        let bob = try await manager(fixture, "img-bob", bobDelegate, audio: speech(3.0), pushes: false)
        let picture = "https://example.org/people/bob.png"
        ann.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"), credentials: fixture.credentials(try await fixture.token("ann")))
        bob.requestJoinChannel(channelUUID: id, descriptor: ChannelDescriptor(name: "Ops"),
                               credentials: fixture.credentials(try await fixture.token("bob", image: picture)))
        #expect(await annDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await bobDelegate.wait(for: .didJoin(.developerRequest)))
        #expect(await eventually { ann.roster.first { $0.userID == "bob" }?.image == ChannelImage(url: picture) }, "\(ann.roster)")
        #expect(ann.roster.first { $0.userID == "ann" }?.image == nil)

        bob.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { ann.activeRemoteParticipant?.image == ChannelImage(url: picture) }, "\(String(describing: ann.activeRemoteParticipant))")
        // Ann's app shows its own picture of Bob: the roster's next change for him (he stops and
        // talks again, his entry's talking flag with it) does not take it back.
        let own = ChannelImage(url: "https://contacts.example.org/bob-avatar.jpg")
        try await ann.setActiveRemoteParticipant(try Participant(name: "Bob", image: own), channelUUID: id)
        bob.stopTransmitting(channelUUID: id)
        #expect(await eventually { ann.activeRemoteParticipant == nil })
        try await Task.sleep(for: .milliseconds(300))
        bob.requestBeginTransmitting(channelUUID: id)
        #expect(await eventually { ann.activeRemoteParticipant != nil })
        try await Task.sleep(for: .milliseconds(300))
        #expect(ann.activeRemoteParticipant?.image == own, "\(String(describing: ann.activeRemoteParticipant))")
        bob.stopTransmitting(channelUUID: id)
        await ann.invalidate()
        await bob.invalidate()
        await fixture.stop()
    }
}
