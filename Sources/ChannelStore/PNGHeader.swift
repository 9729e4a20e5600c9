import ChannelProtocol
import Foundation

/// Why bytes are not a PNG, for `ChannelRecord.validateImage`.
struct PNGHeaderError: Error, CustomStringConvertible {
    var description: String
}

/// The part of a PNG file that says it is one and how big it is: the 8-byte signature, then the IHDR
/// chunk (length 13, type, width, height). The rest is the client's decoder's business.
enum PNGHeader {
    static let signature: [UInt8] = [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]

    static func size(of data: Data) throws(PNGHeaderError) -> (width: UInt32, height: UInt32) {
        let bytes = [UInt8](data.prefix(24))
        guard bytes.count == 24 else { throw PNGHeaderError(description: "only \(data.count) bytes") }
        guard Array(bytes[0..<8]) == signature else { throw PNGHeaderError(description: "no PNG signature") }
        guard Array(bytes[8..<16]) == [0, 0, 0, 13] + Array("IHDR".utf8) else {
            throw PNGHeaderError(description: "no IHDR header after the signature")
        }
        func word(_ at: Int) -> UInt32 { bytes[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) } }
        let width = word(16), height = word(20)
        guard width > 0, height > 0 else { throw PNGHeaderError(description: "a width or height of 0") }
        return (width, height)
    }
}
