//! Reading an OpenAPI or Swagger document into `serde_json::Value`, telling its version
//! and resolving local JSON pointers in it.

use super::external::Externals;
use crate::RestError;
use serde_json::Value;

/// The document versions understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// Swagger 2.0.
    Swagger2,
    /// OpenAPI 3.0.x.
    OpenApi30,
    /// OpenAPI 3.1.x.
    OpenApi31,
    /// OpenAPI 3.2.x: 3.1 plus the `query` method, `additionalOperations` and `querystring`
    /// parameters.
    OpenApi32,
}

/// A parsed document with its version and where it came from (for error messages).
#[derive(Debug)]
pub(crate) struct Document {
    pub(crate) root: Value,
    pub(crate) version: Version,
    /// A file path or URL, for messages.
    pub(crate) source_name: String,
    /// The URL the document was fetched from, to resolve relative server URLs.
    pub(crate) source_url: Option<String>,
    /// The files its external references reached, put into `root` (see
    /// [`super::external`]), and those they could not.
    pub(crate) externals: Externals,
}

impl Document {
    /// Parses JSON (or, when that fails and the text does not look like JSON, YAML).
    pub(crate) fn parse(
        text: &str,
        source_name: &str,
        source_url: Option<&str>,
    ) -> Result<Document, RestError> {
        let root = parse_value(text, source_name)?;
        Document::from_value(root, source_name, source_url)
    }

    /// Checks the version of an already parsed document.
    pub(crate) fn from_value(
        root: Value,
        source_name: &str,
        source_url: Option<&str>,
    ) -> Result<Document, RestError> {
        let spec_error = |pointer: &str, message: String| RestError::Spec {
            source_name: source_name.to_owned(),
            pointer: if pointer.is_empty() { "/".to_owned() } else { pointer.to_owned() },
            message,
        };
        if !root.is_object() {
            return Err(spec_error("", "the document is not an object".into()));
        }
        let version = match (root.get("openapi"), root.get("swagger")) {
            (Some(v), _) => {
                let v = version_text(v);
                if v.starts_with("3.0") {
                    Version::OpenApi30
                } else if v.starts_with("3.1") {
                    Version::OpenApi31
                } else if v.starts_with("3.2") {
                    Version::OpenApi32
                } else {
                    return Err(spec_error(
                        "/openapi",
                        format!(
                            "unsupported OpenAPI version `{v}` (supported: 2.0, 3.0.x, 3.1.x, 3.2.x)"
                        ),
                    ));
                }
            }
            (None, Some(v)) => {
                let v = version_text(v);
                if v == "2.0" {
                    Version::Swagger2
                } else {
                    return Err(spec_error(
                        "/swagger",
                        format!("unsupported Swagger version `{v}` (supported: 2.0)"),
                    ));
                }
            }
            (None, None) => {
                return Err(spec_error(
                    "",
                    "neither `openapi` nor `swagger` is set: not an OpenAPI document".into(),
                ));
            }
        };
        if let Some(paths) = root.get("paths")
            && !paths.is_object()
        {
            return Err(spec_error("/paths", "`paths` is not an object".into()));
        }
        Ok(Document {
            root,
            version,
            source_name: source_name.to_owned(),
            source_url: source_url.map(str::to_owned),
            externals: Externals::default(),
        })
    }

    /// An error at `pointer` in this document, or in the external file it lies in.
    pub(crate) fn error(&self, pointer: &str, message: impl Into<String>) -> RestError {
        let (source_name, pointer) = match Externals::split(pointer)
            .and_then(|(n, inner)| Some((self.externals.names.get(n)?, inner)))
        {
            Some((name, inner)) => (name.clone(), inner),
            None => (self.source_name.clone(), pointer),
        };
        RestError::Spec {
            source_name,
            pointer: if pointer.is_empty() { "/".into() } else { pointer.to_owned() },
            message: message.into(),
        }
    }

    /// A reference as its author wrote it, for messages: `pet.yaml#/Pet`, not the
    /// `#/x-toolmux-external/0/Pet` it was rewritten to.
    pub(crate) fn show_ref(&self, reference: &str) -> String {
        let Some(pointer) = reference.strip_prefix('#') else { return reference.to_owned() };
        match Externals::split(pointer)
            .and_then(|(n, inner)| Some((self.externals.names.get(n)?, inner)))
        {
            Some((name, "")) => name.clone(),
            Some((name, inner)) => format!("{name}#{inner}"),
            None => reference.to_owned(),
        }
    }

    /// Why the external reference `reference` was not followed.
    pub(crate) fn unfollowed(&self, reference: &str) -> String {
        match self.externals.unfollowed.get(reference) {
            Some(why) => format!("external reference `{reference}` is not followed: {why}"),
            None => format!(
                "external reference `{reference}` is not followed: only documents read from \
                 a file or a URL follow external references"
            ),
        }
    }

    /// Resolves a local reference (`#/components/schemas/Pet`) to its target.
    pub(crate) fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        self.root.pointer(&percent_decode(pointer))
    }

    /// Follows `$ref` chains starting at `value` (found at `pointer`), up to a fixed depth.
    /// Returns the target with the pointer where it lives.
    pub(crate) fn follow<'a>(
        &'a self,
        value: &'a Value,
        pointer: &str,
    ) -> Result<(&'a Value, String), RestError> {
        let mut current = value;
        let mut at = pointer.to_owned();
        for _ in 0..32 {
            let Some(reference) = current.get("$ref").and_then(Value::as_str) else {
                return Ok((current, at));
            };
            if !reference.starts_with('#') {
                return Err(self.error(&format!("{at}/$ref"), self.unfollowed(reference)));
            }
            current = self.resolve(reference).ok_or_else(|| {
                let shown = self.show_ref(reference);
                self.error(&format!("{at}/$ref"), format!("dangling reference `{shown}`"))
            })?;
            at = percent_decode(&reference[1..]);
        }
        Err(self.error(&at, "reference chain longer than 32 steps (a cycle of `$ref`s?)"))
    }
}

fn version_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_owned(),
        other => other.to_string(),
    }
}

/// Parses a JSON or YAML document into a value; errors name line and column.
pub(crate) fn parse_value(text: &str, source_name: &str) -> Result<Value, RestError> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return serde_json::from_str(trimmed).map_err(|e| RestError::Syntax {
            source_name: source_name.to_owned(),
            location: format!("line {} column {}", e.line(), e.column()),
            message: strip_position(&e.to_string()),
        });
    }
    let syntax = |e: serde_yaml_ng::Error| {
        let location = e.location().map_or_else(
            || "an unknown place".to_owned(),
            |l| format!("line {} column {}", l.line(), l.column()),
        );
        RestError::Syntax {
            source_name: source_name.to_owned(),
            location,
            message: strip_position(&e.to_string()),
        }
    };
    // Read into YAML's own value first, so that merge keys (`<<: *anchor`, YAML 1.1, as
    // the configuration loader takes them) are applied rather than kept as a `<<` key.
    let Yaml(mut value) = serde_yaml_ng::from_str::<Yaml>(trimmed).map_err(syntax)?;
    value.apply_merge().map_err(syntax)?;
    yaml_to_json(value).map_err(|message| RestError::Syntax {
        source_name: source_name.to_owned(),
        location: "an unknown place".to_owned(),
        message,
    })
}

/// A YAML value read as JSON reads numbers: an integer wider than 64 bits
/// (`maximum: 99999999999999999999999`) becomes the nearest float, where YAML's own value
/// refuses it and the whole document with it. A tag (`!Thing value`) is dropped for the
/// value it tags, as JSON has none.
struct Yaml(serde_yaml_ng::Value);

impl<'de> serde::Deserialize<'de> for Yaml {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Yaml, D::Error> {
        deserializer.deserialize_any(YamlVisitor).map(Yaml)
    }
}

struct YamlVisitor;

impl<'de> serde::de::Visitor<'de> for YamlVisitor {
    type Value = serde_yaml_ng::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(b.into())
    }

    fn visit_i64<E>(self, i: i64) -> Result<Self::Value, E> {
        Ok(i.into())
    }

    fn visit_u64<E>(self, u: u64) -> Result<Self::Value, E> {
        Ok(u.into())
    }

    #[allow(clippy::cast_precision_loss)] // JSON reads such a number as this float too.
    fn visit_i128<E>(self, i: i128) -> Result<Self::Value, E> {
        Ok((i as f64).into())
    }

    #[allow(clippy::cast_precision_loss)] // JSON reads such a number as this float too.
    fn visit_u128<E>(self, u: u128) -> Result<Self::Value, E> {
        Ok((u as f64).into())
    }

    fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
        Ok(f.into())
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(s.into())
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(s.into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_yaml_ng::Value::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_yaml_ng::Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(YamlVisitor)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = serde_yaml_ng::Sequence::new();
        while let Some(Yaml(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(serde_yaml_ng::Value::Sequence(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut mapping = serde_yaml_ng::Mapping::new();
        while let Some((Yaml(key), Yaml(value))) = map.next_entry()? {
            mapping.insert(key, value);
        }
        Ok(serde_yaml_ng::Value::Mapping(mapping))
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, tagged: A) -> Result<Self::Value, A::Error> {
        use serde::de::VariantAccess;
        let (_tag, contents): (String, _) = tagged.variant()?;
        contents.newtype_variant::<Yaml>().map(|Yaml(value)| value)
    }
}

/// A YAML value as JSON: keys that are numbers, booleans or null (`200:` of a response)
/// become their text; a non-finite float (`.nan`, `.inf`) becomes `null`, as JSON has none.
fn yaml_to_json(value: serde_yaml_ng::Value) -> Result<Value, String> {
    use serde_yaml_ng::Value as Y;
    Ok(match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into(),
            (None, Some(i), _) => i.into(),
            (None, None, Some(f)) => {
                serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
            }
            (None, None, None) => Value::Null,
        },
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => {
            Value::Array(items.into_iter().map(yaml_to_json).collect::<Result<_, _>>()?)
        }
        Y::Mapping(mapping) => {
            let mut map = serde_json::Map::new();
            for (key, value) in mapping {
                let key = match key {
                    Y::String(s) => s,
                    Y::Number(n) => n.to_string(),
                    Y::Bool(b) => b.to_string(),
                    Y::Null => "null".to_owned(),
                    Y::Tagged(tagged) => match tagged.value {
                        Y::String(s) => s,
                        _ => return Err("a mapping key is not a string".to_owned()),
                    },
                    Y::Sequence(_) | Y::Mapping(_) => {
                        return Err("a mapping key is a list or a mapping, which JSON cannot \
                                    hold: write it as a string"
                            .to_owned());
                    }
                };
                map.insert(key, yaml_to_json(value)?);
            }
            Value::Object(map)
        }
        Y::Tagged(tagged) => yaml_to_json(tagged.value)?,
    })
}

/// Drops the ` at line N column M` a parser appends, since the error names it separately.
fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Decodes `%XX` escapes of a URI fragment (JSON pointer `~` escapes are left to
/// `Value::pointer`).
pub(crate) fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Escapes one token of a JSON pointer.
pub(crate) fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn error_of(text: &str) -> String {
        Document::parse(text, "spec.yaml", None).unwrap_err().to_string()
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        expect!["spec.yaml: not valid JSON or YAML at line 2 column 12: key must be a string"]
            .assert_eq(&error_of("{\"openapi\": \"3.0.0\",\n \"paths\": {]}"));
        expect!["spec.yaml: not valid JSON or YAML at line 2 column 9: mapping values are not allowed in this context"]
            .assert_eq(&error_of("openapi: 3.0.0\npaths: a: b: c\n"));
    }

    #[test]
    fn versions() {
        expect![[r#"spec.yaml: at /openapi: unsupported OpenAPI version `4.0.0` (supported: 2.0, 3.0.x, 3.1.x, 3.2.x)"#]]
            .assert_eq(&error_of("openapi: 4.0.0\npaths: {}\n"));
        expect![[r#"spec.yaml: at /swagger: unsupported Swagger version `1.2` (supported: 2.0)"#]]
            .assert_eq(&error_of("{\"swagger\": \"1.2\"}"));
        expect!["spec.yaml: at /: neither `openapi` nor `swagger` is set: not an OpenAPI document"]
            .assert_eq(&error_of("info: {}\n"));
        let doc = Document::parse("openapi: 3.1.0\npaths: {}\n", "s", None).unwrap();
        assert_eq!(doc.version, Version::OpenApi31);
    }

    #[test]
    fn follows_reference_chains() {
        let doc = Document::parse(
            r##"{"openapi":"3.0.0","paths":{},"components":{"schemas":{
                "A":{"$ref":"#/components/schemas/B"},"B":{"type":"string"},
                "C":{"$ref":"#/components/schemas/Missing"}}}}"##,
            "s.json",
            None,
        )
        .unwrap();
        let a = &doc.root["components"]["schemas"]["A"];
        let (target, at) = doc.follow(a, "/components/schemas/A").unwrap();
        assert_eq!(target["type"], "string");
        assert_eq!(at, "/components/schemas/B");
        let c = &doc.root["components"]["schemas"]["C"];
        expect![[r#"s.json: at /components/schemas/C/$ref: dangling reference `#/components/schemas/Missing`"#]]
            .assert_eq(&doc.follow(c, "/components/schemas/C").unwrap_err().to_string());
    }
}
