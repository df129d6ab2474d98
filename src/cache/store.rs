//! The cache index as the server shares it: one published snapshot that admissions read without
//! locking, replaced whole by the cache source (files, or the cluster watch).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use super::CacheIndex;
use crate::policy::Caches;

#[derive(Debug, Default)]
pub struct CacheStore {
    current: ArcSwap<CacheIndex>,
    synced: AtomicBool,
}

/// What one admission holds on to: a snapshot and whether it may be trusted.
pub struct CacheView {
    pub index: Arc<CacheIndex>,
    pub synced: bool,
}

impl CacheView {
    pub fn caches(&self) -> Caches<'_> {
        if self.synced {
            Caches::Ready(&self.index)
        } else {
            Caches::NotSynced(&self.index)
        }
    }
}

impl CacheStore {
    /// A store that is synced from the start, for static caches (`--caches`, `--no-cluster`).
    pub fn fixed(index: CacheIndex) -> Self {
        CacheStore {
            current: ArcSwap::from_pointee(index),
            synced: AtomicBool::new(true),
        }
    }

    /// A store that waits for its source's first full list.
    pub fn unsynced(index: CacheIndex) -> Self {
        CacheStore {
            current: ArcSwap::from_pointee(index),
            synced: AtomicBool::new(false),
        }
    }

    pub fn view(&self) -> CacheView {
        // The flag first: a source publishes the complete index before it sets the flag, so an
        // index loaded after seeing `true` is at least that one. Loading the index first could
        // pair an older, incomplete index with a flag set just after.
        let synced = self.synced.load(Ordering::Acquire);
        CacheView {
            index: self.current.load_full(),
            synced,
        }
    }

    pub fn publish(&self, index: CacheIndex) {
        self.current.store(Arc::new(index));
    }

    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

/// Hands pages the allocator holds but no longer uses back to the OS: called after a large
/// structure is freed (the JSON of `--caches`, a replaced index), since the allocator otherwise
/// keeps them until the freeing thread allocates again, which a serving thread rarely does.
pub fn release_freed_memory() {
    // SAFETY: mi_collect only walks mimalloc's own heaps; it is callable at any time, also when
    // mimalloc is not the global allocator (then there is nothing to collect).
    unsafe { libmimalloc_sys::mi_collect(true) }
}
