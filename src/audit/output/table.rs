//! `audit -o table` (the default): counts per namespace and per rule, then each denial, then
//! each finding of a rule that only warns.

use crate::audit::{Counts, Report};
use crate::policy::Rule;

impl Report {
    /// The human report: a table per namespace, one per rule, then each denial.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut rows = vec![[
            "NAMESPACE".to_string(),
            "OBJECTS".into(),
            "PATCHED".into(),
            "DENIED".into(),
            "UNCHANGED".into(),
        ]];
        for (name, ns) in &self.namespaces {
            rows.push(count_row(name, ns.counts));
        }
        rows.push(count_row("(all)", self.counts));
        out.push_str(&render(&rows));
        out.push('\n');
        let mut rows = vec![[
            "RULE".to_string(),
            "OBJECTS".into(),
            "PATCHED".into(),
            "DENIED".into(),
            "UNCHANGED".into(),
        ]];
        // A rule that only warns patches and denies nothing: its findings are listed below.
        for rule in Rule::ALL.into_iter().filter(|r| !r.warns_only()) {
            let counts = self.rules.get(rule.as_str()).copied().unwrap_or_default();
            rows.push(count_row(
                &format!("{} ({})", rule.as_str(), rule.section()),
                counts,
            ));
        }
        out.push_str(&render(&rows));
        if !self.denials.is_empty() {
            out.push_str(&format!("\nDENIED ({}):\n", self.denials.len()));
            for d in &self.denials {
                out.push_str(&format!(
                    "{} {}/{} ({}): {}\n",
                    d.kind.as_str(),
                    d.namespace,
                    d.name,
                    d.origin,
                    d.message
                ));
            }
        }
        if !self.warnings.is_empty() {
            out.push_str(&format!("\nWARNINGS ({}):\n", self.warnings.len()));
            for w in &self.warnings {
                out.push_str(&format!(
                    "{} {}/{} ({}): {}: {}\n",
                    w.kind.as_str(),
                    w.namespace,
                    w.name,
                    w.origin,
                    w.rule,
                    w.message
                ));
            }
        }
        if let Some(images) = &self.images {
            out.push_str(&images_section(images));
        }
        if !self.exceptions.is_empty() {
            out.push_str(&self.exceptions.table());
        }
        if !self.exempt.is_empty() {
            let list: Vec<String> = self
                .exempt
                .iter()
                .map(|(ns, n)| format!("{ns} ({n})"))
                .collect();
            out.push_str(&format!(
                "\nNot evaluated, exempt namespaces: {}\n",
                list.join(", ")
            ));
        }
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }
}

/// `--images`: the workloads whose `image-user` result is `warn` or `error`, each with why.
fn images_section(images: &crate::audit::images::ImagesAudit) -> String {
    use crate::audit::Status;
    let flagged: Vec<_> = images
        .results
        .iter()
        .filter(|r| matches!(r.status, Status::Warn | Status::Error))
        .collect();
    let mut out = format!(
        "\nIMAGE USER ({} of {} workloads):\n",
        flagged.len(),
        images.results.len()
    );
    for r in flagged {
        out.push_str(&format!(
            "{} {}/{}: {}: {}\n",
            r.kind,
            r.namespace,
            r.name,
            r.status.as_str(),
            r.message
        ));
    }
    for note in &images.notes {
        out.push_str(&format!("note: images: {note}\n"));
    }
    out
}

fn count_row(label: &str, c: Counts) -> [String; 5] {
    [
        label.to_string(),
        c.objects().to_string(),
        c.patched.to_string(),
        c.denied.to_string(),
        c.unchanged.to_string(),
    ]
}

/// Columns left-aligned, two spaces apart.
fn render(rows: &[[String; 5]]) -> String {
    let mut widths = [0; 5];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
