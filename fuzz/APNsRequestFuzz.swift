import Foundation

// libFuzzer target for the APNs simulator's request validator (Sources/APNsSimulator/
// APNsRequestValidation.swift): whatever a client sends, `validate` must return a verdict, never trap,
// and what it calls valid must really obey every rule. Built by `make fuzz-build` with that one file.
//
// Input layout: three flag bytes, then segments separated by 0x00. The flags choose, field by field,
// between a well-formed value and the next segment (or leaving the field out), so the fuzzer reaches
// the late rules (topic, priority, body) without first having to discover a signed JWT.

/// One key, "FUZZKEY001" of team "FUZZTEAM01"; a signature is "valid" when it is 64 bytes and starts with
/// the signing input's length, a rule simple enough for the fuzzer to satisfy and to break.
struct FuzzVerifier: ProviderTokenVerifying {
    func teamID(forKeyID keyID: String) -> String? { keyID == "FUZZKEY001" ? "FUZZTEAM01" : nil }

    func isValidSignature(_ signature: [UInt8], signingInput: ArraySlice<UInt8>, keyID: String) -> Bool {
        signature.count == 64 && signature[0] == UInt8(truncatingIfNeeded: signingInput.count)
    }
}

private let now = Date(timeIntervalSince1970: 1_750_000_000)
private let verifier = FuzzVerifier()

private func base64URL(_ bytes: some Collection<UInt8>) -> String {
    Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// A JWT over `header` and `claims` with a signature `FuzzVerifier` accepts.
private func signedJWT(header: [UInt8], claims: [UInt8]) -> String {
    let signingInput = base64URL(header) + "." + base64URL(claims)
    var signature = [UInt8](repeating: 7, count: 64)
    signature[0] = UInt8(truncatingIfNeeded: signingInput.utf8.count)
    return signingInput + "." + base64URL(signature)
}

private struct Segments {
    var parts: [ArraySlice<UInt8>]
    var next = 0

    mutating func take() -> [UInt8] {
        defer { next += 1 }
        return next < parts.count ? Array(parts[next]) : []
    }

    mutating func string() -> String { String(decoding: take(), as: UTF8.self) }
    var remaining: Int { max(0, parts.count - next) }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAPNsRequest(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard bytes.count >= 3 else { return 0 }
    let flags = UInt32(bytes[0]) | UInt32(bytes[1]) << 8 | UInt32(bytes[2]) << 16
    func flag(_ bit: UInt32) -> Bool { flags & (1 << bit) != 0 }
    func field(_ bit: UInt32) -> UInt32 { (flags >> bit) & 3 }
    var segments = Segments(parts: bytes[3...].split(separator: 0, omittingEmptySubsequences: false))

    let method = flag(0) ? "POST" : segments.string()
    let path = flag(1) ? "/3/device/" + segments.string() : segments.string()
    var headers: [(name: String, value: String)] = []
    switch field(2) {
    case 0: headers.append(("authorization", segments.string()))
    case 1: headers.append(("authorization", "bearer " + signedJWT(
        header: Array(#"{"alg":"ES256","kid":"FUZZKEY001"}"#.utf8), claims: Array(#"{"iss":"FUZZTEAM01","iat":1750000000}"#.utf8))))
    case 2: headers.append(("authorization", "bearer " + signedJWT(header: segments.take(), claims: segments.take())))
    default: break
    }
    switch field(4) {
    case 0: headers.append(("apns-push-type", "pushtotalk"))
    case 1: headers.append(("apns-push-type", segments.string()))
    case 3: headers.append(("apns-push-type", "alert"))
    default: break
    }
    switch field(6) {
    case 0: headers.append(("apns-topic", "com.example.voip-ptt"))
    case 1: headers.append(("apns-topic", segments.string()))
    case 3: headers.append(("apns-topic", "com.example"))
    default: break
    }
    for (bit, name) in [(8, "apns-priority"), (9, "apns-expiration"), (10, "apns-id"), (11, "apns-collapse-id")] where flag(UInt32(bit)) {
        headers.append((name, segments.string()))
    }
    if flag(16) {
        while segments.remaining > 2 { headers.append((segments.string(), segments.string())) }
    }
    // What the transport does with a long body: keeps one byte past the limit, counts the rest.
    var body = segments.take()
    var bodyLength = body.count
    if flag(12) { bodyLength += APNsLimits.maxPayloadBytes }
    if body.count > APNsLimits.storedBodyBytes { body = Array(body.prefix(APNsLimits.storedBodyBytes)) }
    let request = APNsRequest(method: method, path: path, headers: headers, body: body, bodyLength: bodyLength)
    let allowedTopics: Set<String>? = flag(17) ? ["com.example.voip-ptt"] : nil

    var validator = APNsRequestValidator(verifier: verifier, allowedTopics: allowedTopics)
    let verdict = validator.validate(request, now: now)
    check(verdict, request, validator: validator, allowedTopics: allowedTopics)

    // Same input, fresh connection: same answer (the validator has no hidden inputs).
    var fresh = APNsRequestValidator(verifier: verifier, allowedTopics: allowedTopics)
    precondition(fresh.validate(request, now: now) == verdict, "two fresh validators disagree on one request")

    // The same request again later on the same connection: the session rules (cached JWT, expiry,
    // token updates) run, and their answer must still be one of Apple's.
    let later = now.addingTimeInterval(Double((flags >> 13) & 7) * 600)
    check(validator.validate(request, now: later), request, validator: validator, allowedTopics: allowedTopics)

    if let apnsID = APNsRequestValidator.echoableAPNsID(of: request) {
        precondition(APNsRequestValidator.isCanonicalUUID(apnsID), "echoing a non-canonical apns-id \(apnsID)")
    }
    return 0
}

/// What "valid" promises, restated from the rules rather than from the code.
private func check(_ verdict: APNsVerdict, _ request: APNsRequest, validator: APNsRequestValidator, allowedTopics: Set<String>?) {
    switch verdict {
    case .invalid(let reason, let token):
        precondition([400, 403, 404, 405, 413, 429].contains(reason.status), "\(reason) has status \(reason.status)")
        if let token { precondition(token.count <= APNsLimits.maxLoggedTokenCharacters, "logged a token of \(token.count) characters") }
    case .valid(let push):
        precondition(request.method == "POST", "accepted method \(String(describing: request.method))")
        precondition(request.path == "/3/device/" + push.token || request.path?.lowercased() == "/3/device/" + push.token,
                     "token \(push.token) is not the path's")
        let token = Array(push.token.utf8)
        precondition(token.count % 2 == 0 && (2...200).contains(token.count), "accepted token length \(token.count)")
        precondition(token.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }, "token not lowercase hex")
        precondition((1...APNsLimits.maxPayloadBytes).contains(request.bodyLength), "accepted body of \(request.bodyLength) bytes")
        precondition(APNsRequestValidator.pushTypes.contains(push.pushType), "accepted push type \(push.pushType)")
        precondition(!push.topic.isEmpty && (allowedTopics?.contains(push.topic) ?? true), "accepted topic \(push.topic)")
        precondition(push.pushType != "pushtotalk" || push.topic.hasSuffix(".voip-ptt"), "pushtotalk to \(push.topic)")
        precondition(push.priority == nil || [1, 5, 10].contains(push.priority!), "accepted priority \(push.priority!)")
        precondition(push.expiration.map { $0 >= 0 } ?? true, "accepted negative expiration")
        precondition((push.collapseID?.utf8.count ?? 0) <= 64, "accepted a long collapse id")
        precondition(push.keyID == "FUZZKEY001" && push.teamID == "FUZZTEAM01", "accepted key \(push.keyID) of \(push.teamID)")
        precondition(validator.session.isAuthenticated, "valid push on an unauthenticated connection")
        var names = Set<String>()
        for (name, _) in request.headers { precondition(names.insert(name.lowercased()).inserted, "accepted repeated \(name)") }
    }
}
