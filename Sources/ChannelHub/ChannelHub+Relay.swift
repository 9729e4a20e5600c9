import ChannelProtocol
import ChannelStore
import FloorControl
import Foundation
import SFrame
import Wire

extension ChannelHub {
    /// One audio datagram from `link`. If its sender holds the floor, it is recorded for late joiners
    /// and forwarded to every listening member but the sender, through `send` (which seals and queues
    /// it for one listener, and returns false if it couldn't). Anything else is dropped and counted.
    /// Returns how many listeners it went to.
    @discardableResult
    public func receiveAudio(from link: Link, datagram: UnsafeRawBufferPointer, at now: WireInstant,
                             send: (UnsafeRawBufferPointer, Link) -> Bool) -> Int {
        counters.packetsIn &+= 1
        counters.bytesIn &+= datagram.count
        guard let header = AudioHeader(parsing: datagram) else { drop(.malformed); return 0 }
        guard case .joined(let channel, let slot)? = sessions[link] else { drop(.notJoined); return 0 }
        guard channel.isServed(at: now) else { drop(.notHome); return 0 }
        guard let burst = channel.floor.burst(of: slot) else { drop(.notFloorHolder); return 0 }
        guard UInt16(truncatingIfNeeded: burst) == header.burst else { drop(.staleBurst); return 0 }
        channel.floor.heard(slot, now: now.nanoseconds)

        let payloadCount = datagram.count - AudioHeader.size
        let payload = UnsafeRawBufferPointer(rebasing: datagram[AudioHeader.size...])
        // Every burst has a recording from its grant to its end; without one nothing polices the
        // sender, so nothing is relayed either.
        guard let recording = channel.recording(of: slot) else { drop(.notFloorHolder); return 0 }
        // The payload is the talker's sealed frame; the relay can't and needn't open it, but only
        // frames under a key of this burst are ones the server can hand late joiners the key for.
        guard let (frame, frameHeaderSize) = SFrameHeader.parse(payload), payloadCount >= frameHeaderSize + SFrameKey.tagLength,
              recording.hasKey(frame.keyID) else { drop(.unknownKey); return 0 }
        guard recording.pace.take(at: now, perSecond: configuration.audioPacketsPerSecond,
                                  burst: configuration.audioPacketBurst) else { drop(.overRate); return 0 }
        recording.append(header, payload: payload, maxPackets: configuration.maxRecordedPackets,
                         maxBytes: configuration.maxRecordedBytes)
        AudioHeader(flags: header.flags.intersection(.endOfBurst), slot: slot, burst: header.burst, sequence: header.sequence)
            .write(to: scratch)
        UnsafeMutableRawBufferPointer(rebasing: scratch[AudioHeader.size ..< AudioHeader.size + payloadCount]).copyMemory(from: payload)
        let packet = UnsafeRawBufferPointer(rebasing: scratch[..<(AudioHeader.size + payloadCount)])
        var forwarded = 0
        for listener in channel.listeners where listener.slot != slot && (listener.unheard.isEmpty || !listener.unheard.contains(slot)) {
            if send(packet, listener.link) {
                forwarded &+= 1
            } else {
                drop(.sendFailed)
            }
        }
        counters.packetsOut &+= forwarded
        counters.bytesOut &+= forwarded &* packet.count
        // Whom to wake is decided after the copies are out (`wakeOwedListeners`): it walks every member of
        // the channel, and the first packet's listeners needn't wait for 10,000 sleepers to be looked at.
        if recording.wakeOwed != nil { owedWakes.append((channel, slot, recording)) }
        return forwarded
    }

    /// Decides the wakes owed by bursts whose first audio `receiveAudio` relayed: the driver calls it
    /// once that audio's copies have left. Outputs `burstStarted`.
    public func wakeOwedListeners(at now: WireInstant) {
        let owed = owedWakes
        owedWakes.removeAll(keepingCapacity: true)
        for (channel, slot, recording) in owed {
            guard let taken = recording.wakeOwed else { continue }
            wakeListeners(channel, talker: slot, recording: recording, taken: taken, at: now)
        }
    }

    func drop(_ reason: DropReason) { counters.drops[reason.rawValue] &+= 1 }
}
