//! A persistent hash map: cloning it costs O(1), and a change copies only the path from the root
//! to the changed entry (O(log₃₂ n) nodes of at most 32 slots), sharing every other node with
//! the clones. The index is published as an immutable snapshot after each batch of watch
//! events; with this map a snapshot is a clone, and a change costs in proportion to what
//! changed, not to the size of the cluster.
//!
//! A hash array mapped trie: each level branches on 5 bits of the key's hash; a node keeps only
//! its occupied slots (a bitmap says which), so memory stays linear and close to a flat hash
//! map's. Keys with the same 64-bit hash share a collision slot. Each map hashes with its own
//! random keys (`RandomState`), so names chosen by cluster users cannot be aimed at one path.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

const BITS: u32 = 5;
const MASK: u64 = (1 << BITS) - 1;

pub(crate) struct PMap<K, V> {
    root: Node<K, V>,
    len: usize,
    hasher: RandomState,
}

/// A trie node: the occupied slots, in bit order. Shared between clones until written.
struct Node<K, V> {
    bitmap: u32,
    slots: Arc<[Slot<K, V>]>,
}

enum Slot<K, V> {
    Leaf(K, V),
    Branch(Node<K, V>),
    /// Two or more keys whose hashes are equal in all 64 bits.
    Collision(Arc<[(K, V)]>),
}

impl<K, V> Clone for Node<K, V> {
    fn clone(&self) -> Self {
        Node {
            bitmap: self.bitmap,
            slots: self.slots.clone(),
        }
    }
}

impl<K: Clone, V: Clone> Clone for Slot<K, V> {
    fn clone(&self) -> Self {
        match self {
            Slot::Leaf(k, v) => Slot::Leaf(k.clone(), v.clone()),
            Slot::Branch(n) => Slot::Branch(n.clone()),
            Slot::Collision(c) => Slot::Collision(c.clone()),
        }
    }
}

impl<K, V> Clone for PMap<K, V> {
    fn clone(&self) -> Self {
        PMap {
            root: self.root.clone(),
            len: self.len,
            hasher: self.hasher.clone(),
        }
    }
}

impl<K, V> Default for PMap<K, V> {
    fn default() -> Self {
        PMap {
            root: Node {
                bitmap: 0,
                slots: Arc::new([]),
            },
            len: 0,
            hasher: RandomState::new(),
        }
    }
}

/// The slots of a node, copied first if a clone shares them.
fn make_mut<T: Clone>(slots: &mut Arc<[T]>) -> &mut [T] {
    if Arc::get_mut(slots).is_none() {
        *slots = slots.iter().cloned().collect();
    }
    Arc::get_mut(slots).expect("unique after the copy")
}

fn chunk(hash: u64, shift: u32) -> u32 {
    ((hash >> shift) & MASK) as u32
}

impl<K: Clone, V: Clone> Node<K, V> {
    fn position(&self, bit: u32) -> usize {
        (self.bitmap & (bit - 1)).count_ones() as usize
    }

    /// A node holding two slots whose keys' hashes differ (at `shift` or deeper).
    fn pair(shift: u32, (ha, a): (u64, Slot<K, V>), (hb, b): (u64, Slot<K, V>)) -> Node<K, V> {
        let (ca, cb) = (chunk(ha, shift), chunk(hb, shift));
        if ca == cb {
            let inner = Node::pair(shift + BITS, (ha, a), (hb, b));
            return Node {
                bitmap: 1 << ca,
                slots: Arc::new([Slot::Branch(inner)]),
            };
        }
        let slots = if ca < cb { [a, b] } else { [b, a] };
        Node {
            bitmap: (1 << ca) | (1 << cb),
            slots: Arc::new(slots),
        }
    }

    fn with_inserted(&self, at: usize, slot: Slot<K, V>) -> Arc<[Slot<K, V>]> {
        let mut out = Vec::with_capacity(self.slots.len() + 1);
        out.extend_from_slice(&self.slots[..at]);
        out.push(slot);
        out.extend_from_slice(&self.slots[at..]);
        out.into()
    }

    fn with_removed(&self, at: usize) -> Arc<[Slot<K, V>]> {
        let mut out = Vec::with_capacity(self.slots.len() - 1);
        out.extend_from_slice(&self.slots[..at]);
        out.extend_from_slice(&self.slots[at + 1..]);
        out.into()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> PMap<K, V> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let mut node = &self.root;
        let mut shift = 0;
        loop {
            let bit = 1 << chunk(hash, shift);
            if node.bitmap & bit == 0 {
                return None;
            }
            match &node.slots[node.position(bit)] {
                Slot::Leaf(k, v) => return (k.borrow() == key).then_some(v),
                Slot::Branch(next) => node = next,
                Slot::Collision(pairs) => {
                    return pairs
                        .iter()
                        .find(|(k, _)| k.borrow() == key)
                        .map(|(_, v)| v);
                }
            }
            shift += BITS;
        }
    }

    pub(crate) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Adds or replaces; returns the value replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = self.hash(&key);
        let hasher = self.hasher.clone();
        let old = insert(&mut self.root, 0, hash, key, value, &hasher);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes the key out; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Nothing is copied for a key that is not there.
        self.get(key)?;
        let hash = self.hash(key);
        let old = remove(&mut self.root, 0, hash, key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// The value, to change in place (copying the path to it if a clone shares it).
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key)?;
        let hash = self.hash(key);
        let mut node = &mut self.root;
        let mut shift = 0;
        loop {
            let bit = 1 << chunk(hash, shift);
            let at = node.position(bit);
            match &mut make_mut(&mut node.slots)[at] {
                Slot::Leaf(_, v) => return Some(v),
                Slot::Branch(next) => node = next,
                Slot::Collision(pairs) => {
                    return make_mut(pairs)
                        .iter_mut()
                        .find(|(k, _)| k.borrow() == key)
                        .map(|(_, v)| v);
                }
            }
            shift += BITS;
        }
    }

    /// The value under `key`, inserted by `make` first if there is none.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.contains_key(&key) {
            self.insert(key.clone(), make());
        }
        self.get_mut(&key).expect("present")
    }

    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            stack: vec![self.root.slots.iter()],
            pairs: [].iter(),
        }
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

fn insert<K: Hash + Eq + Clone, V: Clone>(
    node: &mut Node<K, V>,
    shift: u32,
    hash: u64,
    key: K,
    value: V,
    hasher: &RandomState,
) -> Option<V> {
    let bit = 1 << chunk(hash, shift);
    let at = node.position(bit);
    if node.bitmap & bit == 0 {
        node.slots = node.with_inserted(at, Slot::Leaf(key, value));
        node.bitmap |= bit;
        return None;
    }
    let slot = &mut make_mut(&mut node.slots)[at];
    match slot {
        Slot::Leaf(k, v) if *k == key => Some(std::mem::replace(v, value)),
        Slot::Branch(next) => insert(next, shift + BITS, hash, key, value, hasher),
        Slot::Collision(pairs) if hasher.hash_one(&pairs[0].0) == hash => {
            let pairs_mut = make_mut(pairs);
            if let Some((_, v)) = pairs_mut.iter_mut().find(|(k, _)| *k == key) {
                return Some(std::mem::replace(v, value));
            }
            let mut all = pairs.to_vec();
            all.push((key, value));
            *pairs = all.into();
            None
        }
        Slot::Leaf(k, _) => {
            let other = hasher.hash_one(&*k);
            *slot = if other == hash {
                let Slot::Leaf(k, v) = slot.clone() else {
                    unreachable!()
                };
                Slot::Collision(Arc::new([(k, v), (key, value)]))
            } else {
                Slot::Branch(Node::pair(
                    shift + BITS,
                    (other, slot.clone()),
                    (hash, Slot::Leaf(key, value)),
                ))
            };
            None
        }
        Slot::Collision(pairs) => {
            let other = hasher.hash_one(&pairs[0].0);
            *slot = Slot::Branch(Node::pair(
                shift + BITS,
                (other, slot.clone()),
                (hash, Slot::Leaf(key, value)),
            ));
            None
        }
    }
}

/// Removes a key known to be present.
fn remove<K, V, Q>(node: &mut Node<K, V>, shift: u32, hash: u64, key: &Q) -> Option<V>
where
    K: Borrow<Q> + Clone,
    V: Clone,
    Q: Eq + ?Sized,
{
    let bit = 1 << chunk(hash, shift);
    if node.bitmap & bit == 0 {
        return None;
    }
    let at = node.position(bit);
    match &mut make_mut(&mut node.slots)[at] {
        Slot::Leaf(k, v) => {
            if (*k).borrow() != key {
                return None;
            }
            let old = v.clone();
            node.slots = node.with_removed(at);
            node.bitmap &= !bit;
            Some(old)
        }
        slot @ Slot::Branch(_) => {
            let Slot::Branch(next) = slot else {
                unreachable!()
            };
            let old = remove(next, shift + BITS, hash, key)?;
            // A branch left with one leaf or collision is replaced by it, so that the trie
            // keeps no chain of one-slot nodes.
            if next.slots.len() == 1 && !matches!(next.slots[0], Slot::Branch(_)) {
                *slot = next.slots[0].clone();
            } else if next.slots.is_empty() {
                node.slots = node.with_removed(at);
                node.bitmap &= !bit;
            }
            Some(old)
        }
        slot @ Slot::Collision(_) => {
            let Slot::Collision(pairs) = slot else {
                unreachable!()
            };
            let i = pairs.iter().position(|(k, _)| k.borrow() == key)?;
            let old = pairs[i].1.clone();
            let mut rest = pairs.to_vec();
            rest.remove(i);
            *slot = if rest.len() == 1 {
                let (k, v) = rest.pop().expect("one left");
                Slot::Leaf(k, v)
            } else {
                Slot::Collision(rest.into())
            };
            Some(old)
        }
    }
}

pub(crate) struct Iter<'a, K, V> {
    stack: Vec<std::slice::Iter<'a, Slot<K, V>>>,
    pairs: std::slice::Iter<'a, (K, V)>,
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((k, v)) = self.pairs.next() {
                return Some((k, v));
            }
            let top = self.stack.last_mut()?;
            match top.next() {
                None => {
                    self.stack.pop();
                }
                Some(Slot::Leaf(k, v)) => return Some((k, v)),
                Some(Slot::Branch(n)) => self.stack.push(n.slots.iter()),
                Some(Slot::Collision(pairs)) => self.pairs = pairs.iter(),
            }
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone + PartialEq> PartialEq for PMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl<K: Hash + Eq + Clone, V: Clone + Eq> Eq for PMap<K, V> {}

impl<K: fmt::Debug + Hash + Eq + Clone, V: fmt::Debug + Clone> fmt::Debug for PMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
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
        // Emptied, the trie holds nothing.
        for k in model.keys() {
            map.remove(k);
        }
        assert!(map.is_empty());
        assert_eq!(map.root.slots.len(), 0);
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
    fn a_clone_costs_nothing_and_a_change_copies_one_path() {
        let map: PMap<u32, u32> = (0..100_000).map(|i| (i, i)).collect();
        let mut copy = map.clone();
        assert!(Arc::ptr_eq(&map.root.slots, &copy.root.slots));
        copy.insert(7, 0);
        // Of the root's 32 subtrees, 31 are still shared.
        let shared = map
            .root
            .slots
            .iter()
            .zip(copy.root.slots.iter())
            .filter(|(a, b)| match (a, b) {
                (Slot::Branch(a), Slot::Branch(b)) => Arc::ptr_eq(&a.slots, &b.slots),
                _ => false,
            })
            .count();
        assert_eq!(shared, 31);
        assert_eq!((map.get(&7), copy.get(&7)), (Some(&7), Some(&0)));
        assert_eq!(map, map.clone());
        assert_ne!(map, copy);
    }
}
