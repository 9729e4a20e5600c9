import Crypto
import Foundation
import X509

// The handshake (docs/protocol.md §5–6): one round trip in the style of TLS 1.3.
extension Connection {
    func randomBytes(_ count: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count + 8)
        while bytes.count < count {
            var word = random.next()
            for _ in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: word)); word >>= 8 }
        }
        return Array(bytes.prefix(count))
    }

    func localParameters() -> TransportParameters {
        var params = TransportParameters()
        params.maxIdleTimeout = config.idleTimeout / 1_000_000
        params.maxAckDelay = config.maxAckDelay / 1_000_000
        params.maxUDPPayloadSize = UInt64(max(config.maxDatagramSize, 1200))
        params.maxDatagramFrameSize = UInt64(config.maxDatagramSize)
        params.activeConnectionIDLimit = config.activeConnectionIDLimit
        params.initialSourceConnectionID = localID
        return params
    }

    func startClientHello() {
        guard let configuration = clientConfiguration else { return }
        // Ephemeral key from the injected generator, so test vectors are reproducible.
        let key = (try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: randomBytes(32))) ?? Curve25519.KeyAgreement.PrivateKey()
        ephemeral = key
        let random = randomBytes(32), share = Array(key.publicKey.rawRepresentation)
        var parameters = localParameters()
        parameters.entryPass = configuration.entryPass?.parameter(random: random, keyShare: share)
        let hello = HandshakeMessage.clientHello(.init(
            version: WireVersion.v1, offeredVersions: configuration.versions, random: random,
            suites: config.suites.map(\.rawValue), keyShare: share,
            serverName: configuration.serverName, parameters: parameters))
        clientHello = hello.encoded()
        transcript.add(clientHello)
        initialSpace.flight = clientHello
    }

    /// Parses every complete message in a space's inbox.
    func processHandshakeInbox(_ space: LongPacketType, now: WireInstant) {
        while state == .handshaking || (role == .client && state == .established && space == .handshake) {
            let inbox = space == .initial ? initialSpace.inbox : handshakeSpace.inbox
            guard inbox.count >= 4 else { return }
            let length = Int(inbox[1]) << 16 | Int(inbox[2]) << 8 | Int(inbox[3])
            guard length <= HandshakeMessage.maximumLength else {
                failHandshake(.malformed("message of \(length) bytes"), now: now); return
            }
            guard inbox.count >= 4 + length else { return }
            let bytes = Array(inbox[0..<(4 + length)])
            if space == .initial { initialSpace.inbox.removeFirst(4 + length) } else { handshakeSpace.inbox.removeFirst(4 + length) }
            let message: HandshakeMessage
            do {
                message = try bytes.withUnsafeBytes { raw throws(WireParseError) in
                    var reader = WireReader(raw)
                    return try HandshakeMessage.decode(&reader)
                }
            } catch {
                failHandshake(.malformed("\(error)"), now: now); return
            }
            do {
                if role == .client { try clientHandle(message, bytes: bytes, space: space, now: now) } else {
                    try serverHandle(message, bytes: bytes, space: space, now: now)
                }
            } catch {
                failHandshake(error, now: now); return
            }
        }
    }

    // MARK: Client

    func clientHandle(_ message: HandshakeMessage, bytes: [UInt8], space: LongPacketType, now: WireInstant) throws(HandshakeFailure) {
        switch (message, space) {
        case (.serverHello(let hello), .initial):
            guard secrets == nil else { throw .unexpectedMessage("second ServerHello") }
            guard hello.version == WireVersion.v1 else { throw .versionMismatch(offered: clientConfiguration?.versions ?? [], chosen: hello.version) }
            guard let chosen = CipherSuite(rawValue: hello.suite), config.suites.contains(chosen) else { throw .noCommonSuite }
            guard let ephemeral else { throw .unexpectedMessage("ServerHello before ClientHello") }
            let shared = try HandshakeCrypto.sharedSecret(ephemeral, peerShare: hello.keyShare)
            transcript.add(bytes)
            suite = chosen
            let derived = HandshakeCrypto.handshakeSecrets(shared: shared, helloHash: transcript.current)
            secrets = derived
            do {
                handshakeSpace.seal = try PacketKey(secret: derived.clientHandshake, suite: chosen, sealing: true)
                handshakeSpace.open = try PacketKey(secret: derived.serverHandshake, suite: chosen, sealing: false)
            } catch {
                throw .malformed("key setup failed")
            }
        case (.encryptedExtensions(let params), .handshake):
            guard secrets != nil, peerParameters == nil else { throw .unexpectedMessage("EncryptedExtensions") }
            // The server proves it saw our original destination ID and, after a Retry, which Retry.
            guard params.originalDestinationConnectionID == originalDestination else {
                throw .transportParameters("original_destination_connection_id does not match")
            }
            guard params.retrySourceConnectionID == retrySource else { throw .transportParameters("retry_source_connection_id does not match") }
            guard params.initialSourceConnectionID == peerID else { throw .transportParameters("initial_source_connection_id does not match") }
            guard params.statelessResetToken != nil else { throw .transportParameters("missing stateless_reset_token") }
            guard !params.entryPassAccepted || clientConfiguration?.entryPass != nil else {
                throw .transportParameters("entry_pass_accepted without an entry pass")
            }
            entryPassAccepted = params.entryPassAccepted
            peerParameters = params
            peerIDs = [PeerID(sequence: 0, id: peerID, resetToken: params.statelessResetToken, retired: false)]
            transcript.add(bytes)
        case (.certificate(let chain), .handshake):
            guard peerParameters != nil, serverChain.isEmpty else { throw .unexpectedMessage("Certificate") }
            serverChain = chain
            transcript.add(bytes)
        case (.certificateVerify(let scheme, let signature), .handshake):
            guard let leafDER = serverChain.first, !certificateVerified else { throw .unexpectedMessage("CertificateVerify") }
            guard scheme == HandshakeMessage.ecdsaP256SHA256 else { throw .badSignature }
            let leaf: Certificate
            do { leaf = try Certificate(derEncoded: leafDER) } catch { throw .unreadableCertificate(reason: "\(error)") }
            let content = HandshakeCrypto.certificateVerifyContent(transcriptHash: transcript.current)
            guard let key = P256.Signing.PublicKey(leaf.publicKey),
                  let parsed = try? P256.Signing.ECDSASignature(derRepresentation: signature),
                  key.isValidSignature(parsed, for: content) else { throw .badSignature }
            transcript.add(bytes)
            certificateVerified = true
        case (.finished(let mac), .handshake):
            guard let secrets, certificateVerified, serverFinishedHash.isEmpty else { throw .unexpectedMessage("Finished") }
            guard HandshakeCrypto.finishedIsValid(mac, baseSecret: secrets.serverHandshake, transcriptHash: transcript.current) else {
                throw .badFinished
            }
            transcript.add(bytes)
            serverFinishedHash = transcript.current
            let application = HandshakeCrypto.applicationSecrets(handshake: secrets.handshake, serverFinishedHash: serverFinishedHash)
            clientApplicationSecret = application.client
            serverApplicationSecret = application.server
            pendingCertificateCheck = CertificateCheck(chain: serverChain, serverName: clientConfiguration?.serverName ?? "")
            handshakeRetransmitAt = nil
        default:
            throw .unexpectedMessage("\(message.type) in the \(space) space")
        }
    }

    /// Server: the payload of an entry pass in the ClientHello if this server honours it: its ticket
    /// is this cluster's, for this node, unexpired; the binder proves the client holds the pass's key
    /// for this very hello; and the ticket has not entered before. Anything else is ignored, not
    /// refused: the handshake goes on, and the client sends what the pass carried itself.
    func redeemEntryPass(_ value: [UInt8], hello: HandshakeMessage.ClientHello, secrets: ServerSecrets) -> [UInt8]? {
        guard let passes = secrets.entryPasses, let spentPasses else { return nil }
        let ticket = value[..<(value.count - EntryPass.binderLength)]
        let binder = value[(value.count - EntryPass.binderLength)...]
        guard let contents = passes.open(ticket),
              EntryPass.binderIsValid(binder, key: contents.key, random: hello.random, keyShare: hello.keyShare),
              spentPasses.spend(ticket, expiresMilliseconds: contents.expiresMilliseconds, nowMilliseconds: passes.clock()) else { return nil }
        // The redirecting node saw this client at that host over a validated connection, moments ago:
        // as with a NEW_TOKEN token's host, the 3x limit goes, so that the answer to the join fits
        // behind the flight however large the channel's roster (§8.4). Another host keeps the limit.
        if contents.host == EntryPasses.host(path.address) { path.validated = true }
        return contents.payload
    }

    func installApplicationKeys() {
        let (sealSecret, openSecret) = role == .client ? (clientApplicationSecret, serverApplicationSecret)
            : (serverApplicationSecret, clientApplicationSecret)
        // A server that honoured an entry pass has been writing with its key since the ClientHello.
        if appSeal == nil || role == .client { appSeal = try? PacketKey(secret: sealSecret, suite: suite, sealing: true) }
        appOpen = try? PacketKey(secret: openSecret, suite: suite, sealing: false)
        // The next read key is made when the peer first uses it (`receiveShort`), not now: most
        // connections never update keys, and a key costs about 2 KB of cipher state.
        appOpenNext = nil
    }

    // MARK: Server

    func serverHandle(_ message: HandshakeMessage, bytes: [UInt8], space: LongPacketType, now: WireInstant) throws(HandshakeFailure) {
        switch (message, space) {
        case (.clientHello(let hello), .initial):
            guard !clientHelloProcessed, let serverSecrets else { throw .unexpectedMessage("second ClientHello") }
            // The version the client used must be one it offered and one we speak: a forged Version
            // Negotiation would show up here, inside the signed transcript.
            guard hello.version == WireVersion.v1, hello.offeredVersions.contains(hello.version) else {
                throw .versionMismatch(offered: hello.offeredVersions, chosen: hello.version)
            }
            guard let chosen = hello.suites.lazy.compactMap(CipherSuite.init(rawValue:)).first(where: config.suites.contains) else {
                throw .noCommonSuite
            }
            guard hello.parameters.initialSourceConnectionID == peerID else {
                throw .transportParameters("initial_source_connection_id does not match")
            }
            clientHelloProcessed = true
            suite = chosen
            peerParameters = hello.parameters
            transcript.add(bytes)
            let key = (try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: randomBytes(32))) ?? Curve25519.KeyAgreement.PrivateKey()
            let shared = try HandshakeCrypto.sharedSecret(key, peerShare: hello.keyShare)
            let serverHello = HandshakeMessage.serverHello(.init(version: hello.version, random: randomBytes(32), suite: chosen.rawValue,
                                                                 keyShare: Array(key.publicKey.rawRepresentation))).encoded()
            transcript.add(serverHello)
            let derived = HandshakeCrypto.handshakeSecrets(shared: shared, helloHash: transcript.current)
            secrets = derived

            var params = localParameters()
            params.originalDestinationConnectionID = originalDestination
            params.retrySourceConnectionID = retrySource
            params.statelessResetToken = serverSecrets.resetToken(for: localID)
            let entered = hello.parameters.entryPass.flatMap { redeemEntryPass($0, hello: hello, secrets: serverSecrets) }
            params.entryPassAccepted = entered != nil
            let extensions = HandshakeMessage.encryptedExtensions(params).encoded()
            transcript.add(extensions)
            let certificate = HandshakeMessage.certificate(serverSecrets.identity.derChain).encoded()
            transcript.add(certificate)
            let content = HandshakeCrypto.certificateVerifyContent(transcriptHash: transcript.current)
            guard let signature = try? serverSecrets.identity.signingKey.signature(for: content) else { throw .badSignature }
            let verify = HandshakeMessage.certificateVerify(scheme: HandshakeMessage.ecdsaP256SHA256,
                                                            signature: Array(signature.derRepresentation)).encoded()
            transcript.add(verify)
            let finished = HandshakeMessage.finished(HandshakeCrypto.finished(baseSecret: derived.serverHandshake,
                                                                           transcriptHash: transcript.current)).encoded()
            transcript.add(finished)
            serverFinishedHash = transcript.current
            let application = HandshakeCrypto.applicationSecrets(handshake: derived.handshake, serverFinishedHash: serverFinishedHash)
            clientApplicationSecret = application.client
            serverApplicationSecret = application.server
            do {
                handshakeSpace.seal = try PacketKey(secret: derived.serverHandshake, suite: chosen, sealing: true)
                handshakeSpace.open = try PacketKey(secret: derived.clientHandshake, suite: chosen, sealing: false)
            } catch {
                throw .malformed("key setup failed")
            }
            // The application keys wait for the client's Finished (below), except the write key
            // after an entry pass: the answer to what it carried goes with this flight.
            initialSpace.flight = serverHello
            handshakeSpace.flight = extensions + certificate + verify + finished
            handshakeRetransmitAt = now + rtt.probeTimeout(maxAckDelay: 0)
            if let entered {
                // The EncryptedExtensions promised the answer: a key that can't be made (libcrypto
                // out of memory) ends the handshake, as any other key setup failure does.
                guard let seal = try? PacketKey(secret: serverApplicationSecret, suite: chosen, sealing: true) else {
                    throw .malformed("key setup failed")
                }
                appSeal = seal
                emit(.entered(entered))
            }
        case (.finished(let mac), .handshake):
            guard let secrets, !peerFinished else { throw .unexpectedMessage("Finished") }
            guard HandshakeCrypto.finishedIsValid(mac, baseSecret: secrets.clientHandshake, transcriptHash: transcript.current) else {
                throw .badFinished
            }
            // Made now, not at ClientHello: nothing is sealed or opened with them before (1-RTT
            // packets that come first are dropped). Checked before the handshake keys go, so that a
            // failure (libcrypto out of memory) can still be closed in the Handshake space.
            installApplicationKeys()
            guard appSeal != nil, appOpen != nil else { throw .malformed("key setup failed") }
            transcript.add(bytes)
            peerFinished = true
            handshakeConfirmed = true
            state = .established
            path.validated = true
            handshakeDeadline = nil
            handshakeRetransmitAt = nil
            // Handshake done: the Initial and Handshake keys are no longer needed, nor are the
            // handshake's secrets (key updates derive from the application keys). Dropping them keeps
            // every idle connection smaller and the secrets out of a later memory disclosure.
            initialSpace = HandshakeSpace()
            handshakeSpace = HandshakeSpace()
            clientHelloFirstFragment = nil
            self.secrets = nil
            serverFinishedHash = []
            clientApplicationSecret = []
            serverApplicationSecret = []
            pendingHandshakeDone = true
            issueConnectionIDs()
            if let token = serverSecrets.map({ AddressToken.seal(address: path.address, original: nil, secrets: $0, now: now) }) {
                pendingNewToken = token
            }
            resetIdleTimer(now: now)
            armKeepAlive(now: now)
            emit(.connected)
        default:
            throw .unexpectedMessage("\(message.type) in the \(space) space")
        }
    }

    /// Server: keeps the client stocked with spare connection IDs for migration.
    func issueConnectionIDs() {
        let limit = Int(min(peerParameters?.activeConnectionIDLimit ?? 2, 8))
        while issuedIDs.count < limit {
            let sequence = nextIssuedSequence
            nextIssuedSequence += 1
            let id = ConnectionID(random.next())
            issuedIDs.append(IssuedID(sequence: sequence, id: id))
            routingChanges.append((id, true))
            pendingNewIDs |= 1 << (sequence % 64)
        }
    }
}
