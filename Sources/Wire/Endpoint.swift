/// Server settings: limits that defend against handshake floods (docs/protocol.md §8).
public struct EndpointConfiguration: Sendable {
    public var connection = ConnectionConfiguration()
    /// New connections are refused (CONNECTION_CLOSE connection refused) beyond this many.
    public var maxConnections = 10_000
    /// With this many handshakes in progress, clients without a valid token get a Retry first, which
    /// costs them a round trip and costs the server no state. 0: always.
    public var retryThreshold = 64
    /// New handshakes accepted per second from one IP address (IPv6: one /64); the rest are dropped.
    /// An IPv6 /56 may have 4 times as many, and a /48 16 times: one party holds many /64s.
    public var handshakesPerSecondPerAddress = 20
    /// Connections open at once from one IP address (IPv6: one /64), counted from the address each
    /// connected from; more are refused. Keeps one source from taking every slot of `maxConnections`,
    /// yet leaves room for a site whose whole crew shares one NAT address.
    public var maxConnectionsPerAddress = 1_000
    /// Connections not yet admitted (`Endpoint.admit`; squelchd admits a connection when it joins),
    /// kept at once from one source and in all. A new connection past either budget first closes the
    /// oldest unadmitted one (from its source, or anywhere), at once and without a closing period. A
    /// handshake proves only an address, so without this about 20 sources handshaking at their rate
    /// and never joining would hold every slot of `maxConnections`, each for its join deadline.
    public var maxUnadmittedPerAddress = 64
    public var maxUnadmitted = 1_000
    /// Control-stream bytes an unadmitted connection may have in reassembly (out of order); the full
    /// `controlStreamLimit` once admitted: room for one message of the largest size (64 KiB); a join
    /// needs a few kilobytes.
    public var unadmittedControlLimit = 80 << 10
    public init() {}
}

/// Counters for what the endpoint handled without a connection.
public struct EndpointStats: Sendable, Equatable {
    public var retriesSent = 0
    public var statelessResetsSent = 0
    public var versionNegotiationsSent = 0
    public var refused = 0
    /// Of `refused`, those whose address already had `maxConnectionsPerAddress` connections.
    public var refusedForAddress = 0
    public var rateLimited = 0
    /// Address tokens presented again after they had opened a connection (`SpentTokens`).
    public var tokensRefused = 0
    /// Datagrams for no connection that could not start one (too short, malformed, bad token).
    public var dropped = 0
    public var accepted = 0
    /// Handshakes that completed (the client's Finished verified).
    public var handshakesCompleted = 0
    /// Unadmitted connections closed to make room for new ones (`maxUnadmitted…`).
    public var evicted = 0
    /// Connections that closed before their handshake completed: timed out, a bad or unexpected
    /// message or transport parameter, the client refusing the server's certificate, or the server
    /// shutting down mid-handshake.
    public var handshakesFailed = 0
    public init() {}
}

/// The server side: routes datagrams to connections by connection ID, and answers what belongs to no
/// connection (Version Negotiation, Retry, stateless reset, refusal) without keeping state for it.
///
/// Sans-I/O like `Connection`; not Sendable: it lives on one event loop.
public final class Endpoint {
    /// Refers to one connection; the generation keeps a reused slot from answering for an old one.
    public struct Handle: Hashable, Sendable, CustomStringConvertible {
        public let index: UInt32
        public let generation: UInt32
        public var description: String { "#\(index).\(generation)" }
        /// Endpoints make handles; this is for code that tests the layers above without one. A
        /// handle the endpoint did not make refers to no connection.
        public init(index: UInt32, generation: UInt32) {
            self.index = index
            self.generation = generation
        }
    }

    struct Slot {
        var connection: Connection
        var generation: UInt32
        var deadline: WireInstant?
        var dirty: Bool
        var initialDestination: ConnectionID
        /// The source it connected from (`PathAddress.source`), counted in `perSource` until it closes.
        var source: PathAddress
        var admission: Admission
    }

    /// Whether the application has vouched for a connection (`admit`).
    enum Admission {
        /// Counted against the unadmitted budgets, oldest first in `unadmittedOrder`.
        case pending
        case admitted
        /// Closed to make room: no longer counted, on its way out.
        case evicted
    }

    public let secrets: ServerSecrets
    public let configuration: EndpointConfiguration
    @exclusivity(unchecked) public private(set) var stats = EndpointStats()
    @exclusivity(unchecked) var random: any RandomNumberGenerator
    /// Makes each connection's generator. Production draws from the system generator everywhere;
    /// simulations derive a seeded one per connection so every run of a seed is identical.
    let forkRandom: (inout any RandomNumberGenerator) -> any RandomNumberGenerator
    @exclusivity(unchecked) var slots: [Slot?] = []
    @exclusivity(unchecked) var generations: [UInt32] = []
    @exclusivity(unchecked) var free: [UInt32] = []
    @exclusivity(unchecked) var routes: [ConnectionID: Handle] = [:]
    /// Connections that may have output, in the order they got it: `poll` serves them first come,
    /// first served, so a reply to one member goes out before the notices the same
    /// command queued for everyone else (a floor grant before 200 `taken`s).
    @exclusivity(unchecked) var dirty = FIFOQueue<Handle>()
    @exclusivity(unchecked) var timers = DeadlineHeap()
    /// Stateless replies (version negotiation, Retry, stateless reset, refusals), served first come,
    /// first served, like the connections.
    @exclusivity(unchecked) var outbox = FIFOQueue<([UInt8], PathAddress)>()
    @exclusivity(unchecked) var events = FIFOQueue<(Handle, ConnectionEvent)>()
    @exclusivity(unchecked) var rate: [PathAddress: (window: UInt64, count: Int)] = [:]
    @exclusivity(unchecked) var rateWindow: UInt64 = 0
    /// Open connections per source (`PathAddress.source`); sources with none are not kept.
    @exclusivity(unchecked) var perSource: [PathAddress: Int] = [:]
    @exclusivity(unchecked) public private(set) var connectionCount = 0
    @exclusivity(unchecked) var handshaking = 0
    /// Unadmitted connections in the order they came (entries for ones admitted or gone since are
    /// skipped and dropped as they surface), and how many there are, per source and in all.
    @exclusivity(unchecked) var unadmittedOrder: [Handle] = []
    @exclusivity(unchecked) var unadmittedPerSource: [PathAddress: Int] = [:]
    @exclusivity(unchecked) public private(set) var unadmittedCount = 0
    /// Address tokens that have opened a connection: each opens one. Room for as many as there may
    /// be connections, four times over (tokens outlive their connections by up to an hour).
    @exclusivity(unchecked) var spentTokens: SpentTokens
    /// Entry passes that have opened a connection here (`secrets.entryPasses`; each enters once).
    let spentPasses: SpentPasses?
    @exclusivity(unchecked) let tally = TroubleTally()
    /// What every connection this endpoint has had dropped or lost, live or closed.
    public var troubleTotals: ConnectionTroubleTotals { tally.totals }

    public init(secrets: ServerSecrets, configuration: EndpointConfiguration = EndpointConfiguration(),
                random: any RandomNumberGenerator = SystemRandomNumberGenerator(),
                forkRandom: @escaping (inout any RandomNumberGenerator) -> any RandomNumberGenerator = { _ in SystemRandomNumberGenerator() }) {
        self.secrets = secrets
        self.configuration = configuration
        self.random = random
        self.forkRandom = forkRandom
        spentTokens = SpentTokens(capacity: max(1_024, 4 * configuration.maxConnections))
        spentPasses = secrets.entryPasses == nil ? nil : SpentPasses(capacity: max(1_024, 4 * configuration.maxConnections))
    }

    public func connection(_ handle: Handle) -> Connection? {
        guard Int(handle.index) < slots.count, let slot = slots[Int(handle.index)], slot.generation == handle.generation else { return nil }
        return slot.connection
    }

    /// Every live connection.
    public var handles: [Handle] {
        slots.enumerated().compactMap { index, slot in slot.map { Handle(index: UInt32(index), generation: $0.generation) } }
    }

    public func nextEvent() -> (Handle, ConnectionEvent)? { events.next() }

    // MARK: Receive

    /// Handles one datagram. Audio datagrams are handed to `datagrams` with their connection, in the
    /// middle of that connection's packet processing: the closure must not call back into the
    /// endpoint (record the slice and act after `receive` returns, as WireNIO does).
    public func receive(_ datagram: UnsafeMutableRawBufferPointer, from address: PathAddress, now: WireInstant,
                        datagrams: (Handle, UnsafeRawBufferPointer) -> Void = { _, _ in }) {
        guard let destination = PacketHeader.destination(of: UnsafeRawBufferPointer(datagram)) else {
            stats.dropped += 1
            return
        }
        if let handle = routes[destination], let connection = connection(handle) {
            connection.receive(datagram, from: address, now: now) { datagrams(handle, $0) }
            touched(handle, now: now)
            return
        }
        let header: PacketHeader
        do { header = try PacketHeader.parse(UnsafeRawBufferPointer(datagram)) } catch {
            stats.dropped += 1
            return
        }
        switch header {
        case .unsupportedVersion(_, let destination, let source):
            // Only for datagrams as large as an Initial, so it can't amplify.
            guard datagram.count >= PacketHeader.minimumInitialDatagram else { stats.dropped += 1; return }
            sendVersionNegotiation(to: address, destination: source, source: destination)
        case .long(.initial, _, let destination, let source, let token, _, _):
            accept(datagram, from: address, destination: destination, source: source, token: Array(datagram[token]), now: now,
                   datagrams: datagrams)
        case .short(let destination, _):
            sendStatelessReset(to: address, for: destination, triggerSize: datagram.count)
        default:
            stats.dropped += 1
        }
    }

    func accept(_ datagram: UnsafeMutableRawBufferPointer, from address: PathAddress, destination: ConnectionID, source: ConnectionID,
                token: [UInt8], now: WireInstant, datagrams: (Handle, UnsafeRawBufferPointer) -> Void) {
        guard datagram.count >= PacketHeader.minimumInitialDatagram else { stats.dropped += 1; return }
        guard allowHandshake(from: address, now: now) else { stats.rateLimited += 1; return }
        var original = destination
        var retrySource: ConnectionID?
        var validated = false
        // A token lets a client skip the Retry; it no longer lifts the 3x limit (below), as it binds
        // only the host, or an address for 10 s, while whoever sent this can pick its own port.
        var contents = token.isEmpty ? nil : AddressToken.validate(token, address: address, secrets: secrets, now: now)
        if let valid = contents, !spentTokens.spend(token, expires: AddressToken.expiry(of: valid), now: now) {
            // A second use: as if there were no token (a Retry if the server is busy). A Retry
            // token is for one connection, which exists already: the client must start again.
            stats.tokensRefused += 1
            if valid.isRetry {
                refuse(datagram, from: address, destination: destination, source: source, now: now,
                       code: .invalidToken, reason: "Retry token already used; start again without it")
                return
            }
            contents = nil
        }
        if let contents {
            if contents.isRetry {
                guard contents.retrySource == destination, let tokenOriginal = contents.original else { stats.dropped += 1; return }
                original = tokenOriginal
                retrySource = destination
            }
            validated = true
        } else if !token.isEmpty, AddressToken.open(token, secrets: secrets)?.isRetry == true {
            // Our own Retry token, but stale or from another address. A second Retry would be ignored
            // (one per connection), so say so; WireClient starts afresh without the token.
            refuse(datagram, from: address, destination: destination, source: source, now: now,
                   code: .invalidToken, reason: "Retry token expired or issued to another address")
            return
        }
        if connectionCount >= configuration.maxConnections {
            refuse(datagram, from: address, destination: destination, source: source, now: now,
                   code: .connectionRefused, reason: "server at its connection limit; try again later")
            return
        }
        if perSource[address.source, default: 0] >= configuration.maxConnectionsPerAddress {
            stats.refusedForAddress += 1
            refuse(datagram, from: address, destination: destination, source: source, now: now,
                   code: .connectionRefused, reason: "too many connections from this address; close some, or ask the operator to raise maxConnectionsPerAddress")
            return
        }
        if !validated, handshaking >= configuration.retryThreshold {
            sendRetry(to: address, destination: source, original: destination, now: now)
            return
        }
        makeRoomForUnadmitted(from: address.source, now: now)
        var localID = ConnectionID(random.next())
        while routes[localID] != nil { localID = ConnectionID(random.next()) }
        let connection = Connection(server: secrets, configuration: configuration.connection, remote: address, now: now,
                                    initialDestination: destination, clientSource: source, originalDestination: original,
                                    retrySource: retrySource, localID: localID, random: forkRandom(&random))
        connection.controlReceive.limit = min(configuration.connection.controlStreamLimit, configuration.unadmittedControlLimit)
        connection.spentPasses = spentPasses
        let handle = insert(connection, initialDestination: destination, source: address.source)
        routes[localID] = handle
        routes[destination] = handle
        stats.accepted += 1
        connection.receive(datagram, from: address, now: now) { datagrams(handle, $0) }
        touched(handle, now: now)
    }

    /// A simple per-address counter per one-second window.
    func allowHandshake(from address: PathAddress, now: WireInstant) -> Bool {
        let window = now.nanoseconds / seconds(1)
        if window != rateWindow {
            rate.removeAll(keepingCapacity: true)
            rateWindow = window
        }
        let limit = configuration.handshakesPerSecondPerAddress
        let source = address.source
        let count = (rate[source]?.count ?? 0) + 1
        rate[source] = (window, count)
        guard count <= limit else { return false }
        // The wider prefixes count only handshakes their /64 let through: one /64 over its rate
        // must not use up its neighbours' share.
        let wide = Array(zip(address.wideSources, [4, 16]))
        for (key, share) in wide where (rate[key]?.count ?? 0) >= (limit > Int.max / share ? Int.max : limit * share) { return false }
        for (key, _) in wide { rate[key] = (window, (rate[key]?.count ?? 0) + 1) }
        return true
    }

    func insert(_ connection: Connection, initialDestination: ConnectionID, source: PathAddress) -> Handle {
        let index: UInt32
        if let reused = free.popLast() { index = reused } else {
            index = UInt32(slots.count)
            slots.append(nil)
            generations.append(0)
        }
        generations[Int(index)] &+= 1
        let handle = Handle(index: index, generation: generations[Int(index)])
        slots[Int(index)] = Slot(connection: connection, generation: handle.generation, deadline: nil, dirty: false,
                                 initialDestination: initialDestination, source: source, admission: .pending)
        perSource[source, default: 0] += 1
        compactUnadmittedOrder()
        unadmittedOrder.append(handle)
        unadmittedPerSource[source, default: 0] += 1
        unadmittedCount += 1
        connection.tally = tally
        connectionCount += 1
        handshaking += 1
        return handle
    }

    /// After anything happened to a connection: collect its events and routing changes, re-arm its
    /// timer, mark it for polling, and free it once closed.
    func touched(_ handle: Handle, now: WireInstant, markDirty: Bool = true) {
        guard let connection = connection(handle) else { return }
        let index = Int(handle.index)
        for (id, add) in connection.takeRoutingChanges() {
            if add { routes[id] = handle } else if routes[id] == handle { routes[id] = nil }
        }
        while let event = connection.nextEvent() {
            if case .connected = event {
                handshaking -= 1
                stats.handshakesCompleted += 1
            }
            events.append((handle, event))
        }
        if markDirty, !(slots[index]!.dirty) {
            slots[index]!.dirty = true
            dirty.append(handle)
        }
        let deadline = connection.nextDeadline
        if deadline != slots[index]!.deadline {
            slots[index]!.deadline = deadline
            if let deadline { timers.push(deadline, handle) }
            // Superseded entries stay in the heap until they surface; an idle deadline pushed on every
            // packet would pile up for minutes. Rebuild from the live deadlines when they dominate.
            if timers.count > 4 * connectionCount + 64 { rebuildTimers() }
        }
        if connection.state == .closed { remove(handle) }
    }

    func rebuildTimers() {
        timers.removeAll()
        for (index, slot) in slots.enumerated() {
            guard let slot, let deadline = slot.deadline else { continue }
            timers.push(deadline, Handle(index: UInt32(index), generation: slot.generation))
        }
    }

    func remove(_ handle: Handle) {
        guard let slot = slots[Int(handle.index)], slot.generation == handle.generation else { return }
        for id in slot.connection.activeLocalIDs + [slot.initialDestination] where routes[id] == handle { routes[id] = nil }
        if slot.connection.peerFinished == false {
            handshaking -= 1
            stats.handshakesFailed += 1
        }
        if let count = perSource[slot.source], count > 1 { perSource[slot.source] = count - 1 } else { perSource[slot.source] = nil }
        if slot.admission == .pending { uncount(slot.source) }
        slots[Int(handle.index)] = nil
        free.append(handle.index)
        connectionCount -= 1
    }

    // MARK: Admission

    /// The application vouches for `handle` (squelchd: it joined a channel): it no longer counts
    /// against the unadmitted budgets, and may use its whole control stream.
    public func admit(_ handle: Handle) {
        guard let slot = slots.indices.contains(Int(handle.index)) ? slots[Int(handle.index)] : nil,
              slot.generation == handle.generation, slot.admission == .pending else { return }
        slots[Int(handle.index)]!.admission = .admitted
        uncount(slot.source)
        slot.connection.admitted()
    }

    /// Whether `handle` has been admitted.
    public func isAdmitted(_ handle: Handle) -> Bool {
        guard let slot = slots.indices.contains(Int(handle.index)) ? slots[Int(handle.index)] : nil,
              slot.generation == handle.generation else { return false }
        return slot.admission == .admitted
    }

    /// Drops the entries of connections admitted or gone since, once they outnumber the pending
    /// ones: the order then holds at most about twice as many entries as there are unadmitted
    /// connections, however many connections come and go.
    func compactUnadmittedOrder() {
        guard unadmittedOrder.count > 2 * unadmittedCount + 64 else { return }
        unadmittedOrder.removeAll { handle in
            guard let slot = slots[Int(handle.index)] else { return true }
            return slot.generation != handle.generation || slot.admission != .pending
        }
    }

    func uncount(_ source: PathAddress) {
        unadmittedCount -= 1
        if let count = unadmittedPerSource[source], count > 1 { unadmittedPerSource[source] = count - 1 } else { unadmittedPerSource[source] = nil }
    }

    /// Before a new connection from `source`: closes the oldest unadmitted one from the same source
    /// if that source is at its budget, then the oldest anywhere if all are.
    func makeRoomForUnadmitted(from source: PathAddress, now: WireInstant) {
        if unadmittedPerSource[source, default: 0] >= configuration.maxUnadmittedPerAddress { evictOldest(from: source, now: now) }
        if unadmittedCount >= configuration.maxUnadmitted { evictOldest(from: nil, now: now) }
    }

    func evictOldest(from source: PathAddress?, now: WireInstant) {
        compactUnadmittedOrder()
        guard let index = unadmittedOrder.firstIndex(where: { handle in
            guard let slot = slots[Int(handle.index)], slot.generation == handle.generation, slot.admission == .pending else { return false }
            return source == nil || slot.source == source
        }) else { return }
        let handle = unadmittedOrder.remove(at: index)
        guard let slot = slots[Int(handle.index)] else { return }
        slots[Int(handle.index)]!.admission = .evicted
        uncount(slot.source)
        stats.evicted += 1
        slot.connection.abandon(code: TransportErrorCode.connectionRefused.rawValue,
                                reason: "closed to make room: too many connections that have not joined; join right after the handshake",
                                now: now)
        touched(handle, now: now)
    }

    // MARK: Commands

    public func sendControl(_ message: [UInt8], to handle: Handle, now: WireInstant) throws(ConnectionError) {
        guard let connection = connection(handle) else { throw .local(code: 0, reason: "no such connection") }
        try connection.sendControl(message)
        touched(handle, now: now)
    }

    /// Wraps one relayed media frame for `handle` in an envelope straight into `buffer` (the fan-out
    /// hot path: nothing is sealed per listener).
    public func sendEnvelope(_ media: UnsafeRawBufferPointer, to handle: Handle, into buffer: UnsafeMutableRawBufferPointer,
                             now: WireInstant) -> Transmit? {
        connection(handle)?.sendEnvelope(media, into: buffer, now: now)
    }

    /// `Connection.envelope(mediaCount:now:)` for `handle`: the relay's destination for a copy another
    /// thread writes.
    public func envelope(to handle: Handle, mediaCount: Int, now: WireInstant) -> (Transmit, ConnectionID)? {
        connection(handle)?.envelope(mediaCount: mediaCount, now: now)
    }

    /// Seals one audio datagram for `handle` straight into `buffer` (the fan-out hot path).
    public func sendDatagram(_ payload: UnsafeRawBufferPointer, to handle: Handle, into buffer: UnsafeMutableRawBufferPointer,
                             now: WireInstant) -> Transmit? {
        guard let connection = connection(handle) else { return nil }
        let transmit = connection.sendDatagram(payload, into: buffer, now: now)
        // Rarely, sealing queues output (a control packet displaced from the sent ring, to be sent
        // again; a PING a key update waits on): make sure the next poll visits the connection.
        if connection.outputQueuedOnSend {
            connection.outputQueuedOnSend = false
            if !slots[Int(handle.index)]!.dirty, connection.hasPendingOutput {
                slots[Int(handle.index)]!.dirty = true
                dirty.append(handle)
            }
        }
        return transmit
    }

    public func close(_ handle: Handle, code: UInt64 = 0, reason: String = "", now: WireInstant) {
        connection(handle)?.close(code: code, reason: reason, now: now)
        touched(handle, now: now)
    }

    // MARK: Output

    /// The next datagram to send, or nil when everything is flushed.
    public func poll(into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        while let (bytes, address) = outbox.next() {
            // The adapters offer at least maxDatagramSize; a smaller buffer drops the reply rather
            // than leave it blocking the ones behind it.
            guard bytes.count <= buffer.count else { stats.dropped += 1; continue }
            bytes.withUnsafeBytes { buffer.copyMemory(from: $0) }
            return Transmit(count: bytes.count, address: address)
        }
        while let handle = dirty.first {
            guard let connection = connection(handle) else { _ = dirty.next(); continue }
            if let transmit = connection.poll(into: buffer, now: now) {
                touched(handle, now: now)
                return transmit
            }
            _ = dirty.next()
            slots[Int(handle.index)]?.dirty = false
            touched(handle, now: now, markDirty: false)
        }
        return nil
    }

    public var nextDeadline: WireInstant? {
        while let (deadline, handle) = timers.peek() {
            if let slot = slots.indices.contains(Int(handle.index)) ? slots[Int(handle.index)] : nil,
               slot.generation == handle.generation, slot.deadline == deadline { return deadline }
            timers.pop()
        }
        return nil
    }

    public func handleTimeout(now: WireInstant) {
        while let (deadline, handle) = timers.peek(), deadline <= now {
            timers.pop()
            guard let slot = slots.indices.contains(Int(handle.index)) ? slots[Int(handle.index)] : nil,
                  slot.generation == handle.generation, slot.deadline == deadline else { continue }
            slots[Int(handle.index)]!.deadline = nil
            slot.connection.handleTimeout(now: now)
            touched(handle, now: now)
        }
    }

    // MARK: Stateless answers

    func sendVersionNegotiation(to address: PathAddress, destination: ConnectionID, source: ConnectionID) {
        var bytes = [UInt8](repeating: 0, count: 64)
        let count = bytes.withUnsafeMutableBytes { buffer in
            var w = WireWriter(buffer)
            w.u8(PacketHeader.longFormBit | UInt8(truncatingIfNeeded: random.next() & 0x7F))
            w.u32(WireVersion.negotiation)
            w.u8(8); w.uint(destination.value, 8)
            w.u8(8); w.uint(source.value, 8)
            for version in WireVersion.supported { w.u32(version) }
            return w.offset
        }
        outbox.append((Array(bytes[..<count]), address))
        stats.versionNegotiationsSent += 1
    }

    func sendRetry(to address: PathAddress, destination: ConnectionID, original: ConnectionID, now: WireInstant) {
        let retrySource = ConnectionID(random.next())
        let token = AddressToken.seal(address: address, original: original, retrySource: retrySource, secrets: secrets, now: now)
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { buffer in
            var w = WireWriter(buffer)
            w.u8(PacketHeader.longFormBit | PacketHeader.fixedBit | LongPacketType.retry.rawValue << 4)
            w.u32(WireVersion.v1)
            w.u8(8); w.uint(destination.value, 8)
            w.u8(8); w.uint(retrySource.value, 8)
            w.bytes(token)
            return w.offset
        }
        var packet = Array(bytes[..<count])
        packet += RetryIntegrity.tag(original: original, retryPacketWithoutTag: packet)
        outbox.append((packet, address))
        stats.retriesSent += 1
    }

    /// Tells a client that this server has no state for its connection ID. Always shorter than the
    /// packet that triggered it, so two endpoints can't loop, and never below 21 bytes.
    func sendStatelessReset(to address: PathAddress, for id: ConnectionID, triggerSize: Int) {
        let size = min(triggerSize - 1, 42)
        guard size >= PacketHeader.minimumStatelessReset else { stats.dropped += 1; return }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size)
        while bytes.count < size - 16 {
            var word = random.next()
            for _ in 0..<8 where bytes.count < size - 16 { bytes.append(UInt8(truncatingIfNeeded: word)); word >>= 8 }
        }
        bytes[0] = (bytes[0] & 0x3F) | PacketHeader.fixedBit
        bytes += secrets.resetToken(for: id)
        outbox.append((bytes, address))
        stats.statelessResetsSent += 1
    }

    /// Refuses a new connection with CONNECTION_CLOSE in an Initial packet, so the client learns why
    /// at once instead of timing out.
    func refuse(_ datagram: UnsafeMutableRawBufferPointer, from address: PathAddress, destination: ConnectionID, source: ConnectionID,
                now: WireInstant, code: TransportErrorCode, reason: String) {
        let connection = Connection(server: secrets, configuration: configuration.connection, remote: address, now: now,
                                    initialDestination: destination, clientSource: source, originalDestination: destination,
                                    retrySource: nil, localID: ConnectionID(random.next()), random: forkRandom(&random))
        connection.path.bytesReceived = datagram.count
        connection.close(code: code.rawValue, reason: reason, application: false, now: now)
        var bytes = [UInt8](repeating: 0, count: 1200)
        if let transmit = bytes.withUnsafeMutableBytes({ connection.poll(into: $0, now: now) }) {
            outbox.append((Array(bytes[..<transmit.count]), address))
        }
        stats.refused += 1
    }
}

/// Connection deadlines, soonest first. Entries go stale when a connection's deadline moves; the
/// endpoint skips those when it pops them, so re-arming a timer is O(log n) with no search.
typealias DeadlineHeap = MinHeap<WireInstant, Endpoint.Handle>
