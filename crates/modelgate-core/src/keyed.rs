//! Maps kept as sorted vectors of pairs: smaller and faster to build than a tree map for the
//! handful of keys an object has.

/// Sorts `entries` by key and keeps, of each key given more than once, the last one given: how
/// Kubernetes' JSON decoding reads a key written twice.
pub(crate) fn sort_keeping_last<K: Ord, V>(entries: &mut Vec<(K, V)>) {
    // A stable sort keeps repeated keys in their order, so the last of each run is the last
    // one written.
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            std::mem::swap(later, earlier);
        }
        same
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn sorted_by_key_and_the_last_of_a_repeated_key_wins() {
        let mut entries = vec![("b", 1), ("a", 2), ("b", 3), ("c", 4), ("b", 5)];
        super::sort_keeping_last(&mut entries);
        assert_eq!(entries, [("a", 2), ("b", 5), ("c", 4)]);
    }
}
