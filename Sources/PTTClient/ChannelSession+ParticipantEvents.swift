import ChannelProtocol

/// Per-person events, as a stage renderer wants them (Amazon IVS's `participantJoined`, `…Left`,
/// publish and subscribe state), beside the roster snapshots: a tile appears, lights up while its
/// member talks, dims when unheard, and goes. Derived from what the app was last told
/// (`announced`), so a reconnection's roster, which repeats who is there, tells nothing new.
extension ChannelSession {
    /// How long a rejoin's roster may pause between chunks before it is taken as whole. The server
    /// sends every chunk as fast as the connection takes it; a second is many round trips.
    static let rosterSettleMilliseconds = 1_000

    /// The roster snapshot, then what changed per person since the app last heard.
    mutating func emitRoster() {
        let entries = rosterEntries
        outputs.append(.event(.roster(entries)))
        for entry in entries where !entry.isLocal {
            if let before = announced[entry.userID] {
                if before.talking != entry.talking {
                    outputs.append(.event(.participantPublishState(userID: entry.userID, entry.talking ? .published : .notPublished)))
                }
                if before.subscribe != entry.subscribe {
                    outputs.append(.event(.participantSubscribeState(userID: entry.userID, entry.subscribe == .none ? .notSubscribed : .subscribed)))
                }
            } else {
                outputs.append(.event(.participantJoined(entry)))
            }
            announced[entry.userID] = entry
        }
    }

    /// Waits (again) for a rejoin's roster to stop arriving.
    mutating func awaitRosterSettling() {
        rosterGeneration += 1
        rosterSettling = rosterGeneration
        outputs.append(.scheduleRosterSettle(milliseconds: Self.rosterSettleMilliseconds, generation: rosterGeneration))
    }

    /// The roster is whole: whoever the app knew and it lacks left while this member was away.
    mutating func rosterSettled(generation: Int) {
        guard rosterSettling == generation else { return }
        rosterSettling = nil
        let present = Set(roster.values.map(\.userID))
        for (user, entry) in announced.sorted(by: { $0.value.slot < $1.value.slot }) where !present.contains(user) {
            announced[user] = nil
            outputs.append(.event(.participantLeft(entry)))
        }
    }
}
