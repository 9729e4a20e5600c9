extension ServerConfiguration {
    /// Where the device push service listens, as `devicePushPort` says.
    public enum DevicePushListen: Sendable, Equatable {
        case off
        /// TCP at the voice port's number (the one bound, when the voice port is 0).
        case voicePort
        case port(Int)
    }

    /// `devicePushPort` read; nil when it is none of the three.
    public var devicePushListen: DevicePushListen? {
        switch devicePushPort.lowercased() {
        case "voice": .voicePort
        case "off": .off
        default: Int(devicePushPort).map(DevicePushListen.port)
        }
    }
}
