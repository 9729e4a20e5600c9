// Receiving: header protection off, AEAD open in place, replay check, then frames.
import Crypto
extension Connection {
    /// Processes one received datagram, decrypting in place. Audio datagram frames are handed to
    /// `datagrams` as slices of `datagram`, valid only during the call.
    public func receive(_ datagram: UnsafeMutableRawBufferPointer, from address: PathAddress, now: WireInstant,
                        datagrams: (UnsafeRawBufferPointer) -> Void = { _ in }) {
        guard state != .closed, state != .draining else { return }
        stats.datagramsReceived += 1
        stats.bytesReceived += datagram.count
        if address == path.address { path.bytesReceived += datagram.count }
        if let first = datagram.first, MediaEnvelope.isEnvelope(first) {
            receiveEnvelope(UnsafeRawBufferPointer(datagram), from: address, datagrams: datagrams)
            return
        }
        var offset = 0
        var authenticated = false
        // Whether the peer said anything but audio: only that answers what this side sent. A
        // listener hears audio all through a burst, and must still learn that its keepalive was lost.
        var answered = false
        // Only a datagram with a Handshake packet is part of the flight a ping is owed for: Initial
        // keys are derived from what anyone on the path sees, so Initials alone prove nothing.
        let handshakePacketsBefore = handshakePacketsReceived
        while offset < datagram.count, state != .closed, state != .draining {
            let header: PacketHeader
            do { header = try PacketHeader.parse(UnsafeRawBufferPointer(datagram), at: offset) } catch {
                count(.malformed)
                break
            }
            switch header {
            case .long(let type, _, let destination, let source, let token, let pnOffset, let end):
                if receiveLong(datagram, type: type, start: offset, destination: destination, source: source, token: token,
                               pnOffset: pnOffset, end: end, now: now) { authenticated = true; answered = true }
                offset = end
            case .short(_, let pnOffset):
                switch receiveShort(datagram, start: offset, pnOffset: pnOffset, from: address, size: datagram.count, now: now,
                                    datagrams: datagrams) {
                case .dropped: break
                case .media: authenticated = true
                case .answered: authenticated = true; answered = true
                }
                offset = datagram.count
            case .retry(_, _, let source, let token, let tag):
                receiveRetry(datagram, start: offset, source: source, token: token, tag: tag, now: now)
                offset = datagram.count
            case .versionNegotiation(let destination, let source, let versions):
                receiveVersionNegotiation(UnsafeRawBufferPointer(datagram), destination: destination, source: source,
                                          versions: versions, now: now)
                offset = datagram.count
            case .unsupportedVersion:
                count(.malformed)
                offset = datagram.count
            }
        }
        if authenticated, role == .client, state == .handshaking, handshakePacketsReceived > handshakePacketsBefore { oweFlightAcknowledgement() }
        if answered {
            forgetUnanswered()
            if stalled {
                stalled = false
                emit(.stallEnded)
            }
        }
        if authenticated {
            lastReceiveTime = now
            if state == .handshaking || state == .established { resetIdleTimer(now: now) }
            if state == .closing, closeResends < 8 {
                // Answer the peer's packets with the close again, so it learns even if one was lost.
                closeResends += 1
                pendingCloseResend = true
            }
        } else if role == .client, isStatelessReset(UnsafeRawBufferPointer(datagram)) {
            state = .closed
            finish(.statelessReset)
        }
    }

    /// Client, during the handshake: after each datagram of the server's flight (one that brought an
    /// authenticated Handshake packet) while the rest of it
    /// is still to come, sends a PING padded to 1,200 bytes, which lifts the server's 3× limit (RFC
    /// 9000 §8.1) by 3,600 bytes. The handshake spaces carry no ACKs, so without it a flight over
    /// the first 3,600 bytes (a large certificate chain) waited for the ClientHello's resend, which
    /// makes the server start its flight over, from the same first 3,600 bytes: the handshake never
    /// completed. With one PING per datagram the server's budget grows three times faster than it
    /// spends it, so a chain up to the 16 KiB limit costs about a round trip more, and after a loss
    /// the resent flight is never held back by the limit either. No estimate of the server's budget
    /// decides it: lost datagrams either way would make such an estimate too high, and the stall would
    /// come back. The client sends at most one datagram per datagram it received, so this gives no
    /// one a way to make it send more than it is sent.
    func oweFlightAcknowledgement() {
        // Called only after an authenticated Handshake packet, so the flight has begun; it is still
        // owed until the server's Finished, and can be sent while the Initial keys are kept.
        guard serverFinishedHash.isEmpty, initialSpace.seal != nil else { return }
        initialSpace.pingsOwed += 1
    }

    /// Client: is this unauthenticated datagram a stateless reset for one of the server's IDs?
    func isStatelessReset(_ datagram: UnsafeRawBufferPointer) -> Bool {
        guard datagram.count >= PacketHeader.minimumStatelessReset, datagram[0] & PacketHeader.longFormBit == 0 else { return false }
        let tail = datagram.count - 16
        var matched = false
        // Retired IDs' tokens don't count (RFC 9000 §10.3.1): the server answers a packet to a retired
        // ID with that ID's reset, which a late packet or an observer of the old ID can provoke.
        for peer in peerIDs where !peer.retired {
            guard let token = peer.resetToken else { continue }
            var difference: UInt8 = 0
            for i in 0..<16 { difference |= token[i] ^ datagram[tail + i] }  // constant time per token
            matched = matched || difference == 0
        }
        return matched
    }

    // MARK: Header protection

    /// Removes header protection in place. Returns the full packet number and the offset where the
    /// payload starts, or nil if the sample doesn't fit.
    func unprotectHeader(_ packet: UnsafeMutableRawBufferPointer, start: Int, pnOffset: Int, key: PacketKey,
                         long: Bool, largest: UInt64?) -> (pn: UInt64, payloadStart: Int, first: UInt8)? {
        guard let mask = key.headerMask(UnsafeRawBufferPointer(packet), sampleOffset: pnOffset + 4) else { return nil }
        let first = packet[start] ^ (UInt8(truncatingIfNeeded: mask >> 56) & (long ? 0x0F : 0x1F))
        packet[start] = first
        let pnLength = Int(first & 0x03) + 1
        var truncated: UInt64 = 0
        for i in 0..<pnLength {
            let byte = packet[pnOffset + i] ^ UInt8(truncatingIfNeeded: mask >> UInt64(48 - 8 * i))
            packet[pnOffset + i] = byte
            truncated = truncated << 8 | UInt64(byte)
        }
        return (PacketNumber.decode(truncated: truncated, length: pnLength, largest: largest), pnOffset + pnLength, first)
    }

    // MARK: Long headers

    func receiveLong(_ datagram: UnsafeMutableRawBufferPointer, type: LongPacketType, start: Int, destination: ConnectionID,
                     source: ConnectionID, token: Range<Int>, pnOffset: Int, end: Int, now: WireInstant) -> Bool {
        // RFC 9000 §14.1: a client's Initial always comes in a datagram of at least 1,200 bytes.
        // Checked on every one, not only the first: a small Initial that makes the server answer
        // (an ACK, a resent flight) would let whoever sends it spend the server's bytes on the address.
        if role == .server, type == .initial, datagram.count < PacketHeader.minimumInitialDatagram {
            count(.malformed)
            return false
        }
        let packet = UnsafeMutableRawBufferPointer(rebasing: datagram[..<end])
        let spaceKey = type == .initial ? initialSpace.open : handshakeSpace.open
        guard let key = spaceKey else { count(.noKeys); return false }
        let largest = type == .initial ? initialSpace.largestReceived : handshakeSpace.largestReceived
        guard let (pn, payloadStart, first) = unprotectHeader(packet, start: start, pnOffset: pnOffset, key: key, long: true, largest: largest),
              first & 0x0C == 0 else {
            count(.malformed)
            return false
        }
        let aad = UnsafeMutableRawBufferPointer(rebasing: packet[start...])
        guard key.open(aad, payloadStart: payloadStart - start, tagStart: end - 16 - start, packetNumber: pn) else {
            count(.undecryptable)
            return false
        }
        stats.packetsReceived += 1
        if type == .initial { initialSpace.largestReceived = max(pn, initialSpace.largestReceived ?? 0) } else {
            handshakeSpace.largestReceived = max(pn, handshakeSpace.largestReceived ?? 0)
        }
        if role == .client, !receivedServerPacket {
            // The server chose its own ID: address it from now on.
            receivedServerPacket = true
            peerID = source
        }
        if type == .handshake { handshakePacketsReceived += 1 }
        if role == .server, type == .handshake { path.validated = true }
        var parser = FrameParser(payload: UnsafeRawBufferPointer(rebasing: datagram[..<(end - 16)]), offset: payloadStart)
        do {
            while let frame = try parser.next() {
                switch frame {
                case .padding, .ping, .ack:
                    break
                case .crypto(let offset, let data):
                    try receiveCrypto(type, offset: offset, data: UnsafeRawBufferPointer(rebasing: datagram[data]), now: now)
                case .connectionClose(let code, let reason):
                    peerClosed(code: code, reason: String(decoding: UnsafeRawBufferPointer(rebasing: datagram[reason]), as: UTF8.self),
                               application: false, now: now)
                default:
                    protocolViolation("\(frame) is not allowed in a \(type) packet", now: now)
                }
            }
        } catch {
            protocolViolation("malformed \(type) packet: \(error)", now: now, code: .frameEncodingError)
        }
        return true
    }

    func receiveCrypto(_ type: LongPacketType, offset: UInt64, data: UnsafeRawBufferPointer, now: WireInstant) throws(WireParseError) {
        // A retransmitted ClientHello means the server's flight was lost: send it again. Only the
        // ClientHello's own first fragment counts (`clientHelloFirstFragment`): any other CRYPTO at
        // offset 0 (an empty one costs a few bytes) made the server send its whole flight again,
        // which an attacker could repeat.
        if role == .server, type == .initial, clientHelloProcessed, offset == 0 {
            if let first = clientHelloFirstFragment, data.count == first.length, SHA256.hash(data: data) == first.digest {
                initialSpace.flightSent = 0
                handshakeSpace.flightSent = 0
            }
            return
        }
        if role == .server, type == .initial, offset == 0, clientHelloFirstFragment == nil {
            clientHelloFirstFragment = (data.count, SHA256.hash(data: data))
        }
        do {
            // The inbox is moved out and back rather than the whole space copied: a copy would share
            // the reassembly buffer's storage, and every fragment would then copy all of it.
            var inbox: [UInt8] = []
            if type == .initial {
                swap(&inbox, &initialSpace.inbox)
                defer { swap(&inbox, &initialSpace.inbox) }
                try initialSpace.receive.receive(offset: offset, data: data, into: &inbox)
            } else {
                swap(&inbox, &handshakeSpace.inbox)
                defer { swap(&inbox, &handshakeSpace.inbox) }
                try handshakeSpace.receive.receive(offset: offset, data: data, into: &inbox)
            }
        } catch {
            failHandshake(.malformed("handshake data beyond the buffer limit"), now: now)
            return
        }
        processHandshakeInbox(type, now: now)
    }

    func peerClosed(code: UInt64, reason: String, application: Bool, now: WireInstant) {
        if state == .handshaking, role == .client, code >= 0x100, code < 0x200 {
            finish(.handshake(.unexpectedMessage("the server rejected the handshake: \(reason)")))
        } else {
            finish(.peer(code: code, reason: reason, application: application))
        }
        state = .draining
        closeDeadline = now + min(3 * currentPTO, config.maxClosingPeriod)
    }

    // MARK: Retry and version negotiation

    func receiveRetry(_ datagram: UnsafeMutableRawBufferPointer, start: Int, source: ConnectionID, token: Range<Int>,
                      tag: Range<Int>, now: WireInstant) {
        // Only one Retry, only before any other server packet, and never for our own ID.
        guard role == .client, state == .handshaking, retrySource == nil, !receivedServerPacket, source != originalDestination,
              !token.isEmpty else { return }
        let expected = RetryIntegrity.tag(original: originalDestination, retryPacketWithoutTag: datagram[start..<tag.lowerBound])
        var difference: UInt8 = expected.count == 16 ? 0 : 1
        for (i, b) in expected.enumerated() { difference |= b ^ datagram[tag.lowerBound + i] }
        guard difference == 0 else { count(.undecryptable); return }
        retrySource = source
        retryToken = Array(datagram[token])
        peerID = source
        setInitialKeys(destination: source)
        initialSpace.flightSent = 0
        handshakeRetransmitAt = now + rtt.probeTimeout(maxAckDelay: 0)
    }

    func receiveVersionNegotiation(_ datagram: UnsafeRawBufferPointer, destination: ConnectionID, source: ConnectionID,
                                   versions: Range<Int>, now: WireInstant) {
        // Unauthenticated, and it ends the handshake for good: it must at least echo the connection
        // IDs of our Initial (RFC 9000 §6.2, §17.2.1), which an off-path attacker spoofing the
        // server's address has not seen. After a Retry the server has answered, so none can follow.
        guard role == .client, state == .handshaking, !receivedServerPacket, retrySource == nil,
              destination == localID, source == originalDestination else { return }
        var list: [UInt32] = []
        var index = versions.lowerBound
        while index + 4 <= versions.upperBound {
            list.append(UInt32(datagram[index]) << 24 | UInt32(datagram[index + 1]) << 16 | UInt32(datagram[index + 2]) << 8 | UInt32(datagram[index + 3]))
            index += 4
        }
        // A Version Negotiation that lists our version is forged or stale (RFC 9000 §6.2): ignore it.
        guard !list.contains(WireVersion.v1) else { return }
        state = .closed
        finish(.versionNegotiation(serverVersions: list))
    }

    // MARK: Short headers

    /// A relayed media frame (§3.6): handed over as it is, for the application to authenticate with
    /// its burst key. Only a client takes envelopes, only from the server's address, only for a
    /// connection ID it issued; they prove nothing of the peer, so they neither answer a probe nor
    /// keep the connection alive.
    func receiveEnvelope(_ datagram: UnsafeRawBufferPointer, from address: PathAddress, datagrams: (UnsafeRawBufferPointer) -> Void) {
        guard role == .client, state == .established, address == path.address,
              let (destination, media) = MediaEnvelope.parse(datagram),
              destination == localID || issuedIDs.contains(where: { $0.id == destination }) else {
            count(.malformed)
            return
        }
        stats.envelopesReceived += 1
        datagrams(UnsafeRawBufferPointer(rebasing: datagram[media]))
    }

    func receiveShort(_ datagram: UnsafeMutableRawBufferPointer, start: Int, pnOffset: Int, from address: PathAddress, size: Int,
                      now: WireInstant, datagrams: (UnsafeRawBufferPointer) -> Void) -> ShortPacketOutcome {
        guard let current = appOpen, role == .client || peerFinished else { count(.noKeys); return .dropped }
        let packet = UnsafeMutableRawBufferPointer(rebasing: datagram[start...])
        guard let (pn, payloadStart, first) = unprotectHeader(packet, start: 0, pnOffset: pnOffset - start, key: current, long: false,
                                                              largest: replay.largest),
              first & 0x18 == 0 else {
            count(.malformed)
            return .dropped
        }
        let phase = first & PacketHeader.keyPhaseBit != 0
        var key = current
        var isNextPhase = false
        if phase != readKeyPhase {
            if pn >= firstPNInReadPhase, let next = nextReadKey() {
                key = next
                isNextPhase = true
            } else if let previous = appOpenPrevious {
                key = previous
            } else {
                count(.noKeys)
                return .dropped
            }
        }
        guard key.open(packet, payloadStart: payloadStart, tagStart: packet.count - 16, packetNumber: pn) else {
            count(.undecryptable)
            if key.uses >= suite.integrityLimit {
                protocolViolation("too many forged packets", now: now, code: .aeadLimitReached)
            }
            return .dropped
        }
        guard replay.isFresh(pn) else { count(.replayed); return .dropped }
        replay.record(pn)
        stats.packetsReceived += 1
        if isNextPhase { rotateReadKeys(firstPN: pn, now: now) }

        // Migration: an authenticated packet that is the newest so far, from a new address.
        if role == .server, address != path.address, pn == replay.largest, state == .established {
            migratePath(to: address, size: size, now: now)
        }

        var ackEliciting = false
        var mediaOnly = true
        var parser = FrameParser(payload: UnsafeRawBufferPointer(rebasing: packet[..<(packet.count - 16)]), offset: payloadStart)
        do {
            while let frame = try parser.next() {
                // Closing (this side closed, or a frame before this one closed it): the packet counts,
                // so the close is sent again, but nothing in it is acted on (RFC 9000 §10.2.1).
                guard state == .established || state == .handshaking else { break }
                if frame.isAckEliciting { ackEliciting = true }
                switch frame {
                case .datagram, .padding: break
                default: mediaOnly = false
                }
                try handleApplicationFrame(frame, packet: UnsafeRawBufferPointer(packet), from: address, now: now, datagrams: datagrams)
            }
        } catch {
            protocolViolation("malformed packet: \(error)", now: now, code: .frameEncodingError)
            return .answered
        }
        received.insert(pn)
        if pn == received.largest { largestReceivedTime = now }
        // Audio (DATAGRAM frames) is not ack-eliciting: the sender keeps no record of it and learns
        // of loss from reception reports. Its packet numbers still go in the next ACK that control
        // or a keepalive causes, which keeps the sender's packet-number encoding short.
        if ackEliciting {
            ackElicitingSinceAck += 1
            if ackElicitingSinceAck >= 2 {
                ackNow = true
            } else {
                // RFC 9000's every second packet, or within maxAckDelay of the first.
                let at = now + config.maxAckDelay
                if ackDeadline.map({ at < $0 }) ?? true { ackDeadline = at }
            }
        }
        return mediaOnly ? .media : .answered
    }

    /// The read key of the next phase, made on first use and then kept, whether or not the packet that
    /// asked for it opens: forged packets with the other phase bit cost one derivation per key phase,
    /// not one each. RFC 9001 §9.5 recommends deriving it ahead, so that processing time says nothing
    /// about a packet's unprotected key phase bit. Here only the first such packet per phase is
    /// slower, so an attacker injecting packets learns at most one bit of one header-protection mask
    /// per key phase, which is not enough to guess packet numbers; in exchange every connection is
    /// about 2 KB smaller (most never update keys).
    func nextReadKey() -> PacketKey? {
        if appOpenNext == nil { appOpenNext = try? appOpen?.nextGeneration() }
        return appOpenNext
    }

    func rotateReadKeys(firstPN: UInt64, now: WireInstant) {
        appOpenPrevious = appOpen
        appOpen = appOpenNext
        appOpenNext = nil
        readKeyPhase.toggle()
        firstPNInReadPhase = firstPN
        previousReadKeyDiscardAt = now + 3 * currentPTO
        keyGeneration += 1
        stats.keyUpdates += 1
        // The peer updated first: follow, so both directions use the same generation.
        if sendKeyPhase != readKeyPhase, let next = try? appSeal?.nextGeneration() {
            appSeal = next
            sendGeneration += 1
            sendKeyPhase = readKeyPhase
            firstPNInSendPhase = appNextPN
            sentInSendPhase = 0
            sendPhaseAcknowledged = false
        }
        emit(.keyUpdated(generation: keyGeneration))
    }

    func migratePath(to address: PathAddress, size: Int, now: WireInstant) {
        // Back on an address this connection validated and left less than `recentPathLifetime` ago
        // (a phone between Wi-Fi and cellular): the peer's ownership of it is still proven (RFC 9000
        // §9.3 lets validation be skipped for an address seen recently), so the path is validated
        // at once. Validated again instead, the 3× limit would drop its audio for a round trip, a
        // gap FEC can't fill. A replayed old packet can't bring the path back: the replay window
        // drops it before it gets here.
        let returning = recentlyValidated.map { $0.address == address && now.since($0.leftAt) <= Self.recentPathLifetime } ?? false
        if path.validated { recentlyValidated = (path.address, now) }
        if previousPath == nil || path.validated { previousPath = path }
        let sameHost = address.sameHost(as: path.address)
        path = Path(address: address, validated: returning, bytesReceived: size)
        // A new host is a new network path: its RTT is unknown. A new port on the same host is NAT
        // rebinding, which keeps the estimate (RFC 9000 §9.4).
        if !sameHost { rtt.reset() }
        emit(.peerMigrated(address))
        if returning {
            previousPath = nil
            emit(.pathValidated(address))
        } else {
            startPathChallenge(now: now)
        }
    }

    /// How long an address the connection left counts as still the peer's: RFC 4787's shortest UDP
    /// mapping lifetime (REQ-5, 2 minutes), within which a NAT can't have handed the address to
    /// another host.
    static let recentPathLifetime = seconds(120)

    func handleApplicationFrame(_ frame: Frame, packet: UnsafeRawBufferPointer, from address: PathAddress, now: WireInstant,
                                datagrams: (UnsafeRawBufferPointer) -> Void) throws(WireParseError) {
        switch frame {
        case .padding, .ping:
            break
        case .ack(let ack):
            processAck(ack, packet: packet, now: now)
        case .crypto:
            break  // no post-handshake messages in this version
        case .newToken(let range):
            // A token is presented in every later Initial, which must still fit 1,200 bytes with
            // room for the ClientHello: a longer one (a broken or hostile server's) would make every
            // later handshake unsendable. Ours are 60 bytes; anything past 256 is not kept.
            if role == .client {
                if range.count <= Self.maximumNewTokenBytes { emit(.newToken(Array(packet[range]))) }
            } else {
                protocolViolation("NEW_TOKEN from a client", now: now)
            }
        case .control(let offset, let data):
            do {
                try controlReceive.receive(offset: offset, data: UnsafeRawBufferPointer(rebasing: packet[data]), into: &controlInbox)
            } catch {
                protocolViolation("control stream beyond the buffer limit", now: now)
                return
            }
            deliverControlMessages(now: now)
        case .newConnectionID(let sequence, let retirePriorTo, let id, let token):
            guard role == .client else { protocolViolation("NEW_CONNECTION_ID from a client", now: now); return }
            if !peerIDs.contains(where: { $0.sequence == sequence }) {
                peerIDs.append(PeerID(sequence: sequence, id: id, resetToken: Array(packet[token]), retired: false))
            }
            for index in peerIDs.indices where peerIDs[index].sequence < retirePriorTo && !peerIDs[index].retired {
                peerIDs[index].retired = true
                pendingRetireIDs |= 1 << (peerIDs[index].sequence % 64)
                if peerIDs[index].sequence == currentPeerSequence, let next = peerIDs.first(where: { !$0.retired }) {
                    currentPeerSequence = next.sequence
                    peerID = next.id
                }
            }
            if peerIDs.filter({ !$0.retired }).count > Int(config.activeConnectionIDLimit) {
                protocolViolation("more connection IDs than active_connection_id_limit", now: now)
            }
            peerIDs.removeAll { $0.retired && $0.sequence + 16 < sequence }
        case .retireConnectionID(let sequence):
            guard role == .server else { return }
            guard sequence <= highestSentSequence else {
                protocolViolation("RETIRE_CONNECTION_ID for sequence number \(sequence), never issued", now: now)
                return
            }
            if let index = issuedIDs.firstIndex(where: { $0.sequence == sequence }) {
                routingChanges.append((issuedIDs[index].id, false))
                issuedIDs.remove(at: index)
                issueConnectionIDs()
            }
        case .pathChallenge(let data):
            pendingPathResponse = data
        case .pathResponse(let data):
            if path.challenge == data {
                path.validated = true
                path.endChallenge()
                previousPath = nil
                emit(.pathValidated(path.address))
            }
        case .connectionClose(let code, let reason):
            peerClosed(code: code, reason: String(decoding: UnsafeRawBufferPointer(rebasing: packet[reason]), as: UTF8.self),
                       application: false, now: now)
        case .applicationClose(let code, let reason):
            peerClosed(code: code, reason: String(decoding: UnsafeRawBufferPointer(rebasing: packet[reason]), as: UTF8.self),
                       application: true, now: now)
        case .handshakeDone:
            guard role == .client else { protocolViolation("HANDSHAKE_DONE from a client", now: now); return }
            if !handshakeConfirmed {
                handshakeConfirmed = true
                handshakeSpace = HandshakeSpace()
                handshakeRetransmitAt = nil
            }
        case .datagram(let range):
            stats.datagramsDelivered += 1
            datagrams(UnsafeRawBufferPointer(rebasing: packet[range]))
        }
    }

    func deliverControlMessages(now: WireInstant) {
        var consumed = 0
        while true {
            let message: Range<Int>?
            do {
                message = try controlInbox.withUnsafeBytes { raw throws(WireParseError) -> Range<Int>? in
                    var reader = WireReader(raw, offset: consumed)
                    guard !reader.isAtEnd, let length = try? reader.varint("control message length") else { return nil }
                    guard length <= UInt64(config.maxControlMessage) else { throw .invalid(field: "control message length", value: length) }
                    guard UInt64(reader.remaining) >= length else { return nil }
                    return try reader.range(length, "control message")
                }
            } catch {
                protocolViolation("control message too long", now: now)
                return
            }
            guard let message else { break }
            emit(.control(Array(controlInbox[message])))
            stats.controlMessagesDelivered += 1
            consumed = message.upperBound
        }
        // All read (the usual case): give the buffer back, so an idle connection doesn't keep its
        // largest message's worth of memory.
        if consumed == controlInbox.count { controlInbox = [] } else if consumed > 0 { controlInbox.removeFirst(consumed) }
    }
}

/// What one short-header packet turned out to be.
enum ShortPacketOutcome {
    /// Not authenticated, replayed, or without keys: as if it never came.
    case dropped
    /// Nothing but audio (and padding): proof the path works, but no answer to anything.
    case media
    /// Anything else: ACKs, control, PINGs; an answer to what this side sent.
    case answered
}
