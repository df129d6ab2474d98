use super::*;
use serde_json::json;

fn spec() -> Value {
    json!({
        "reason": "vendor image runs as root until its 2.0",
        "expires": "2027-01-01T00:00:00Z",
        "rules": ["non-root"],
        "selector": {"matchLabels": {"app": "vendor"}},
        "images": ["registry.example/vendor@sha256:abc"]
    })
}

#[test]
fn exception_times_parse_as_rfc3339() {
    assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(parse_time("2027-01-01T00:00:00Z"), Some(1_798_761_600));
    assert_eq!(
        parse_time("2027-01-01T01:00:00.25+01:00"),
        Some(1_798_761_600)
    );
    assert_eq!(parse_time("2026-12-31T19:00:00-05:00"), Some(1_798_761_600));
    for bad in [
        "",
        "2027-01-01",
        "2027-13-01T00:00:00Z",
        "2027-01-01T00:00:00",
        "tomorrow",
    ] {
        assert_eq!(parse_time(bad), None, "{bad}");
    }
}

#[test]
fn exception_object_checks_name_the_field() {
    let now = parse_time("2026-12-01T00:00:00Z");
    assert_eq!(validate_object(&spec(), now, 90), ObjectVerdict::default());
    let fields = |s: Value| -> Vec<String> {
        validate_object(&s, now, 90)
            .problems
            .into_iter()
            .map(|p| p.field)
            .collect()
    };
    let mut s = spec();
    s.as_object_mut().unwrap().remove("reason");
    assert_eq!(fields(s), ["spec.reason"]);
    let mut s = spec();
    s["reason"] = json!("  ");
    assert_eq!(fields(s), ["spec.reason"]);
    let mut s = spec();
    s["reason"] = json!("x".repeat(MAX_REASON_LEN + 1));
    assert_eq!(fields(s), ["spec.reason"]);
    let mut s = spec();
    s["rules"] = json!(["non-root", "privileged"]);
    assert_eq!(fields(s), ["spec.rules[1]"]);
    let mut s = spec();
    s["rules"] = json!([]);
    assert_eq!(fields(s), ["spec.rules"]);
    let mut s = spec();
    s["selector"] = json!({});
    assert_eq!(fields(s), ["spec.selector"]);
    // Broad selectors: nothing pinned to a value.
    for broad in [
        json!({"matchExpressions": [{"key": "x", "operator": "Exists"}]}),
        json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]}),
        json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
    ] {
        let mut s = spec();
        s["selector"] = broad.clone();
        assert_eq!(fields(s), ["spec.selector"], "{broad}");
    }
    let mut s = spec();
    s["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "Has"}]});
    assert_eq!(
        fields(s),
        [
            "spec.selector.matchExpressions[0].operator",
            "spec.selector"
        ]
    );
    let mut s = spec();
    s["images"] = json!(["registry.example/*/vendor", "registry.example/vendor*"]);
    assert_eq!(fields(s), ["spec.images[0]"]);
    // 90 days ahead is the limit; a second more is refused.
    let mut s = spec();
    s["expires"] = json!("2027-03-01T00:00:00Z");
    assert_eq!(fields(s.clone()), Vec::<String>::new());
    s["expires"] = json!("2027-03-01T00:00:01Z");
    let v = validate_object(&s, now, 90);
    assert_eq!(v.problems.len(), 1);
    assert_eq!(
        v.problems[0].to_string(),
        "spec.expires: 2027-03-01T00:00:01Z is more than 90 days ahead (--max-exception-days)"
    );
    let mut s = spec();
    s["expires"] = json!("next week");
    assert_eq!(fields(s), ["spec.expires"]);
}

#[test]
fn a_non_root_exception_without_images_is_warned_of() {
    let mut s = spec();
    s.as_object_mut().unwrap().remove("images");
    let v = validate_object(&s, parse_time("2026-12-01T00:00:00Z"), 90);
    assert!(v.problems.is_empty(), "{v:?}");
    assert_eq!(v.warnings.len(), 1);
    assert!(v.warnings[0].starts_with("spec.images is not set"), "{v:?}");
    let mut s = spec();
    s["rules"] = json!(["cache-prep"]);
    s.as_object_mut().unwrap().remove("images");
    assert!(validate_object(&s, None, 90).warnings.is_empty());
}

fn exception(spec: Value, created: Option<&str>) -> Exception {
    Exception::from_parts(
        Some("vendor-root"),
        Some("team-a"),
        created.and_then(parse_time),
        &spec,
    )
    .unwrap()
}

#[test]
fn an_exception_is_in_force_until_expires_exactly_and_never_beyond_its_limit() {
    let e = exception(spec(), Some("2026-12-01T00:00:00Z"));
    let t = |s: &str| parse_time(s).unwrap();
    assert_eq!(e.in_force(t("2026-12-31T23:59:59Z"), 90), Ok(()));
    assert_eq!(e.in_force(t("2027-01-01T00:00:00Z"), 90), Ok(()));
    assert_eq!(
        e.in_force(t("2027-01-01T00:00:01Z"), 90),
        Err(NotInForce::Expired)
    );
    // Created long before its expiry (while the webhook did not answer): never in force.
    let e = exception(spec(), Some("2026-06-01T00:00:00Z"));
    assert_eq!(
        e.in_force(t("2026-12-01T00:00:00Z"), 90),
        Err(NotInForce::TooLong)
    );
    // From a file (no creation time): counted from now.
    let e = exception(spec(), None);
    assert_eq!(e.in_force(t("2026-12-01T00:00:00Z"), 90), Ok(()));
    assert_eq!(
        e.in_force(t("2026-09-01T00:00:00Z"), 90),
        Err(NotInForce::TooLong)
    );
}

#[test]
fn selectors_and_images_match_as_kubernetes_and_the_patterns_say() {
    use crate::policy::view::StrMap;
    let mut s = spec();
    s["selector"] = json!({"matchLabels": {"app": "vendor"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]},
                             {"key": "canary", "operator": "DoesNotExist"}]});
    s["images"] = json!([
        "registry.example/vendor:*",
        "docker.io/library/nginx@sha256:abc"
    ]);
    let e = exception(s, None);
    let labels = |pairs: &[(&'static str, &'static str)]| StrMap::from_pairs(pairs.iter().copied());
    assert!(
        e.selector
            .matches(Some(&labels(&[("app", "vendor"), ("tier", "web")])))
    );
    assert!(!e.selector.matches(Some(&labels(&[("app", "vendor")]))));
    assert!(!e.selector.matches(Some(&labels(&[
        ("app", "vendor"),
        ("tier", "web"),
        ("canary", "1")
    ]))));
    assert!(!e.selector.matches(None));
    assert!(e.covers("any", Some("registry.example/vendor:1.2")));
    assert!(!e.covers("any", Some("registry.example/vendor-evil:1.2")));
    assert!(!e.covers("any", Some("docker.io/library/nginx@sha256:abcd")));
    assert!(e.covers("any", Some("docker.io/library/nginx@sha256:abc")));
    assert!(!e.covers("any", None));
}

#[test]
fn the_status_says_whether_it_is_in_force_and_why_not() {
    let e = exception(spec(), Some("2026-12-01T00:00:00Z"));
    let t = |s: &str| parse_time(s).unwrap();
    let at = |open, now: &str| e.status_at(open, t(now), 90);
    assert_eq!(
        at(true, "2027-01-01T00:00:00Z"),
        Status {
            in_force: true,
            reason: "in force until 2027-01-01T00:00:00Z".into()
        }
    );
    let closed = at(false, "2027-01-01T00:00:00Z");
    assert!(!closed.in_force);
    assert!(
        closed.reason.contains("namespace team-a is not open")
            && closed.reason.contains("modelgate.io/exceptions: allowed"),
        "{closed:?}"
    );
    // Its own limits first, whatever the namespace.
    for open in [true, false] {
        let expired = at(open, "2027-01-01T00:00:01Z");
        assert_eq!(
            (expired.in_force, &*expired.reason),
            (false, "expired at 2027-01-01T00:00:00Z")
        );
    }
    let too_long = exception(spec(), Some("2026-06-01T00:00:00Z")).status_at(
        true,
        t("2026-12-01T00:00:00Z"),
        90,
    );
    assert!(
        !too_long.in_force
            && too_long
                .reason
                .contains("more than 90 days after its creation"),
        "{too_long:?}"
    );
}

#[test]
fn the_status_an_object_holds_is_read_when_well_formed() {
    let object = |status: Value| {
        json!({"metadata": {"name": "vendor-root", "namespace": "team-a"},
               "spec": spec(), "status": status})
    };
    let read = |status| Exception::from_object(&object(status)).unwrap().status;
    assert_eq!(
        read(json!({"inForce": false, "reason": "expired at x"})),
        Some(Status {
            in_force: false,
            reason: "expired at x".into()
        })
    );
    assert_eq!(read(json!({"inForce": "yes", "reason": "r"})), None);
    assert_eq!(read(json!({})), None);
    assert_eq!(
        Status::from_object(Some(&read_back())).map(|s| s.to_json()),
        Some(read_back())
    );
}

fn read_back() -> Value {
    json!({"inForce": true, "reason": "in force until 2027-01-01T00:00:00Z"})
}
