//! `${parameters.x}` templates of inline tools, filled from a call's arguments.
//!
//! `${VAR}` references to the environment were expanded by whoever loaded the
//! configuration; only `${parameters.` placeholders are left for us. A name may use dots to
//! reach into an object argument (`${parameters.user.id}`).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

const PREFIX: &str = "${parameters.";

/// Everything but RFC 3986 unreserved characters is escaped, in path segments and in query
/// components alike: `/`, `?`, `#` and `\` in a value never end its segment. `.` stays as
/// it is, so a value that would make a whole `.` or `..` segment is refused instead (see
/// [`dot_segment`]).
pub(crate) const COMPONENT: &AsciiSet =
    &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Percent-encodes one URL component.
pub(crate) fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// How placeholder values are written into the text around them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Escape {
    /// Percent-encoded as one URL component.
    Component,
    /// As they are (headers, body strings).
    Verbatim,
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Parameter(String),
}

/// A parsed template string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    pub(crate) fn parse(text: &str) -> Template {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(PREFIX) {
            let after = &rest[start + PREFIX.len()..];
            let Some(end) = after.find('}') else { break };
            let name = &after[..end];
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid {
                pieces.push(Piece::Text(rest[..start + PREFIX.len()].to_owned()));
                rest = after;
                continue;
            }
            if start > 0 {
                pieces.push(Piece::Text(rest[..start].to_owned()));
            }
            pieces.push(Piece::Parameter(name.to_owned()));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Template { pieces }
    }

    /// The parameter names used.
    pub(crate) fn parameters(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Parameter(name) => Some(name.as_str()),
            Piece::Text(_) => None,
        })
    }

    /// The text the template writes around its placeholders, piece by piece.
    pub(crate) fn texts(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Text(text) => Some(text.as_str()),
            Piece::Parameter(_) => None,
        })
    }

    /// The template as a reader would write it: each placeholder as `{name}`.
    pub(crate) fn shown(&self) -> String {
        self.pieces
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Parameter(name) => format!("{{{name}}}"),
            })
            .collect()
    }

    /// The parameter when the template is exactly one placeholder.
    pub(crate) fn sole_parameter(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Parameter(name)] => Some(name),
            _ => None,
        }
    }

    /// Fills the template; `Err(name)` names the first missing argument.
    pub(crate) fn render(
        &self,
        args: &Map<String, Value>,
        escape: Escape,
    ) -> Result<String, String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Parameter(name) => {
                    let value = lookup(args, name).ok_or_else(|| name.clone())?;
                    let text = value_text(value);
                    match escape {
                        Escape::Component => out.push_str(&encode(&text)),
                        Escape::Verbatim => out.push_str(&text),
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The argument at a dotted name; `null` counts as absent.
pub(crate) fn lookup<'a>(args: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    if let Some(value) = args.get(name) {
        return (!value.is_null()).then_some(value);
    }
    let mut parts = name.split('.');
    let mut current = args.get(parts.next()?)?;
    for part in parts {
        current = current.get(part)?;
    }
    (!current.is_null()).then_some(current)
}

/// A value as text: strings as they are, everything else as compact JSON, but a whole
/// number written with a fraction (`5.0`, as Python writes a float, and an integer to
/// JSON Schema) without it: `/items/5.0` names no item. Only up to 2^53, below which
/// every whole number is exact as a float.
pub(crate) fn value_text(value: &Value) -> String {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Number(n) => match n.as_f64() {
            #[allow(clippy::cast_possible_truncation)] // Whole and within ±2^53: exact.
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() <= EXACT => (f as i64).to_string(),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// Why a URL template could not be filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UrlError {
    /// The argument is absent.
    Missing(String),
    /// The argument would make a `.` or `..` path segment.
    DotSegment {
        /// The argument.
        parameter: String,
        /// The segment it would make.
        segment: String,
    },
    /// The argument is empty and would leave an empty path segment.
    EmptySegment(String),
    /// The argument fills part of the URL's host (or port or user info) with a value its
    /// `enum` does not list.
    Host {
        /// The argument.
        parameter: String,
        /// The values the tool's `parametersSchema` allows.
        allowed: Vec<String>,
    },
}

impl UrlError {
    /// The message for the caller, naming the argument.
    pub(crate) fn message(&self) -> String {
        match self {
            UrlError::Missing(name) => format!("missing argument `{name}` for the URL"),
            UrlError::DotSegment { parameter, segment } => dot_segment_message(parameter, segment),
            UrlError::EmptySegment(parameter) => format!(
                "path argument `{parameter}` is empty; give it a value: an empty one would \
                 leave an empty segment in the path, which names another resource"
            ),
            UrlError::Host { parameter, allowed } => format!(
                "argument `{parameter}` goes into the URL's host, where only the values its \
                 `enum` lists are taken: {}",
                allowed.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Why a path argument is refused: URL parsers resolve `.` and `..` segments (and their
/// `%2e` spellings), so the request would leave the path the tool was made for.
pub(crate) fn dot_segment_message(parameter: &str, segment: &str) -> String {
    format!(
        "path argument `{parameter}` would make the URL path segment `{segment}`, which steps \
         out of the tool's path; `.` and `..` are refused in path arguments"
    )
}

/// Whether a path segment is one URL parsers resolve away: `.` or `..`, also spelled with
/// `%2e` (the WHATWG URL standard treats `%2e` as a dot there).
pub(crate) fn dot_segment(segment: &str) -> bool {
    let plain = segment.to_ascii_lowercase().replace("%2e", ".");
    plain == "." || plain == ".."
}

/// A URL template: its path part (before `?`) and its query pairs.
#[derive(Debug, Clone)]
pub(crate) struct UrlTemplate {
    path: Template,
    query: Vec<(Template, Template)>,
    /// The values each parameter of the authority (host, port, user info) may take, as
    /// text; one with no entry takes none.
    authority_values: Vec<(String, Vec<String>)>,
}

impl UrlTemplate {
    /// The template of URL `url`, without its fragment: a fragment is never sent (it is
    /// the client's), and the query the arguments add must go before it, or the request
    /// would lose that query with the fragment.
    pub(crate) fn parse(url: &str) -> UrlTemplate {
        let url = url.split_once('#').map_or(url, |(url, _)| url);
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        let query = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (Template::parse(k), Template::parse(v))
            })
            .collect();
        UrlTemplate { path: Template::parse(path), query, authority_values: Vec::new() }
    }

    /// The parameters written into the URL's authority (between `://` and the path): its
    /// host, port or user info. An argument there chooses where the request goes, so each
    /// takes only the values [`UrlTemplate::allow_authority_values`] gives it.
    pub(crate) fn authority_parameters(&self) -> Vec<&str> {
        let mut found = Vec::new();
        // Whether `://` has been written, and whether the path has begun since.
        let mut written = String::new();
        for piece in &self.path.pieces {
            match piece {
                Piece::Text(text) => {
                    let before = written.len();
                    written.push_str(text);
                    if let Some(at) = written.find("://") {
                        let authority_start = at + 3;
                        let searched = authority_start.max(before);
                        if written[searched..].contains('/') {
                            return found;
                        }
                    }
                }
                Piece::Parameter(name) => {
                    // Before the scheme's end a value would be part of the scheme or the
                    // authority; values cannot write `/`, so both count.
                    found.push(name.as_str());
                }
            }
        }
        found
    }

    /// The values (as text) an authority parameter may take.
    pub(crate) fn allow_authority_values(&mut self, parameter: &str, values: Vec<String>) {
        self.authority_values.push((parameter.to_owned(), values));
    }

    /// Parameters the path needs (required ones).
    pub(crate) fn path_parameters(&self) -> impl Iterator<Item = &str> {
        self.path.parameters()
    }

    /// Parameters of the query part.
    pub(crate) fn query_parameters(&self) -> impl Iterator<Item = &str> {
        self.query.iter().flat_map(|(k, v)| k.parameters().chain(v.parameters()))
    }

    /// The URL with every placeholder filled and encoded for its position; a query pair
    /// whose value is one placeholder of an absent argument is left out. A path argument
    /// that would make a `.` or `..` segment is refused.
    pub(crate) fn render(&self, args: &Map<String, Value>) -> Result<String, UrlError> {
        let mut url = self.render_path(args)?;
        let mut first = true;
        for (key, value) in &self.query {
            if value.sole_parameter().is_some_and(|name| lookup(args, name).is_none()) {
                continue;
            }
            url.push(if first { '?' } else { '&' });
            first = false;
            url.push_str(&key.render(args, Escape::Component).map_err(UrlError::Missing)?);
            let value = value.render(args, Escape::Component).map_err(UrlError::Missing)?;
            if !value.is_empty() {
                url.push('=');
                url.push_str(&value);
            }
        }
        Ok(url)
    }

    /// The path part, filled, with no argument making a `.` or `..` segment.
    fn render_path(&self, args: &Map<String, Value>) -> Result<String, UrlError> {
        let authority = self.authority_parameters();
        let mut out = String::new();
        // Where each argument's text lies in `out`.
        let mut spans: Vec<(usize, usize, &str)> = Vec::new();
        for piece in &self.path.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Parameter(name) => {
                    let value =
                        lookup(args, name).ok_or_else(|| UrlError::Missing(name.clone()))?;
                    if authority.contains(&name.as_str()) {
                        let allowed = self
                            .authority_values
                            .iter()
                            .find(|(parameter, _)| parameter == name)
                            .map(|(_, values)| values.clone())
                            .unwrap_or_default();
                        let text = value_text(value);
                        if !allowed.contains(&text) {
                            return Err(UrlError::Host { parameter: name.clone(), allowed });
                        }
                        // One of the configuration's own values, as it wrote it
                        // (`127.0.0.1:8080` keeps its colon).
                        out.push_str(&text);
                        continue;
                    }
                    let start = out.len();
                    out.push_str(&encode(&value_text(value)));
                    spans.push((start, out.len(), name));
                }
            }
        }
        let mut start = 0;
        for segment in out.split('/') {
            let end = start + segment.len();
            // An empty argument that is all of its segment (`/users//x`); the empty segment
            // of `https://` holds no argument.
            if segment.is_empty()
                && let Some(&(_, _, name)) = spans.iter().find(|&&(s, e, _)| s == start && e == end)
            {
                return Err(UrlError::EmptySegment(name.to_owned()));
            }
            if dot_segment(segment) {
                // A value within the segment counts, an empty one too (`.${parameters.x}.`
                // with `x` empty); one with text is named first.
                let within = |&&(s, e, _): &&(usize, usize, &str)| s < end && e > start;
                let culprit = spans
                    .iter()
                    .find(|span| span.0 < span.1 && within(span))
                    .or_else(|| spans.iter().find(within));
                if let Some(&(_, _, name)) = culprit {
                    return Err(UrlError::DotSegment {
                        parameter: name.to_owned(),
                        segment: segment.to_owned(),
                    });
                }
            }
            start = end + 1;
        }
        Ok(out)
    }
}

/// Fills a body template: a string that is one placeholder takes the argument's JSON value
/// (an object member whose placeholder has no argument is left out), other strings are
/// filled as text.
pub(crate) fn render_body(template: &Value, args: &Map<String, Value>) -> Result<Value, String> {
    match template {
        Value::String(text) => {
            let parsed = Template::parse(text);
            if let Some(name) = parsed.sole_parameter() {
                return Ok(lookup(args, name).cloned().unwrap_or(Value::Null));
            }
            parsed.render(args, Escape::Verbatim).map(Value::String)
        }
        Value::Array(items) => items
            .iter()
            .map(|item| render_body(item, args))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if let Value::String(text) = value
                    && let Some(name) = Template::parse(text).sole_parameter()
                    && lookup(args, name).is_none()
                {
                    continue;
                }
                out.insert(key.clone(), render_body(value, args)?);
            }
            Ok(Value::Object(out))
        }
        other => Ok(other.clone()),
    }
}

/// Every placeholder of a body template.
/// The parameters that stand alone as a whole string of the body template
/// (`"count": "${parameters.count}"`): each takes the argument's JSON value as it is.
pub(crate) fn sole_body_parameters(template: &Value, out: &mut BTreeSet<String>) {
    match template {
        Value::String(text) => {
            out.extend(Template::parse(text).sole_parameter().map(str::to_owned));
        }
        Value::Array(items) => items.iter().for_each(|v| sole_body_parameters(v, out)),
        Value::Object(map) => map.values().for_each(|v| sole_body_parameters(v, out)),
        _ => {}
    }
}

pub(crate) fn body_parameters(template: &Value, out: &mut BTreeSet<String>) {
    match template {
        Value::String(text) => out.extend(Template::parse(text).parameters().map(str::to_owned)),
        Value::Array(items) => items.iter().for_each(|v| body_parameters(v, out)),
        Value::Object(map) => map.values().for_each(|v| body_parameters(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn url_placeholders_are_encoded_per_position() {
        let url = UrlTemplate::parse(
            "http://h/v1/${parameters.city}/x?q=${parameters.q}&unit=${parameters.unit}&fixed=1",
        );
        let got = url
            .render(&args(json!({"city": "São Paulo/../x", "q": "a&b=c d", "unit": null})))
            .unwrap();
        assert_eq!(got, "http://h/v1/S%C3%A3o%20Paulo%2F..%2Fx/x?q=a%26b%3Dc%20d&fixed=1");
        assert_eq!(url.render(&args(json!({}))).unwrap_err(), UrlError::Missing("city".into()));
    }

    #[test]
    fn an_empty_path_argument_is_refused() {
        let url = UrlTemplate::parse("https://h/users/${parameters.id}/posts?q=${parameters.q}");
        let empty = url.render(&args(json!({"id": "", "q": ""}))).unwrap_err();
        assert_eq!(
            empty.message(),
            "path argument `id` is empty; give it a value: an empty one would leave an empty \
             segment in the path, which names another resource"
        );
        // An empty query value and a value sharing its segment with text are fine.
        assert!(url.render(&args(json!({"id": "7", "q": ""}))).is_ok());
        let joined = UrlTemplate::parse("https://h/users/u${parameters.id}");
        assert!(joined.render(&args(json!({"id": ""}))).is_ok());
    }

    #[test]
    fn path_arguments_cannot_make_dot_segments() {
        let url = UrlTemplate::parse("http://h/v1/users/${parameters.id}/x.${parameters.ext}");
        let refused = |v: Value| url.render(&args(v)).unwrap_err();
        for id in ["..", "."] {
            assert_eq!(
                refused(json!({"id": id, "ext": "json"})),
                UrlError::DotSegment { parameter: "id".into(), segment: id.into() }
            );
        }
        // A value spelling dots as `%2e` is encoded to `%252e`, which no parser reads as one.
        assert_eq!(
            url.render(&args(json!({"id": "%2e%2E", "ext": "j"}))).unwrap(),
            "http://h/v1/users/%252e%252E/x.j"
        );
        assert!(dot_segment("%2e%2E") && dot_segment(".%2E") && !dot_segment("..."));
        // `x.` + `.` is `x..`, an ordinary segment; `..` after a text is one too.
        assert_eq!(
            url.render(&args(json!({"id": "a..b", "ext": "."}))).unwrap(),
            "http://h/v1/users/a..b/x.."
        );
        let dots = UrlTemplate::parse("http://h/v1/.${parameters.a}${parameters.b}/z");
        assert_eq!(
            dots.render(&args(json!({"a": "", "b": "."}))).unwrap_err().message(),
            "path argument `b` would make the URL path segment `..`, which steps out of the \
             tool's path; `.` and `..` are refused in path arguments"
        );
        // Separators in a value are encoded, so a value stays within its segment.
        assert_eq!(
            url.render(&args(json!({"id": "../a?b#c\\d", "ext": "j"}))).unwrap(),
            "http://h/v1/users/..%2Fa%3Fb%23c%5Cd/x.j"
        );
    }

    #[test]
    fn non_placeholders_and_env_leftovers_stay_text() {
        let t = Template::parse("a ${HOME} ${parameters.} ${parameters.x y} ${parameters.n}");
        assert_eq!(
            t.render(&args(json!({"n": 5})), Escape::Verbatim).unwrap(),
            "a ${HOME} ${parameters.} ${parameters.x y} 5"
        );
    }

    #[test]
    fn body_keeps_json_types_and_drops_absent_members() {
        let body = json!({"n": "${parameters.n}", "s": "id-${parameters.n}",
                          "o": "${parameters.user.name}", "gone": "${parameters.missing}",
                          "list": ["${parameters.n}"]});
        let got = render_body(&body, &args(json!({"n": 3, "user": {"name": "ann"}}))).unwrap();
        assert_eq!(got, json!({"n": 3, "s": "id-3", "o": "ann", "list": [3]}));
    }
}
