//! A persistent hash map: cloning it costs O(1), and a change copies only the path from the root
//! to the changed entry, sharing every other node with the clones. The index is published as an
//! immutable snapshot after each batch of watch events; with this map a snapshot is a clone, and
//! a change costs in proportion to what changed, not to the size of the cluster.
//!
//! The trie is `rpds`'s hash array mapped trie (`HashTrieMapSync`, atomic reference counts);
//! this wrapper gives it the `HashMap`-like calls the index makes (an insert or removal that
//! returns the old value, `get_or_insert_with`). Each map hashes with its own random keys
//! (`RandomState`), so names chosen by cluster users cannot be aimed at one path.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use rpds::HashTrieMapSync;

pub(crate) struct PMap<K, V>(HashTrieMapSync<K, V>);

impl<K: Hash + Eq, V> Clone for PMap<K, V> {
    fn clone(&self) -> Self {
        PMap(self.0.clone())
    }
}

impl<K: Hash + Eq, V> Default for PMap<K, V> {
    fn default() -> Self {
        PMap(HashTrieMapSync::new_sync())
    }
}

impl<K: Hash + Eq + Clone, V: Clone> PMap<K, V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.size()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.get(key)
    }

    pub(crate) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.contains_key(key)
    }

    /// Adds or replaces; returns the value replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.0.get(&key).cloned();
        self.0.insert_mut(key, value);
        old
    }

    /// Takes the key out; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Nothing is copied for a key that is not there.
        let old = self.0.get(key)?.clone();
        self.0.remove_mut(key);
        Some(old)
    }

    /// The value, to change in place (copying the path to it if a clone shares it).
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // rpds copies the path before it knows whether the key is there.
        self.0.get(key)?;
        self.0.get_mut(key)
    }

    /// The value under `key`, inserted by `make` first if there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.0.contains_key(&key) {
            self.0.insert_mut(key.clone(), make());
        }
        self.0.get_mut(&key).expect("present")
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.keys()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.values()
    }
}

impl<K: Hash + Eq, V: PartialEq> PartialEq for PMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<K: Hash + Eq, V: Eq> Eq for PMap<K, V> {}

impl<K: fmt::Debug + Hash + Eq, V: fmt::Debug> fmt::Debug for PMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter()).finish()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> FromIterator<(K, V)> for PMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = PMap::new();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::Hasher;

    /// A key whose hash the test chooses, to make collisions and deep paths on purpose.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Forced(u64, u32);

    impl Hash for Forced {
        fn hash<H: Hasher>(&self, state: &mut H) {
            self.0.hash(state);
        }
    }

    /// Checks the map against a std HashMap after each of a long pseudo-random sequence of
    /// inserts, replacements and removals, with a clone taken along the way that must not move.
    fn against_std<K: Hash + Eq + Clone + fmt::Debug>(key: impl Fn(u64) -> K, keys: u64) {
        let mut map = PMap::new();
        let mut model = HashMap::new();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut frozen: Option<(PMap<K, u64>, HashMap<K, u64>)> = None;
        for step in 0..20_000u64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = key(state % keys);
            match state % 5 {
                0..=2 => assert_eq!(map.insert(k.clone(), step), model.insert(k, step)),
                3 => assert_eq!(map.remove(&k), model.remove(&k)),
                _ => {
                    if let Some(v) = map.get_mut(&k) {
                        *v += 1;
                    }
                    if let Some(v) = model.get_mut(&k) {
                        *v += 1;
                    }
                }
            }
            assert_eq!(map.len(), model.len());
            if step == 7_000 {
                frozen = Some((map.clone(), model.clone()));
            }
        }
        for (k, v) in &model {
            assert_eq!(map.get(k), Some(v), "{k:?}");
        }
        assert_eq!(map.iter().count(), model.len());
        let (map_then, model_then) = frozen.unwrap();
        assert_eq!(map_then.len(), model_then.len());
        for (k, v) in map_then.iter() {
            assert_eq!(model_then.get(k), Some(v), "a clone kept its state: {k:?}");
        }
        for k in model.keys() {
            map.remove(k);
        }
        assert!(map.is_empty());
        assert_eq!(map.iter().count(), 0);
    }

    #[test]
    fn behaves_as_a_hash_map_with_clones_unaffected() {
        against_std(|i| format!("pvc-{i}"), 3_000);
    }

    #[test]
    fn colliding_and_near_colliding_hashes() {
        // 40 distinct keys on 8 hashes that share their low 60 bits: full collisions and
        // paths down to the last level.
        against_std(|i| Forced((i % 8) << 60 | 0xabc, (i / 8) as u32), 40);
    }

    #[test]
    fn a_clone_is_a_snapshot() {
        let map: PMap<u32, u32> = (0..100_000).map(|i| (i, i)).collect();
        let mut copy = map.clone();
        assert!(copy.0.ptr_eq(&map.0));
        copy.insert(7, 0);
        *copy.get_or_insert_with(100_001, || 5) += 1;
        assert_eq!(*copy.get_or_insert_with(100_001, || 9), 6);
        assert_eq!(*copy.get_or_insert_with(3, || 9), 3);
        assert_eq!((map.get(&7), copy.get(&7)), (Some(&7), Some(&0)));
        assert_eq!(map.get(&100_001), None);
        assert_eq!(map, map.clone());
        assert_ne!(map, copy);
    }
}
