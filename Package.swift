// swift-tools-version:6.1
import PackageDescription

// Module layout: see docs/architecture.md. Each folder under Sources/ is named for its one job.
let swift6: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "Squelch",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "squelchd", targets: ["squelchd"]),
        .executable(name: "walkie", targets: ["walkie"]),
        .executable(name: "squelch-bench", targets: ["squelch-bench"]),
        .library(name: "PTTClient", targets: ["PTTClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
    ],
    targets: [
        // C libraries from Debian, and the small C shims Swift needs for their variadic calls.
        .systemLibrary(name: "COpus", pkgConfig: "opus", providers: [.apt(["libopus-dev"])]),
        .systemLibrary(name: "CALSA", pkgConfig: "alsa", providers: [.apt(["libasound2-dev"])]),
        .target(name: "COpusShim", dependencies: ["COpus"]),
        .target(name: "CALSAShim", dependencies: ["CALSA"]),
        // libcrypto's EVP AEADs seal and open in place with a reusable context (docs/decisions/0003).
        .systemLibrary(name: "CLibCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .target(name: "CPacketCrypto", dependencies: ["CLibCrypto"]),
        // libnghttp2's sans-I/O session is the APNs client's HTTP/2 engine (docs/decisions/0049).
        .systemLibrary(name: "CNGHTTP2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        .target(name: "HTTP2Session", dependencies: ["CNGHTTP2"], swiftSettings: swift6),
        .target(name: "RandomUUID", swiftSettings: swift6),
        // sendmmsg(2) for the server's fan-out, without NIO's per-datagram buffers (docs/decisions/0006).
        .target(name: "CUDPBatch"),

        .target(name: "SquelchInfo", swiftSettings: swift6),
        // The one seeded generator (SplitMix64): simulations, fault plans, fuzzed inputs.
        .target(name: "SeededRandom", swiftSettings: swift6),
        .target(name: "KeyFiles", swiftSettings: swift6),
        .target(name: "Opus", dependencies: ["COpus", "COpusShim"], swiftSettings: swift6),
        .target(name: "Audio", dependencies: ["CALSA", "CALSAShim"], swiftSettings: swift6),
        .target(name: "Wire", dependencies: [
            "CPacketCrypto",
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "X509", package: "swift-certificates"),
            .product(name: "SwiftASN1", package: "swift-asn1"),
        ], swiftSettings: swift6),
        .target(name: "WireTesting", dependencies: [
            "Wire",
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "X509", package: "swift-certificates"),
            .product(name: "SwiftASN1", package: "swift-asn1"),
        ], swiftSettings: swift6),
        .target(name: "WireNIO", dependencies: [
            "Wire",
            "CUDPBatch",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
        ], swiftSettings: swift6),
        .target(name: "FloorControl", swiftSettings: swift6),
        // The claims a token carries, as plain values: what the hub and the client read, without JWT.
        .target(name: "ParticipantClaims", swiftSettings: swift6),
        .target(name: "ParticipantTokens", dependencies: [
            "KeyFiles", "ParticipantClaims",
            .product(name: "JWTKit", package: "jwt-kit"),
            .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: swift6),
        // The records and the store protocol; each database is a target of its own beside it.
        .target(name: "ChannelStore", dependencies: ["ChannelProtocol"], swiftSettings: swift6),
        .target(name: "ChannelStoreSQLite", dependencies: [
            "ChannelStore", "ChannelProtocol",
            .product(name: "GRDB", package: "GRDB.swift"),
        ], swiftSettings: swift6),
        // Where each channel lives in a cluster, as plain decisions (sans-I/O).
        .target(name: "ClusterPlacement", swiftSettings: swift6),
        // The cluster's shared store (docs/architecture.md says why postgres-nio).
        .target(name: "ChannelStorePostgres", dependencies: [
            "ChannelStore", "ChannelProtocol", "ClusterPlacement",
            .product(name: "PostgresNIO", package: "postgres-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "Logging", package: "swift-log"),
        ], swiftSettings: swift6),
        // A PTTClient member that talks and records, for process tests and benchmarks.
        .target(name: "PTTClientTesting", dependencies: ["PTTClient", "Audio", "SquelchTesting"], swiftSettings: swift6),
        // A private PostgreSQL server for tests and benchmarks (initdb in a temporary directory).
        .target(name: "PostgresTesting", dependencies: ["ChannelStorePostgres", "SquelchTesting"], swiftSettings: swift6),
        .target(name: "ChannelProtocol", swiftSettings: swift6),
        // Media frames sealed once by the talker, opened by each listener (RFC 9605; decision 0047).
        .target(name: "SFrame", dependencies: [
            "CPacketCrypto",
            .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: swift6),
        // Our media datagrams sealed and opened with the bursts' keys (talker and listener sides).
        .target(name: "MediaFrames", dependencies: [
            "SFrame", "ChannelProtocol", "Wire",
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: swift6),
        .target(name: "SquelchTesting", dependencies: [
            "Wire", "WireNIO", "ChannelProtocol", "MediaFrames",
            .product(name: "GRDB", package: "GRDB.swift"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: swift6),
        .target(name: "ChannelHub", dependencies: [
            "Wire", "FloorControl", "ChannelProtocol", "ChannelStore", "ParticipantClaims", "SFrame",
        ], swiftSettings: swift6),
        // APNs speaks HTTP/2 through libnghttp2's sans-I/O session rather than AsyncHTTPClient (the client
        // needs the peer's SETTINGS, PING keepalive and GOAWAY) or swift-nio-http2 (a channel per stream
        // cost 12x h2load's CPU per push: docs/decisions/0049).
        .target(name: "APNs", dependencies: [
            "HTTP2Session", "CNGHTTP2", "RandomUUID",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "NIOTLS", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "JWTKit", package: "jwt-kit"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Logging", package: "swift-log"),
        ], swiftSettings: swift6),
        // A device's end of a push stream (NDJSON over one HTTP/1.1 GET, plain or TLS).
        .target(name: "PushStream", dependencies: [
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
        ], swiftSettings: swift6),
        .target(name: "APNsDevice", dependencies: ["PushStream"], swiftSettings: swift6),
        .target(name: "APNsSimulator", dependencies: [
            "SeededRandom", "APNsDevice", "RandomUUID", "HTTP2Session", "CNGHTTP2",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "NIOTLS", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "JWTKit", package: "jwt-kit"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Hummingbird", package: "hummingbird"),
        ], swiftSettings: swift6),
        .target(name: "JitterBuffer", swiftSettings: swift6),
        .target(name: "TerminalUI", swiftSettings: swift6),
        .target(name: "InputDevices", swiftSettings: swift6),
        .target(name: "ImpairmentKit", dependencies: [
            "SeededRandom",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
        ], swiftSettings: swift6),
        .target(name: "PTTClient", dependencies: [
            "Wire", "WireNIO", "Audio", "Opus", "ChannelProtocol", "JitterBuffer", "ParticipantClaims", "MediaFrames",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: swift6),
        .target(name: "PTTServer", dependencies: [
            "Wire", "WireNIO", "APNs", "SquelchInfo", "FloorControl", "ParticipantTokens", "ParticipantClaims", "ChannelStore", "ChannelStoreSQLite", "ChannelStorePostgres", "ClusterPlacement", "ChannelProtocol",
            "ChannelHub", "KeyFiles",
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Metrics", package: "swift-metrics"),
            .product(name: "Prometheus", package: "swift-prometheus"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Hummingbird", package: "hummingbird"),
            .product(name: "HummingbirdCore", package: "hummingbird"),
            .product(name: "HummingbirdTLS", package: "hummingbird"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "UnixSignals", package: "swift-service-lifecycle"),
        ], swiftSettings: swift6),

        // The APNs simulator as the server's embedded push service, for the executables that embed it.
        .target(name: "APNsSimulatorEmbedding", dependencies: ["APNsSimulator", "PTTServer"], swiftSettings: swift6),

        // squelchd in a test's own process (test support, like SquelchTesting).
        .target(name: "ServerTesting", dependencies: ["PTTServer", "APNsSimulatorEmbedding", "Wire"], swiftSettings: swift6),

        .executableTarget(name: "squelchd", dependencies: [
            "PTTServer", "APNsSimulator", "APNsSimulatorEmbedding", "SquelchInfo", "ParticipantTokens", "ParticipantClaims", "ChannelStore", "ChannelStoreSQLite", "ChannelStorePostgres", "ClusterPlacement", "ChannelProtocol",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ], swiftSettings: swift6),
        // PTTClient's pushes from the APNs simulator, for the programs that take them (walkie, tests).
        .target(name: "SimulatedPush", dependencies: ["PTTClient", "APNsDevice", "ChannelProtocol"], swiftSettings: swift6),
        // PTTClient's pushes from squelchd's own device push service (walkie anywhere).
        .target(name: "DevicePush", dependencies: [
            "PTTClient", "PushStream", "ChannelProtocol",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
        ], swiftSettings: swift6),
        .executableTarget(name: "walkie", dependencies: [
            "PTTClient", "SimulatedPush", "DevicePush", "ParticipantTokens", "ParticipantClaims", "Audio", "Opus", "SquelchInfo", "TerminalUI", "ChannelProtocol", "JitterBuffer",
            "InputDevices",
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ], swiftSettings: swift6),
        .executableTarget(name: "impairment-proxy", dependencies: [
            "ImpairmentKit",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
        ], swiftSettings: swift6),
        // The reference event loop for TerminalUI, and the child process its signal tests kill.
        .executableTarget(name: "terminal-ui-demo", dependencies: ["TerminalUI"], path: "Examples/TerminalUIDemo", swiftSettings: swift6),
        .executableTarget(name: "ptt-example", dependencies: ["PTTClient", "SimulatedPush", "Audio"], path: "Examples/PTTExample", swiftSettings: swift6),
        .executableTarget(name: "squelch-bench", dependencies: [
            "Opus", "Audio", "SquelchInfo", "Wire", "WireNIO", "WireTesting", "SquelchTesting", "ChannelProtocol",
            "ParticipantTokens", "ParticipantClaims", "APNs", "APNsSimulator", "APNsDevice", "ChannelStore", "ChannelStoreSQLite", "PTTClient", "JitterBuffer", "ImpairmentKit", "CUDPBatch",
            "ChannelStorePostgres", "ClusterPlacement", "PostgresTesting", "PTTClientTesting",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ], swiftSettings: swift6),

        .testTarget(name: "APNsTests", dependencies: [
            "RandomUUID", "APNs", "APNsSimulator", "SquelchTesting",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            .product(name: "NIOEmbedded", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "JWTKit", package: "jwt-kit"),
        ], swiftSettings: swift6),
        .testTarget(name: "APNsSimulatorTests", dependencies: [
            "APNsSimulator", "APNsDevice", "PushStream",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOHTTP2", package: "swift-nio-http2"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "JWTKit", package: "jwt-kit"),
        ], swiftSettings: swift6),
        .testTarget(name: "FloorControlTests", dependencies: ["FloorControl"], swiftSettings: swift6),
        .testTarget(name: "ParticipantTokensTests", dependencies: [
            "ParticipantTokens", "ParticipantClaims",
            .product(name: "Crypto", package: "swift-crypto"),
        ], swiftSettings: swift6),
        .testTarget(name: "ChannelStoreTests", dependencies: [
            "ChannelStore", "ChannelStoreSQLite", "ChannelStorePostgres", "PostgresTesting", "SquelchTesting", "ChannelProtocol", "ClusterPlacement",
            .product(name: "GRDB", package: "GRDB.swift"),
            .product(name: "PostgresNIO", package: "postgres-nio"),
        ], swiftSettings: swift6),
        .testTarget(name: "ChannelHubTests", dependencies: [
            "ChannelHub", "ChannelProtocol", "ChannelStore", "ParticipantClaims", "Wire", "SFrame",
        ], swiftSettings: swift6),
        .testTarget(name: "ChannelProtocolTests", dependencies: ["ChannelProtocol"], swiftSettings: swift6),
        .testTarget(name: "SFrameTests", dependencies: ["SFrame", "MediaFrames", "ChannelProtocol", "Wire"], swiftSettings: swift6),
        .testTarget(name: "HTTP2SessionTests", dependencies: ["HTTP2Session"], swiftSettings: swift6),
        .testTarget(name: "ClusterPlacementTests", dependencies: ["ClusterPlacement", "SeededRandom"], swiftSettings: swift6),
        .testTarget(name: "OpusTests", dependencies: ["SeededRandom", "Opus", "Audio"], swiftSettings: swift6),
        .testTarget(name: "AudioTests", dependencies: ["Audio"], swiftSettings: swift6),
        .testTarget(name: "JitterBufferTests", dependencies: ["SeededRandom", "JitterBuffer"], swiftSettings: swift6),
        .testTarget(name: "ImpairmentKitTests", dependencies: [
            "ImpairmentKit", "impairment-proxy",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: swift6),
        .testTarget(name: "InputDevicesTests", dependencies: ["InputDevices"], swiftSettings: swift6),
        .testTarget(name: "TerminalUITests", dependencies: ["SeededRandom", "TerminalUI", "terminal-ui-demo"], swiftSettings: swift6),
        .testTarget(name: "PTTClientTests", dependencies: [
            "PTTClient", "SimulatedPush", "DevicePush", "PushStream", "PTTServer", "ServerTesting", "APNsSimulator", "APNsSimulatorEmbedding", "APNsDevice", "ChannelProtocol", "ChannelStore", "ChannelStoreSQLite", "ParticipantTokens", "ParticipantClaims",
            "Audio", "Opus", "JitterBuffer", "SquelchTesting", "Wire", "WireNIO", "WireTesting", "ImpairmentKit",
            "ChannelStorePostgres", "PostgresTesting", "ClusterPlacement", "MediaFrames",
            .product(name: "X509", package: "swift-certificates"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ], swiftSettings: swift6),
        .testTarget(name: "PTTServerTests", dependencies: [
            "SeededRandom", "PTTServer", "ServerTesting", "APNsSimulator", "APNsSimulatorEmbedding", "ChannelStore", "ChannelStoreSQLite", "ChannelProtocol", "ParticipantTokens", "ParticipantClaims", "Wire", "WireNIO", "WireTesting",
            "SquelchTesting", "KeyFiles", "APNs", "ChannelStorePostgres", "PostgresTesting",
            .product(name: "Prometheus", package: "swift-prometheus"),
            .product(name: "GRDB", package: "GRDB.swift"),
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "Hummingbird", package: "hummingbird"),
            .product(name: "HummingbirdTesting", package: "hummingbird"),
        ], swiftSettings: swift6),
        .testTarget(name: "WireTests", dependencies: [
            "SeededRandom", "Wire", "WireTesting",
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "_CryptoExtras", package: "swift-crypto"),
            .product(name: "X509", package: "swift-certificates"),
            .product(name: "SwiftASN1", package: "swift-asn1"),
        ], swiftSettings: swift6),
        .testTarget(name: "WireNIOTests", dependencies: [
            "WireNIO", "Wire", "WireTesting", "SquelchTesting",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOEmbedded", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "Crypto", package: "swift-crypto"),
            .product(name: "X509", package: "swift-certificates"),
            .product(name: "SwiftASN1", package: "swift-asn1"),
        ], swiftSettings: swift6),
        // squelch-bench's own entry points (`make bench-quick` runs each benchmark whole).
        .testTarget(name: "BenchTests", dependencies: ["squelch-bench", "SquelchTesting", "WireTesting"], swiftSettings: swift6),
        .testTarget(name: "CLITests", dependencies: [
            "SquelchInfo", "Audio", "PTTClient", "Wire", "WireNIO", "ParticipantTokens", "ParticipantClaims", "SquelchTesting", "ChannelProtocol",
            "ChannelStore", "ChannelStorePostgres", "PostgresTesting", "ClusterPlacement", "PTTClientTesting", "InputDevices",
            .product(name: "NIOCore", package: "swift-nio"),
        ], swiftSettings: swift6),
    ]
)
