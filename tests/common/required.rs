//! What a test needs from outside the project (the corpus in `../shared`, `python3`, `openssl`,
//! `curl`): without it the test says so and passes, except under `MODELGATE_REQUIRE_TOOLS=1`,
//! which the test command sets, where it fails naming what is missing. The test command can
//! then never go green without having run every test.

/// Called where a test would skip for want of `what`: panics under
/// `MODELGATE_REQUIRE_TOOLS=1`, else prints that the test is skipped.
pub fn missing(what: &str) {
    if std::env::var("MODELGATE_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!("{what} is required (MODELGATE_REQUIRE_TOOLS=1) but is missing");
    }
    println!("{what} is missing: skipped (MODELGATE_REQUIRE_TOOLS=1 makes this a failure)");
}
