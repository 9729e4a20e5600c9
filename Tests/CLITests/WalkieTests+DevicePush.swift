import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

extension WalkieTests {
    /// Two hosts: a network namespace made for the test, joined to this one by a veth pair, so that
    /// the walkie inside reaches squelchd only across a real (virtual) link, at a non-loopback address.
    /// Where namespaces can't be made (not root), the machine's own non-loopback address stands in.
    final class TwoHosts {
        let namespace: String?
        /// The server's address, as the other host reaches it.
        let serverAddress: String
        private let link: String?

        init() throws {
            let octet = Int.random(in: 1...250)
            let namespace = "sqdp\(octet)", outer = "sqa\(octet)", inner = "sqb\(octet)"
            let server = "10.251.\(octet).1", device = "10.251.\(octet).2"
            let setUp = [
                "ip netns add \(namespace)",
                "ip link add \(outer) type veth peer name \(inner)",
                "ip link set \(inner) netns \(namespace)",
                "ip addr add \(server)/30 dev \(outer)",
                "ip link set \(outer) up",
                "ip netns exec \(namespace) ip addr add \(device)/30 dev \(inner)",
                "ip netns exec \(namespace) ip link set \(inner) up",
                "ip netns exec \(namespace) ip link set lo up",
            ].joined(separator: " && ")
            if (try? Executables.runShell("(\(setUp)) >/dev/null 2>&1 && echo made"))?.contains("made") == true {
                self.namespace = namespace
                self.link = outer
                serverAddress = server
            } else {
                _ = try? Executables.runShell("ip netns del \(namespace) 2>/dev/null; ip link del \(outer) 2>/dev/null")
                let addresses = try Executables.runShell("hostname -I").split(separator: " ").map(String.init)
                let address = try #require(addresses.first { $0.contains(".") && !$0.hasPrefix("127.") },
                                           "no network namespace (ip netns needs root) and no non-loopback address to stand in")
                self.namespace = nil
                self.link = nil
                serverAddress = address.trimmingCharacters(in: .whitespacesAndNewlines)
            }
        }

        /// `command` run on the other host.
        func onDevice(_ command: [String]) -> [String] {
            guard let namespace else { return command }
            return ["ip", "netns", "exec", namespace] + command
        }

        func tearDown() {
            if let namespace { _ = try? Executables.runShell("ip netns del \(namespace) 2>/dev/null") }
            if let link { _ = try? Executables.runShell("ip link del \(link) 2>/dev/null") }
        }
    }

    /// Issue 43's field set-up: a walkie on another host, asleep, is woken by a burst through
    /// squelchd's device push service, while the same burst's push for an iPhone's token goes to APNs
    /// (the embedded simulator) as the exact pushtotalk request.
    @Test func aWalkieOnAnotherHostIsWokenBesideAnIPhone() async throws {
        let hosts = try TwoHosts()
        defer { hosts.tearDown() }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("walkie-hosts-\(UUID())").path
        let certs = dir + "/certs", data = dir + "/data"
        let reaper = KillRestartTests.Reaper()
        defer {
            reaper.killAll()
            try? FileManager.default.removeItem(atPath: dir)
        }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try Executables.makeDevCertificates(into: certs, names: [hosts.serverAddress])
        let created = try Executables.run("squelchd", ["channel", "create", "--name", "Field", "--data-dir", data])
        let channel = try #require(UUID(uuidString: created.out.trimmingCharacters(in: .whitespacesAndNewlines)))
        var tokens: [String: String] = [:]
        for (user, name) in [("ann", "Ann"), ("bob", "Bob"), ("cat", "Cat")] {
            tokens[user] = try Executables.run("squelchd", ["token", "issue", "--channel", channel.uuidString, "--user", user, "--name", name,
                                                           "--data-dir", data]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        }

        let server = Process()
        server.executableURL = Executables.url("squelchd")
        server.arguments = ["serve", "--data-dir", data, "--host", "0.0.0.0", "--port", "0", "--admin-port", "0",
                            "--cert", certs + "/server-chain.pem", "--key", certs + "/server.key"] + Executables.simulatorArguments(certs: certs)
        server.standardOutput = FileHandle.nullDevice
        let err = Pipe()
        server.standardError = err
        let log = PipeCollector(err)
        try server.run()
        reaper.processes.append(server)
        // On every address: the walkie reaches it across the link, the iPhone stand-in (whose
        // simulator is on 127.0.0.1, as the walkie looks for it at the server's address) on loopback.
        let address = #"0\.0\.0\.0"#
        let voice = await log.wait(for: address + #":\d+[^\n]*voice transport listening"#, seconds: 20)
        let devicePush = await log.wait(for: "device push service listening on https://" + address + #":\d+"#, seconds: 20)
        let control = await log.wait(for: #"control=http://127\.0\.0\.1:\d+"#, seconds: 20)
        func port(after prefix: String, in line: String?) -> Int? {
            guard let line, let range = line.range(of: prefix + #":\d+"#, options: .regularExpression) else { return nil }
            return line[range].split(separator: ":").last.flatMap { Int($0) }
        }
        let voicePort = try #require(port(after: address, in: voice), "\(log.contents)")
        #expect(port(after: address, in: devicePush) == voicePort, "the device push service is on the voice port's number: \(log.contents)")
        let controlPort = try #require(control.flatMap { KillRestartTests.firstPort(in: $0) })
        let speech = dir + "/speech.wav"
        try World.writeSpeech(seconds: 3, to: speech)
        func join(_ user: String, at host: String) -> [String] {
            [Executables.url("walkie").path, "join", "--server", "\(host):\(voicePort)", "--token", tokens[user]!,
             "--ca", certs + "/ca.pem", "--state-dir", dir + "/state-\(user)", "--input-file", speech,
             "--output-file", dir + "/\(user)-heard.wav", "--suspend-after", "2"]
        }

        let tmux = Tmux()
        defer { tmux.stop() }
        // Bob's walkie, on the other host, takes its pushes from squelchd (the default, --push device).
        try tmux.start("bob", hosts.onDevice(join("bob", at: hosts.serverAddress)))
        // Cat's stands in for an iPhone: its token is an APNs one, delivered through the simulator.
        try tmux.start("cat", join("cat", at: "127.0.0.1") + ["--push", "simulator", "--push-port", "\(controlPort)"])
        for user in ["bob", "cat"] {
            #expect(try await tmux.wait(user, for: "\(user.capitalized) (you)"), "\(tmux.screen(user))")
            #expect(try await tmux.wait(user, for: "BACKGROUND"), "asleep, with a push channel to wake it: \(tmux.screen(user))")
        }

        let talk = try Running(["talk", "--server", "\(hosts.serverAddress):\(voicePort)", "--token", tokens["ann"]!, "--ca", certs + "/ca.pem",
                                "--file", speech, "--push", "off"], reaper: reaper)
        #expect(await talk.out.wait(for: "sending", seconds: 20) != nil, "\(talk.err.contents)")
        #expect(try await tmux.wait("bob", for: "RECEIVING"), "the walkie on the other host was woken and hears Ann: \(tmux.screen("bob"))")
        #expect(try await tmux.wait("cat", for: "RECEIVING"), "the iPhone stand-in was woken through APNs: \(tmux.screen("cat"))")
        #expect(await talk.process.waitForExit(seconds: 20) && talk.process.terminationStatus == 0, "\(talk.err.contents)")

        // The simulator got exactly one push, Cat's, as Apple's pushtotalk request: Bob's went to his
        // walkie, not to APNs.
        let (body, _) = try await URLSession.shared.data(from: try #require(URL(string: "http://127.0.0.1:\(controlPort)/v1/pushes")))
        let pushes = (try JSONSerialization.jsonObject(with: body) as? [String: Any])?["pushes"] as? [[String: Any]] ?? []
        #expect(pushes.count == 1, "\(String(decoding: body, as: UTF8.self))")
        let push = try #require(pushes.first)
        let pushType = push["pushType"] as? String, topic = push["topic"] as? String
        let priority = push["priority"] as? Int, expiration = push["expiration"] as? Int
        #expect(pushType == "pushtotalk" && topic == "org.squelch.walkie.voip-ptt", "\(push)")
        #expect(priority == 10 && expiration == 0, "\(push)")
        let payload = try JSONSerialization.jsonObject(with: Data((push["body"] as? String ?? "").utf8)) as? [String: Any]
        #expect(payload?["activeSpeaker"] as? String == "Ann", "\(push)")
        // What Bob's walkie heard is Ann's speech, not silence.
        let heard = try Self.envelope(dir + "/bob-heard.wav")
        #expect(heard.contains { $0 > 0.01 }, "Bob's speaker file holds speech")
    }
}
