//! JUnit XML reports (`review -o junit`, `audit -o junit`), the format CI systems (GitLab,
//! Jenkins, GitHub test reporters) show as a list of passed and failed checks: one test case per
//! object, a `<failure>` per denial.

use std::io::{self, Write};

/// One checked object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Case {
    /// Where the object came from (file and document, or `namespace/Kind/name`).
    pub classname: String,
    /// The object (`Pod team-a/llm`).
    pub name: String,
    /// The denial message, when the object is denied.
    pub failure: Option<String>,
    /// What would change and the warnings, shown beside a passing case.
    pub output: Option<String>,
}

/// A group of cases (the review's inputs, an audited namespace).
#[derive(Clone, Debug, Default)]
pub struct Suite {
    pub name: String,
    pub cases: Vec<Case>,
}

/// Writes the suites as one `<testsuites>` document.
pub fn write(out: &mut dyn Write, name: &str, suites: &[Suite]) -> io::Result<()> {
    let count = |s: &Suite| s.cases.len();
    let failed = |s: &Suite| s.cases.iter().filter(|c| c.failure.is_some()).count();
    let tests: usize = suites.iter().map(count).sum();
    let failures: usize = suites.iter().map(failed).sum();
    writeln!(out, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
    writeln!(
        out,
        r#"<testsuites name="{}" tests="{tests}" failures="{failures}" errors="0">"#,
        escape(name)
    )?;
    for suite in suites {
        writeln!(
            out,
            r#"  <testsuite name="{}" tests="{}" failures="{}" errors="0" skipped="0">"#,
            escape(&suite.name),
            count(suite),
            failed(suite)
        )?;
        for case in &suite.cases {
            write!(
                out,
                r#"    <testcase classname="{}" name="{}""#,
                escape(&case.classname),
                escape(&case.name)
            )?;
            if case.failure.is_none() && case.output.is_none() {
                writeln!(out, "/>")?;
                continue;
            }
            writeln!(out, ">")?;
            if let Some(message) = &case.failure {
                let message = escape(message);
                writeln!(
                    out,
                    r#"      <failure type="denied" message="{message}">{message}</failure>"#
                )?;
            }
            if let Some(output) = &case.output {
                writeln!(out, "      <system-out>{}</system-out>", escape(output))?;
            }
            writeln!(out, "    </testcase>")?;
        }
        writeln!(out, "  </testsuite>")?;
    }
    writeln!(out, "</testsuites>")
}

/// Text as XML attribute or element content. Characters XML 1.0 cannot carry at all (control
/// characters other than tab and line breaks) become U+FFFD.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_failures_and_escapes_what_xml_cannot_hold() {
        let suites = [Suite {
            name: "inputs".into(),
            cases: vec![
                Case {
                    classname: "a.yaml".into(),
                    name: "Pod default/a".into(),
                    ..Default::default()
                },
                Case {
                    classname: "b.yaml#2".into(),
                    name: "Job <x> & \"y\"".into(),
                    failure: Some("runAsUser: 0 is outside 1..2147483647\u{1}".into()),
                    output: Some("would set\nthings".into()),
                },
            ],
        }];
        let mut out = Vec::new();
        write(&mut out, "modelgate review", &suites).unwrap();
        let xml = String::from_utf8(out).unwrap();
        assert!(
            xml.contains(
                r#"<testsuites name="modelgate review" tests="2" failures="1" errors="0">"#
            ),
            "{xml}"
        );
        assert!(
            xml.contains(r#"<testcase classname="a.yaml" name="Pod default/a"/>"#),
            "{xml}"
        );
        assert!(
            xml.contains(r#"name="Job &lt;x&gt; &amp; &quot;y&quot;""#),
            "{xml}"
        );
        assert!(xml.contains("1..2147483647\u{fffd}</failure>"), "{xml}");
        assert!(
            xml.contains("<system-out>would set&#10;things</system-out>"),
            "{xml}"
        );
        assert!(!xml.contains('\u{1}'));
    }
}
