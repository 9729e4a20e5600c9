import ArgumentParser
import Audio
import ChannelProtocol
import Foundation
import JitterBuffer
import ParticipantTokens
import NIOConcurrencyHelpers
import PTTClient
import SquelchInfo

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the channel walkie would restore, without connecting (a running walkie keeps its connection).")

    @OptionGroup var state: StateOptions

    func run() async throws {
        let store = RestorationStore(directory: state.stateDir ?? RestorationStore.defaultDirectory(app: "walkie"))
        let record: RestorationRecord?
        do { record = try store.load() } catch { fail(.other(error.description)) }
        // Leaves the server has not heard yet, whatever the saved channel.
        let owed = (try? store.loadOwedLeaves()) ?? []
        for leave in owed {
            say("not yet heard by the server: the leave of channel \(leave.channel) at \(leave.leftAt.formatted(.iso8601)) (\(leave.credentials.address)); 'walkie leave' tries again")
        }
        guard let record else {
            say("no saved channel in \(store.directory); join one with 'walkie join --server HOST:PORT --token T'")
            throw ExitCode(2)
        }
        let claims = try? tokenClaims(record.credentials.token)
        say("channel   \(record.descriptor?.name ?? "?") (\(record.channel))")
        say("server    \(record.credentials.address), CA \(record.credentials.caPath)")
        if let claims {
            say("you       \(claims.name) (\(claims.userID))")
            say("token     " + (claims.expiresAt < Date() ? "expired " : "valid until ") + claims.expiresAt.formatted(.iso8601))
        }
        say("push      " + (record.pushToken == nil ? "no push token yet" : "registered (\(record.pushToken!.count)-byte token)"))
        // What to run next, for this directory: plain 'walkie' looks in the default one.
        // Quoted only when the shell needs it, and with double quotes: the command itself is shown in
        // single quotes.
        let directoryFlag = state.stateDir.map { dir in
            let plain = !dir.isEmpty && dir.allSatisfy { $0.isLetter || $0.isNumber || "/._-+:@%".contains($0) }
            let escaped = dir.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
                .replacingOccurrences(of: "$", with: "\\$").replacingOccurrences(of: "`", with: "\\`")
            return " --state-dir " + (plain ? dir : "\"\(escaped)\"")
        } ?? ""
        if let holder = StateDirectoryLock.holder(of: store.directory) {
            say("open in a running walkie\(holder.map { " (pid \($0))" } ?? ""); leave from it, or quit it with q first")
        } else if let claims, claims.expiresAt < Date(), SavedSettings.load(from: store.directory)?.tokenFile == nil {
            // The saved token can't rejoin: 'walkie' would only be refused.
            say("the saved token has expired: rejoin with a new one, 'walkie join --server \(record.credentials.address) --token NEW\(directoryFlag)', or 'walkie leave\(directoryFlag)' to leave")
        } else {
            say("run 'walkie\(directoryFlag)' to rejoin, 'walkie leave\(directoryFlag)' to leave")
        }
    }
}
