// Sending: build packets into the caller's buffer, seal in place, apply header protection.
extension Connection {
    /// Builds the next datagram to send into `buffer` (at least `maxDatagramSize` bytes), or returns nil
    /// when there is nothing to send now. Call it until it returns nil after every receive, timeout
    /// and command.
    public func poll(into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        lastPollTime = now
        if state == .established { updateKeysIfDue(now: now) }
        switch state {
        case .closed, .draining: return nil
        case .closing:
            guard pendingClose != nil, !closeSent || pendingCloseResend else { return nil }
            pendingCloseResend = false
            closeSent = true
            return finishDatagram(writeClosePacket(buffer, now: now), now: now)
        default: break
        }
        let budget = amplificationBudget
        guard budget >= 64 else {
            if hasPendingOutput { count(.amplificationBlocked) }
            return nil
        }
        let limit = min(buffer.count, config.maxDatagramSize, budget)
        let datagram = UnsafeMutableRawBufferPointer(rebasing: buffer[..<limit])
        var offset = 0
        var containsInitial = false
        if initialSpace.hasSomethingToSend {
            offset = writeHandshakePacket(.initial, into: datagram, at: offset, padTo: role == .client ? PacketHeader.minimumInitialDatagram : 0)
            containsInitial = offset > 0
        }
        if handshakeSpace.hasSomethingToSend, datagram.count - offset > 64 {
            offset = writeHandshakePacket(.handshake, into: datagram, at: offset, padTo: 0)
        }
        // A server also sends 1-RTT packets while handshaking once an entry pass was honoured (it has
        // its write key from the ClientHello on; `Connection.entered`): the join's answer rides with
        // the handshake flight.
        if appSeal != nil, state == .established || state == .handshaking, datagram.count - offset > 64, !containsInitial || role == .server {
            offset = writeApplicationPacket(into: datagram, at: offset, now: now)
        }
        guard offset > 0 else { return nil }
        return finishDatagram(offset, now: now)
    }

    /// Whether anything is waiting to be sent (ignoring the amplification budget).
    public var hasPendingOutput: Bool {
        if state == .closing { return pendingClose != nil && (!closeSent || pendingCloseResend) }
        guard state == .handshaking || state == .established else { return false }
        if initialSpace.hasSomethingToSend || handshakeSpace.hasSomethingToSend { return true }
        guard appSeal != nil else { return false }
        return ackNow || hasAckElicitingFramesPending
    }

    /// Frames waiting to go in the next 1-RTT packet that oblige the peer to acknowledge it.
    var hasAckElicitingFramesPending: Bool {
        pendingPathResponse != nil || path.challengePending || pendingHandshakeDone || pendingNewToken != nil
            || pendingNewIDs != 0 || pendingRetireIDs != 0 || pendingPing || controlSend.hasDataToSend
    }

    func finishDatagram(_ length: Int, now: WireInstant) -> Transmit? {
        guard length > 0 else { return nil }
        path.bytesSent += length
        stats.datagramsSent += 1
        stats.bytesSent += length
        return Transmit(count: length, address: path.address)
    }

    // MARK: Handshake packets

    func writeHandshakePacket(_ type: LongPacketType, into datagram: UnsafeMutableRawBufferPointer, at start: Int, padTo: Int) -> Int {
        var space = type == .initial ? initialSpace : handshakeSpace
        guard let key = space.seal else { return start }
        let pn = space.nextPN
        var w = WireWriter(datagram, offset: start)
        let token = type == .initial && role == .client ? retryToken : []
        let (lengthOffset, pnOffset) = w.writeLongHeader(type: type, version: WireVersion.v1, destination: peerID, source: localID,
                                                         token: token, packetNumber: pn, pnLength: 4)
        let payloadStart = w.offset
        if space.pingsOwed > 0 {
            w.writePing()
            space.pingsOwed -= 1
        }
        let room = w.remaining - 16 - 16
        if room > 0, space.flightSent < space.flight.count {
            let chunk = min(room, space.flight.count - space.flightSent)
            space.flight.withUnsafeBytes { all in
                w.writeCrypto(offset: UInt64(space.flightSent), data: UnsafeRawBufferPointer(rebasing: all[space.flightSent..<(space.flightSent + chunk)]))
            }
            space.flightSent += chunk
        }
        // Pad: to the Initial minimum for clients, and always enough for the header-protection sample.
        let wanted = padTo - 16 - w.offset
        if wanted > 0 { w.writePadding(min(wanted, w.remaining - 16)) }
        guard !w.overflowed else { return start }
        let payloadEnd = w.offset
        let length = payloadEnd + 16 - pnOffset
        datagram[lengthOffset] = 0x40 | UInt8(length >> 8)
        datagram[lengthOffset + 1] = UInt8(length & 0xFF)
        let packet = UnsafeMutableRawBufferPointer(rebasing: datagram[start...])
        guard (try? key.seal(packet, payloadStart: payloadStart - start, payloadEnd: payloadEnd - start, packetNumber: pn)) != nil else { return start }
        protectHeader(packet, pnOffset: pnOffset - start, pnLength: 4, key: key, long: true)
        space.nextPN += 1
        if type == .initial { initialSpace = space } else { handshakeSpace = space }
        stats.packetsSent += 1
        if handshakeRetransmitAt == nil, !(role == .client && handshakeConfirmed) {
            handshakeRetransmitAt = lastPollTime + handshakeRetransmitInterval
        }
        return payloadEnd + 16
    }

    func protectHeader(_ packet: UnsafeMutableRawBufferPointer, pnOffset: Int, pnLength: Int, key: PacketKey, long: Bool) {
        guard let mask = key.headerMask(UnsafeRawBufferPointer(packet), sampleOffset: pnOffset + 4) else { return }
        packet[0] ^= UInt8(truncatingIfNeeded: mask >> 56) & (long ? 0x0F : 0x1F)
        for i in 0..<pnLength { packet[pnOffset + i] ^= UInt8(truncatingIfNeeded: mask >> UInt64(48 - 8 * i)) }
    }

    // MARK: Application packets

    /// Writes one 1-RTT packet with whatever is pending. Returns the new datagram length (unchanged
    /// when there was nothing worth a packet).
    func writeApplicationPacket(into datagram: UnsafeMutableRawBufferPointer, at start: Int, now: WireInstant) -> Int {
        guard let key = appSeal else { return start }
        let pn = appNextPN
        let pnLength = PacketNumber.encodedLength(pn, largestAcked: largestAckedByPeer)
        var w = WireWriter(UnsafeMutableRawBufferPointer(rebasing: datagram[..<(datagram.count - 16)]), offset: start)
        let pnOffset = w.writeShortHeader(destination: peerID, keyPhase: sendKeyPhase, packetNumber: pn, pnLength: pnLength)
        let payloadStart = w.offset
        var record = SentPacket.empty
        record.number = pn
        record.time = now
        var ackEliciting = false
        var includesChallenge = false

        let ackDue = ackNow || ackDeadline.map { $0 <= now } ?? false
        // An ACK goes out when due, and rides along whenever anything else is sent.
        if ackDue || (hasAckElicitingFramesPending && ackElicitingSinceAck > 0) { writeAck(&w, now: now) }
        if let response = pendingPathResponse, w.remaining > 9 {
            w.writePathResponse(response); pendingPathResponse = nil; ackEliciting = true
        }
        if path.challengePending, let challenge = path.challenge, w.remaining > 9 {
            w.writePathChallenge(challenge); path.challengePending = false; ackEliciting = true; includesChallenge = true
        }
        if pendingHandshakeDone, w.remaining > 1 {
            w.writeHandshakeDone(); pendingHandshakeDone = false; record.handshakeDone = true; ackEliciting = true; record.retransmittable = true
        }
        if pendingNewIDs != 0, let secrets = serverSecrets {
            for issued in issuedIDs where pendingNewIDs & (1 << (issued.sequence % 64)) != 0 && w.remaining > 40 {
                let retirePriorTo = issuedIDs.first?.sequence ?? 0
                secrets.resetToken(for: issued.id).withUnsafeBytes {
                    w.writeNewConnectionID(sequence: issued.sequence, retirePriorTo: min(retirePriorTo, issued.sequence), id: issued.id, resetToken: $0)
                }
                pendingNewIDs &= ~(1 << (issued.sequence % 64))
                highestSentSequence = max(highestSentSequence, issued.sequence)
                record.newConnectionIDs |= 1 << (issued.sequence % 64)
                ackEliciting = true; record.retransmittable = true
            }
            pendingNewIDs &= issuedIDs.reduce(0) { $0 | 1 << ($1.sequence % 64) }
        }
        if pendingRetireIDs != 0 {
            for bit in 0..<64 where pendingRetireIDs & (1 << UInt64(bit)) != 0 && w.remaining > 10 {
                guard let peer = peerIDs.first(where: { $0.sequence % 64 == UInt64(bit) }) else { pendingRetireIDs &= ~(1 << UInt64(bit)); continue }
                w.writeRetireConnectionID(sequence: peer.sequence)
                pendingRetireIDs &= ~(1 << UInt64(bit))
                record.retireConnectionIDs |= 1 << UInt64(bit)
                ackEliciting = true; record.retransmittable = true
            }
        }
        if let token = pendingNewToken, w.remaining > token.count + 4 {
            token.withUnsafeBytes { w.writeNewToken($0) }
            pendingNewToken = nil; record.newToken = true; ackEliciting = true; record.retransmittable = true
        }
        if pendingPing { w.writePing(); pendingPing = false; ackEliciting = true }
        if controlSend.hasDataToSend, w.remaining > 24, let chunk = controlSend.nextChunk(maximum: w.remaining - 20) {
            controlSend.withBytes(chunk) { w.writeControl(offset: chunk.lowerBound, data: $0) }
            record.controlStart = chunk.lowerBound
            record.controlEnd = chunk.upperBound
            ackEliciting = true; record.retransmittable = true
        }
        guard w.offset > payloadStart, !w.overflowed else { return start }
        // Probes on a new path are padded to 1200 bytes (RFC 9000 §8.2.1), budget permitting.
        if includesChallenge { w.writePadding(max(0, min(w.remaining, config.maxDatagramSize - 16 - w.offset))) }
        let needed = pnOffset + 4 - w.offset  // sample: pn + payload ≥ 4 bytes
        if needed > 0 { w.writePadding(needed) }
        guard !w.overflowed else { return start }
        return sealApplicationPacket(datagram, start: start, pnOffset: pnOffset, pnLength: pnLength, payloadStart: payloadStart,
                                     payloadEnd: w.offset, key: key, record: record, ackEliciting: ackEliciting, now: now)
    }

    /// `reserve`: bytes the rest of the packet needs after the ACK (an audio datagram's payload).
    func writeAck(_ w: inout WireWriter, now: WireInstant, reserve: Int = 0) {
        let room = w.remaining - reserve
        guard !received.ranges.isEmpty, room > 40 else { return }
        let delay = ((largestReceivedTime.map { now.since($0) } ?? 0) / 1000) >> 3  // µs >> ack_delay_exponent 3
        // Fit the ranges to the room left: drop the oldest.
        var ranges = received.ranges[...]
        while ranges.count > 1, ranges.count * 16 + 20 > room { ranges = ranges.dropLast() }
        w.writeAck(ranges: ranges, delay: delay)
        ackElicitingSinceAck = 0
        ackDeadline = nil
        ackNow = false
    }

    func sealApplicationPacket(_ datagram: UnsafeMutableRawBufferPointer, start: Int, pnOffset: Int, pnLength: Int, payloadStart: Int,
                               payloadEnd: Int, key: PacketKey, record: SentPacket, ackEliciting: Bool, now: WireInstant) -> Int {
        let packet = UnsafeMutableRawBufferPointer(rebasing: datagram[start...])
        guard (try? key.seal(packet, payloadStart: payloadStart - start, payloadEnd: payloadEnd - start, packetNumber: record.number)) != nil
        else { return start }
        protectHeader(packet, pnOffset: pnOffset - start, pnLength: pnLength, key: key, long: false)
        appNextPN += 1
        sentInSendPhase += 1
        stats.packetsSent += 1
        if ackEliciting {
            stats.ackElicitingSent += 1
            var record = record
            record.ackEliciting = true
            record.live = true
            if let displaced = sent.record(record) {
                onLost(displaced)
                outputQueuedOnSend = true
            }
            if record.retransmittable {
                retransmittableInFlight += 1
                lastRetransmittableSent = now
            }
            if !ackElicitingSentSinceReceive {
                ackElicitingSentSinceReceive = true
                unansweredSince = now
                resetIdleTimer(now: now)
            }
            armKeepAlive(now: now)
        }
        return payloadEnd + 16
    }

    /// Updates the sending keys once `keyUpdateInterval` packets have gone under them. An update
    /// can't start until the peer acknowledges a packet under the current keys; a peer that never
    /// does must not get packets past the suite's confidentiality limit (RFC 9001 §6.6), so the
    /// connection closes with AEAD_LIMIT_REACHED a few packets short of it, leaving room for the
    /// close and its resends (at most 9) under the same keys.
    func updateKeysIfDue(now: WireInstant) {
        let limit = min(config.keyUpdateInterval, suite.confidentialityLimit / 2)
        guard sentInSendPhase >= limit, !initiateKeyUpdate() else { return }
        // The update waits for the peer to acknowledge a packet under the current keys. A talker
        // sends audio, which asks for no acknowledgement: ask with a PING, once per probe timeout.
        if handshakeConfirmed, keyUpdatePingAt.map({ $0 + currentPTO <= now }) ?? true {
            keyUpdatePingAt = now
            pendingPing = true
            outputQueuedOnSend = true
        }
        guard sentInSendPhase + 16 >= suite.confidentialityLimit else { return }
        protocolViolation("the peer acknowledged no packet under the current keys, so they could not be updated before the AEAD limit",
                          now: now, code: .aeadLimitReached)
    }

    /// Seals one audio datagram into `buffer` and returns it to send now, bypassing the queue: the
    /// relay's hot path. Pending ACKs ride along. Nil when the connection can't send (not established,
    /// payload too large, or the new path's 3× budget is spent); the audio is then dropped, never queued.
    public func sendDatagram(_ payload: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        guard state == .established, appSeal != nil else { return nil }
        let limit = min(buffer.count, config.maxDatagramSize)
        guard payload.count + 1 + ConnectionID.length + 4 + 16 + 1 <= limit else { return nil }
        updateKeysIfDue(now: now)
        guard state == .established, let key = appSeal else { return nil }
        let pn = appNextPN
        let pnLength = PacketNumber.encodedLength(pn, largestAcked: largestAckedByPeer)
        var w = WireWriter(UnsafeMutableRawBufferPointer(rebasing: buffer[..<(limit - 16)]))
        let pnOffset = w.writeShortHeader(destination: peerID, keyPhase: sendKeyPhase, packetNumber: pn, pnLength: pnLength)
        let payloadStart = w.offset
        // The ACK's state is taken back if the packet isn't sent: it would otherwise count as
        // acknowledged, and no ACK would go until the peer's next ack-eliciting packet.
        let ackState = (ackElicitingSinceAck, ackDeadline, ackNow)
        // Sized around the payload (its frame type, and padding for a short packet number): with
        // many ranges to report, an ACK sized to the whole packet left no room for the audio.
        if ackElicitingSinceAck > 0, w.remaining > payload.count + 48 { writeAck(&w, now: now, reserve: payload.count + 4) }
        let needed = pnOffset + 4 - (w.offset + 1 + payload.count)
        if needed > 0 { w.writePadding(needed) }
        w.writeDatagram(payload, last: true)
        guard !w.overflowed else {
            (ackElicitingSinceAck, ackDeadline, ackNow) = ackState
            return nil
        }
        let length = w.offset + 16
        guard length <= amplificationBudget else {
            (ackElicitingSinceAck, ackDeadline, ackNow) = ackState
            count(.amplificationBlocked)
            return nil
        }
        var record = SentPacket.empty
        record.number = pn
        // Not ack-eliciting: nothing is recorded, nothing waits for an answer, no probe follows.
        let end = sealApplicationPacket(buffer, start: 0, pnOffset: pnOffset, pnLength: pnLength, payloadStart: payloadStart,
                                        payloadEnd: w.offset, key: key, record: record, ackEliciting: false, now: now)
        return finishDatagram(end, now: now)
    }

    /// Wraps one relayed media frame for this listener in an envelope (§3.6) in `buffer`: nothing
    /// sealed, numbered or recorded, as the talker sealed the frame for every member at once. Nil
    /// when the connection can't send (not established, too large, or the new path's 3× budget is
    /// spent); the frame is then dropped, never queued.
    public func sendEnvelope(_ media: UnsafeRawBufferPointer, into buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Transmit? {
        guard MediaEnvelope.headerSize + media.count <= buffer.count, let (transmit, destination) = envelope(mediaCount: media.count, now: now)
        else { return nil }
        _ = MediaEnvelope.write(media, to: destination, into: buffer)
        return transmit
    }

    /// Where an envelope of `mediaCount` bytes of media goes, and under which connection ID, counted
    /// as sent (and against the path's budget) as `sendEnvelope` would; for a sender that writes it on
    /// another thread. Nil when it may not go (see `sendEnvelope`).
    public func envelope(mediaCount: Int, now: WireInstant) -> (Transmit, ConnectionID)? {
        guard role == .server, state == .established, mediaCount > 0 else { return nil }
        let length = MediaEnvelope.headerSize + mediaCount
        guard length <= config.maxDatagramSize else { return nil }
        guard length <= amplificationBudget else {
            count(.amplificationBlocked)
            return nil
        }
        return finishDatagram(length, now: now).map { ($0, peerID) }
    }

    // MARK: Closing

    func writeClosePacket(_ buffer: UnsafeMutableRawBufferPointer, now: WireInstant) -> Int {
        guard let close = pendingClose else { return 0 }
        let datagram = UnsafeMutableRawBufferPointer(rebasing: buffer[..<min(buffer.count, config.maxDatagramSize)])
        // At most 256 bytes, cut between characters (a cut inside one would decode to U+FFFD and grow).
        var cut = close.reason.startIndex, bytes = 0
        for character in close.reason {
            bytes += character.utf8.count
            guard bytes <= 256 else { break }
            cut = close.reason.index(after: cut)
        }
        let reason = String(close.reason[..<cut])
        if !closeInHandshakeSpace, let key = appSeal {
            let pn = appNextPN
            let pnLength = PacketNumber.encodedLength(pn, largestAcked: largestAckedByPeer)
            var w = WireWriter(UnsafeMutableRawBufferPointer(rebasing: datagram[..<(datagram.count - 16)]))
            let pnOffset = w.writeShortHeader(destination: peerID, keyPhase: sendKeyPhase, packetNumber: pn, pnLength: pnLength)
            let payloadStart = w.offset
            w.writeConnectionClose(code: close.code, reason: reason, application: close.application)
            if pnOffset + 4 > w.offset { w.writePadding(pnOffset + 4 - w.offset) }
            var record = SentPacket.empty
            record.number = pn
            return sealApplicationPacket(datagram, start: 0, pnOffset: pnOffset, pnLength: pnLength, payloadStart: payloadStart,
                                         payloadEnd: w.offset, key: key, record: record, ackEliciting: false, now: now)
        }
        // During the handshake the peer may have only Initial keys: close there (and in Handshake).
        var offset = 0
        for type in [LongPacketType.initial, .handshake] {
            var space = type == .initial ? initialSpace : handshakeSpace
            guard let key = space.seal, datagram.count - offset > 100 else { continue }
            var w = WireWriter(datagram, offset: offset)
            let (lengthOffset, pnOffset) = w.writeLongHeader(type: type, version: WireVersion.v1, destination: peerID, source: localID,
                                                             token: type == .initial && role == .client ? retryToken : [],
                                                             packetNumber: space.nextPN, pnLength: 4)
            let payloadStart = w.offset
            // A transport close only: an application's code and reason must not leak before the peer
            // is authenticated (RFC 9000 §10.2.3), so they become APPLICATION_ERROR with no reason.
            w.writeConnectionClose(code: close.application ? TransportErrorCode.applicationError.rawValue : close.code,
                                   reason: close.application ? "" : reason, application: false)
            if role == .client, type == .initial { w.writePadding(max(0, PacketHeader.minimumInitialDatagram - 16 - w.offset)) }
            guard !w.overflowed, w.remaining >= 16 else { continue }
            let length = w.offset + 16 - pnOffset
            datagram[lengthOffset] = 0x40 | UInt8(length >> 8)
            datagram[lengthOffset + 1] = UInt8(length & 0xFF)
            let packet = UnsafeMutableRawBufferPointer(rebasing: datagram[offset...])
            guard (try? key.seal(packet, payloadStart: payloadStart - offset, payloadEnd: w.offset - offset, packetNumber: space.nextPN)) != nil
            else { continue }
            protectHeader(packet, pnOffset: pnOffset - offset, pnLength: 4, key: key, long: true)
            space.nextPN += 1
            if type == .initial { initialSpace.nextPN = space.nextPN } else { handshakeSpace.nextPN = space.nextPN }
            offset = w.offset + 16
        }
        return offset
    }
}
