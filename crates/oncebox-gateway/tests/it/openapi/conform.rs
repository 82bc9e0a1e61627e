//! Checks a value against the OpenAPI document's schemas: the JSON Schema keywords the document
//! uses, and its patterns' regular expressions. An unknown keyword or pattern syntax is an error,
//! never skipped: a declaration this cannot read is not a declaration it checked.

use serde_json::Value;

/// Whether `value` fits `schema`, whose `$ref`s name `doc`'s components; the error says where
/// and why not.
pub fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let rules = schema
        .as_object()
        .ok_or_else(|| format!("{at}: {schema} is no schema"))?;
    let fail = |why: String| Err(format!("{at}: {value} {why}"));
    for (keyword, rule) in rules {
        match (keyword.as_str(), value) {
            ("$ref", _) => {
                let name = rule.as_str().unwrap_or_default();
                let name = name.strip_prefix("#/components/schemas/").unwrap_or(name);
                let target = &doc["components"]["schemas"][name];
                if target.is_null() {
                    return Err(format!("{at}: no schema {rule}"));
                }
                conforms(doc, target, value, at)?;
            }
            ("allOf", _) => {
                for part in rule.as_array().into_iter().flatten() {
                    conforms(doc, part, value, at)?;
                }
            }
            ("type", _) => {
                let types: Vec<&str> = match rule {
                    Value::Array(all) => all.iter().filter_map(Value::as_str).collect(),
                    one => one.as_str().into_iter().collect(),
                };
                if !types.iter().any(|t| is_type(value, t)) {
                    return fail(format!("is not {rule}"));
                }
            }
            ("required", Value::Object(fields)) => {
                for name in rule.as_array().into_iter().flatten() {
                    if !fields.contains_key(name.as_str().unwrap_or_default()) {
                        return fail(format!("lacks required {name}"));
                    }
                }
            }
            ("properties", Value::Object(fields)) => {
                for (name, property) in rule.as_object().into_iter().flatten() {
                    if let Some(field) = fields.get(name) {
                        conforms(doc, property, field, &format!("{at}.{name}"))?;
                    }
                }
            }
            ("items", Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    conforms(doc, rule, item, &format!("{at}[{i}]"))?;
                }
            }
            ("enum", _) if !rule.as_array().is_some_and(|all| all.contains(value)) => {
                return fail(format!("is not one of {rule}"));
            }
            ("const", _) if rule != value => return fail(format!("is not {rule}")),
            ("minItems" | "maxItems", Value::Array(items)) => {
                bound(keyword, rule, items.len()).or_else(fail)?;
            }
            ("minLength" | "maxLength", Value::String(text)) => {
                bound(keyword, rule, text.chars().count()).or_else(fail)?;
            }
            ("minimum", Value::Number(n)) if n.as_f64() < rule.as_f64() => {
                return fail(format!("is below {rule}"));
            }
            ("pattern", Value::String(text)) if !matches(rule.as_str().unwrap_or(""), text)? => {
                return fail(format!("does not match {rule}"));
            }
            // Annotations, and keywords that say nothing about a value of another type.
            ("description" | "format", _)
            | ("enum" | "const", _)
            | ("required" | "properties" | "items" | "minItems" | "maxItems", _)
            | ("minLength" | "maxLength" | "minimum" | "pattern", _) => {}
            (other, _) => return Err(format!("{at}: keyword {other} is not checked here")),
        }
    }
    Ok(())
}

fn is_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    }
}

/// `minX` or `maxX` against a count.
fn bound(keyword: &str, rule: &Value, count: usize) -> Result<(), String> {
    let limit = rule.as_u64().unwrap_or(0) as usize;
    let fits = if keyword.starts_with("min") {
        count >= limit
    } else {
        count <= limit
    };
    if fits {
        Ok(())
    } else {
        Err(format!("has {count}, {keyword} {limit}"))
    }
}

/// Whether `text` matches `pattern`, read as a regular expression. The document's patterns use
/// only syntax ECMA-262 and the `regex` crate read alike (anchors, classes, ranges, `\uXXXX`,
/// counted repeats).
pub fn matches(pattern: &str, text: &str) -> Result<bool, String> {
    let re = regex::Regex::new(pattern).map_err(|e| format!("pattern {pattern:?}: {e}"))?;
    Ok(re.is_match(text))
}

#[test]
fn the_checker_reads_its_patterns_as_a_regex_engine_would() {
    let slug = "^[a-z0-9][a-z0-9._-]{0,63}$";
    for (text, expected) in [("a", true), ("a.b_c-d", true), ("", false), ("-a", false)] {
        assert_eq!(matches(slug, text), Ok(expected), "{text:?}");
    }
    assert_eq!(matches(slug, &"a".repeat(64)), Ok(true));
    assert_eq!(matches(slug, &"a".repeat(65)), Ok(false));
    let id = r"^[^\u0000-\u001F]*[^\u0000-\u0020][^\u0000-\u001F]*$";
    for (text, expected) in [(" x ", true), ("  ", false), ("x\u{1}", false), ("é", true)] {
        assert_eq!(matches(id, text), Ok(expected), "{text:?}");
    }
    assert!(
        matches("^(a$", "a").is_err(),
        "a pattern that does not parse"
    );
}

#[test]
fn the_checker_refuses_what_a_schema_refuses() {
    use serde_json::json;
    let doc = json!({ "components": { "schemas": { "P": { "type": "object", "required": ["a"],
        "properties": { "a": { "type": ["integer", "null"], "minimum": 1 } } } } } });
    let p = json!({ "$ref": "#/components/schemas/P" });
    for good in [json!({ "a": 1 }), json!({ "a": null, "b": "x" })] {
        assert_eq!(conforms(&doc, &p, &good, "good"), Ok(()), "{good}");
    }
    for bad in [json!({}), json!({ "a": 0 }), json!({ "a": "1" }), json!([])] {
        assert!(conforms(&doc, &p, &bad, "bad").is_err(), "{bad}");
    }
    let unknown = json!({ "uniqueItems": true });
    assert!(
        conforms(&doc, &unknown, &json!([]), "").is_err(),
        "an unread keyword"
    );
}
