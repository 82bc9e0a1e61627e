//! JSON payloads for reading: an indented rendering whose lines know the JSON Pointer they
//! belong to, and the pointers at which two payloads differ, so a conflict can show both side by
//! side with the differing fields marked. Works on the core's exact JSON values, so `1` and
//! `1.0` are equal here exactly as they are for fingerprints.

use std::collections::HashSet;

use maud::{Markup, html};
use oncebox_core::json::Value;

/// The longest a number is shown in plain decimal: past it, the canonical form.
const PLAIN_NUMBER: usize = 64;

/// A path into a JSON document (object keys and array indexes).
pub(crate) type Path = Vec<String>;

/// One rendered line: indentation depth, text, and whether it is part of a difference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub depth: usize,
    pub text: String,
    pub marked: bool,
}

/// The most memory the paths of a conflict's differences may take. Each path is a copy of the
/// keys above it, so a payload of a few kilobytes with thousands of differences far down
/// under long keys (anyone may send one to an unsigned source) took over a hundred megabytes
/// per conflict, twenty conflicts a page.
const PATHS_BUDGET: usize = 8 * 1024 * 1024;

/// The paths at which `a` and `b` differ: a value that differs, a member or element present
/// on one side only, or another type. Objects and arrays that differ only inside are not
/// themselves listed; their differing parts are. `None` when they would take more than
/// [`PATHS_BUDGET`]: shown unmarked then.
pub(crate) fn differences(a: &Value, b: &Value) -> Option<Vec<Path>> {
    let mut found = Found {
        paths: Vec::new(),
        left: PATHS_BUDGET,
    };
    walk(a, b, &mut Vec::new(), &mut found).then_some(found.paths)
}

/// The differences found so far, and the bytes their paths may still take.
struct Found {
    paths: Vec<Path>,
    left: usize,
}

impl Found {
    /// Records `at`; `false` once past the budget.
    fn push(&mut self, at: &Path) -> bool {
        let cost = std::mem::size_of::<Path>()
            + at.iter()
                .map(|k| std::mem::size_of::<String>() + k.len())
                .sum::<usize>();
        match self.left.checked_sub(cost) {
            Some(left) => {
                self.left = left;
                self.paths.push(at.clone());
                true
            }
            None => false,
        }
    }
}

/// `false` once the differences are past the budget (the walk stops there).
fn walk(a: &Value, b: &Value, at: &mut Path, out: &mut Found) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            // Both sides' members in key order, walked together: a conflict's payloads are
            // anyone's input, and a lookup per key would be quadratic in an object's width.
            let (x, y) = (by_key(x), by_key(y));
            let (mut i, mut j) = (0, 0);
            while i < x.len() || j < y.len() {
                let order = match (x.get(i), y.get(j)) {
                    (Some(l), Some(r)) => l.0.cmp(&r.0),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    _ => std::cmp::Ordering::Greater,
                };
                let (k, pair) = match order {
                    std::cmp::Ordering::Less => (&x[i].0, None),
                    std::cmp::Ordering::Greater => (&y[j].0, None),
                    std::cmp::Ordering::Equal => (&x[i].0, Some((&x[i].1, &y[j].1))),
                };
                at.push(k.clone());
                let within = match pair {
                    Some((l, r)) => walk(l, r, at, out),
                    None => out.push(at),
                };
                at.pop();
                if !within {
                    return false;
                }
                i += usize::from(order.is_le());
                j += usize::from(order.is_ge());
            }
            true
        }
        (Value::Array(x), Value::Array(y)) => {
            for i in 0..x.len().max(y.len()) {
                at.push(i.to_string());
                let within = match (x.get(i), y.get(i)) {
                    (Some(l), Some(r)) => walk(l, r, at, out),
                    _ => out.push(at),
                };
                at.pop();
                if !within {
                    return false;
                }
            }
            true
        }
        _ if a == b => true,
        _ => out.push(at),
    }
}

/// An object's members sorted by key (the parser refuses duplicate names).
fn by_key(members: &[(String, Value)]) -> Vec<&(String, Value)> {
    let mut sorted: Vec<&(String, Value)> = members.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
}

/// `value` indented two spaces a level, members sorted; lines inside any of `marked` (or
/// equal to one) are marked.
pub(crate) fn pretty(value: &Value, marked: &[Path]) -> Vec<Line> {
    // A set, and marks passed down to the insides: a check of every line against every
    // difference would be quadratic in a large payload.
    let marked: HashSet<&[String]> = marked.iter().map(Vec::as_slice).collect();
    let mut lines = Vec::new();
    let mut at = Vec::new();
    emit(value, None, true, 0, (&mut at, false), &marked, &mut lines);
    lines
}

/// A JSON string literal, escaped as JSON requires.
fn quoted(s: &str) -> String {
    String::from_utf8_lossy(&Value::String(s.to_owned()).canonical()).into_owned()
}

fn emit(
    value: &Value,
    key: Option<&str>,
    last: bool,
    depth: usize,
    (at, inside_marked): (&mut Path, bool),
    marked: &HashSet<&[String]>,
    out: &mut Vec<Line>,
) {
    let prefix = key.map(|k| format!("{}: ", quoted(k))).unwrap_or_default();
    let comma = if last { "" } else { "," };
    let marked_here = inside_marked || marked.contains(at.as_slice());
    let mut line = |depth: usize, text: String| {
        out.push(Line {
            depth,
            text,
            marked: marked_here,
        });
    };
    match value {
        Value::Object(members) if !members.is_empty() => {
            line(depth, format!("{prefix}{{"));
            let sorted = by_key(members);
            let n = sorted.len();
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                at.push(k.clone());
                let here = (&mut *at, marked_here);
                emit(v, Some(k), i + 1 == n, depth + 1, here, marked, out);
                at.pop();
            }
            out.push(Line {
                depth,
                text: format!("}}{comma}"),
                marked: marked_here,
            });
        }
        Value::Array(items) if !items.is_empty() => {
            line(depth, format!("{prefix}["));
            let n = items.len();
            for (i, v) in items.iter().enumerate() {
                at.push(i.to_string());
                let here = (&mut *at, marked_here);
                emit(v, None, i + 1 == n, depth + 1, here, marked, out);
                at.pop();
            }
            out.push(Line {
                depth,
                text: format!("]{comma}"),
                marked: marked_here,
            });
        }
        // Numbers as people write them (the canonical form says `1e1` for 10 and `1999e-2`
        // for 19.99); one too long for that (`1e309`) as the canonical form has it.
        scalar => {
            let plain = match scalar {
                Value::Number(n) => n.plain_text(PLAIN_NUMBER),
                _ => None,
            };
            let text =
                plain.unwrap_or_else(|| String::from_utf8_lossy(&scalar.canonical()).into_owned());
            line(depth, format!("{prefix}{text}{comma}"));
        }
    }
}

/// Whether `lines`, the indented form of a payload of `raw` bytes, are worth showing. Each
/// line is indented by its depth, so a payload of many small values deep inside brackets (a
/// megabyte of `0,` 128 arrays down) would take a hundred times its size, sent to the
/// operator's browser: past four times the payload as sent (both escaped, and 64 KiB), with the
/// marks of a conflict's differences, it is shown as sent instead.
pub(crate) fn fits(lines: &[Line], raw: &[u8]) -> bool {
    let mark = r#"<mark class="diff"></mark>"#.len();
    let rendered: usize = lines
        .iter()
        .map(|l| 2 * l.depth + escaped(l.text.as_bytes()) + 1 + if l.marked { mark } else { 0 })
        .sum();
    rendered <= escaped(raw).saturating_mul(4).max(64 * 1024)
}

/// The length of `text` as the page writes it, escaped.
fn escaped(text: &[u8]) -> usize {
    text.iter()
        .map(|b| match b {
            b'&' => 5,
            b'<' | b'>' => 4,
            b'"' => 6,
            _ => 1,
        })
        .sum()
}

/// The lines as a block of text; marked lines are `<mark>`ed. Every line's text is escaped.
pub(crate) fn render(lines: &[Line]) -> Markup {
    html! {
        pre.payload {
            @for l in lines {
                @let text = format!("{}{}", "  ".repeat(l.depth), l.text);
                @if l.marked { mark.diff { (text) } "\n" } @else { (text) "\n" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncebox_core::json::parse;

    fn v(s: &str) -> Value {
        parse(s.as_bytes()).unwrap()
    }

    fn path(p: &[&str]) -> Path {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn differences_name_changed_missing_and_retyped_fields() {
        let a = v(r#"{"amount":10,"cur":"EUR","items":[1,2],"meta":{"x":1},"same":1.0}"#);
        let b = v(r#"{"amount":11,"items":[1,2,3],"meta":"x","same":1,"new":null}"#);
        assert_eq!(
            differences(&a, &b).unwrap(),
            vec![
                path(&["amount"]),
                path(&["cur"]),
                path(&["items", "2"]),
                path(&["meta"]),
                path(&["new"]),
            ]
        );
        assert!(differences(&a, &a).unwrap().is_empty());
    }

    #[test]
    fn pretty_marks_the_differing_lines_and_their_insides() {
        let a = v(r#"{"a":1,"m":{"x":[1]}}"#);
        let lines = pretty(&a, &[path(&["m"])]);
        let shown: Vec<(String, bool)> = lines
            .iter()
            .map(|l| (format!("{}{}", "  ".repeat(l.depth), l.text), l.marked))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("{".to_owned(), false),
                ("  \"a\": 1,".to_owned(), false),
                ("  \"m\": {".to_owned(), true),
                ("    \"x\": [".to_owned(), true),
                ("      1".to_owned(), true),
                ("    ]".to_owned(), true),
                ("  }".to_owned(), true),
                ("}".to_owned(), false),
            ]
        );
    }

    #[test]
    fn rendering_escapes_markup_in_keys_and_values() {
        let a = v(r#"{"<b>":"<script>alert(1)</script>&"}"#);
        let html = render(&pretty(&a, &[path(&["<b>"])])).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;"),
            "{html}"
        );
    }

    /// Wide payloads, as anyone may send to an unsigned source: every member and element
    /// differs, and each one is found and marked (in time linear in the size, not quadratic).
    #[test]
    fn wide_payloads_differ_everywhere_and_every_line_is_marked() {
        let n = 60_000;
        let object = |x: u32| {
            let members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{x}")).collect();
            v(&format!("{{{}}}", members.join(",")))
        };
        let array = |x: u32| v(&format!("[{}]", vec![x.to_string(); n].join(",")));
        for (a, b) in [(object(0), object(1)), (array(0), array(1))] {
            let d = differences(&a, &b).unwrap();
            assert_eq!(d.len(), n);
            let lines = pretty(&a, &d);
            assert_eq!(lines.len(), n + 2);
            assert_eq!(lines.iter().filter(|l| l.marked).count(), n);
        }
    }

    /// A few kilobytes of payload, thousands of differences far down under long keys: their
    /// paths, a copy of the keys above each, would take over a hundred megabytes.
    #[test]
    fn differences_deep_under_long_keys_are_given_up_past_the_budget() {
        let nest = |leaf: &str| {
            let key = format!("\"{}\"", "k".repeat(200));
            let mut doc = leaf.to_owned();
            for _ in 0..100 {
                doc = format!("{{{key}:{doc}}}");
            }
            v(&doc)
        };
        let zeros = |x: u32| format!("[{}]", vec![x.to_string(); 6_000].join(","));
        let (a, b) = (nest(&zeros(0)), nest(&zeros(1)));
        assert_eq!(differences(&a, &b), None);
        // Few of them, as deep: found.
        let (a, b) = (nest("[0,0]"), nest("[0,1]"));
        assert_eq!(differences(&a, &b).map(|d| d.len()), Some(1));
    }

    #[test]
    fn empty_containers_and_scalars_are_one_line() {
        assert_eq!(pretty(&v("{}"), &[]).len(), 1);
        assert_eq!(pretty(&v("[]"), &[]).len(), 1);
        assert_eq!(pretty(&v("\"a\\nb\""), &[])[0].text, "\"a\\nb\"");
    }
}
