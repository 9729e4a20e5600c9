import ChannelHub
import ChannelStore
import Foundation

/// The store writes waiting for SQLite, in order, with repeats folded together so that a stalled
/// database costs memory in proportion to the members and bursts it missed, not to the events.
///
/// A plain state machine (no locks, no clock): `StoreWriter` owns one behind a lock.
///
/// A new write is folded into one of the member's waiting writes only where applying the one result
/// leaves the database exactly as applying both in turn would. It is tried against the member's last
/// waiting write, then further back past writes it commutes with (push token, subscription list and
/// last-seen time touch different columns of the row), so that a member alternating two kinds of
/// write (a token, a list, a token, …) keeps one of each waiting rather than one per message:
/// - a last-seen time replaces the waiting last-seen time, or becomes the waiting member record's;
/// - a member record replaces a waiting last-seen time;
/// - a push token set or cleared replaces the waiting set or clear;
/// - a subscription list replaces the waiting list, or becomes the waiting member record's; a member
///   record (which carries the list) replaces a waiting list;
/// - a member record replaces the waiting record (keeping its push token when the new one has none,
///   as the store's upsert would have kept it);
/// - a removal replaces any waiting write of the member (the row goes either way), and then folds
///   on back into the member's earlier waiting writes, down to one removal (a waiting removal takes a
///   later one: that would find no row). A member that joins and leaves in a loop during a stall
///   (record, list, removal, record, …) so keeps one removal and at most one record waiting, not a
///   record with its subscription list per round.
/// Anything else waits behind it. Writes of different members touch different rows, so folding one
/// member's writes never reorders them against another's that matter. A client reconnecting in a loop
/// (record, last-seen time, record, …) folds into one write; an administrator adding and removing the
/// same member still queues one write per change.
///
/// Transmission-log records fold only one way: a burst's progress or end replaces its own start or
/// progress record (`inProgress`) while that still waits. They are the only writes that can be shed: past
/// `maxWaitingLogRecords` waiting, new ones are refused and counted, so a database that stays stalled
/// can't take the server's memory with it; a start is refused from half that, so that the ends of the
/// bursts whose starts got in still have room (a start kept without its end would read as a burst
/// going on, and as `interrupted` after the next restart). Member state is never shed.
struct StoreQueue {
    enum Pushed: Equatable { case queued, folded, refused }

    let maxWaitingLogRecords: Int
    /// Waiting writes; `nil` marks one already handed out, or (from `head` on) one folded into an
    /// earlier write (`cancelled` counts those). `head` is the next to hand out.
    private var entries: [StoreOperation?] = []
    private var cancelled = 0
    private var head = 0
    /// How many writes were handed out before `entries[0]`: turns a position into a sequence number.
    private var base = 0
    /// Each member's waiting writes, by sequence number, oldest first.
    private var waitingOfMember: [MemberKey: [Int]] = [:]
    /// Each waiting burst start (`inProgress` log record), by sequence number, for its end to replace.
    private var waitingStarts: [BurstKey: Int] = [:]
    struct BurstKey: Hashable {
        var channel: UUID
        var user: String
        var startedAt: Date
    }
    private(set) var waitingLogRecords = 0

    init(maxWaitingLogRecords: Int = 100_000) {
        self.maxWaitingLogRecords = maxWaitingLogRecords
    }

    var count: Int { entries.count - head - cancelled }
    var isEmpty: Bool { count == 0 }

    mutating func push(_ operation: StoreOperation) -> Pushed {
        guard let key = Self.key(of: operation) else {
            guard case .logTransmission(let record) = operation else { return .refused }  // every other write has a key
            let burst = BurstKey(channel: record.channelID, user: record.userID, startedAt: record.startedAt)
            if record.endReason == TransmissionRecord.inProgress {
                // Progress (the length so far) replaces the burst's start or progress still waiting.
                if let sequence = waitingStarts[burst], entries[sequence - base] != nil {
                    entries[sequence - base] = operation
                    return .folded
                }
                guard waitingLogRecords < maxWaitingLogRecords / 2 else { return .refused }
                waitingStarts[burst] = base + entries.count
            } else {
                if let sequence = waitingStarts.removeValue(forKey: burst), entries[sequence - base] != nil {
                    entries[sequence - base] = operation
                    return .folded
                }
                guard waitingLogRecords < maxWaitingLogRecords else { return .refused }
            }
            waitingLogRecords += 1
            entries.append(operation)
            return .queued
        }
        for sequence in (waitingOfMember[key] ?? []).reversed() {
            guard let waiting = entries[sequence - base] else { break }
            if let folded = Self.fold(waiting, operation) {
                entries[sequence - base] = folded
                if case .removeMember = folded { collapseRemoval(at: sequence, of: key) }
                return .folded
            }
            guard Self.commute(waiting, operation) else { break }
        }
        waitingOfMember[key, default: []].append(base + entries.count)
        entries.append(operation)
        return .queued
    }

    /// The removal now at `sequence` replaces the member's waiting writes before it, one by one, for
    /// as long as they fold (every write of the member does, unless handed out already): each
    /// position it leaves is cancelled.
    private mutating func collapseRemoval(at sequence: Int, of key: MemberKey) {
        guard var waiting = waitingOfMember[key], var index = waiting.lastIndex(of: sequence) else { return }
        while index > 0, let earlier = entries[waiting[index - 1] - base], let removal = entries[waiting[index] - base],
              let folded = Self.fold(earlier, removal) {
            entries[waiting[index - 1] - base] = folded
            entries[waiting[index] - base] = nil
            cancelled += 1
            waiting.remove(at: index)
            index -= 1
        }
        waitingOfMember[key] = waiting
    }

    mutating func pop() -> StoreOperation? {
        // Positions cancelled by a fold are passed over.
        while head < entries.count, entries[head] == nil {
            head += 1
            cancelled -= 1
        }
        guard head < entries.count, let operation = entries[head] else { return nil }
        entries[head] = nil
        if let key = Self.key(of: operation) {
            // A member's writes leave in order, so this one is the first of its list.
            if var waiting = waitingOfMember[key], waiting.first == base + head {
                waiting.removeFirst()
                waitingOfMember[key] = waiting.isEmpty ? nil : waiting
            }
        } else {
            waitingLogRecords -= 1
            if case .logTransmission(let record) = operation, record.endReason == TransmissionRecord.inProgress {
                let burst = BurstKey(channel: record.channelID, user: record.userID, startedAt: record.startedAt)
                if waitingStarts[burst] == base + head { waitingStarts[burst] = nil }
            }
        }
        head += 1
        // Give the handed-out slots back once they are most of the array (amortised O(1)); an empty
        // queue drops its storage, so a stall's backlog doesn't stay allocated after it.
        if head == entries.count {
            entries = []
            base += head
            head = 0
        } else if head >= 1_024, head * 2 >= entries.count {
            entries.removeFirst(head)
            base += head
            head = 0
        }
        return operation
    }

    static func key(of operation: StoreOperation) -> MemberKey? {
        switch operation {
        case .upsertMember(let member): return MemberKey(channel: member.channelID, user: member.userID)
        case .touchMember(let channel, let user, _), .setPushToken(let channel, let user, _, _, _),
             .removeMember(let channel, let user), .clearPushToken(let channel, let user),
             .setSubscriptions(let channel, let user, _):
            return MemberKey(channel: channel, user: user)
        case .logTransmission: return nil
        }
    }

    /// Whether applying the two (of one member) in either order gives the same row: they write
    /// different columns, and neither creates or deletes it.
    static func commute(_ a: StoreOperation, _ b: StoreOperation) -> Bool {
        func column(_ operation: StoreOperation) -> Int? {
            switch operation {
            case .setPushToken, .clearPushToken: return 0
            case .setSubscriptions: return 1
            case .touchMember: return 2
            case .upsertMember, .removeMember, .logTransmission: return nil
            }
        }
        guard let first = column(a), let second = column(b) else { return false }
        return first != second
    }

    /// `next` folded into `last` (both of one member), or nil when they must both be applied.
    static func fold(_ last: StoreOperation, _ next: StoreOperation) -> StoreOperation? {
        switch (last, next) {
        case (.touchMember, .touchMember):
            return next
        // The record carries a last-seen time of its own: the touch's replaces it, or it replaces the
        // touch's. (Without the row, neither writes anything; a missing channel takes its rows along.)
        case (.upsertMember(var member), .touchMember(_, _, let lastSeen)):
            member.lastSeen = lastSeen
            return .upsertMember(member)
        case (.touchMember, .upsertMember):
            return next
        case (.setPushToken, .setPushToken), (.setPushToken, .clearPushToken),
             (.clearPushToken, .setPushToken), (.clearPushToken, .clearPushToken):
            return next
        case (.upsertMember(let earlier), .upsertMember(var later)):
            if later.pushToken == nil {
                later.pushToken = earlier.pushToken
                later.pushEnvironment = earlier.pushEnvironment
                later.pushRegisteredAt = earlier.pushRegisteredAt
            }
            if later.grant == nil { later.grant = earlier.grant }
            return .upsertMember(later)
        // A member record carries the whole subscription list, which the hub keeps current.
        case (.setSubscriptions, .setSubscriptions), (.setSubscriptions, .upsertMember):
            return next
        case (.upsertMember(var member), .setSubscriptions(_, _, let unheard)):
            member.unheard = unheard
            return .upsertMember(member)
        case (.removeMember, .removeMember):
            return last
        // The row goes either way: any write of the member before it changes nothing.
        case (_, .removeMember):
            return next
        default:
            return nil
        }
    }
}
