import NIOCore
import Wire

// The relay's fan-out of talker packets: sent from the server's loop, or spread to the relay's
// other loops once it is behind (`FanoutWorkers`, decision 0048).

extension WireServer {
    /// The relay's fan-out of one talker packet: `withDatagramSender(sendingAtOnce: true, enveloped:
    /// true)`, except that with fan-out workers, once this loop is behind, the copies of some
    /// talkers' packets are counted and addressed here but written and sent by a worker
    /// (`FanoutWorkers`). `handedOver` says so; the worker reports when they are sent. Event loop only.
    ///
    /// Behind means: `spreadAfter` talker packets were relayed in this read cycle already. A loop
    /// that keeps up reads one or a few at a time and sends every copy itself, since handing over
    /// costs a wake-up on the worker's thread (up to milliseconds on a busy machine: measured in
    /// docs/benchmarks.md); a loop that reads many at once has more than it can send promptly, and
    /// spreads the rest by talker (each talker's packets keep to one thread, so they leave in order).
    public func withRelaySender<Result>(talker: Endpoint.Handle, started: WireInstant,
                                        _ body: ((UnsafeRawBufferPointer, Endpoint.Handle) -> Bool) -> Result) -> (result: Result, handedOver: Bool) {
        let core = core.value
        let behind = core.relayedThisCycle >= Self.spreadAfter
        core.relayedThisCycle += 1
        if behind, let fanout = core.fanout, core.state == .running, core.output.context != nil {
            let index = Int(talker.index) % (fanout.count + 1)
            if index > 0 { return (core.withJob(for: fanout.workers[index - 1], started: started, body), true) }
        }
        return (withDatagramSender(sendingAtOnce: true, enveloped: true, body), false)
    }

    /// Talker packets a read cycle relays from the server's loop before it spreads the rest.
    public static let spreadAfter = 4
}

extension ServerCore {
    /// Fills a job for `worker` with what `body` sends, and hands it over.
    func withJob<Result>(for worker: FanoutWorker, started: WireInstant,
                         _ body: ((UnsafeRawBufferPointer, Endpoint.Handle) -> Bool) -> Result) -> Result {
        let job = worker.takeJob()
        job.started = started
        let now = WireNIO.now()
        let result = body { payload, handle in self.queueEnvelope(payload, to: handle, in: job, now: now) }
        if job.destinations.isEmpty {
            worker.free.withLockedValue { $0.append(job) }
        } else {
            worker.submit(job)
        }
        return result
    }

    /// One listener's copy for a worker: counted as sent and addressed here, written there.
    func queueEnvelope(_ media: UnsafeRawBufferPointer, to handle: Endpoint.Handle, in job: FanoutJob, now: WireInstant) -> Bool {
        guard let (transmit, destination) = endpoint.envelope(to: handle, mediaCount: media.count, now: now) else { return false }
        var sockaddr = FanoutSockaddr()
        guard let length = withUnsafeMutableBytes(of: &sockaddr.bytes, { output.addresses.writeSockaddr(for: transmit.address, into: $0.baseAddress!) })
        else {
            stats.refusedDestinations += 1
            return false
        }
        sockaddr.length = length
        if job.media.isEmpty { job.media.append(contentsOf: media) }
        job.destinations.append(destination)
        job.paths.append(transmit.address)
        job.sockaddrs.append(sockaddr)
        stats.datagramsSent += 1
        return true
    }
}
