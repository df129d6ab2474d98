//! What `audit` writes: the table (the default), the whole report as JSON, JUnit XML, and the
//! policy reports (`openreports.io` `Report`, `wgpolicyk8s.io` `PolicyReport`) that
//! `--write-reports` also applies to the cluster.

mod junit;
pub mod reports;
mod table;

use std::io::{self, Write};

use super::Report;

impl Report {
    /// The whole report as one pretty-printed JSON object and a line break.
    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        writeln!(out)
    }
}
