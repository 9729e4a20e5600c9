import NIOCore
import NIOPosix
import Testing

@testable import ImpairmentKit

/// An echo server, a proxy in front of it and one client, all on real 127.0.0.1 sockets.
private struct Rig {
    let echo: UDPPeer
    let proxy: ImpairmentProxy
    let proxyAddress: SocketAddress
    let client: UDPPeer

    static func make(clientToServer: Impairment = .none, serverToClient: Impairment = .none) async throws -> Rig {
        let echo = try await UDPPeer.bind(echo: true)
        let proxy = ImpairmentProxy(
            upstream: try SocketAddress(ipAddress: "127.0.0.1", port: echo.port),
            clientToServer: clientToServer, serverToClient: serverToClient)
        let port = try await proxy.start()
        let client = try await UDPPeer.bind(echo: false)
        return Rig(
            echo: echo, proxy: proxy, proxyAddress: try SocketAddress(ipAddress: "127.0.0.1", port: port),
            client: client)
    }

    func shutdown() async {
        await proxy.stop()
        await client.close()
        await echo.close()
    }
}

// Serialized: these measure time and count datagrams on a small shared machine, so they should not compete with
// each other for the two cores. Timing is only ever asserted as a lower bound.
@Suite("ImpairmentProxy over real UDP", .serialized)
struct ImpairmentProxyTests {
    @Test("without impairment every datagram makes the round trip byte for byte")
    func transparentEcho() async throws {
        let rig = try await Rig.make()
        let sent = payloads(count: 120)
        // In windows, each waited for: the point is the proxy, not how many datagrams a slow (e.g. sanitized)
        // echo server lets the kernel drop when they arrive all at once.
        for window in stride(from: 0, to: sent.count, by: 10) {
            let end = min(window + 10, sent.count)
            for payload in sent[window..<end] { rig.client.send(payload, to: rig.proxyAddress) }
            await rig.client.waitFor(count: end)
        }
        let received = await rig.client.waitFor(count: sent.count)
        #expect(received.count == sent.count)
        let byIndex = Dictionary(received.map { (index(of: $0.bytes), $0.bytes) }, uniquingKeysWith: { a, _ in a })
        let mismatched = sent.indices.filter { byIndex[$0] != sent[$0] }
        #expect(mismatched.isEmpty, "datagrams \(mismatched) did not come back intact")
        #expect(received.allSatisfy { $0.from == rig.proxyAddress })
        // The server saw one proxy port, not the client's.
        #expect(Set(rig.echo.received.map(\.from)).count == 1)
        #expect(rig.echo.received.first?.from.port != rig.client.port)

        let stats = await rig.proxy.stats()
        #expect(stats.impairment.clientToServer.forwarded == 120 && stats.impairment.serverToClient.forwarded == 120)
        #expect(stats.clients == 1 && stats.openSockets == 2 && stats.undeliverable == 0)
        await rig.shutdown()
    }

    @Test("50 ms of delay each way makes every round trip take at least 100 ms")
    func delayedEcho() async throws {
        let delayed = Impairment(delayMilliseconds: 50, jitterMilliseconds: 10, seed: 1)
        let rig = try await Rig.make(clientToServer: delayed, serverToClient: delayed)
        var sentAt: [Int: UInt64] = [:]
        for (index, payload) in payloads(count: 10, sizes: [32]).enumerated() {
            sentAt[index] = NIODeadline.now().uptimeNanoseconds
            rig.client.send(payload, to: rig.proxyAddress)
            try await Task.sleep(for: .milliseconds(20))
        }
        let received = await rig.client.waitFor(count: 10)
        #expect(received.count == 10)
        for reply in received {
            let rtt = reply.at - sentAt[index(of: reply.bytes)]!
            #expect(rtt >= 100_000_000, "RTT \(Double(rtt) / 1e6) ms")
        }
        await rig.shutdown()
    }

    @Test("20 % loss each way loses about 36 % of round trips")
    func lossyEcho() async throws {
        let lossy = Impairment(lossPercent: 20, seed: 2024)
        let rig = try await Rig.make(clientToServer: lossy, serverToClient: lossy)
        let total = 1_000
        let sent = payloads(count: total, sizes: [48])
        // Sent in windows, each allowed to settle before the next, so that every datagram the proxy forwards
        // really arrives: the counts below must be the model's decisions, not kernel buffer overflows.
        for window in stride(from: 0, to: total, by: 20) {
            for payload in sent[window..<window + 20] { rig.client.send(payload, to: rig.proxyAddress) }
            let settled = await waitUntil(timeout: .seconds(10)) {
                let stats = await rig.proxy.stats().impairment
                return stats.clientToServer.received == UInt64(window + 20)
                    && stats.serverToClient.received == stats.clientToServer.forwarded
                    && UInt64(rig.client.received.count) == stats.serverToClient.forwarded
            }
            try #require(settled, "window at \(window) did not settle")
        }
        let stats = await rig.proxy.stats().impairment
        let returned = rig.client.received.count
        let lost = Double(total - returned) / Double(total)
        #expect(lost > 0.30 && lost < 0.42, "lost \(lost * 100) % of round trips")
        #expect(UInt64(returned) == stats.serverToClient.forwarded)
        #expect(rig.echo.received.count == Int(stats.clientToServer.forwarded))
        await rig.shutdown()
    }

    @Test("rebind: the server sees a new source port while the client keeps the same proxy port")
    func rebinding() async throws {
        let rig = try await Rig.make()
        rig.client.send(Array("before".utf8), to: rig.proxyAddress)
        await rig.client.waitFor(count: 1)
        let mappings = await rig.proxy.clients()
        #expect(mappings.count == 1)
        let mapping = try #require(mappings.first)
        #expect(mapping.client.port == rig.client.port)
        let firstPort = try #require(rig.echo.received.first?.from.port)
        #expect(mapping.upstreamPort == firstPort)

        let newPort = try await rig.proxy.rebind(client: mapping.client)
        #expect(newPort != firstPort)
        rig.client.send(Array("after".utf8), to: rig.proxyAddress)
        let replies = await rig.client.waitFor(count: 2)
        #expect(replies.map { String(decoding: $0.bytes, as: UTF8.self) } == ["before", "after"])
        #expect(replies.allSatisfy { $0.from == rig.proxyAddress })
        #expect(rig.echo.received.map(\.from.port) == [firstPort, newPort])
        #expect(await rig.proxy.clients().first?.upstreamPort == newPort)

        // The old upstream socket is gone: only the listener and the new socket remain.
        let stats = await rig.proxy.stats()
        #expect(stats.rebinds == 1 && stats.openSockets == 2 && stats.clientsSeen == 1)
        await rig.shutdown()
    }

    @Test("rebindAll moves every client; unknown clients are an error")
    func rebindingAll() async throws {
        let rig = try await Rig.make()
        let second = try await UDPPeer.bind(echo: false)
        rig.client.send([1], to: rig.proxyAddress)
        second.send([2], to: rig.proxyAddress)
        await rig.client.waitFor(count: 1)
        await second.waitFor(count: 1)
        let before = Set(rig.echo.received.map(\.from.port))
        #expect(before.count == 2)

        #expect(await rig.proxy.rebindAll() == 2)
        rig.client.send([3], to: rig.proxyAddress)
        second.send([4], to: rig.proxyAddress)
        await rig.client.waitFor(count: 2)
        await second.waitFor(count: 2)
        let after = Set(rig.echo.received.suffix(2).map(\.from.port))
        #expect(after.count == 2 && after.isDisjoint(with: before))
        #expect(second.received.map(\.bytes) == [[2], [4]])

        let stranger = try SocketAddress(ipAddress: "127.0.0.1", port: 9)
        await #expect(throws: ImpairmentProxyError.unknownClient(stranger)) {
            try await rig.proxy.rebind(client: stranger)
        }
        await second.close()
        await rig.shutdown()
    }

    @Test("a blackhole drops everything for its duration, then traffic flows again")
    func blackhole() async throws {
        let rig = try await Rig.make()
        rig.client.send([0], to: rig.proxyAddress)
        await rig.client.waitFor(count: 1)

        let clock = ContinuousClock()
        let outageStart = clock.now
        await rig.proxy.blackhole(for: .milliseconds(800))
        for byte in 1...10 as ClosedRange<UInt8> { rig.client.send([byte], to: rig.proxyAddress) }
        try await Task.sleep(for: .milliseconds(300))
        #expect(rig.client.received.count == 1)
        #expect(rig.echo.received.count == 1)
        let during = await rig.proxy.stats().impairment.clientToServer
        #expect(during.blackholed == 10 && during.dropped == 10)

        // Well past the window (its end is measured from before the call, so this errs on the late side).
        try await Task.sleep(until: outageStart + .milliseconds(1_000))
        for byte in 11...20 as ClosedRange<UInt8> { rig.client.send([byte], to: rig.proxyAddress) }
        let received = await rig.client.waitFor(count: 11)
        #expect(received.map(\.bytes) == [[0]] + (11...20).map { [UInt8($0)] })
        await rig.shutdown()
    }

    @Test("setImpairment applies at run time")
    func runtimeImpairment() async throws {
        let rig = try await Rig.make()
        await rig.proxy.setImpairment(Impairment(lossPercent: 100), direction: .clientToServer)
        #expect(await rig.proxy.impairment(for: .clientToServer).lossPercent == 100)
        for byte in 0..<5 as Range<UInt8> { rig.client.send([byte], to: rig.proxyAddress) }
        try await Task.sleep(for: .milliseconds(200))
        #expect(rig.echo.received.isEmpty)

        await rig.proxy.setImpairment(Impairment(duplicatePercent: 100), direction: .clientToServer)
        rig.client.send([9], to: rig.proxyAddress)
        let echoed = await rig.echo.waitFor(count: 2)
        #expect(echoed.map(\.bytes) == [[9], [9]])
        #expect(await rig.client.waitFor(count: 2).count == 2)
        let stats = await rig.proxy.stats().impairment.clientToServer
        #expect(stats.dropped == 5 && stats.duplicated == 1)
        await rig.shutdown()
    }

    @Test("stop() closes every socket")
    func stopClosesSockets() async throws {
        let rig = try await Rig.make(clientToServer: Impairment(delayMilliseconds: 2_000))
        rig.client.send([1], to: rig.proxyAddress)
        let mapped = await waitUntil(timeout: .seconds(5)) {
            await rig.proxy.clients().first?.upstreamPort != nil
        }
        #expect(mapped)
        let upstreamPort = try #require(await rig.proxy.clients().first?.upstreamPort)
        #expect(await rig.proxy.stats().scheduled == 1)

        await rig.proxy.stop()
        let stats = await rig.proxy.stats()
        #expect(stats.openSockets == 0 && stats.clients == 0 && stats.scheduled == 0)

        // The delayed datagram was cancelled with its timer, and nothing answers on the old port.
        rig.client.send([2], to: rig.proxyAddress)
        try await Task.sleep(for: .milliseconds(700))
        #expect(rig.echo.received.isEmpty && rig.client.received.isEmpty)

        // The ports are free again: binding them without SO_REUSEADDR succeeds only if the proxy let go.
        let listenAgain = try await UDPPeer.bind(echo: false, port: rig.proxyAddress.port!)
        let upstreamAgain = try await UDPPeer.bind(echo: false, port: upstreamPort)
        await listenAgain.close()
        await upstreamAgain.close()

        await rig.proxy.stop()  // idempotent
        await #expect(throws: ImpairmentProxyError.alreadyStarted) { try await rig.proxy.start() }
        await rig.shutdown()
    }

    @Test("a proxy stopped before it starts, and a second start, are handled")
    func lifecycleMisuse() async throws {
        let echo = try await UDPPeer.bind(echo: true)
        let proxy = ImpairmentProxy(upstream: echo.address)
        await proxy.stop()
        await #expect(throws: ImpairmentProxyError.alreadyStarted) { try await proxy.start() }

        let running = ImpairmentProxy(upstream: echo.address)
        _ = try await running.start()
        await #expect(throws: ImpairmentProxyError.alreadyStarted) { try await running.start() }
        await #expect(throws: ImpairmentProxyError.unknownClient(echo.address)) {
            try await running.rebind(client: echo.address)
        }
        await running.stop()
        await echo.close()
    }
}
