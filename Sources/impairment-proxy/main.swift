import Dispatch
import Foundation
import ImpairmentKit
import NIOCore

// Written straight to the file descriptor, unbuffered: a script waiting for "listening ..." on a pipe must see
// it at once, and C stdio's `stdout` global is not usable from Swift 6 code anyway.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func complain(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

func report(_ stats: ProxyStats) -> [String] {
    let directions: [(String, ImpairmentCounters)] = [
        ("c2s", stats.impairment.clientToServer), ("s2c", stats.impairment.serverToClient),
    ]
    var lines = directions.map { name, counters in
        "stats \(name) received=\(counters.received) forwarded=\(counters.forwarded) dropped=\(counters.dropped)"
            + " blackholed=\(counters.blackholed) duplicated=\(counters.duplicated)"
            + " reordered=\(counters.reordered) bytes-in=\(counters.bytesReceived)"
            + " bytes-out=\(counters.bytesForwarded)"
    }
    lines.append(
        "stats proxy clients=\(stats.clientsSeen) rebinds=\(stats.rebinds) undeliverable=\(stats.undeliverable)"
            + " scheduled=\(stats.scheduled)")
    return lines
}

let options: Options
do {
    options = try Options.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    complain("impairment-proxy: \(error)\n\n\(Options.usage)")
    exit(2)
}
if options.help {
    say(Options.usage)
    exit(0)
}

let upstream: SocketAddress
do {
    upstream = try SocketAddress.makeAddressResolvingHost(options.upstreamHost, port: options.upstreamPort)
} catch {
    complain("impairment-proxy: cannot resolve upstream \(options.upstreamHost):\(options.upstreamPort): \(error)")
    exit(2)
}

/// Signals become values in a stream so the handling runs as ordinary async code. The default dispositions are
/// turned off first; otherwise SIGINT would kill the process before the dispatch source saw it. This is a
/// nonisolated function on purpose: a handler closure formed in top-level code would be main-actor isolated, and
/// Swift 6 traps when the dispatch queue runs it off the main actor.
func installSignalSources(
    _ numbers: [Int32], into continuation: AsyncStream<Int32>.Continuation
) -> [any DispatchSourceSignal] {
    numbers.map { number in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { continuation.yield(number) }
        source.resume()
        return source
    }
}

let (signals, signalContinuation) = AsyncStream<Int32>.makeStream()
let signalSources = installSignalSources([SIGINT, SIGTERM, SIGUSR1, SIGUSR2], into: signalContinuation)

let proxy = ImpairmentProxy(
    listenHost: options.listenHost,
    listenPort: options.listenPort,
    upstream: upstream,
    upstreamBindHost: options.bindHost,
    clientToServer: options.clientToServer,
    serverToClient: options.serverToClient
)
let port: Int
do {
    port = try await proxy.start()
} catch {
    complain("impairment-proxy: cannot listen on \(options.listenHost):\(options.listenPort): \(error)")
    exit(1)
}
complain("c2s: \(options.clientToServer)")
complain("s2c: \(options.serverToClient)")
say("listening \(options.listenHost):\(port)")

signalLoop: for await number in signals {
    switch number {
    case SIGUSR1:
        let rebound = await proxy.rebindAll()
        say("rebound \(rebound) client(s)")
    case SIGUSR2:
        report(await proxy.stats()).forEach(say)
    default:
        break signalLoop
    }
}

await proxy.stop()
report(await proxy.stats()).forEach(say)
signalSources.forEach { $0.cancel() }
exit(0)
