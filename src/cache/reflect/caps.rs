//! The caps on the kinds tenants create in their own namespaces, per namespace and over all
//! namespaces: `LocalModelNamespaceCache` (`--max-caches-per-namespace`,
//! `--max-namespace-caches`) and `ModelgateException` (`--max-exceptions-per-namespace`,
//! `--max-exceptions`). The objects kept are the oldest: walking
//! every namespace cache from the oldest (`metadata.creationTimestamp`, then namespace, then
//! name), one is kept when its namespace and the total are both below their caps. The newest
//! excess is ignored: never converted into the index, never held by the watch, counted.
//!
//! [`Selection`] keeps that set as objects are offered one by one, in any order (a list comes
//! in name order): an object older than the newest kept one of a full namespace (or of a full
//! total) takes its place, and the one it displaces is ignored. What is held is the ranks of the
//! kept objects, so its memory is bounded by the caps, not by what a namespace creates.
//!
//! An object that is deleted frees a place; an object ignored since the last list may be owed
//! it, but is no longer known: [`Selection::remove`] says so, and the watch relists the kind
//! (rate-limited) to find it. Until then a newer object is not given the place.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::super::SkipReason;
use super::super::cluster::{Kind, ObjectKey};

/// The capped kinds, with the flags that set their caps (per namespace, total).
pub(crate) fn cap_flags(kind: Kind) -> Option<(&'static str, &'static str)> {
    match kind {
        Kind::NamespaceCache => Some(("--max-caches-per-namespace", "--max-namespace-caches")),
        Kind::Exception => Some(("--max-exceptions-per-namespace", "--max-exceptions")),
        _ => None,
    }
}

/// The caps of one kind, as the flags set them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// `--max-caches-per-namespace`.
    pub per_namespace: usize,
    /// `--max-namespace-caches`: over all namespaces.
    pub total: usize,
}

impl CacheLimits {
    pub const DEFAULT_PER_NAMESPACE: usize = 1_000;
    pub const DEFAULT_TOTAL: usize = 20_000;
    /// `ModelgateException`s: a handful per namespace is the use, and every admission in a
    /// namespace reads all of that namespace's exceptions (docs/exceptions.md, "Bounds").
    pub const DEFAULT_EXCEPTIONS: CacheLimits = CacheLimits {
        per_namespace: 100,
        total: 10_000,
    };
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            per_namespace: Self::DEFAULT_PER_NAMESPACE,
            total: Self::DEFAULT_TOTAL,
        }
    }
}

/// Where an object stands among the caches of its kind: older first, then by namespace and
/// name. An object without a creation time (the API server always sets one) is the newest.
type Rank = (i64, Arc<str>, Arc<str>);

/// Within one namespace: creation time and name.
type NamespaceRank = (i64, Arc<str>);

/// What became of an object offered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// It was kept already (an update).
    Kept,
    /// Kept now; these kept objects are ignored from now on to make room for it.
    Admitted {
        displaced: Vec<(ObjectKey, SkipReason)>,
    },
    /// Ignored: a cap is reached by older objects.
    Refused(SkipReason),
}

/// The namespace caches kept, by the rule of the module docs. Below the caps it holds one
/// creation time per kept object; the orders it needs to find the newest kept object are built
/// when a namespace, or the total, reaches its cap, and kept up from then on.
pub(crate) struct Selection {
    limits: CacheLimits,
    /// namespace → name → creation time, of every kept object.
    kept: HashMap<Arc<str>, HashMap<Arc<str>, i64>>,
    total: usize,
    /// The kept objects of each namespace that reached its cap, in order.
    namespace_order: HashMap<Arc<str>, BTreeSet<NamespaceRank>>,
    /// Once the total reached its cap: every kept object, in order.
    all_order: Option<BTreeSet<Rank>>,
    /// The oldest object the total refused since the last list: a newer one is refused too
    /// (a place freed meanwhile is owed to an ignored object, found by the next list).
    total_refused: Option<Rank>,
    /// Likewise per namespace.
    namespace_refused: HashMap<Arc<str>, NamespaceRank>,
}

impl Selection {
    pub(crate) fn new(limits: CacheLimits) -> Self {
        Selection {
            limits,
            kept: HashMap::new(),
            total: 0,
            namespace_order: HashMap::new(),
            all_order: None,
            total_refused: None,
            namespace_refused: HashMap::new(),
        }
    }

    /// Forgets everything: a list starts over.
    pub(crate) fn reset(&mut self) {
        *self = Selection::new(self.limits);
    }

    /// How many objects are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// Offers an object of `key` created at `created` (Unix seconds).
    pub(crate) fn offer(&mut self, key: &ObjectKey, created: i64) -> Offer {
        let (ns, name) = key;
        let in_namespace = self.kept.get(ns).map_or(0, HashMap::len);
        if in_namespace > 0 && self.kept[ns].contains_key(name) {
            return Offer::Kept;
        }
        let rank: Rank = (created, ns.clone(), name.clone());
        if self.total_refused.as_ref().is_some_and(|t| rank > *t) {
            return Offer::Refused(SkipReason::OverTotalCap);
        }
        let namespace_rank: NamespaceRank = (created, name.clone());
        if self
            .namespace_refused
            .get(ns)
            .is_some_and(|t| namespace_rank > *t)
        {
            return Offer::Refused(SkipReason::OverNamespaceCap);
        }
        let mut displaced = Vec::new();
        if in_namespace >= self.limits.per_namespace {
            let newest = self.namespace_order(ns).last().cloned().expect("full");
            if namespace_rank > newest {
                refused_at(self.namespace_refused.entry(ns.clone()), namespace_rank);
                return Offer::Refused(SkipReason::OverNamespaceCap);
            }
            self.forget(&(newest.0, ns.clone(), newest.1.clone()));
            displaced.push(((ns.clone(), newest.1.clone()), SkipReason::OverNamespaceCap));
            refused_at(self.namespace_refused.entry(ns.clone()), newest);
        }
        self.kept
            .entry(ns.clone())
            .or_default()
            .insert(name.clone(), created);
        self.total += 1;
        if let Some(order) = self.namespace_order.get_mut(ns) {
            order.insert(namespace_rank);
        }
        if let Some(all) = &mut self.all_order {
            all.insert(rank.clone());
        }
        if self.total > self.limits.total {
            let newest = self.all_order().last().cloned().expect("over the cap");
            self.forget(&newest);
            let is_offered = newest == rank;
            self.total_refused = Some(match self.total_refused.take() {
                Some(t) if t < newest => t,
                _ => newest.clone(),
            });
            if is_offered {
                return Offer::Refused(SkipReason::OverTotalCap);
            }
            displaced.push(((newest.1, newest.2), SkipReason::OverTotalCap));
        }
        Offer::Admitted { displaced }
    }

    /// Takes a kept object out (deleted, or no longer usable). Returns whether an ignored
    /// object may be owed its place: its namespace or the total refused one since the last
    /// list. Nothing happens for an object that is not kept.
    pub(crate) fn remove(&mut self, key: &ObjectKey) -> bool {
        let (ns, name) = key;
        let Some(created) = self.kept.get(ns).and_then(|n| n.get(name)) else {
            return false;
        };
        self.forget(&(*created, ns.clone(), name.clone()));
        self.total_refused.is_some() || self.namespace_refused.contains_key(ns)
    }

    /// The kept objects of `ns` in order, built now if they were not kept in order yet.
    fn namespace_order(&mut self, ns: &Arc<str>) -> &mut BTreeSet<NamespaceRank> {
        let kept = &self.kept;
        self.namespace_order.entry(ns.clone()).or_insert_with(|| {
            kept.get(ns)
                .into_iter()
                .flatten()
                .map(|(name, created)| (*created, name.clone()))
                .collect()
        })
    }

    /// Every kept object in order, built now if they were not kept in order yet.
    fn all_order(&mut self) -> &mut BTreeSet<Rank> {
        let kept = &self.kept;
        self.all_order.get_or_insert_with(|| {
            kept.iter()
                .flat_map(|(ns, names)| {
                    names
                        .iter()
                        .map(|(name, created)| (*created, ns.clone(), name.clone()))
                })
                .collect()
        })
    }

    /// Takes a kept object out of everything that holds it.
    fn forget(&mut self, rank: &Rank) {
        let (created, ns, name) = rank;
        if let Some(names) = self.kept.get_mut(ns)
            && names.remove(name).is_some()
        {
            self.total -= 1;
            if names.is_empty() {
                self.kept.remove(ns);
                self.namespace_order.remove(ns);
            }
        }
        if let Some(order) = self.namespace_order.get_mut(ns) {
            order.remove(&(*created, name.clone()));
        }
        if let Some(all) = &mut self.all_order {
            all.remove(rank);
        }
    }
}

/// Keeps the older of what `slot` holds and `rank`.
fn refused_at(
    slot: std::collections::hash_map::Entry<'_, Arc<str>, NamespaceRank>,
    rank: NamespaceRank,
) {
    slot.and_modify(|t| {
        if rank < *t {
            *t = rank.clone();
        }
    })
    .or_insert(rank);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    /// The rule of the module docs, applied to every object at once.
    fn expected(objects: &[(ObjectKey, i64)], limits: CacheLimits) -> BTreeSet<ObjectKey> {
        let mut sorted: Vec<Rank> = objects
            .iter()
            .map(|((ns, name), t)| (*t, ns.clone(), name.clone()))
            .collect();
        sorted.sort();
        let mut per: HashMap<Arc<str>, usize> = HashMap::new();
        let mut kept = BTreeSet::new();
        for (_, ns, name) in sorted {
            let n = per.entry(ns.clone()).or_default();
            if *n < limits.per_namespace && kept.len() < limits.total {
                *n += 1;
                kept.insert((ns, name));
            }
        }
        kept
    }

    /// Offers every object; returns what is kept, checking the offers' answers against it.
    fn select(objects: &[(ObjectKey, i64)], limits: CacheLimits) -> BTreeSet<ObjectKey> {
        let mut s = Selection::new(limits);
        let mut kept = BTreeSet::new();
        for (k, t) in objects {
            match s.offer(k, *t) {
                Offer::Kept => assert!(kept.contains(k)),
                Offer::Admitted { displaced } => {
                    for (d, _) in displaced {
                        assert!(kept.remove(&d), "{d:?} displaced but not kept");
                    }
                    kept.insert(k.clone());
                }
                Offer::Refused(_) => {}
            }
        }
        assert_eq!(s.len(), kept.len());
        kept
    }

    #[test]
    fn the_oldest_are_kept_whatever_order_they_are_offered_in() {
        let mut state = 0x853c_49e6_748f_ea9bu64;
        let mut r = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..2_000 {
            let limits = CacheLimits {
                per_namespace: 1 + r(6) as usize,
                total: 1 + r(20) as usize,
            };
            let objects: Vec<(ObjectKey, i64)> = (0..r(40))
                .map(|i| (key(&format!("ns{}", r(5)), &format!("o{i}")), r(30) as i64))
                .collect();
            assert_eq!(
                select(&objects, limits),
                expected(&objects, limits),
                "round {round}: {limits:?} {objects:?}"
            );
        }
    }

    #[test]
    fn the_newest_past_a_cap_are_refused_and_a_freed_place_waits_for_a_list() {
        let limits = CacheLimits {
            per_namespace: 2,
            total: 3,
        };
        let mut s = Selection::new(limits);
        let admitted = Offer::Admitted { displaced: vec![] };
        assert_eq!(s.offer(&key("a", "x"), 10), admitted);
        assert_eq!(s.offer(&key("a", "x"), 10), Offer::Kept);
        assert_eq!(s.offer(&key("a", "y"), 20), admitted);
        assert_eq!(
            s.offer(&key("a", "z"), 30),
            Offer::Refused(SkipReason::OverNamespaceCap)
        );
        // An older one displaces the namespace's newest.
        assert_eq!(
            s.offer(&key("a", "w"), 5),
            Offer::Admitted {
                displaced: vec![(key("a", "y"), SkipReason::OverNamespaceCap)]
            }
        );
        assert_eq!(s.offer(&key("b", "x"), 40), admitted);
        assert_eq!(
            s.offer(&key("c", "x"), 50),
            Offer::Refused(SkipReason::OverTotalCap)
        );
        assert_eq!(
            s.offer(&key("c", "old"), 1),
            Offer::Admitted {
                displaced: vec![(key("b", "x"), SkipReason::OverTotalCap)]
            }
        );
        // Another namespace's deletion frees a place the total refused: a list must find who
        // is owed it; meanwhile a new object does not take it.
        assert!(s.remove(&key("c", "old")));
        assert_eq!(
            s.offer(&key("d", "new"), 60),
            Offer::Refused(SkipReason::OverTotalCap)
        );
        assert!(!s.remove(&key("d", "new")), "not kept");
        // A list starts over.
        s.reset();
        assert_eq!(s.len(), 0);
        assert_eq!(s.offer(&key("d", "new"), 60), admitted);
        // Nothing was refused: a deletion owes nothing.
        assert!(!s.remove(&key("d", "new")));
    }
}
