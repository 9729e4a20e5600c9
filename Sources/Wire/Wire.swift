/// The QUIC-style secure UDP transport, as a sans-I/O state machine: datagrams, time and commands go in;
/// datagrams, events and the next timer deadline come out. See docs/protocol.md.
///
/// The transport lands with issue 3; until then this module holds only the protocol's identity.
public enum Wire {
    /// ALPN-like name of the protocol family, carried in the handshake once it exists.
    public static let protocolName = "squelch-wire"
}
