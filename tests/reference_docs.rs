//! The reference pages cannot drift from the binary.
//!
//! - `docs/cli.md`: for every command `modelgate --help` lists, `modelgate <command> --help` is
//!   read, and every long flag must have a row in that command's section (or, for a command
//!   whose section links to `#policy-flags`, in the "Policy flags" section), whose flag column
//!   names it as `` `--flag` `` (and its short form), whose environment column names exactly its
//!   `[env: X]` (`—` when it has none), and whose default column names its `[default: Y]`. No
//!   row may name a flag the command does not have, and every exit code the help lists must be
//!   in the section's exit table, and no other. Every link of the page reaches a page and a
//!   heading or anchor that exist.
//! - `docs/operations.md`, section "Metrics": every metric family a fresh `serve` exports, with
//!   and without a cluster (the fake API server of `tests/support`, as tests/serve_cluster.rs
//!   runs it), must have a row, with its type and its label names when the table has those
//!   columns; and every row must name a family one of the two exports. The fake API server
//!   holds one `ModelgateException`, so that the families with a series per exception have one.
//!
//! - `docs/annotations.md`: every `modelgate.io/` annotation or label key that a string literal of
//!   `crates/modelgate-core/src` or `src` quotes (API versions such as `modelgate.io/v1alpha1`
//!   aside) must have a row whose key column names it in backticks; every link of the page
//!   reaches a page and a heading or anchor that exist.
//!
//! A flag, variable, default, exit code, metric or key added without its row fails here, naming
//! it.

mod common;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{ServerProcess, TestPki, serve_command_against};
use support::fake_apiserver::{CACHES, EXCEPTIONS, FakeApiServer, NAMESPACE_CACHES, NODE_GROUPS};

const CLI_DOC: &str = "docs/cli.md";
const METRICS_DOC: &str = "docs/operations.md";
const ANNOTATIONS_DOC: &str = "docs/annotations.md";
/// The section of docs/cli.md that holds the flags `serve`, `review`, `audit` and `backstop`
/// share; a command's section takes them by linking to it.
const POLICY_SECTION: &str = "Policy flags";
const POLICY_LINK: &str = "(#policy-flags)";
/// Flags every command has, documented once in the page's conventions.
const GENERIC_FLAGS: [&str; 2] = ["help", "version"];

fn read_doc(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Fails with every problem found at once, one per line.
fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n- {}",
        problems.len(),
        problems.join("\n- ")
    );
}

// ---------------------------------------------------------------------------------------------
// Markdown: sections and tables

/// The `## ` sections of a page: heading (backticks removed) and body, up to the next `## `.
fn sections(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && let Some(heading) = line.strip_prefix("## ") {
            out.push((heading.replace('`', "").trim().to_string(), String::new()));
            continue;
        }
        if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

fn section<'a>(sections: &'a [(String, String)], name: &str) -> Option<&'a str> {
    sections
        .iter()
        .find(|(heading, _)| heading == name)
        .map(|(_, body)| body.as_str())
}

/// The cells of a table row, split at the `|` that are not escaped (`\|`), trimmed.
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell).trim().to_string()),
            _ => cell.push(c),
        }
    }
    out.push(cell.trim().to_string());
    out
}

/// A table: its header cells (lower case) and its rows.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }
}

/// Every table of `body`: runs of lines starting with `|`, the first the header, the second
/// the separator.
fn tables(body: &str) -> Vec<Table> {
    let mut out = Vec::new();
    let mut run: Vec<&str> = Vec::new();
    for line in body.lines().chain(std::iter::once("")) {
        if line.trim_start().starts_with('|') {
            run.push(line);
            continue;
        }
        if run.len() >= 2 {
            out.push(Table {
                header: cells(run[0]).iter().map(|c| c.to_lowercase()).collect(),
                rows: run[2..].iter().map(|l| cells(l)).collect(),
            });
        }
        run.clear();
    }
    out
}

/// The code spans (`` `…` ``) of a cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

// ---------------------------------------------------------------------------------------------
// The binary's help

/// A flag as `--help` shows it.
#[derive(Debug)]
struct HelpFlag {
    long: String,
    short: Option<String>,
    env: Option<String>,
    default: Option<String>,
}

/// What `modelgate <command> --help` says: the flags and the exit codes its text lists.
struct Help {
    flags: Vec<HelpFlag>,
    exit_codes: BTreeSet<String>,
}

/// `modelgate <args>`, which must succeed, with no `MODELGATE_*` or `POD_NAMESPACE` variable
/// of the test's environment (clap shows a set variable's value in `[env: X=value]`).
fn help_text(args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(common::bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MODELGATE_") || k == "POD_NAMESPACE" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("the modelgate binary starts");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "modelgate {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

/// The commands `modelgate --help` lists, but `help`.
fn commands() -> Vec<String> {
    let text = help_text(&["--help"]);
    let list = text
        .split_once("\nCommands:\n")
        .expect("`modelgate --help` lists its commands")
        .1;
    list.lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// The text of `[name: …]` in `block`: the last one (clap writes its own after the
/// description), up to a `;` (`[default: 0.0.0.0:8443; with --dev …]`, written by hand).
fn bracket(block: &str, name: &str) -> Option<String> {
    let open = format!("[{name}: ");
    let start = block.rfind(&open)? + open.len();
    let end = block[start..].find(']')? + start;
    let value = &block[start..end];
    Some(value.split(';').next().unwrap_or(value).trim().to_string())
}

/// A flag's first line: indented by two (`  -n, --namespace <NS>`) or six (`      --listen`)
/// spaces, where descriptions are indented by ten.
fn is_flag_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    (1..=6).contains(&indent) && trimmed.starts_with('-')
}

fn help(command: &str) -> Help {
    let text = help_text(&[command, "--help"]);
    // Each flag's block: its line and those that follow, up to the next flag or a heading.
    let mut blocks: Vec<String> = Vec::new();
    let mut in_flag = false;
    for line in text.lines() {
        if is_flag_line(line) {
            blocks.push(format!("{line}\n"));
            in_flag = true;
        } else if !line.is_empty() && !line.starts_with(' ') {
            in_flag = false;
        } else if in_flag && let Some(block) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    let flags = blocks
        .iter()
        .filter_map(|block| {
            let head = block.lines().next().unwrap_or_default().trim();
            let short = head
                .strip_prefix('-')
                .filter(|rest| !rest.starts_with('-'))
                .and_then(|rest| rest.split(',').next())
                .map(|s| format!("-{s}"));
            let long_at = head.find("--")?;
            let long: String = head[long_at + 2..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let env = bracket(block, "env").map(|e| e.split('=').next().unwrap_or("").to_string());
            Some(HelpFlag {
                long,
                short,
                env,
                default: bracket(block, "default"),
            })
        })
        .filter(|f| !GENERIC_FLAGS.contains(&f.long.as_str()))
        .collect();
    // "Exit codes:" then lines `  N  when`.
    let exit_codes = text
        .split_once("\nExit codes:\n")
        .map(|(_, rest)| {
            rest.lines()
                .take_while(|l| l.starts_with(' '))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|code| code.chars().all(|c| c.is_ascii_digit()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Help { flags, exit_codes }
}

// ---------------------------------------------------------------------------------------------
// docs/cli.md

/// One row of a flag table: the long flags its flag column names, and the row.
struct FlagRow {
    section: String,
    longs: Vec<String>,
    flag: String,
    env: String,
    default: String,
}

/// The long flags a flag cell names: `` `--listen ADDR` ``, `` `-o`, `--output FORMAT` ``,
/// `` `--log-admissions[=BOOL]` `` name `listen`, `output`, `log-admissions`.
fn long_flags(cell: &str) -> Vec<String> {
    code_spans(cell)
        .into_iter()
        .filter_map(|span| span.strip_prefix("--"))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

/// The flag rows of a section, with problems in the tables' shape.
fn flag_rows(section_name: &str, body: &str, problems: &mut Vec<String>) -> Vec<FlagRow> {
    let mut out = Vec::new();
    for table in tables(body) {
        if table.header.first().map(String::as_str) != Some("flag") {
            continue;
        }
        let (Some(env), Some(default)) = (
            table.column("environment variable"),
            table.column("default"),
        ) else {
            problems.push(format!(
                "{CLI_DOC} § {section_name}: a flag table needs the columns `flag | environment \
                 variable | default | meaning`, has {:?}",
                table.header
            ));
            continue;
        };
        for row in &table.rows {
            let cell = |i: usize| row.get(i).cloned().unwrap_or_default();
            let longs = long_flags(&cell(0));
            if longs.is_empty() {
                problems.push(format!(
                    "{CLI_DOC} § {section_name}: a row names no `--flag`: {row:?}"
                ));
                continue;
            }
            out.push(FlagRow {
                section: section_name.to_string(),
                longs,
                flag: cell(0),
                env: cell(env),
                default: cell(default),
            });
        }
    }
    out
}

/// Whether `span` looks like an environment variable's name (`MODELGATE_LISTEN`,
/// `POD_NAMESPACE`).
fn is_env_name(span: &str) -> bool {
    span.contains('_')
        && span
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// What is wrong with `row` as the documentation of `flag` of `command`.
fn check_row(command: &str, flag: &HelpFlag, row: &FlagRow, problems: &mut Vec<String>) {
    let at = format!("`{command} --{}` ({CLI_DOC} § {})", flag.long, row.section);
    if let Some(short) = &flag.short
        && !code_spans(&row.flag).contains(&short.as_str())
    {
        problems.push(format!("{at}: the flag column does not name `{short}`"));
    }
    let documented_env: Vec<&str> = code_spans(&row.env)
        .into_iter()
        .filter(|s| is_env_name(s))
        .collect();
    match &flag.env {
        Some(env) if documented_env != [env.as_str()] => problems.push(format!(
            "{at}: the environment variable column should name `{env}` (alone), says {:?}",
            row.env
        )),
        None if row.env != "—" => problems.push(format!(
            "{at}: the flag reads no environment variable, so the column should say `—`, says \
             {:?}",
            row.env
        )),
        _ => {}
    }
    if let Some(default) = &flag.default
        && !code_spans(&row.default).contains(&default.as_str())
    {
        problems.push(format!(
            "{at}: the default column should name `{default}`, says {:?}",
            row.default
        ));
    }
}

/// The page, its sections, and each command's help.
struct CliReference {
    sections: Vec<(String, String)>,
    helps: BTreeMap<String, Help>,
}

impl CliReference {
    fn load() -> Self {
        let helps = commands()
            .into_iter()
            .map(|c| (c.clone(), help(&c)))
            .collect();
        CliReference {
            sections: sections(&read_doc(CLI_DOC)),
            helps,
        }
    }

    fn takes_policy_flags(&self, command: &str) -> bool {
        section(&self.sections, command).is_some_and(|body| body.contains(POLICY_LINK))
    }
}

#[test]
fn every_command_has_its_section_in_the_cli_reference() {
    let reference = CliReference::load();
    assert!(reference.helps.len() >= 5, "{:?}", reference.helps.keys());
    // The help is read as expected (a change of clap's layout must not make the checks
    // below pass on nothing).
    let serve = &reference.helps["serve"].flags;
    let listen = serve
        .iter()
        .find(|f| f.long == "listen")
        .expect("serve --listen");
    assert_eq!(listen.env.as_deref(), Some("MODELGATE_LISTEN"));
    assert_eq!(listen.default.as_deref(), Some("0.0.0.0:8443"));
    assert!(
        serve
            .iter()
            .any(|f| f.long == "run-as-user" && f.default.as_deref() == Some("1000"))
    );
    let days = reference.helps["certs"]
        .flags
        .iter()
        .find(|f| f.long == "days");
    assert_eq!(
        days.map(|f| (f.env.as_deref(), f.default.as_deref())),
        Some((None, Some("365")))
    );
    let review = &reference.helps["review"];
    assert!(
        review
            .flags
            .iter()
            .any(|f| f.long == "namespace" && f.short.as_deref() == Some("-n"))
    );
    assert_eq!(review.exit_codes.len(), 3, "{:?}", review.exit_codes);
    let mut problems = Vec::new();
    for command in reference.helps.keys() {
        if section(&reference.sections, command).is_none() {
            problems.push(format!(
                "{CLI_DOC} has no section `## {command}` (anchor #{command})"
            ));
        }
    }
    assert_no_problems("commands without a section", &problems);
}

#[test]
fn every_flag_its_environment_variable_and_its_default_are_in_the_cli_reference() {
    let reference = CliReference::load();
    let mut problems = Vec::new();
    let policy = section(&reference.sections, POLICY_SECTION)
        .map(|body| flag_rows(POLICY_SECTION, body, &mut problems))
        .unwrap_or_default();
    for (command, help) in &reference.helps {
        let Some(body) = section(&reference.sections, command) else {
            continue; // every_command_has_its_section_in_the_cli_reference
        };
        let own = flag_rows(command, body, &mut problems);
        let takes_policy = reference.takes_policy_flags(command);
        for flag in &help.flags {
            let find = |rows: &[FlagRow]| -> Vec<usize> {
                (0..rows.len())
                    .filter(|&i| rows[i].longs.contains(&flag.long))
                    .collect()
            };
            let (rows, found) = match find(&own) {
                found if !found.is_empty() => (&own, found),
                _ if takes_policy => (&policy, find(&policy)),
                _ => (&own, Vec::new()),
            };
            match found.as_slice() {
                [i] => check_row(command, flag, &rows[*i], &mut problems),
                [] => problems.push(format!(
                    "`{command} --{}` (env {:?}, default {:?}) has no row in {CLI_DOC} § \
                     {command}{}",
                    flag.long,
                    flag.env,
                    flag.default,
                    if takes_policy {
                        format!(" nor § {POLICY_SECTION}")
                    } else {
                        String::new()
                    }
                )),
                _ => problems.push(format!(
                    "`{command} --{}` has {} rows in {CLI_DOC}",
                    flag.long,
                    found.len()
                )),
            }
        }
    }
    assert_no_problems("undocumented flags", &problems);
}

#[test]
fn the_cli_reference_names_no_flag_the_binary_lacks() {
    let reference = CliReference::load();
    let mut problems = Vec::new();
    let has = |command: &str, long: &str| {
        reference.helps[command]
            .flags
            .iter()
            .any(|f| f.long == long)
    };
    for (heading, body) in &reference.sections {
        let rows = flag_rows(heading, body, &mut problems);
        if rows.is_empty() {
            continue;
        }
        // The commands this section's rows are flags of.
        let commands: Vec<&String> = if reference.helps.contains_key(heading) {
            vec![heading]
        } else if heading == POLICY_SECTION {
            let users: Vec<&String> = reference
                .helps
                .keys()
                .filter(|c| reference.takes_policy_flags(c))
                .collect();
            if users.is_empty() {
                problems.push(format!(
                    "no command section links to {POLICY_LINK}, so § {POLICY_SECTION} is no \
                     command's"
                ));
            }
            users
        } else {
            problems.push(format!(
                "{CLI_DOC} § {heading}: a flag table outside a command's section (nothing checks \
                 it against the binary)"
            ));
            continue;
        };
        for row in &rows {
            for long in &row.longs {
                for command in &commands {
                    if !has(command, long) {
                        problems.push(format!(
                            "{CLI_DOC} § {heading} documents `--{long}`, which `modelgate \
                             {command}` does not have"
                        ));
                    }
                }
            }
        }
    }
    assert_no_problems("stale flag rows", &problems);
}

#[test]
fn the_exit_codes_the_help_lists_are_the_cli_references() {
    let reference = CliReference::load();
    let mut problems = Vec::new();
    for (command, help) in &reference.helps {
        let Some(body) = section(&reference.sections, command) else {
            continue;
        };
        let documented: BTreeSet<String> = tables(body)
            .into_iter()
            .filter(|t| t.header.first().map(String::as_str) == Some("exit"))
            .flat_map(|t| t.rows)
            .filter_map(|row| row.first().cloned())
            .collect();
        if documented.is_empty() {
            problems.push(format!(
                "{CLI_DOC} § {command} has no exit code table (`| exit | when |`)"
            ));
        }
        if !help.exit_codes.is_empty() && help.exit_codes != documented {
            problems.push(format!(
                "`{command} --help` lists exit codes {:?}, {CLI_DOC} § {command} {:?}",
                help.exit_codes, documented
            ));
        }
    }
    assert_no_problems("exit codes", &problems);
}

/// The anchors of a page as GitHub makes them from its headings (lower case, punctuation but
/// `-` and `_` dropped, spaces as `-`), and its `<a id="…">`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let slug: String = line[hashes..]
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.insert(slug);
        }
        for part in line.split("<a id=\"").skip(1) {
            if let Some((id, _)) = part.split_once('"') {
                out.insert(id.to_string());
            }
        }
    }
    out
}

/// Every link of `doc` (a page under `docs/`) that is not a URL reaches a page and, when it has
/// a fragment, a heading or anchor of that page.
fn link_problems(doc: &str) -> Vec<String> {
    let page = read_doc(doc);
    let mut problems = Vec::new();
    for part in page.split("](").skip(1) {
        let Some((target, _)) = part.split_once(')') else {
            continue;
        };
        let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
        if file.contains("://") {
            continue;
        }
        let path = if file.is_empty() {
            doc.to_string()
        } else {
            format!("docs/{file}")
        };
        let Ok(text) = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&path))
        else {
            problems.push(format!("{doc} links to {target}: no such page"));
            continue;
        };
        if !fragment.is_empty() && !anchors(&text).contains(fragment) {
            problems.push(format!(
                "{doc} links to {target}: {path} has no such heading or anchor"
            ));
        }
    }
    problems
}

#[test]
fn every_link_of_the_cli_reference_reaches_its_anchor() {
    assert_no_problems("links", &link_problems(CLI_DOC));
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// A family of a scrape: its type and the label names of its series (`le` aside).
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
}

/// The label names of a series' `{…}`, quoted values skipped.
fn label_names(series: &str) -> Vec<String> {
    let Some(open) = series.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut name = String::new();
    let mut chars = series[open + 1..].chars();
    while let Some(c) = chars.next() {
        match c {
            '=' => {
                names.push(std::mem::take(&mut name));
                // The quoted value, escapes included.
                let _ = chars.next();
                while let Some(v) = chars.next() {
                    match v {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            ',' | ' ' => {}
            '}' => break,
            _ => name.push(c),
        }
    }
    names
}

/// The families of a `/metrics` text, by the name their samples carry (a counter's with
/// `_total`, as the docs name them).
fn families(scrape: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            let name = match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_string(),
            };
            out.entry(name.clone()).or_default().kind = kind.to_string();
            current = Some(name);
        } else if !line.starts_with('#')
            && !line.trim().is_empty()
            && let Some(family) = current.as_ref().and_then(|n| out.get_mut(n))
        {
            family.labels.extend(
                label_names(line)
                    .into_iter()
                    .filter(|l| l != "le" && l != "quantile"),
            );
        }
    }
    out
}

/// `/metrics` of a fresh `serve` started by `cmd`, once it is ready (its watches listed).
async fn scrape(cmd: std::process::Command) -> String {
    let server = tokio::task::spawn_blocking(move || ServerProcess::spawn(cmd))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !matches!(
        server.probe_get("/readyz").await,
        Ok((hyper::StatusCode::OK, _))
    ) {
        assert!(
            std::time::Instant::now() < deadline,
            "serve not ready after 30 s; logs:\n{}",
            server.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (status, body) = server.probe_get("/metrics").await.unwrap();
    assert_eq!(status, hyper::StatusCode::OK, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_serve_exports_is_in_the_metrics_table() {
    let pki = TestPki::new();
    // Without a cluster (`--no-cluster`), and against one: a family registered only with a
    // cluster (the claim reads) is exported by the second alone.
    let alone = families(&scrape(common::serve_command(&pki.tls_args())).await);
    let api = FakeApiServer::start(&[CACHES, NAMESPACE_CACHES, NODE_GROUPS, EXCEPTIONS]).await;
    // `modelgate_exception_expiry_timestamp_seconds` has no series (and so no family in the
    // text) while no exception is held.
    api.apply(
        EXCEPTIONS,
        serde_json::json!({
            "metadata": {"name": "vendor-root", "namespace": "team-a",
                         "creationTimestamp": "2026-11-20T00:00:00Z"},
            "spec": {"reason": "vendor image runs as root", "expires": "2027-01-01T00:00:00Z",
                     "rules": ["non-root"], "selector": {"matchLabels": {"app": "vendor"}}}
        }),
    );
    let kubeconfig = pki.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let clustered = families(&scrape(serve_command_against(&kubeconfig, &pki.tls_args())).await);
    assert!(alone.contains_key("modelgate_admission_requests_total"));
    assert!(clustered.contains_key("modelgate_admission_requests_total"));
    let mut exported = clustered;
    for (name, family) in alone {
        let entry = exported.entry(name).or_default();
        entry.kind = family.kind;
        entry.labels.extend(family.labels);
    }

    let doc = read_doc(METRICS_DOC);
    let doc_sections = sections(&doc);
    let metrics = section(&doc_sections, "Metrics").expect("operations.md has `## Metrics`");
    let mut problems = Vec::new();
    let mut documented = BTreeSet::new();
    for table in tables(metrics) {
        if table.header.first().map(String::as_str) != Some("metric") {
            continue;
        }
        let (kind_at, labels_at) = (table.column("type"), table.column("labels"));
        for row in &table.rows {
            let Some(name) = code_spans(&row[0]).first().map(|s| s.to_string()) else {
                problems.push(format!(
                    "{METRICS_DOC}: a metrics row names no metric: {row:?}"
                ));
                continue;
            };
            documented.insert(name.clone());
            let Some(family) = exported.get(&name) else {
                problems.push(format!(
                    "{METRICS_DOC} documents `{name}`, which serve does not export (with or \
                     without a cluster)"
                ));
                continue;
            };
            if let Some(i) = kind_at
                && row.get(i).map(|k| k.trim()) != Some(family.kind.as_str())
            {
                problems.push(format!(
                    "{METRICS_DOC}: `{name}` is a {}, its row says {:?}",
                    family.kind,
                    row.get(i)
                ));
            }
            match labels_at {
                Some(i) => {
                    let cell = row.get(i).cloned().unwrap_or_default();
                    let spans = code_spans(&cell);
                    for label in &family.labels {
                        if !spans.contains(&label.as_str()) {
                            problems.push(format!(
                                "{METRICS_DOC}: `{name}` has the label `{label}`, its row's labels \
                                 column does not name it: {cell:?}"
                            ));
                        }
                    }
                }
                None if !family.labels.is_empty() => problems.push(format!(
                    "{METRICS_DOC}: `{name}` has labels {:?}, in a table without a labels column",
                    family.labels
                )),
                None => {}
            }
        }
    }
    for name in exported.keys() {
        if !documented.contains(name) {
            problems.push(format!(
                "serve exports `{name}`, which the metrics table of {METRICS_DOC} does not name"
            ));
        }
    }
    assert_no_problems("metrics", &problems);
}

// ---------------------------------------------------------------------------------------------
// The parsers themselves

#[test]
fn the_parsers_read_what_clap_and_the_pages_write() {
    assert_eq!(
        cells(r"| `--log-format text\|json` | `MODELGATE_LOG_FORMAT` | `text` | x |"),
        [
            "`--log-format text|json`",
            "`MODELGATE_LOG_FORMAT`",
            "`text`",
            "x"
        ]
    );
    assert_eq!(
        long_flags("`-o`, `--output FORMAT`, `--log-admissions[=BOOL]`"),
        ["output", "log-admissions"]
    );
    assert_eq!(
        bracket(
            "--listen <ADDR>\n  Address [default: 0.0.0.0:8443; with --dev 127.0.0.1:8443]\n",
            "default"
        )
        .as_deref(),
        Some("0.0.0.0:8443")
    );
    assert_eq!(
        bracket(
            "  x\n\n  [env: MODELGATE_X=]\n  [default: 15s]\n",
            "default"
        )
        .as_deref(),
        Some("15s")
    );
    let slugs = anchors(
        "## §3 Non-root with numeric users\n## `serve --dev`\n## The backstop (Kubernetes 1.30+)\n\
         - <a id=\"claims-x\"></a>**Claims**\n```sh\n# not a heading\n```\n",
    );
    assert_eq!(
        slugs,
        BTreeSet::from(
            [
                "3-non-root-with-numeric-users",
                "serve---dev",
                "the-backstop-kubernetes-130",
                "claims-x"
            ]
            .map(String::from)
        )
    );
    assert!(is_flag_line("  -n, --namespace <NS>"));
    assert!(is_flag_line("      --out <DIR>       Directory"));
    assert!(!is_flag_line(
        "          --idle-timeout (a kept-alive connection"
    ));
    assert_eq!(
        label_names(r#"m_total{webhook="mutate",kind="P\"o,d",le="+Inf"} 0"#),
        ["webhook", "kind", "le"]
    );
    let scrape = "# HELP a_b x.\n# TYPE a_b counter\na_b_total{result=\"ok\"} 0\n\
                  # TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_sum 0\n# EOF\n";
    let f = families(scrape);
    assert_eq!(f["a_b_total"].kind, "counter");
    assert_eq!(
        f["a_b_total"].labels,
        BTreeSet::from(["result".to_string()])
    );
    assert!(f["h"].labels.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Annotations and labels

/// The sources whose string literals name the `modelgate.io/` keys modelgate reads or writes.
/// Test modules and fixtures are scanned too: they name only keys the code uses (checked when
/// this test was written), and a key a test invents would be worth a row or a rename anyway.
const KEY_SOURCES: [&str; 2] = ["crates/modelgate-core/src", "src"];
const KEY_PREFIX: &str = "modelgate.io/";

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// An API group/version string (`modelgate.io/v1alpha1`, `v1beta2`, `v1`), not a key.
fn is_api_version(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('v') else {
        return false;
    };
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return false;
    }
    let rest = &rest[digits..];
    rest.is_empty()
        || ["alpha", "beta"].iter().any(|stage| {
            rest.strip_prefix(stage)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

/// The keys a text quotes as whole string literals: `"modelgate.io/<name>"` with `<name>` of
/// `[a-z0-9-]+`, API versions aside. (`"modelgate.io/inject=enabled"` is a selector, not a
/// literal of the key alone; the key is quoted on its own elsewhere.)
fn quoted_keys(text: &str) -> BTreeSet<String> {
    let needle = format!("\"{KEY_PREFIX}");
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices(&needle) {
        let rest = &text[at + needle.len()..];
        let len = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(rest.len());
        let name = &rest[..len];
        if !name.is_empty() && rest[len..].starts_with('"') && !is_api_version(name) {
            out.insert(format!("{KEY_PREFIX}{name}"));
        }
    }
    out
}

/// The keys docs/annotations.md has a row for: the code spans of each table row's first cell.
fn documented_keys(page: &str) -> BTreeSet<String> {
    tables(page)
        .iter()
        .filter(|t| t.header.first().is_some_and(|h| h == "key"))
        .flat_map(|t| t.rows.iter())
        .filter_map(|row| row.first())
        .flat_map(|cell| code_spans(cell).into_iter().map(str::to_string))
        .collect()
}

#[test]
fn every_modelgate_key_the_code_names_is_in_the_annotations_reference() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in KEY_SOURCES {
        rust_files(&root.join(dir), &mut files);
    }
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for key in quoted_keys(&text) {
            let shown = file
                .strip_prefix(root)
                .unwrap_or(file)
                .display()
                .to_string();
            used.entry(key).or_insert(shown);
        }
    }
    assert!(
        used.contains_key("modelgate.io/model-uri"),
        "the scan found no key at all: {used:?}"
    );
    let documented = documented_keys(&read_doc(ANNOTATIONS_DOC));
    let problems: Vec<String> = used
        .iter()
        .filter(|(key, _)| !documented.contains(*key))
        .map(|(key, file)| format!("{key} (quoted in {file}) has no row in {ANNOTATIONS_DOC}"))
        .collect();
    assert_no_problems("annotation and label keys", &problems);
}

#[test]
fn every_link_of_the_annotations_reference_reaches_its_anchor() {
    assert_no_problems("links", &link_problems(ANNOTATIONS_DOC));
}

#[test]
fn the_key_scanner_reads_literals_only() {
    let text = r#"const A: &str = "modelgate.io/mode"; let v = "modelgate.io/v1alpha1";
        let s = "modelgate.io/inject=enabled"; // modelgate.io/comment
        json!({"modelgate.io/model-uri": "x", "modelgate.io/": 1, "a.modelgate.io/b": 2})"#;
    assert_eq!(
        quoted_keys(text),
        BTreeSet::from(["modelgate.io/mode", "modelgate.io/model-uri"].map(String::from))
    );
    assert!(is_api_version("v1") && is_api_version("v2beta3") && !is_api_version("v1alpha"));
    assert!(!is_api_version("vault") && !is_api_version("volume"));
    let page = "| key | on |\n|---|---|\n| `modelgate.io/mode` | Namespace |\n\n\
                | mode | x |\n|---|---|\n| `modelgate.io/not-a-row` | y |\n";
    assert_eq!(
        documented_keys(page),
        BTreeSet::from(["modelgate.io/mode".to_string()])
    );
}
