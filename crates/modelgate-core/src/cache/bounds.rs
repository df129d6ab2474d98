//! What one cache object may cost: the limits applied when an object is converted (so that what
//! the index keeps of it, and what a decision that consults it costs, is bounded whatever the
//! object holds), and a text buffer that stops growing at its bound (so that a miss's message
//! costs its bound, not the size of what it describes). The CRDs modelgate ships state the same
//! limits as schema limits (`maxItems`, `maxLength`); the API server refuses past them, and
//! modelgate bounds what it reads where another CRD (KServe's own) lets more through.
//! docs/model-cache.md, "Bounds".

use std::fmt::Write as _;

/// The most node groups kept of a cache's `spec.nodeGroups`: duplicates are dropped (the first
/// of each kept, in order), then the groups past this many. The CRDs' `maxItems`.
pub const MAX_NODE_GROUPS: usize = 8;

/// The longest name kept: a node group, a node of `status.nodeStatus` or a `pvcRef` longer than
/// a Kubernetes object name (a DNS subdomain, 253 bytes) cannot name an object. The CRDs'
/// `maxLength` of the names.
pub const MAX_NAME_LEN: usize = 253;

/// The most `NodeDownloaded` entries of `status.nodeStatus` kept per cache (the nodes a hit may
/// pin the pod to), in node-name order. Other states are kept only among the first
/// [`NODE_STATUS_NOTES`] entries: they serve the miss message alone, which names that many.
pub const MAX_DOWNLOADED_NODES: usize = 5_000;

/// The entries of `status.nodeStatus` a `not-downloaded` message describes (one more is kept,
/// to say that there are more).
pub const NODE_STATUS_NOTES: usize = 5;

/// The longest explanation a miss carries (what is missing): the warning built from it is
/// shortened to 256 bytes anyway, so no more is built.
pub const MAX_MISSING_LEN: usize = 256;

/// The longest reason an unusable object is logged with (a decoding error may quote the
/// object's text).
pub const MAX_REASON_LEN: usize = 200;

/// The node groups kept of `groups` (duplicates and those past [`MAX_NODE_GROUPS`] or longer
/// than [`MAX_NAME_LEN`] left out, order kept) and how many were left out. Costs at most
/// `MAX_NODE_GROUPS` comparisons per group listed.
pub fn bound_node_groups(groups: Vec<String>) -> (Vec<String>, usize) {
    let listed = groups.len();
    let mut kept: Vec<String> = Vec::with_capacity(listed.min(MAX_NODE_GROUPS));
    for g in groups {
        if kept.len() == MAX_NODE_GROUPS {
            break;
        }
        if g.len() <= MAX_NAME_LEN && !kept.contains(&g) {
            kept.push(g);
        }
    }
    let dropped = listed - kept.len();
    (kept, dropped)
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub fn clip(text: &str, max: usize) -> String {
    let mut out = BoundedText::new(max);
    out.push(text);
    out.into_string()
}

/// A string that stops growing at its bound: what is pushed past it is dropped, and the text
/// ends with `…` (within the bound). Each push costs at most the bytes it keeps, plus the scan
/// for a character boundary.
#[derive(Debug)]
pub struct BoundedText {
    text: String,
    max: usize,
    full: bool,
}

const ELLIPSIS: &str = "…";

impl BoundedText {
    pub fn new(max: usize) -> Self {
        BoundedText {
            text: String::new(),
            max: max.max(ELLIPSIS.len()),
            full: false,
        }
    }

    /// Whether more text would be dropped.
    pub fn is_full(&self) -> bool {
        self.full
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    pub fn push(&mut self, s: &str) {
        if self.full {
            return;
        }
        if self.text.len() + s.len() <= self.max {
            self.text.push_str(s);
            return;
        }
        // The part that fits with the ellipsis after it, cut at a character boundary.
        let room = self.max.saturating_sub(self.text.len() + ELLIPSIS.len());
        let mut cut = room.min(s.len());
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&s[..cut]);
        // Room was kept for the ellipsis unless the text already filled it.
        if self.text.len() + ELLIPSIS.len() > self.max {
            let mut end = self.max - ELLIPSIS.len();
            while !self.text.is_char_boundary(end) {
                end -= 1;
            }
            self.text.truncate(end);
        }
        self.text.push_str(ELLIPSIS);
        self.full = true;
    }

    /// Formats into the text, within the bound (the formatting stops being paid for once full:
    /// each piece is pushed as it is produced).
    pub fn push_fmt(&mut self, args: std::fmt::Arguments<'_>) {
        if !self.full {
            let _ = self.write_fmt(args);
        }
    }

    pub fn into_string(self) -> String {
        self.text
    }
}

impl std::fmt::Write for BoundedText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s);
        // Stop the formatting once full: what follows would be dropped.
        if self.full {
            Err(std::fmt::Error)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_groups_are_deduplicated_capped_and_in_order() {
        let groups = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            bound_node_groups(groups(&["b", "a", "b", "c"])),
            (groups(&["b", "a", "c"]), 1)
        );
        let many: Vec<String> = (0..150_000).map(|_| "gpu".to_string()).collect();
        assert_eq!(bound_node_groups(many), (groups(&["gpu"]), 149_999));
        let distinct: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
        let (kept, dropped) = bound_node_groups(distinct);
        assert_eq!(
            (kept.len(), dropped),
            (MAX_NODE_GROUPS, 20 - MAX_NODE_GROUPS)
        );
        assert_eq!(kept[0], "g0");
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            bound_node_groups(vec![long, "ok".into()]),
            (groups(&["ok"]), 1)
        );
    }

    #[test]
    fn bounded_text_stops_at_its_bound_on_a_character_boundary() {
        let mut t = BoundedText::new(10);
        t.push("abc");
        t.push("défghijkl");
        assert!(t.is_full());
        let s = t.into_string();
        assert!(s.len() <= 10, "{s}");
        assert!(s.ends_with('…'), "{s}");
        assert!(s.starts_with("abcdéf"), "{s}");
        let mut t = BoundedText::new(10);
        t.push("0123456789");
        assert!(!t.is_full());
        assert_eq!(t.into_string(), "0123456789");
        let mut t = BoundedText::new(8);
        t.push_fmt(format_args!("{}{}", "ééé", "ééé"));
        let s = t.into_string();
        assert!(s.len() <= 8 && s.ends_with('…'), "{s}");
        assert_eq!(clip(&"x".repeat(1 << 20), 20).len(), 20);
        assert_eq!(clip("short", 20), "short");
    }
}
