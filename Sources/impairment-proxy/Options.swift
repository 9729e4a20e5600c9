import Foundation
import ImpairmentKit

/// The command line, parsed by hand so the tool needs nothing beyond Foundation and the proxy itself.
struct Options: Equatable {
    var listenHost = "127.0.0.1"
    var listenPort = 0
    var upstreamHost = ""
    var upstreamPort = 0
    var bindHost = "127.0.0.1"
    var clientToServer = Impairment()
    var serverToClient = Impairment()
    var help = false

    struct ParseError: Error, CustomStringConvertible {
        var description: String
    }

    static let usage = """
        usage: impairment-proxy --upstream HOST:PORT [--listen [HOST:]PORT] [impairment options]

        Relays UDP between clients and one server, impairing both directions deterministically from a seed.
        Prints "listening HOST:PORT" once bound. SIGUSR1 rebinds every client's upstream socket (NAT rebinding),
        SIGUSR2 prints the counters, SIGINT/SIGTERM stop it and print the counters.

          --listen [HOST:]PORT   where clients send (default 127.0.0.1:0, 0 = any free port)
          --upstream HOST:PORT   the server (required)
          --bind HOST            local address of the per-client upstream sockets (default 127.0.0.1)

        Impairment, applied to both directions; prefix with --up- (client→server) or --down- (server→client)
        to set one direction only, e.g. --loss 5 --down-loss 20:
          --loss PERCENT         independent loss (good-state loss with burst loss)
          --burst-enter P        Gilbert-Elliott: probability 0...1 of entering the bad state per datagram
          --burst-stay P         Gilbert-Elliott: probability 0...1 of staying in it (mean burst 1/(1-P))
          --burst-bad-loss P     Gilbert-Elliott: loss probability in the bad state (default 1)
          --delay MS             fixed one-way delay (a floor)
          --jitter MS            extra random delay in [0, MS]
          --jitter-dist uniform|normal
          --reorder PERCENT      datagrams held back so later ones overtake them
          --reorder-delay MS     how long they are held back (default 40)
          --duplicate PERCENT    datagrams sent twice
          --unordered            let jitter reorder too (independent per-datagram jitter, like netem)
          --seed N               seed (default 0); the two directions draw independent streams from it
        """

    /// Parses the arguments after the program name.
    static func parse(_ arguments: [String]) throws -> Options {
        var options = Options()
        var burst: [Direction: (enter: Double?, stay: Double?, badLoss: Double?)] = [
            .clientToServer: (nil, nil, nil), .serverToClient: (nil, nil, nil),
        ]
        var index = 0

        func value(for flag: String) throws -> String {
            index += 1
            guard index < arguments.count else { throw ParseError(description: "\(flag) needs a value") }
            return arguments[index]
        }
        func number(_ text: String, _ flag: String) throws -> Double {
            guard let number = Double(text), number.isFinite else {
                throw ParseError(description: "\(flag): '\(text)' is not a number")
            }
            return number
        }

        while index < arguments.count {
            let argument = arguments[index]
            // Accept --flag=value as well as --flag value.
            var flag = argument
            var inline: String?
            if let equals = argument.firstIndex(of: "="), argument.hasPrefix("--") {
                flag = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            }
            func next() throws -> String {
                if let inline { return inline }
                return try value(for: flag)
            }

            switch flag {
            case "-h", "--help":
                options.help = true
            case "--listen":
                let text = try next()
                if let port = Int(text) {
                    options.listenPort = port
                } else {
                    (options.listenHost, options.listenPort) = try hostPort(text, flag)
                }
            case "--upstream":
                (options.upstreamHost, options.upstreamPort) = try hostPort(try next(), flag)
            case "--bind":
                options.bindHost = try next()
            default:
                guard flag.hasPrefix("--") else { throw ParseError(description: "unexpected argument '\(argument)'") }
                var key = String(flag.dropFirst(2))
                var directions = Direction.allCases
                if key.hasPrefix("up-") {
                    directions = [.clientToServer]
                    key.removeFirst(3)
                } else if key.hasPrefix("down-") {
                    directions = [.serverToClient]
                    key.removeFirst(5)
                }
                if key == "unordered" {
                    for direction in directions { options[direction].preservesOrder = false }
                    break
                }
                let text = try next()
                for direction in directions {
                    switch key {
                    case "loss": options[direction].lossPercent = try number(text, flag)
                    case "delay": options[direction].delayMilliseconds = try number(text, flag)
                    case "jitter": options[direction].jitterMilliseconds = try number(text, flag)
                    case "reorder": options[direction].reorderPercent = try number(text, flag)
                    case "reorder-delay": options[direction].reorderDelayMilliseconds = try number(text, flag)
                    case "duplicate": options[direction].duplicatePercent = try number(text, flag)
                    case "burst-enter": burst[direction]?.enter = try number(text, flag)
                    case "burst-stay": burst[direction]?.stay = try number(text, flag)
                    case "burst-bad-loss": burst[direction]?.badLoss = try number(text, flag)
                    case "jitter-dist":
                        guard let shape = JitterDistribution(rawValue: text) else {
                            throw ParseError(description: "\(flag): expected uniform or normal, got '\(text)'")
                        }
                        options[direction].jitterDistribution = shape
                    case "seed":
                        guard let seed = UInt64(text) else {
                            throw ParseError(description: "\(flag): '\(text)' is not an unsigned 64-bit integer")
                        }
                        options[direction].seed = seed
                    default:
                        throw ParseError(description: "unknown option '\(flag)'")
                    }
                }
            }
            index += 1
        }

        for (direction, parts) in burst where parts.enter != nil || parts.stay != nil || parts.badLoss != nil {
            guard let enter = parts.enter, let stay = parts.stay else {
                throw ParseError(description: "burst loss needs both --burst-enter and --burst-stay")
            }
            options[direction].burstLoss = BurstLoss(
                enterProbability: enter, stayProbability: stay, lossProbabilityInBadState: parts.badLoss ?? 1)
        }
        if !options.help && options.upstreamHost.isEmpty {
            throw ParseError(description: "--upstream HOST:PORT is required")
        }
        return options
    }

    subscript(direction: Direction) -> Impairment {
        get { direction == .clientToServer ? clientToServer : serverToClient }
        set {
            if direction == .clientToServer { clientToServer = newValue } else { serverToClient = newValue }
        }
    }

    /// Splits `host:port`, `[v6]:port` or `v6::addr:port` (the last colon separates the port).
    static func hostPort(_ text: String, _ flag: String) throws -> (String, Int) {
        var host: Substring
        var port: Substring
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            host = text[text.index(after: text.startIndex)..<close]
            port = text[close...].dropFirst()
            guard port.first == ":" else { throw ParseError(description: "\(flag): expected [HOST]:PORT") }
            port = port.dropFirst()
        } else if let colon = text.lastIndex(of: ":") {
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        } else {
            throw ParseError(description: "\(flag): expected HOST:PORT, got '\(text)'")
        }
        guard !host.isEmpty, let number = Int(port), (0...65_535).contains(number) else {
            throw ParseError(description: "\(flag): expected HOST:PORT, got '\(text)'")
        }
        return (String(host), number)
    }
}
