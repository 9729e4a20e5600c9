/// A binary min-heap of keyed values: the smallest key first, O(log n) to add or take one. Used for
/// the endpoint's connection deadlines and for the offsets of stream fragments waiting to be read.
struct MinHeap<Key: Comparable, Value> {
    private var items: [(Key, Value)] = []

    var count: Int { items.count }

    /// Empties the heap but keeps its storage, so refilling it allocates nothing.
    mutating func removeAll() { items.removeAll(keepingCapacity: true) }

    func peek() -> (Key, Value)? { items.first }

    mutating func push(_ key: Key, _ value: Value) {
        items.append((key, value))
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].0 < items[parent].0 else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes the smallest.
    mutating func pop() {
        guard !items.isEmpty else { return }
        items.swapAt(0, items.count - 1)
        items.removeLast()
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < items.count, items[left].0 < items[smallest].0 { smallest = left }
            if right < items.count, items[right].0 < items[smallest].0 { smallest = right }
            guard smallest != parent else { return }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
