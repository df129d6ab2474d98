use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{Bail, from_str};
use crate::policy::view::{JobView, PodView};

const LLM_REVIEW: &str = include_str!("../../../../../benches/reviews/llm-serving-pod.json");
const REVIEWS: [&str; 3] = [
    LLM_REVIEW,
    include_str!("../../../../../benches/reviews/one-container-pod.json"),
    include_str!("../../../../../benches/reviews/twenty-container-pod.json"),
];

/// `json` without whitespace between tokens, keys in their order: as the API server sends it.
fn compact(json: &str) -> String {
    let (mut in_string, mut escaped) = (false, false);
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c.is_ascii_whitespace() {
            continue;
        } else {
            in_string = c == '"';
        }
        out.push(c);
    }
    out
}

fn object_of(review: &str) -> &str {
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        object: &'a RawValue,
    }
    #[derive(serde::Deserialize)]
    struct Review<'a> {
        #[serde(borrow)]
        request: Request<'a>,
    }
    serde_json::from_str::<Review>(review)
        .expect("a reference review")
        .request
        .object
        .get()
}

/// The contract: what the scan accepts, serde_json accepts, with the same value. Returns whether
/// the scan accepted.
fn agrees<'a, T>(text: &'a str) -> bool
where
    T: serde::Deserialize<'a> + PartialEq + std::fmt::Debug,
{
    let fast: Result<T, Bail> = from_str(text);
    let slow: serde_json::Result<T> = serde_json::from_str(text);
    match (fast, slow) {
        (Ok(fast), Ok(slow)) => {
            assert_eq!(fast, slow, "{text}");
            true
        }
        (Ok(fast), Err(e)) => {
            panic!("the scan accepts what serde_json refuses ({e}): {fast:?} from {text}")
        }
        (Err(Bail), _) => false,
    }
}

#[test]
fn the_reference_reviews_take_the_scan_and_read_as_with_serde_json() {
    for review in REVIEWS {
        for text in [review.to_string(), compact(review)] {
            let object = object_of(&text);
            assert!(agrees::<PodView>(object), "the scan refused {object}");
            assert!(agrees::<IgnoredAny>(&text));
        }
    }
}

/// Every byte of the compact LLM serving pod replaced by a byte that matters to JSON's grammar,
/// or removed: the scan never accepts a text serde_json refuses or reads it differently, and it
/// still takes most of the changes that leave the pod well-formed.
#[test]
fn no_single_byte_change_makes_the_scan_and_serde_json_disagree() {
    let text = compact(object_of(LLM_REVIEW));
    let bytes = text.as_bytes();
    let replacements = [
        None,
        Some(b'"'),
        Some(b'\\'),
        Some(b'}'),
        Some(b']'),
        Some(b','),
        Some(b'0'),
        Some(b'e'),
        Some(0x01),
    ];
    let (mut cases, mut taken) = (0, 0);
    for at in 0..bytes.len() {
        for with in replacements {
            let mut changed = bytes[..at].to_vec();
            changed.extend(with);
            changed.extend_from_slice(&bytes[at + 1..]);
            let Ok(changed) = std::str::from_utf8(&changed) else {
                continue;
            };
            cases += 1;
            if agrees::<PodView>(changed) {
                taken += 1;
            }
            agrees::<IgnoredAny>(changed);
        }
    }
    // Most changes inside strings leave the pod readable: the scan must take those itself.
    assert!(taken * 10 > cases, "the scan took {taken} of {cases}");
}

fn pod_with(spec_json: &str) -> String {
    format!(r#"{{"kind":"Pod","metadata":{{"name":"p"}},"spec":{spec_json}}}"#)
}

#[test]
fn unread_values_are_checked_as_serde_json_checks_them() {
    // (unread value, whether serde_json takes it)
    let cases = [
        (r#""a\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00""#, true),
        // serde_json does not check surrogates in a string it skips.
        (r#""\ud800""#, true),
        (r#""\x""#, false),
        (r#""\u12g4""#, false),
        ("\"\u{1}\"", false),
        (r#""unterminated"#, false),
        ("-0", true),
        ("0.5e-7", true),
        ("1E+2", true),
        ("01", false),
        ("1.", false),
        ("1e", false),
        ("-", false),
        (".5", false),
        ("tru", false),
        ("nul", false),
        ("[1,]", false),
        (r#"{"a":1,}"#, false),
        (r#"{"a" 1}"#, false),
        ("[1 2]", false),
        (r#"{1:2}"#, false),
        ("[[[[]]]]", true),
        ("{}", true),
        ("[{}]", true),
        ("[}", false),
    ];
    for (value, valid) in cases {
        let text = pod_with(&format!(
            r#"{{"unread":{value},"containers":[{{"name":"c"}}]}}"#
        ));
        assert_eq!(
            serde_json::from_str::<PodView>(&text).is_ok(),
            valid,
            "serde_json on {text}"
        );
        let taken = agrees::<PodView>(&text);
        // Everything serde_json takes here is in the scan's subset.
        assert_eq!(taken, valid, "{text}");
    }
}

#[test]
fn read_values_are_typed_as_serde_json_types_them() {
    // (pod security context, whether serde_json takes it, whether the scan does)
    let cases = [
        (r#"{"runAsUser":1000}"#, true, true),
        (r#"{"runAsUser":-5}"#, true, true),
        (r#"{"runAsUser":0}"#, true, true),
        (r#"{"runAsUser":999999999999999999}"#, true, true),
        // 19 digits and more: left to serde_json.
        (r#"{"runAsUser":9223372036854775807}"#, true, false),
        (r#"{"runAsUser":9223372036854775808}"#, false, false),
        (
            r#"{"runAsUser":-99999999999999999999999999999}"#,
            false,
            false,
        ),
        (
            r#"{"runAsUser":99999999999999999999999999999999}"#,
            false,
            false,
        ),
        (r#"{"runAsUser":-0}"#, false, false),
        (r#"{"runAsUser":1000.5}"#, false, false),
        (r#"{"runAsUser":1e3}"#, false, false),
        (r#"{"runAsUser":"0"}"#, false, false),
        (r#"{"runAsUser":null}"#, true, true),
        (r#"{"runAsNonRoot":true,"runAsNonRoot":false}"#, true, true),
        (r#"{"runAsNonRoot":1}"#, false, false),
        (r#"{"runAsUser":01}"#, false, false),
    ];
    for (context, valid, scanned) in cases {
        let text = pod_with(&format!(r#"{{"securityContext":{context}}}"#));
        assert_eq!(
            serde_json::from_str::<PodView>(&text).is_ok(),
            valid,
            "serde_json on {text}"
        );
        assert_eq!(agrees::<PodView>(&text), scanned, "{text}");
    }
}

#[test]
fn read_strings_are_unescaped_as_serde_json_does() {
    let cases = [
        (r#""plain""#, true),
        (r#""a\u003cb\u003e \"q\" \\ \/ \n\t""#, true),
        (r#""\uD83D\uDE00 pair""#, true),
        (r#""\u00e9t\u00e9""#, true),
        // Lone or reversed surrogates are an error in a string serde_json decodes.
        (r#""\uD83D""#, false),
        (r#""\uDE00""#, false),
        (r#""\uD83Dx""#, false),
        (r#""\uD83D\u0041""#, false),
        ("\"tab\there\"", false),
    ];
    for (value, valid) in cases {
        for text in [
            format!(r#"{{"metadata":{{"annotations":{{"k":{value}}}}}}}"#),
            format!(r#"{{"metadata":{{"labels":{{{value}:"v"}}}}}}"#),
        ] {
            assert_eq!(
                serde_json::from_str::<PodView>(&text).is_ok(),
                valid,
                "{text}"
            );
            assert_eq!(agrees::<PodView>(&text), valid, "{text}");
        }
    }
}

#[test]
fn the_last_duplicate_key_wins_and_raw_text_is_serde_json_s() {
    let text = r#"{"kind":"Job","spec":{"template":{"spec":{"initContainers":[ {"name":"a", "image" : "x"} ,{"name":"b"}],"containers":[{"name":"x"}],"containers":[{"name":"y"}]}}}}"#;
    assert!(agrees::<JobView>(text));
    let job: JobView = from_str(text).unwrap();
    let spec = job.spec.unwrap().template.unwrap().spec.unwrap();
    assert_eq!(spec.containers()[0].name(), "y");
    assert_eq!(
        spec.init_containers()[0].raw.get(),
        r#"{"name":"a", "image" : "x"}"#
    );
}

#[test]
fn deep_nesting_is_left_to_serde_json_and_costs_no_stack() {
    for depth in [127, 128, 129, 100_000] {
        let unread = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let text = pod_with(&format!(r#"{{"unread":{unread}}}"#));
        assert_eq!(agrees::<PodView>(&text), depth <= 128, "{depth}");
        // The combined decode takes it, through serde_json.
        assert!(crate::policy::view::from_str::<PodView>(&text).is_ok());
    }
    // Where a view is expected, deeper text is a type error for both.
    let text = pod_with(&format!(r#"{{"volumes":{}}}"#, "[".repeat(100_000)));
    assert!(!agrees::<PodView>(&text));
    assert!(crate::policy::view::from_str::<PodView>(&text).is_err());
}

#[test]
fn trailing_text_and_truncation_are_refused() {
    let text = compact(object_of(LLM_REVIEW));
    assert!(!agrees::<PodView>(&format!("{text} x")));
    assert!(agrees::<PodView>(&format!(" {text} \n")));
    for cut in [1, text.len() / 2, text.len() - 1] {
        assert!(!agrees::<PodView>(&text[..cut]));
    }
}
