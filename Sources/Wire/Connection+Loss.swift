// Acknowledgements and loss: what the peer's ACKs say was delivered, what is taken as lost, and the
// probe timeout (RFC 9002).
extension Connection {
    func processAck(_ ack: AckFrame, packet: UnsafeRawBufferPointer, now: WireInstant) {
        guard ack.largest < appNextPN else {
            protocolViolation("ACK of packet \(ack.largest), never sent", now: now)
            return
        }
        let floor = sent.oldest
        var newest: SentPacket?
        var anyNew = false
        for range in ack.ranges(in: packet) {
            guard range.upperBound >= floor else { break }
            guard let live = sent.clipped(range) else { continue }
            for pn in live {
                guard let acked = sent.take(pn) else { continue }
                anyNew = true
                onAcknowledged(acked)
                if pn == ack.largest { newest = acked }
            }
        }
        if ack.largest > largestAckedByPeer ?? 0 || largestAckedByPeer == nil { largestAckedByPeer = ack.largest }
        // The peer opened a packet under the current keys (audio, of which there is no record, counts).
        if ack.largest >= firstPNInSendPhase { sendPhaseAcknowledged = true }
        if let newest, newest.ackEliciting {
            // ACK Delay is µs >> 3 on the wire; a hostile peer can send up to 2⁶² − 1, so saturate.
            let micros = ack.delay.multipliedReportingOverflow(by: 8)
            let nanos = micros.partialValue.multipliedReportingOverflow(by: 1000)
            let delay = micros.overflow || nanos.overflow ? peerMaxAckDelay : min(nanos.partialValue, peerMaxAckDelay)
            rtt.update(sample: now.since(newest.time), ackDelay: handshakeConfirmed ? delay : 0)
        }
        if anyNew { ptoCount = 0 }
        detectLosses(now: now)
    }

    func onAcknowledged(_ packet: SentPacket) {
        if packet.retransmittable { retransmittableInFlight -= 1 }
        if packet.controlEnd > packet.controlStart { controlSend.markAcknowledged(packet.controlStart..<packet.controlEnd) }
    }

    /// Requeues what `packet` carried. `probe`: resent because the probe timer fired, not because it
    /// was declared lost, so it doesn't count as a loss.
    func onLost(_ packet: SentPacket, probe: Bool = false) {
        if !probe { count(.packetLost) }
        if packet.retransmittable { retransmittableInFlight -= 1 }
        if packet.controlEnd > packet.controlStart { controlSend.markLost(packet.controlStart..<packet.controlEnd) }
        if packet.handshakeDone { pendingHandshakeDone = true }
        if packet.newToken, role == .server, let secrets = serverSecrets {
            pendingNewToken = AddressToken.seal(address: path.address, original: nil, secrets: secrets, now: lastReceiveTime)
        }
        pendingNewIDs |= packet.newConnectionIDs
        pendingRetireIDs |= packet.retireConnectionIDs
    }

    /// RFC 9002 §6.1: lost if three newer packets were acknowledged, or sent more than 9/8 RTT before
    /// the newest acknowledged one.
    func detectLosses(now: WireInstant) {
        lossTime = nil
        guard let largest = largestAckedByPeer else { return }
        let delay = rtt.lossDelay
        guard largest > 0, let live = sent.clipped(0...(largest - 1)) else { return }
        for pn in live {
            if let packet = sent.peek(pn) {
                if largest - pn >= 3 || packet.time + delay <= now {
                    _ = sent.take(pn)
                    onLost(packet)
                } else {
                    let at = packet.time + delay
                    if lossTime.map({ at < $0 }) ?? true { lossTime = at }
                }
            }
        }
    }

    /// No acknowledgement in time: everything retransmittable in flight is sent again (RFC 9002 §6.2,
    /// simplified: the control stream is small, so resending all of it is cheaper than guessing).
    func probeTimeout(now: WireInstant) {
        count(.probeTimeout)
        ptoCount += 1
        var resent = false
        if let live = sent.clipped(0...UInt64.max) {
            for pn in live {
                if let packet = sent.peek(pn), packet.retransmittable {
                    _ = sent.take(pn)
                    onLost(packet, probe: true)
                    resent = true
                }
            }
        }
        if !resent { pendingPing = true }
        // Keep the timer running from now, so a lost probe is probed again (with backoff).
        lastRetransmittableSent = now
    }
}
