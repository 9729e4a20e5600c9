/// A first-in, first-out queue of events that reuses its storage: connections, the endpoint and the
/// client each hand events out one at a time through `nextEvent()`.
struct EventQueue<Event> {
    private var items: [Event] = []
    private var head = 0

    mutating func append(_ event: Event) { items.append(event) }

    mutating func next() -> Event? {
        guard head < items.count else {
            if head > 0 { items.removeAll(keepingCapacity: true); head = 0 }
            return nil
        }
        defer { head += 1 }
        return items[head]
    }
}
