import APNsDevice
import Foundation
import Hummingbird
import Logging
import NIOCore

/// The control port: what the simulator logged and counted, its fault plan, and the device streams,
/// as plain HTTP/1.1 JSON (see `APNsSimulator`). Errors are `{"error": "..."}`.
enum APNsControlAPI {
    static let maxBodyBytes = 1 << 20

    /// Serves until the returned task is cancelled.
    static func start(core: SimulatorCore) async throws -> (task: Task<Void, Never>, port: Int) {
        let configuration = core.configuration
        let (ports, portContinuation) = AsyncThrowingStream.makeStream(of: Int.self)
        let app = Application(
            router: router(core: core),
            configuration: .init(address: .hostname(configuration.host, port: configuration.controlPort), serverName: "apns-sim"),
            onServerRunning: { channel in
                portContinuation.yield(channel.localAddress?.port ?? 0)
                portContinuation.finish()
            },
            logger: quieter(configuration.logger))
        let task = Task {
            do {
                try await app.runService(gracefulShutdownSignals: [])
                portContinuation.finish(throwing: CancellationError())
            } catch {
                portContinuation.finish(throwing: error)
            }
        }
        do {
            for try await port in ports { return (task, port) }
            throw CancellationError()
        } catch {
            task.cancel()
            throw APNsSimulatorError.bindFailed(what: "APNs simulator control API", host: configuration.host,
                                                port: configuration.controlPort, underlying: APNsSimulatorError.bindReason(error))
        }
    }

    /// Hummingbird logs a cancelled server (how `stop()` ends it: a graceful shutdown needs a
    /// ServiceGroup, which this module doesn't link) as two errors; only its critical messages get through.
    private static func quieter(_ logger: Logger) -> Logger {
        var logger = logger
        logger.logLevel = .critical
        return logger
    }

    private struct Health: Encodable { var status = "ok" }
    private struct Pushes: Encodable { var pushes: [APNsAcceptedPush] }
    private struct Rejections: Encodable { var rejections: [APNsRejection] }
    private struct Subscribed: Encodable { var subscribed: String }
    private struct Failure: Encodable { var error: String }

    static func router(core: SimulatorCore) -> Router<BasicRequestContext> {
        let router = Router()
        router.get("/healthz") { _, _ in json(Health()) }
        router.get("/v1/pushes") { request, _ in
            let token = request.uri.queryParameters.get("token").map { $0.lowercased() }
            return json(Pushes(pushes: core.acceptedPushes(token: token)))
        }
        router.delete("/v1/pushes") { _, _ in
            core.clearLog()
            return Response(status: .noContent)
        }
        router.get("/v1/rejections") { _, _ in json(Rejections(rejections: core.rejections())) }
        router.get("/v1/stats") { _, _ in json(core.stats()) }
        router.get("/v1/faults") { _, _ in json(core.faults()) }
        router.put("/v1/faults") { request, _ in
            var request = request
            let body: ByteBuffer
            do { body = try await request.collectBody(upTo: maxBodyBytes) } catch {
                return failure(.contentTooLarge, "the fault plan must be under \(maxBodyBytes) bytes")
            }
            let plan: APNsFaultPlan
            do { plan = try APNsSimulatorJSON.decoder().decode(APNsFaultPlan.self, from: Data(body.readableBytesView)) } catch {
                return failure(.badRequest, "the body is not a fault plan: \(describe(error)). Send a JSON object with any of: serviceUnavailableShare (0…1), delayMilliseconds, unregistered ({token: timestamp ms}), scripted ([{token?, status, reason, count?, timestamp?}]), goAwayAfterRequests, seed")
            }
            if let problem = plan.problem { return failure(.badRequest, "bad fault plan: \(problem)") }
            core.setFaults(plan)
            return json(core.faults())
        }
        router.get("/v1/devices/:token/stream") { _, context in
            let token = (context.parameters.get("token") ?? "").lowercased()
            guard APNsRequestValidator.isHexToken(token.utf8) else {
                return failure(.badRequest, "'\(token)' is not a device token (hex, even length, 2…200 characters)")
            }
            // Subscribed before the first line goes out, so a push sent after the client reads that line
            // is delivered.
            let pushes = core.subscribe(token: token)
            return Response(status: .ok, headers: [.contentType: "application/x-ndjson"], body: ResponseBody { writer in
                try await writer.write(line(Subscribed(subscribed: token)))
                for await push in pushes { try await writer.write(line(push)) }
                try await writer.finish(nil)
            })
        }
        return router
    }

    private static func encode(_ value: some Encodable) -> ByteBuffer {
        // Our own types always encode; the fallback only keeps the signature non-throwing.
        ByteBuffer(data: (try? APNsSimulatorJSON.encoder().encode(value)) ?? Data("{}".utf8))
    }

    private static func line(_ value: some Encodable) -> ByteBuffer {
        var buffer = encode(value)
        buffer.writeString("\n")
        return buffer
    }

    private static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: ResponseBody(byteBuffer: encode(value)))
    }

    private static func failure(_ status: HTTPResponse.Status, _ message: String) -> Response {
        json(Failure(error: message), status: status)
    }

    /// DecodingError's own description is a dump; this says where and what.
    private static func describe(_ error: any Error) -> String {
        func path(_ context: DecodingError.Context) -> String {
            var path = ""
            for key in context.codingPath {
                if let index = key.intValue { path += "[\(index)]" } else { path += (path.isEmpty ? "" : ".") + key.stringValue }
            }
            return path.isEmpty ? "" : " at \(path)"
        }
        switch error {
        case DecodingError.dataCorrupted(let context):
            // The JSON parser's complaints carry its own error; ours (unknown fields) don't.
            if context.underlyingError != nil || context.debugDescription.contains("not valid JSON") { return "not valid JSON" }
            return context.debugDescription + path(context)
        case DecodingError.keyNotFound(let key, let context):
            return "missing field '\(key.stringValue)'\(path(context))"
        case DecodingError.typeMismatch(let type, let context):
            return "expected \(type)\(path(context))"
        case DecodingError.valueNotFound(let type, let context):
            return "expected \(type), found null\(path(context))"
        default:
            return "\(error)"
        }
    }
}
