import Foundation
import ImpairmentKit

/// What the soak measured, against issue 42's targets: joins 100 %, no audio lost beyond the
/// emulated loss, memory flat within 10 %, no crash; stalls over 20 ms counted.
struct SoakFigures {
    let crew: SoakCrew.State
    let audioReceived: Int
    let members: Int
    let before: [String: Double]
    let after: [String: Double]
    let downstream: ImpairmentCounters
    let memory: [(seconds: Double, kilobytes: Double)]
    let survived: Bool
    let log: String
    let attack: [String: Int]

    func delta(_ name: String) -> Double { (after[name] ?? 0) - (before[name] ?? 0) }

    var joinsAttempted: Int { crew.joinsSucceeded + crew.joinsFailed.count }
    /// Audio the server sent to members, live and replayed to those who joined during a burst.
    var audioSent: Double { delta("squelch_packets_out_total") + delta("squelch_catchup_packets_out_total") }
    /// The share of server-to-member datagrams the proxies dropped on purpose (all kinds alike:
    /// the drop is decided per datagram, blind to what it carries).
    var emulatedLoss: Double { downstream.received > 0 ? Double(downstream.dropped) / Double(downstream.received) : 0 }
    /// Frames that did not arrive beyond the emulated share, and three standard deviations of that
    /// share (a binomial count): within ±3σ is no loss of the server's making.
    var lostBeyond: Double { audioSent - Double(audioReceived) - audioSent * emulatedLoss }
    var threeSigma: Double { 3 * (audioSent * emulatedLoss * (1 - emulatedLoss)).squareRoot() }
    /// RSS once warm (the first sample a tenth of the way in) and at the end.
    var memoryStart: Double {
        let warm = (memory.last?.seconds ?? 0) / 10
        return memory.first { $0.seconds >= warm }?.kilobytes ?? .nan
    }
    var memoryEnd: Double { memory.last?.kilobytes ?? .nan }
    var memoryChange: Double { (memoryEnd - memoryStart) / memoryStart }
    var stalls: Double { delta("squelch_event_loop_stalls_total") }
    /// How long the relay loop's ticks ran (`squelch_event_loop_tick_seconds`).
    var ticks: Histogram { Histogram(metrics: after, minus: before, name: "squelch_event_loop_tick_seconds") }
    /// The largest tick bucket that anything fell into (its upper bound).
    var worstTick: Double {
        var previous = 0.0, worst = 0.0
        for bucket in ticks.buckets {
            if bucket.count > previous { worst = bucket.le }
            previous = bucket.count
        }
        return worst
    }
    var crashes: Int { (survived ? 0 : 1) + log.components(separatedBy: "Fatal error").count - 1 }
    var amplification: Double {
        Double(attack["reflector_bytes_received", default: 0]) / Double(max(1, attack["reflector_bytes_sent", default: 0]))
    }

    var report: String {
        let worst = worstTick.isInfinite ? "over 1 s" : "≤ \(fixed(worstTick * 1e3, 0)) ms"
        var lines = [
            "joins by real members: \(crew.joinsSucceeded) of \(joinsAttempted) (\(fixed(100 * Double(crew.joinsSucceeded) / Double(max(1, joinsAttempted)), 2)) %)",
            "audio to members: \(Int(audioSent)) sent, \(audioReceived) received; emulated loss \(fixed(emulatedLoss * 100, 2)) %; lost beyond it \(Int(lostBeyond.rounded())) (±\(Int(threeSigma.rounded())) at 3σ)",
            "turns: \(crew.turnsGranted) granted, \(crew.turnsNotGranted) not granted in 3 s; \(crew.framesSent) frames sent by talkers",
            "server RSS: \(fixed(memoryStart / 1024, 1)) MiB warm, \(fixed(memoryEnd / 1024, 1)) MiB at the end (\(fixed(memoryChange * 100, 1)) %)",
            "relay loop: \(Int(stalls)) ticks of 20 ms or more; tick p99 \(fixed(ticks.quantile(0.99) * 1e3, 2)) ms, longest \(worst)",
            "crashes: \(crashes)",
            "attack: \(attack.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))",
            "reflector: \(fixed(amplification, 2))x the bytes it sent came back",
            "server's defences: \(Int(delta("squelch_transport_evicted_total"))) unjoined connections evicted, "
                + "\(Int(delta("squelch_handshakes_total{outcome=\"rate_limited\"}"))) handshakes over the rate dropped, "
                + "\(Int(delta("squelch_transport_datagrams_dropped_total{reason=\"unroutable\"}"))) unroutable datagrams, "
                + "\(Int(delta("squelch_floor_requests_limited_total"))) floor requests over the allowance, "
                + "\(Int(delta("squelch_control_rate_limited_total"))) control messages over the rate",
        ]
        if !crew.joinsFailed.isEmpty { lines.append("failed joins (first 5): " + crew.joinsFailed.prefix(5).joined(separator: "; ")) }
        return lines.map { "soak: " + $0 }.joined(separator: "\n")
    }

    func record(channels: Int, perChannel: Int, loss: Double, minutes: Double) -> [String: Any] {
        [
            "channels": channels, "members": members, "loss_percent": loss, "minutes": minutes,
            "joins_succeeded": crew.joinsSucceeded, "joins_attempted": joinsAttempted,
            "audio_sent": audioSent, "audio_received": audioReceived, "emulated_loss_percent": emulatedLoss * 100,
            "lost_beyond_emulated": lostBeyond, "lost_three_sigma": threeSigma,
            "turns_granted": crew.turnsGranted, "turns_not_granted": crew.turnsNotGranted,
            "rss_start_mib": memoryStart / 1024, "rss_end_mib": memoryEnd / 1024, "rss_change_percent": memoryChange * 100,
            "stalls_over_20ms": stalls, "tick_p99_ms": ticks.quantile(0.99) * 1e3,
            "longest_tick_ms": worstTick.isInfinite ? -1 : worstTick * 1e3, "crashes": crashes,
            "reflector_amplification": amplification, "attack": attack,
            "evicted": delta("squelch_transport_evicted_total"),
            "handshakes_rate_limited": delta("squelch_handshakes_total{outcome=\"rate_limited\"}"),
            "floor_requests_limited": delta("squelch_floor_requests_limited_total"),
        ]
    }
}
