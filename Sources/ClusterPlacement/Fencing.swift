extension PlacementPolicy {
    /// Whether the database accepts a write that `writer` makes for a channel as its home under
    /// `epoch`: only while the row still names it at that epoch. The SQL form is
    /// `… WHERE channel = $c AND home = $me AND epoch = $e` (zero rows updated: the write is refused
    /// and the writer has lost the channel). This is what stops a home that was paused past its lease
    /// and hasn't noticed yet.
    public static func fencedWriteAllowed<Channel>(row: PlacementRow<Channel>?, writer: NodeID, epoch: Epoch) -> Bool {
        guard let row else { return false }
        return row.home == writer && row.epoch == epoch
    }
}
