import ClusterPlacement
import SeededRandom

/// Microseconds of true time, which is also the simulated database's clock.
typealias TrueTime = Int64

let millisecond: TrueTime = 1_000
let second: TrueTime = 1_000_000

extension SplitMix64 {
    mutating func uniform(_ range: ClosedRange<Int64>) -> Int64 { Int64.random(in: range, using: &self) }
    mutating func uniform(_ range: ClosedRange<Int>) -> Int { Int.random(in: range, using: &self) }
    mutating func chance(_ probability: Double) -> Bool { unitInterval() < probability }
}

/// A seeded discrete-event run of a squelchd cluster around one database: nodes with their own
/// drifting, offset monotonic clocks that die, pause, lose the database, drain and restart; clients
/// that join channels at random nodes and follow redirects; a database whose transactions see a
/// `now()` anywhere between the request's sending and its serialisation (as PostgreSQL's
/// transaction-start `now()` does under lock waits) and that stalls at times.
///
/// Safety is checked as it runs. A node's belief that it serves a channel can only begin when it
/// takes up or renews a lease, so "at most one node serving" is checked for the channel right after
/// each of those (the only moments two beliefs can start to overlap), and for every channel every
/// 100 ms besides. Liveness is checked once every failure has been over for `settleBound`.
final class ClusterSimulation {
    struct Settings {
        var nodes: ClosedRange<Int> = 3...5
        var channels: ClosedRange<Int> = 2...4
        var clientsPerChannel: ClosedRange<Int> = 1...3
        /// Failures happen before this; afterwards everything that lives is up and reachable.
        var quietAt: TrueTime = 40 * second
        /// Every channel with clients is served by this long after `quietAt` (lease + staleness + 3 s).
        var settleBound: TrueTime = 11 * second
        var end: TrueTime = 55 * second
        var policy = PlacementPolicy()
        var keeper = LeaseKeeper<String>.Settings()
        /// Clock rates differ from true time by up to this fraction.
        var clockRateError = 0.005
        var maxDatabaseDelay: TrueTime = 200 * millisecond
        var maxClientDelay: TrueTime = 50 * millisecond
        var maxPause: TrueTime = 15 * second
        /// Requests to and replies from the database lost before `quietAt`.
        var lossBeforeQuiet = 0.02
        /// Keep a readable log of the run (`log`), to study a failing seed.
        var logging = false
    }

    struct Stats: CustomStringConvertible {
        var claims = 0, moved = 0, existing = 0, awaitingExpiry = 0, noNodeAvailable = 0
        var renewalsLost = 0, fenced = 0, writesAccepted = 0, writesRefused = 0
        var handOvers = 0, releases = 0, pauses = 0, crashes = 0, partitions = 0, drains = 0, stalls = 0
        /// The latest moment after `quietAt` at which some channel with clients was not served.
        var lastUnservedAfterQuiet: TrueTime = 0

        var description: String {
            "claims \(claims) (moved \(moved), existing \(existing), awaiting expiry \(awaitingExpiry), none \(noNodeAvailable)), "
                + "renewals lost \(renewalsLost), fenced \(fenced), writes \(writesAccepted) accepted \(writesRefused) refused, "
                + "handovers \(handOvers), releases \(releases); faults: pauses \(pauses), crashes \(crashes), "
                + "partitions \(partitions), drains \(drains), stalls \(stalls); last unserved after quiet +\(lastUnservedAfterQuiet / millisecond) ms"
        }
    }

    enum Request {
        case heartbeat(NodeState, load: Int)
        case claim(String, localSentAt: LocalInstant)
        case renew([HeldLease<String>], localSentAt: LocalInstant)
        case handOver(String, Epoch, localSentAt: LocalInstant)
        case release(String, Epoch)
        case write(String, Epoch)
    }

    enum Reply {
        case claim(String, ClaimDecision<String>, dbNow: DatabaseInstant, localSentAt: LocalInstant)
        case renew(RenewalDecision<String>, localSentAt: LocalInstant)
        case handOver(String, HandOverDecision<String>, localSentAt: LocalInstant)
    }

    enum ClientMessage {
        case connected(node: Int, incarnation: Int)
        case redirect(node: Int)
        case retry(after: TrueTime)
    }

    enum Fault {
        case pause, partition
        case crash(restarts: Bool)
        case drain(exits: Bool)
    }

    enum Event {
        case poll(node: Int, generation: Int)
        case databaseReceives(node: Int, incarnation: Int, sentAt: TrueTime, Request)
        case nodeReceives(node: Int, incarnation: Int, Reply)
        case joinArrives(node: Int, client: Int)
        case clientReceives(client: Int, ClientMessage)
        case clientLoop(client: Int)
        case clientToggle(client: Int)
        case faultStarts(node: Int, Fault, until: TrueTime?)
        case faultEnds(node: Int, Fault)
        case restart(node: Int)
        case check
    }

    struct Node {
        enum Status { case up, paused, dead }
        let id: NodeID
        let offset: Int64
        let rate: Double
        var status = Status.up
        var incarnation = 0
        /// Bumped whenever a node resumes or restarts, so that only one chain of polls runs.
        var pollGeneration = 0
        var keeper: LeaseKeeper<String>
        var draining = false
        var partitioned = false
        /// What reached the node while it was stopped, handled in order when it resumes.
        var inbox: [Event] = []
        var nextHeartbeat: LocalInstant?
        var claimsInFlight: [String: (sentAt: TrueTime, clients: [Int])] = [:]
        var emptySince: [String: TrueTime] = [:]
        var lastHandOver: [String: LocalInstant] = [:]
        /// Requests the node had decided on (its clock read) when it was stopped; they go out, unchecked,
        /// when it resumes. This is the paused holder of Kleppmann's fencing argument.
        var inHand: [(request: Request, readAt: TrueTime)] = []

        /// Its monotonic clock: an arbitrary origin and a rate slightly off true time.
        func local(_ time: TrueTime) -> LocalInstant {
            LocalInstant(nanoseconds: offset + Int64((Double(time) * 1000 * rate).rounded(.down)))
        }
    }

    struct Client {
        let channel: String
        var active = false
        var connected: (node: Int, incarnation: Int)?
        var target: Int?
        /// Without a redirect to follow, a client tries the nodes it knows in turn (a DNS list).
        var lastTried: Int
        var nextAttempt: TrueTime = 0
    }

    struct EpochKey: Hashable {
        var channel: String
        var epoch: Epoch
    }

    let seed: UInt64
    let settings: Settings
    private(set) var stats = Stats()
    private(set) var violations: [String] = []
    /// A running hash of what happened, to show a seed repeats exactly.
    private(set) var trace: UInt64 = 0xCBF2_9CE4_8422_2325
    private(set) var log: [String] = []

    private var random: SplitMix64
    private var queue = EventQueue<Event>()
    private var now: TrueTime = 0
    private var nodes: [Node] = []
    private var clients: [Client] = []
    private var channels: [String] = []
    private var stalls: [(start: TrueTime, end: TrueTime)] = []

    // The database.
    private var rows: [String: PlacementRow<String>] = [:]
    private var nodeRows: [NodeRow?] = []
    private var epochHome: [EpochKey: NodeID] = [:]
    private var lastAcceptedWrite: [String: Epoch] = [:]
    // What nodes did: which node took up each epoch.
    private var epochHolder: [EpochKey: NodeID] = [:]

    init(seed: UInt64, settings: Settings = Settings()) {
        self.seed = seed
        self.settings = settings
        random = SplitMix64(seed: seed)
        let nodeCount = random.uniform(settings.nodes)
        for i in 0..<nodeCount {
            let rate = 1 + (random.unitInterval() * 2 - 1) * settings.clockRateError
            let offset: Int64 = random.uniform(0...1_000_000_000_000_000)
            nodes.append(Node(id: NodeID("n\(i)"), offset: offset, rate: rate, keeper: LeaseKeeper(settings: settings.keeper)))
        }
        nodeRows = Array(repeating: nil, count: nodeCount)
        channels = (0..<random.uniform(settings.channels)).map { "c\($0)" }
        for channel in channels {
            for _ in 0..<random.uniform(settings.clientsPerChannel) {
                clients.append(Client(channel: channel, lastTried: random.uniform(0...(nodeCount - 1))))
            }
        }
        scheduleFaults()
        for i in nodes.indices { queue.push(at: random.uniform(0...(100 * millisecond)), .poll(node: i, generation: 0)) }
        for i in clients.indices {
            queue.push(at: random.uniform(0...(10 * second)), .clientToggle(client: i))
            queue.push(at: random.uniform(0...(300 * millisecond)), .clientLoop(client: i))
        }
        queue.push(at: 0, .check)
    }

    private func address(_ i: Int) -> String { "10.0.0.\(i + 1):7000" }

    // MARK: - Running

    func run() {
        while let (time, event) = queue.pop(), time <= settings.end {
            now = time
            handle(event)
            if violations.count >= 5 { return }
        }
    }

    private func handle(_ event: Event) {
        switch event {
        case .poll(let i, let generation):
            // A stopped node doesn't poll; resuming or restarting starts a new chain.
            guard nodes[i].pollGeneration == generation, nodes[i].status == .up else { return }
            poll(i)
            queue.push(at: now + random.uniform((50 * millisecond)...(150 * millisecond)), .poll(node: i, generation: generation))
        case .databaseReceives(let i, let incarnation, let sentAt, let request):
            if let stall = stalls.first(where: { $0.start <= now && now < $0.end }) {
                queue.push(at: stall.end, event)  // waits for the stall, in arrival order
                return
            }
            database(request, from: i, incarnation: incarnation, sentAt: sentAt)
        case .nodeReceives(let i, let incarnation, let reply):
            guard nodes[i].incarnation == incarnation else { return }
            switch nodes[i].status {
            case .dead: return
            case .paused: nodes[i].inbox.append(event)
            case .up: receive(reply, at: i)
            }
        case .joinArrives(let i, let client):
            switch nodes[i].status {
            case .dead: return  // the client times out
            case .paused: nodes[i].inbox.append(event)
            case .up: join(client, at: i)
            }
        case .clientReceives(let c, let message):
            clientReceives(message, client: c)
        case .clientLoop(let c):
            clientLoop(c)
            queue.push(at: now + random.uniform((150 * millisecond)...(300 * millisecond)), .clientLoop(client: c))
        case .clientToggle(let c):
            toggle(c)
        case .faultStarts(let i, let fault, let until):
            start(fault, on: i, until: until)
        case .faultEnds(let i, let fault):
            end(fault, on: i)
        case .restart(let i):
            restart(i)
        case .check:
            for channel in channels { checkOneHome(channel) }
            if now >= settings.quietAt { checkServed() }
            queue.push(at: now + 100 * millisecond, .check)
        }
    }

    private func note(_ text: @autoclosure () -> String) {
        if settings.logging { log.append("\(Double(now) / Double(second)) \(text())") }
    }

    private func mix(_ values: Int64...) {
        for value in values {
            trace = (trace ^ UInt64(bitPattern: value)) &* 0x100_0000_01B3
        }
    }

    private func violation(_ text: String) {
        violations.append("seed \(seed) at \(Double(now) / Double(second)) s: \(text)")
    }

    // MARK: - Faults

    private func scheduleFaults() {
        let quiet = settings.quietAt
        var foreverDead = 0
        for i in nodes.indices {
            var t = random.uniform((500 * millisecond)...(5 * second))
            for _ in 0..<random.uniform(1...5) {
                let kind = random.uniform(0...5)
                let duration: TrueTime
                let fault: Fault
                switch kind {
                case 0, 1:
                    fault = .pause
                    duration = random.uniform(0...settings.maxPause)
                case 2:
                    fault = .partition
                    duration = random.uniform((1 * second)...(10 * second))
                case 3:
                    let forever = foreverDead < nodes.count - 2 && random.chance(0.3)
                    fault = .crash(restarts: !forever)
                    duration = random.uniform((500 * millisecond)...(10 * second))
                default:
                    fault = .drain(exits: random.chance(0.5))
                    duration = random.uniform((2 * second)...(8 * second))
                }
                // Every fault, restart included, is over by the quiet time.
                guard t + duration + 2 * second < quiet else { break }
                if case .crash(restarts: false) = fault {
                    foreverDead += 1
                    queue.push(at: t, .faultStarts(node: i, fault, until: nil))
                    break
                }
                queue.push(at: t, .faultStarts(node: i, fault, until: t + duration))
                t += duration + random.uniform((1 * second)...(8 * second))
            }
        }
        for _ in 0..<random.uniform(0...3) {
            let start = random.uniform(0...(quiet - 4 * second))
            stalls.append((start, start + random.uniform((300 * millisecond)...(3 * second))))
            stats.stalls += 1
        }
    }

    private func start(_ fault: Fault, on i: Int, until: TrueTime?) {
        guard nodes[i].status != .dead else { return }
        mix(1, Int64(i))
        note("\(nodes[i].id) fault \(fault) until \(until.map { "\($0)" } ?? "-")")
        switch fault {
        case .pause:
            stats.pauses += 1
            nodes[i].status = .paused
            let local = nodes[i].local(now)
            if random.chance(0.5) {
                for holding in nodes[i].keeper.held where nodes[i].keeper.isServing(holding.channel, now: local) {
                    nodes[i].inHand.append((.write(holding.channel, holding.epoch), now))
                }
            }
            if random.chance(0.5), !nodes[i].keeper.held.isEmpty {
                nodes[i].inHand.append((.renew(nodes[i].keeper.startRenewal(now: local), localSentAt: local), now))
            }
        case .partition:
            stats.partitions += 1
            nodes[i].partitioned = true
        case .crash:
            stats.crashes += 1
            nodes[i].status = .dead
            nodes[i].incarnation += 1  // whatever was in flight to it is lost
            nodes[i].inbox = []
            nodes[i].inHand = []
        case .drain:
            stats.drains += 1
            nodes[i].draining = true
            nodes[i].nextHeartbeat = nil  // announce at once
        }
        if let until { queue.push(at: until, .faultEnds(node: i, fault)) }
    }

    private func end(_ fault: Fault, on i: Int) {
        mix(2, Int64(i))
        note("\(nodes[i].id) fault over \(fault)")
        switch fault {
        case .pause:
            guard nodes[i].status == .paused else { return }
            nodes[i].status = .up
            for (request, readAt) in nodes[i].inHand { send(request, from: i, readAt: readAt) }
            nodes[i].inHand = []
            let inbox = nodes[i].inbox
            nodes[i].inbox = []
            for event in inbox { handle(event) }
            guard nodes[i].status == .up else { return }
            nodes[i].pollGeneration += 1
            queue.push(at: now, .poll(node: i, generation: nodes[i].pollGeneration))
        case .partition:
            nodes[i].partitioned = false
        case .crash(let restarts):
            if restarts { restart(i) }
        case .drain(let exits):
            guard nodes[i].status != .dead else { return }
            if exits {
                nodes[i].status = .dead
                nodes[i].incarnation += 1
                nodes[i].inbox = []
                queue.push(at: now + 1 * second, .restart(node: i))
            } else {
                nodes[i].draining = false
                nodes[i].nextHeartbeat = nil
            }
        }
    }

    /// The same node id comes back as a new process: nothing remembered, the machine's clock unchanged.
    private func restart(_ i: Int) {
        guard nodes[i].status == .dead else { return }
        let old = nodes[i]
        var fresh = Node(id: old.id, offset: old.offset, rate: old.rate, keeper: LeaseKeeper(settings: settings.keeper))
        fresh.incarnation = old.incarnation + 1
        fresh.pollGeneration = old.pollGeneration + 1
        nodes[i] = fresh
        queue.push(at: now, .poll(node: i, generation: fresh.pollGeneration))
    }

    // MARK: - Nodes

    /// `readAt`: when the node read its clock for the request (the database's `now()` is no earlier).
    private func send(_ request: Request, from i: Int, readAt: TrueTime? = nil) {
        guard !nodes[i].partitioned else { return }
        if now < settings.quietAt, random.chance(settings.lossBeforeQuiet / 2) { return }
        let delay = random.uniform(0...settings.maxDatabaseDelay)
        queue.push(at: now + delay, .databaseReceives(node: i, incarnation: nodes[i].incarnation, sentAt: readAt ?? now, request))
    }

    private func tell(_ client: Int, _ message: ClientMessage) {
        queue.push(at: now + random.uniform(0...settings.maxClientDelay), .clientReceives(client: client, message))
    }

    private func clientsConnected(to i: Int, channel: String) -> [Int] {
        clients.indices.filter {
            clients[$0].channel == channel && clients[$0].connected?.node == i
                && clients[$0].connected?.incarnation == nodes[i].incarnation
        }
    }

    private func poll(_ i: Int) {
        let local = nodes[i].local(now)
        for case .fenced(_, let epoch) in nodes[i].keeper.tick(now: local) {
            stats.fenced += 1
            note("\(nodes[i].id) fenced \(epoch) at \(local.nanoseconds)")
            mix(3, Int64(i), epoch.rawValue)
        }
        if nodes[i].nextHeartbeat.map({ local >= $0 }) ?? true {
            send(.heartbeat(nodes[i].draining ? .draining : .serving, load: nodes[i].keeper.held.count), from: i)
            nodes[i].nextHeartbeat = local + .seconds(1)
        }
        if let due = nodes[i].keeper.nextRenewal(), local >= due {
            let held = nodes[i].keeper.startRenewal(now: local)
            if !held.isEmpty { send(.renew(held, localSentAt: local), from: i) }
        }
        for holding in nodes[i].keeper.held {
            let channel = holding.channel
            if nodes[i].draining {
                // Stop serving first, then ask the database to move it (at most once a second).
                if let last = nodes[i].lastHandOver[channel], local - last < .seconds(1) { continue }
                guard let epoch = nodes[i].keeper.release(channel) else { continue }
                nodes[i].lastHandOver[channel] = local
                stats.handOvers += 1
                send(.handOver(channel, epoch, localSentAt: local), from: i)
                continue
            }
            guard nodes[i].keeper.isServing(channel, now: local) else { continue }
            if clientsConnected(to: i, channel: channel).isEmpty {
                let since = nodes[i].emptySince[channel] ?? now
                nodes[i].emptySince[channel] = since
                if now - since >= 2 * second, let epoch = nodes[i].keeper.release(channel) {
                    nodes[i].emptySince[channel] = nil
                    stats.releases += 1
                    send(.release(channel, epoch), from: i)
                }
            } else {
                nodes[i].emptySince[channel] = nil
                // A floor grant or a recording: a write fenced by the epoch.
                if random.chance(0.4) { send(.write(channel, holding.epoch), from: i) }
            }
        }
    }

    private func join(_ client: Int, at i: Int) {
        let channel = clients[client].channel
        note("client \(client) (\(channel)) joins at \(nodes[i].id)")
        if nodes[i].keeper.isServing(channel, now: nodes[i].local(now)) {
            tell(client, .connected(node: i, incarnation: nodes[i].incarnation))
            return
        }
        if var inFlight = nodes[i].claimsInFlight[channel], now - inFlight.sentAt < 1 * second {
            inFlight.clients.append(client)
            nodes[i].claimsInFlight[channel] = inFlight
            return
        }
        nodes[i].claimsInFlight[channel] = (now, [client])
        send(.claim(channel, localSentAt: nodes[i].local(now)), from: i)
    }

    private func receive(_ reply: Reply, at i: Int) {
        let local = nodes[i].local(now)
        note("\(nodes[i].id) receives \(reply) at \(local.nanoseconds)")
        switch reply {
        case .claim(let channel, let decision, let dbNow, let localSentAt):
            let waiting = nodes[i].claimsInFlight.removeValue(forKey: channel)?.clients ?? []
            let message: ClientMessage
            switch decision {
            case .moved(let row, _) where row.home == nodes[i].id:
                if nodes[i].keeper.acquired(channel, epoch: row.epoch, requestSentAt: localSentAt) {
                    tookUp(channel, epoch: row.epoch, node: i)
                }
                message = nodes[i].keeper.isServing(channel, now: local)
                    ? .connected(node: i, incarnation: nodes[i].incarnation) : .retry(after: 200 * millisecond)
            case .moved(let row, _), .existing(let row):
                message = .redirect(node: index(of: row.home))
            case .awaitingExpiry(let row):
                message = .retry(after: (row.leaseExpiry.microseconds - dbNow.microseconds) + 100 * millisecond)
            case .noNodeAvailable:
                message = .retry(after: 1 * second)
            }
            for client in waiting { tell(client, message) }
        case .renew(let decision, let localSentAt):
            nodes[i].keeper.renewalSucceeded(decision.renewed.map { HeldLease(channel: $0.channel, epoch: $0.epoch) },
                                              requestSentAt: localSentAt)
            for lost in decision.lost { nodes[i].keeper.lost(lost.channel, epoch: lost.epoch) }
            for row in decision.renewed { checkOneHome(row.channel) }
        case .handOver(let channel, let decision, let localSentAt):
            switch decision {
            case .moved(let row, _):
                for client in clientsConnected(to: i, channel: channel) { tell(client, .redirect(node: index(of: row.home))) }
            case .noNodeAvailable(let kept):
                if nodes[i].keeper.acquired(channel, epoch: kept.epoch, requestSentAt: localSentAt) {
                    tookUp(channel, epoch: kept.epoch, node: i)
                }
            case .notHeld:
                break
            }
        }
    }

    private func index(of id: NodeID) -> Int { nodes.firstIndex { $0.id == id }! }

    /// A node took up an epoch: nobody else ever held it, and no two nodes serve at once.
    private func tookUp(_ channel: String, epoch: Epoch, node i: Int) {
        mix(4, Int64(i), epoch.rawValue)
        note("\(nodes[i].id) takes up \(channel) \(epoch) until \(nodes[i].keeper.holding(channel)!.validUntil.nanoseconds)")
        let key = EpochKey(channel: channel, epoch: epoch)
        if let holder = epochHolder[key], holder != nodes[i].id {
            violation("\(channel) \(epoch) taken up by \(nodes[i].id) after \(holder)")
        }
        epochHolder[key] = nodes[i].id
        checkOneHome(channel)
    }

    // MARK: - The database

    private func database(_ request: Request, from i: Int, incarnation: Int, sentAt: TrueTime) {
        // PostgreSQL's now() is the transaction's start: after the request left, maybe well before the
        // row lock was granted.
        let dbNow = DatabaseInstant(microseconds: random.uniform(sentAt...now))
        let policy = settings.policy
        let id = nodes[i].id
        let table = nodeRows.compactMap { $0 }
        note("db \(id) \(request) dbNow \(dbNow.microseconds) sent \(sentAt)")
        var reply: Reply?
        defer { note("   -> \(reply.map { "\($0)" } ?? "-")") }
        switch request {
        case .heartbeat(let state, let load):
            nodeRows[i] = NodeRow(id: id, voiceAddress: address(i), state: state, load: load, heartbeat: dbNow)
        case .claim(let channel, let localSentAt):
            stats.claims += 1
            let decision = policy.claim(channel, current: rows[channel], nodes: table, requester: id, dbNow: dbNow, random: &random)
            switch decision {
            case .moved(let row, _):
                stats.moved += 1
                if let home = table.first(where: { $0.id == row.home }), home.state != .serving || !policy.isLive(home, at: dbNow) {
                    violation("claim chose \(row.home), which is \(home.state) or stale")
                }
                write(row)
            case .existing(let row):
                stats.existing += 1
                if row.home == id { violation("existing names the requester") }
            case .awaitingExpiry: stats.awaitingExpiry += 1
            case .noNodeAvailable: stats.noNodeAvailable += 1
            }
            reply = .claim(channel, decision, dbNow: dbNow, localSentAt: localSentAt)
        case .renew(let held, let localSentAt):
            let current = held.compactMap { rows[$0.channel] }
            let decision = policy.renew(held, current: current, node: id, dbNow: dbNow)
            for row in decision.renewed { write(row) }
            stats.renewalsLost += decision.lost.count
            reply = .renew(decision, localSentAt: localSentAt)
        case .handOver(let channel, let epoch, let localSentAt):
            let decision = policy.handOver(channel, current: rows[channel], nodes: table, from: id, epoch: epoch,
                                           dbNow: dbNow, random: &random)
            switch decision {
            case .moved(let row, _):
                if row.home == id { violation("handover to the draining node itself") }
                write(row)
            case .noNodeAvailable(let kept): write(kept)
            case .notHeld: break
            }
            reply = .handOver(channel, decision, localSentAt: localSentAt)
        case .release(let channel, let epoch):
            if let row = policy.release(channel, current: rows[channel], node: id, epoch: epoch, dbNow: dbNow) {
                write(row, releasing: true)
            }
        case .write(let channel, let epoch):
            let row = rows[channel]
            if PlacementPolicy.fencedWriteAllowed(row: row, writer: id, epoch: epoch) {
                stats.writesAccepted += 1
                if row?.home != id { violation("write by \(id) accepted for a row naming \(row?.home.description ?? "nobody")") }
                if let last = lastAcceptedWrite[channel], epoch < last {
                    violation("\(channel) write at \(epoch) accepted after one at \(last)")
                }
                if epochHolder[EpochKey(channel: channel, epoch: epoch)] != id {
                    violation("\(channel) write at \(epoch) by \(id), which never took that epoch up")
                }
                lastAcceptedWrite[channel] = epoch
            } else {
                stats.writesRefused += 1
            }
        }
        guard let reply else { return }
        if nodes[i].partitioned { return }
        if now < settings.quietAt, random.chance(settings.lossBeforeQuiet / 2) { return }
        queue.push(at: now + random.uniform(0...settings.maxDatabaseDelay), .nodeReceives(node: i, incarnation: incarnation, reply))
    }

    /// Writes a placement row, checking that epochs only grow, that each names one home, and that
    /// expiries only move later except on release.
    private func write(_ row: PlacementRow<String>, releasing: Bool = false) {
        mix(5, row.epoch.rawValue, row.leaseExpiry.microseconds)
        if let old = rows[row.channel] {
            if row.epoch < old.epoch { violation("\(row.channel) epoch went back from \(old.epoch) to \(row.epoch)") }
            if row.home != old.home, row.epoch <= old.epoch {
                violation("\(row.channel) moved from \(old.home) to \(row.home) without a new epoch")
            }
            if !releasing, row.epoch == old.epoch, row.leaseExpiry < old.leaseExpiry {
                violation("\(row.channel) lease shortened by a renewal")
            }
        }
        let key = EpochKey(channel: row.channel, epoch: row.epoch)
        if let home = epochHome[key], home != row.home { violation("\(row.channel) \(row.epoch) named \(home) and \(row.home)") }
        epochHome[key] = row.home
        rows[row.channel] = row
    }

    // MARK: - Clients

    private func toggle(_ c: Int) {
        if now >= settings.quietAt {
            clients[c].active = true
            return
        }
        clients[c].active.toggle()
        if !clients[c].active { clients[c].connected = nil }
        let next = clients[c].active ? random.uniform((3 * second)...(20 * second)) : random.uniform((1 * second)...(6 * second))
        queue.push(at: min(now + next, settings.quietAt), .clientToggle(client: c))
    }

    private func isServed(_ client: Client) -> Bool {
        guard let (i, incarnation) = client.connected else { return false }
        let node = nodes[i]
        return node.incarnation == incarnation && node.status == .up
            && node.keeper.isServing(client.channel, now: node.local(now))
    }

    private func clientLoop(_ c: Int) {
        guard clients[c].active else { return }
        if clients[c].connected != nil, !isServed(clients[c]) { clients[c].connected = nil }
        guard clients[c].connected == nil, now >= clients[c].nextAttempt else { return }
        let target = clients[c].target ?? (clients[c].lastTried + 1) % nodes.count
        if clients[c].target == nil { clients[c].lastTried = target }
        clients[c].target = nil
        clients[c].nextAttempt = now + 1 * second  // no answer by then: try elsewhere
        note("client \(c) (\(clients[c].channel)) sends a join to \(nodes[target].id) (\(nodes[target].status))")
        queue.push(at: now + random.uniform(0...settings.maxClientDelay), .joinArrives(node: target, client: c))
    }

    private func clientReceives(_ message: ClientMessage, client c: Int) {
        note("client \(c) (\(clients[c].channel)) hears \(message)\(clients[c].active ? "" : " (left)")\(clients[c].connected == nil ? "" : " (connected)")")
        guard clients[c].active, clients[c].connected == nil else { return }
        switch message {
        case .connected(let i, let incarnation):
            clients[c].connected = (i, incarnation)
        case .redirect(let i):
            clients[c].target = i
            clients[c].nextAttempt = now
            clientLoop(c)
        case .retry(let delay):
            clients[c].nextAttempt = now + delay
        }
    }

    // MARK: - Checks

    /// At this true time, at most one node believes it is the channel's home, each by its own clock.
    /// Paused and partitioned nodes count (they act on their belief as soon as they can); dead ones don't.
    private func checkOneHome(_ channel: String) {
        var serving: [String] = []
        for node in nodes where node.status != .dead && node.keeper.isServing(channel, now: node.local(now)) {
            serving.append("\(node.id)@\(node.keeper.holding(channel)!.epoch)")
        }
        if serving.count > 1 { violation("\(channel) served by \(serving.joined(separator: ", "))") }
    }

    /// Once every failure has been over for the settle bound, every client is connected to a live
    /// node serving its channel.
    private func checkServed() {
        let unserved = clients.filter { $0.active && !isServed($0) }
        if !unserved.isEmpty { stats.lastUnservedAfterQuiet = now - settings.quietAt }
        guard now >= settings.quietAt + settings.settleBound else { return }
        for client in unserved {
            let homes = nodes.filter { $0.status == .up && $0.keeper.isServing(client.channel, now: $0.local(now)) }.map(\.id)
            violation("\(client.channel) has a client unserved \(settings.settleBound / second) s after the last failure; "
                      + "row \(rows[client.channel].map { "\($0.home) \($0.epoch)" } ?? "none"), serving: \(homes), "
                      + "client connected to \(client.connected.map { "\(nodes[$0.node].id)#\($0.incarnation)" } ?? "none"), "
                      + "next attempt \(Double(client.nextAttempt) / Double(second)) s")
            return
        }
    }
}
