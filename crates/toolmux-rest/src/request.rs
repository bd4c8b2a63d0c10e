//! Requests built from flat arguments: path templating, query and header styles, cookies,
//! JSON, form and multipart bodies.

use crate::openapi::{BodyEncoding, Field, Location, Operation, Style};
use crate::template::{dot_segment, dot_segment_message, encode, value_text};
use serde_json::{Map, Value};
use toolmux_core::suggest::closest;

/// A request ready to send, independent of the HTTP client.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PreparedRequest {
    pub(crate) method: String,
    /// The full URL, query included, already encoded.
    pub(crate) url: String,
    pub(crate) headers: Vec<(String, String)>,
    /// Cookies as `name=value` pairs (values encoded); the pairs one exploded parameter
    /// makes (`color=blue; color=black`) are one entry, joined by `; `.
    pub(crate) cookies: Vec<String>,
    pub(crate) body: Body,
}

/// A request body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    None,
    Json(Value),
    Form(Vec<(String, String)>),
    Multipart(Vec<MultipartField>),
    Raw { content_type: String, text: String },
}

/// One multipart field.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MultipartField {
    pub(crate) name: String,
    /// The part's content: text as UTF-8, or a file's bytes.
    pub(crate) value: Vec<u8>,
    /// Sent as a file part named after the field.
    pub(crate) file: bool,
    /// The part's media type, when it has one.
    pub(crate) content_type: Option<String>,
}

impl PreparedRequest {
    /// Appends `name=value` (both raw) to the query (the URL has no fragment: templates and
    /// server URLs are read without theirs).
    pub(crate) fn add_query(&mut self, name: &str, value: &str) {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        self.url.push(sep);
        self.url.push_str(&encode(name));
        self.url.push('=');
        self.url.push_str(&encode(value));
    }

    /// Sets query parameter `name` to `value` (both raw), removing any it had.
    pub(crate) fn set_query(&mut self, name: &str, value: &str) {
        if let Some((base, query)) = self.url.split_once('?') {
            let encoded = encode(name);
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| pair.split('=').next() != Some(encoded.as_str()))
                .filter(|pair| !pair.is_empty())
                .collect();
            self.url = if kept.is_empty() {
                base.to_owned()
            } else {
                format!("{base}?{}", kept.join("&"))
            };
        }
        self.add_query(name, value);
    }

    /// Sets header `name` to `value`, removing any of that name (in any case).
    pub(crate) fn set_header(&mut self, name: &str, value: String) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value));
    }

    /// Sets cookie `name` to `value` (raw), removing any of that name. Only the bytes a
    /// cookie value cannot hold (RFC 6265 §4.1.1: controls, space, `"`, `,`, `;`, `\`
    /// and non-ASCII) are percent-encoded: servers read the value as written, so an API
    /// key `abc+d/e==` must arrive as it is, not as `abc%2Bd%2Fe%3D%3D`.
    pub(crate) fn set_cookie(&mut self, name: &str, value: &str) {
        self.remove_cookie(name);
        let mut encoded = String::with_capacity(value.len());
        for byte in value.bytes() {
            match byte {
                0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E => {
                    encoded.push(char::from(byte));
                }
                other => encoded.push_str(&format!("%{other:02X}")),
            }
        }
        self.cookies.push(format!("{name}={encoded}"));
    }

    /// Sets the cookies of a `Cookie` header's value (`a=1; b=2`, sent as written), each
    /// removing any of its name.
    pub(crate) fn set_cookies(&mut self, header: &str) {
        for pair in header.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            self.remove_cookie(cookie_name(pair));
            self.cookies.push(pair.to_owned());
        }
    }

    /// Removes the cookies named `name`, from an exploded parameter's entry too (the
    /// entry's other pairs stay).
    fn remove_cookie(&mut self, name: &str) {
        for entry in &mut self.cookies {
            if entry.split(';').any(|pair| cookie_name(pair) == name) {
                *entry = entry
                    .split(';')
                    .map(str::trim)
                    .filter(|pair| !pair.is_empty() && cookie_name(pair) != name)
                    .collect::<Vec<_>>()
                    .join("; ");
            }
        }
        self.cookies.retain(|entry| !entry.is_empty());
    }

    /// The value of the one `Cookie` header the request sends (RFC 6265 §5.4 allows one):
    /// the pairs of its `Cookie` headers, then its cookies, a cookie replacing an earlier
    /// one of its name in its place. The pairs of one entry of `cookies` (an exploded
    /// array's `color=blue; color=black`) replace earlier ones together and are all kept.
    pub(crate) fn cookie_header(&self) -> Option<String> {
        let headers = self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("cookie"));
        let entries =
            headers.flat_map(|(_, v)| v.split(';')).chain(self.cookies.iter().map(String::as_str));
        let mut merged: Vec<&str> = Vec::new();
        for entry in entries {
            let pairs: Vec<&str> =
                entry.split(';').map(str::trim).filter(|p| !p.is_empty()).collect();
            let replaces = |p: &&str| pairs.iter().any(|q| cookie_name(q) == cookie_name(p));
            // In the place of the first pair they replace (none before it goes), else at
            // the end.
            let at = merged.iter().position(replaces).unwrap_or(merged.len());
            merged.retain(|p| !replaces(p));
            merged.splice(at..at, pairs.iter().copied());
        }
        (!merged.is_empty()).then(|| merged.join("; "))
    }

    /// The URL for messages: without its query and user info, which may hold credentials.
    pub(crate) fn url_for_messages(&self) -> String {
        url_for_messages(&self.url)
    }
}

/// Whether a header named so (any letter case) belongs to the HTTP message or its
/// connection, which the client sets: one taken from an argument could cut the body short
/// (`Content-Length`, `Transfer-Encoding`), hold the request until its timeout, or send it to
/// another virtual host (`Host`), so no parameter may fill it.
pub(crate) fn is_message_header(name: &str) -> bool {
    const OWN: [&str; 9] = [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "expect",
    ];
    let lower = name.trim().to_ascii_lowercase();
    OWN.contains(&lower.as_str()) || lower.starts_with("proxy-")
}

/// The name of a cookie pair `name=value`.
fn cookie_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name).trim()
}

/// `url` for messages and logs: without its query, its fragment and its user info (`user:password@`),
/// which may hold credentials (`?api_key=…`).
pub(crate) fn url_for_messages(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            // Fails only for URLs that cannot have user info, which then have none.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.into()
        }
        Err(_) => url.split(['?', '#']).next().unwrap_or_default().to_owned(),
    }
}

/// [`url_for_messages`] of a URL as written, for one that may not parse: the text up to its
/// query or fragment, without the user info before its host.
pub(crate) fn url_text_for_messages(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    format!("{scheme}://{host}{path}")
}

/// Builds the request of an imported operation from its flat arguments.
pub(crate) fn build(
    op: &Operation,
    base_url: &str,
    args: &Map<String, Value>,
) -> Result<PreparedRequest, String> {
    let mut path_values: Vec<(&Field, String)> = Vec::new();
    let mut query: Vec<String> = Vec::new();
    let mut headers = Vec::new();
    let mut cookies = Vec::new();
    let mut body_map = Map::new();
    let mut whole_body = None;
    let open_body = op.body.as_ref().is_some_and(|b| b.open && b.whole.is_none());
    // A JSON body carries an explicit `null` (an API's way to clear a field: GitHub's
    // `"milestone": null`); elsewhere `null` is the argument left out.
    let json_body = op.body.as_ref().is_some_and(|b| b.encoding == BodyEncoding::Json);
    for (name, value) in args {
        if op.fields.iter().any(|f| &f.flat == name)
            || (value.is_null() && !(json_body && open_body))
        {
            continue;
        }
        if !open_body {
            return Err(unknown_argument(name, op.fields.iter().map(|f| f.flat.as_str())));
        }
        // The body's schema takes properties it does not name.
        body_map.insert(name.clone(), value.clone());
    }
    for field in &op.fields {
        let value = args.get(&field.flat).filter(|v| !v.is_null());
        match field.location {
            Location::Path => {
                let Some(value) = value else {
                    return Err(format!("missing required path argument `{}`", field.flat));
                };
                let text = path_value(field, value);
                if text.is_empty() {
                    return Err(format!(
                        "path argument `{}` is empty; give it a value: an empty one would leave \
                         an empty segment in the path (`{}`), which names another resource",
                        field.flat,
                        op.path.replace(&format!("{{{}}}", field.name), "")
                    ));
                }
                path_values.push((field, text));
            }
            Location::Query => {
                if let Some(value) = value {
                    query_pairs(field, value, &mut query);
                }
            }
            Location::Header => {
                if let Some(value) = value {
                    let text = match field.style {
                        Style::Json => json_text(value),
                        _ => simple(value, field.explode),
                    };
                    headers.push((field.name.clone(), text));
                }
            }
            Location::Cookie => {
                if let Some(value) = value {
                    cookies.push(cookie_pairs(field, value));
                }
            }
            Location::Body => {
                if field.name.is_empty() {
                    whole_body = value.cloned();
                } else if let Some(value) = if json_body { args.get(&field.flat) } else { value } {
                    body_map.insert(field.name.clone(), value.clone());
                }
            }
        }
    }
    let path = fill_path(&op.path, &path_values)?;
    // A path written without its leading `/` (`{tenant}/items`) still starts the URL's
    // path: glued to the server, an argument would extend its host name.
    let slash = if path.starts_with('/') { "" } else { "/" };
    // A server URL with a query (`https://h/v1?tenant=acme`) keeps it after the path,
    // ahead of the operation's own query parameters.
    // A server URL's fragment is never sent: the path and query go where it was.
    let base_url = base_url.split_once('#').map_or(base_url, |(url, _)| url);
    let (base, base_query) = base_url.split_once('?').unwrap_or((base_url, ""));
    let mut url = format!("{}{slash}{path}", base.trim_end_matches('/'));
    let query: Vec<&str> = std::iter::once(base_query)
        .filter(|q| !q.is_empty())
        .chain(query.iter().map(String::as_str))
        .collect();
    if !query.is_empty() {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&query.join("&"));
    }
    let body = match &op.body {
        None => Body::None,
        Some(spec) => {
            let payload = match whole_body {
                Some(value) => Some(value),
                None if !body_map.is_empty() => Some(Value::Object(body_map)),
                // No property of a flattened JSON body was given. A required body is still
                // an object, `{}` (FastAPI answers a missing required body 422 "Field
                // required"). An optional one (`requestBody.required` false or absent,
                // FastAPI's `Optional[Item] = Body(None)`) is left out: OpenAPI says the
                // request may then have no body, and every server must take that, where
                // `null` is only valid when the schema allows it and some frameworks
                // refuse a `null` body even then.
                None if spec.required
                    && spec.whole.is_none()
                    && spec.encoding == BodyEncoding::Json =>
                {
                    Some(Value::Object(Map::new()))
                }
                None => None,
            };
            match payload {
                None => Body::None,
                Some(value) => encode_body(spec.encoding, &spec.content_type, value, &op.fields)?,
            }
        }
    };
    if let Some(spec) = &op.body
        && body != Body::None
        && !matches!(spec.encoding, BodyEncoding::Multipart | BodyEncoding::Form)
    {
        headers.push(("Content-Type".into(), spec.content_type.clone()));
    }
    Ok(PreparedRequest { method: op.method.clone(), url, headers, cookies, body })
}

fn encode_body(
    encoding: BodyEncoding,
    content_type: &str,
    value: Value,
    fields: &[Field],
) -> Result<Body, String> {
    match encoding {
        BodyEncoding::Json => Ok(Body::Json(value)),
        BodyEncoding::Raw => {
            Ok(Body::Raw { content_type: content_type.to_owned(), text: value_text(&value) })
        }
        BodyEncoding::Form => {
            let Value::Object(map) = value else {
                return Ok(Body::Raw {
                    content_type: content_type.to_owned(),
                    text: value_text(&value),
                });
            };
            let mut pairs = Vec::new();
            for (name, value) in map {
                // A field's style, from the body's `encoding` (OpenAPI 3) or its
                // `collectionFormat` (Swagger 2); a property the schema does not name goes
                // as an unnamed object would, as JSON text.
                let (style, explode) = match body_field(fields, &name) {
                    Some(field) => (field.style, field.explode),
                    None if value.is_object() => (Style::Json, false),
                    None => (Style::Form, true),
                };
                form_pairs(&name, &value, style, explode, &mut pairs);
            }
            Ok(Body::Form(pairs))
        }
        BodyEncoding::Multipart => {
            let Value::Object(map) = value else {
                return Ok(Body::Raw {
                    content_type: content_type.to_owned(),
                    text: value_text(&value),
                });
            };
            let mut parts = Vec::new();
            for (name, value) in map {
                let field = body_field(fields, &name);
                let file = field.is_some_and(|f| f.binary);
                let base64 = field.is_some_and(|f| f.base64);
                let declared = field.and_then(|f| f.content_type.clone());
                let argument = field.map_or(name.as_str(), |f| f.flat.as_str());
                // A list is one part each, files or not.
                let listed = value.is_array();
                let values = match value {
                    Value::Array(items) => items,
                    other => vec![other],
                };
                for (i, v) in values.into_iter().enumerate() {
                    let (bytes, media) = if base64 {
                        file_bytes(&v).map_err(|why| {
                            let which = if listed {
                                format!("item {i} of argument `{argument}`")
                            } else {
                                format!("argument `{argument}`")
                            };
                            format!(
                                "{which} is not a file in base64, as its schema says it is \
                                 given: {why}"
                            )
                        })?
                    } else {
                        (value_text(&v).into_bytes(), None)
                    };
                    // OpenAPI's default media types of parts: JSON for an object or an
                    // array, an octet stream for a file, plain text otherwise; a `data:`
                    // URL's own type before the defaults.
                    let content_type = declared.clone().or(media).or_else(|| {
                        if file {
                            Some("application/octet-stream".to_owned())
                        } else if v.is_object() || v.is_array() {
                            Some("application/json".to_owned())
                        } else {
                            None
                        }
                    });
                    parts.push(MultipartField {
                        name: name.clone(),
                        value: bytes,
                        file,
                        content_type,
                    });
                }
            }
            Ok(Body::Multipart(parts))
        }
    }
}

/// The bytes of a file given in base64, and the media type of a `data:` URL
/// (`data:image/png;base64,iVBOR…`, which models often write for a file).
fn file_bytes(value: &Value) -> Result<(Vec<u8>, Option<String>), String> {
    let Value::String(text) = value else {
        return Err(format!("a string of base64 is expected, not {value}"));
    };
    let (media, digits) = match text.strip_prefix("data:").and_then(|rest| rest.split_once(',')) {
        Some((header, digits)) if header.ends_with(";base64") => {
            let media = header.split(';').next().unwrap_or_default().trim();
            ((!media.is_empty()).then(|| media.to_owned()), digits)
        }
        _ => (None, text.as_str()),
    };
    Ok((decode_base64(digits)?, media))
}

/// The bytes of base64 text: the standard alphabet or the URL-safe one, padding optional,
/// whitespace (the line breaks of MIME's 76-column lines) ignored.
fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut buffer, mut bits, mut padded) = (0u32, 0u32, false);
    for (i, c) in text.chars().enumerate() {
        let digit = match c {
            'A'..='Z' => u32::from(c) - u32::from('A'),
            'a'..='z' => u32::from(c) - u32::from('a') + 26,
            '0'..='9' => u32::from(c) - u32::from('0') + 52,
            '+' | '-' => 62,
            '/' | '_' => 63,
            '=' => {
                padded = true;
                continue;
            }
            c if c.is_ascii_whitespace() => continue,
            other => return Err(format!("`{other}` (character {}) is no base64 digit", i + 1)),
        };
        if padded {
            return Err("digits follow the `=` padding".into());
        }
        buffer = (buffer << 6) | digit;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    // Four digits make three bytes; a lone digit after the last whole group is no byte.
    if bits == 6 {
        return Err("its digits end one short of a whole byte (truncated?)".into());
    }
    Ok(out)
}

/// The body field named `name` in the request.
fn body_field<'a>(fields: &'a [Field], name: &str) -> Option<&'a Field> {
    fields.iter().find(|f| f.location == Location::Body && f.name == name)
}

/// The `name=value` pairs (not yet encoded) of one form field in its style: an array's
/// items joined by the style's delimiter or, exploded, one pair each; an object's members
/// as pairs of their own (exploded `form`) or joined (`k,v,k2,v2`); `deepObject` as
/// bracketed names.
fn form_pairs(
    name: &str,
    value: &Value,
    style: Style,
    explode: bool,
    out: &mut Vec<(String, String)>,
) {
    match (style, value) {
        (Style::Json, _) => out.push((name.to_owned(), json_text(value))),
        (Style::DeepObject, Value::Array(_) | Value::Object(_)) => {
            deep_pairs(name.to_owned(), value, Empty::Value, out);
        }
        (_, Value::Array(items)) => {
            let sep = match style {
                Style::SpaceDelimited => " ",
                Style::PipeDelimited => "|",
                Style::TabDelimited => "\t",
                _ if explode => {
                    out.extend(items.iter().map(|item| (name.to_owned(), value_text(item))));
                    return;
                }
                _ => ",",
            };
            let joined: Vec<String> = items.iter().map(value_text).collect();
            out.push((name.to_owned(), joined.join(sep)));
        }
        (_, Value::Object(map)) if explode => {
            out.extend(map.iter().map(|(k, v)| (k.clone(), value_text(v))));
        }
        (_, Value::Object(map)) => {
            let flat: Vec<String> =
                map.iter().flat_map(|(k, v)| [k.clone(), value_text(v)]).collect();
            out.push((name.to_owned(), flat.join(",")));
        }
        (_, other) => out.push((name.to_owned(), value_text(other))),
    }
}

/// `deepObject` pairs (not yet encoded), nested as PHP, Rails and Stripe read them: an
/// object's members as `name[key]`, an array's items as `name[0]`, deeper values alike
/// (`line_items[0][price]`). An empty object or array is `name=` with `Empty::Value` (a
/// form body: Stripe clears an object's metadata on `metadata=`, and nothing else can say
/// it), and sends nothing with `Empty::Nothing` (a query, where an empty value would be a
/// filter on the empty string).
fn deep_pairs(prefix: String, value: &Value, empty: Empty, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if map.is_empty() && empty == Empty::Value => {
            out.push((prefix, String::new()));
        }
        Value::Array(items) if items.is_empty() && empty == Empty::Value => {
            out.push((prefix, String::new()));
        }
        Value::Object(map) => {
            for (key, member) in map {
                deep_pairs(format!("{prefix}[{key}]"), member, empty, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                deep_pairs(format!("{prefix}[{i}]"), item, empty, out);
            }
        }
        other => out.push((prefix, value_text(other))),
    }
}

/// What an empty object or array becomes under `deepObject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Empty {
    /// `name=`.
    Value,
    /// No pair at all.
    Nothing,
}

/// The message for an argument no parameter or body property takes: a misspelled name
/// would otherwise vanish from the request without a word.
pub(crate) fn unknown_argument<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> String {
    let known: Vec<&str> = known.collect();
    let hint = match closest(name, &known) {
        Some(best) => format!("; did you mean `{best}`?"),
        None if known.is_empty() => "; this tool takes no arguments".to_owned(),
        None => {
            let list: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            format!("; the arguments are {}", list.join(", "))
        }
    };
    format!("unknown argument `{name}`{hint}")
}

/// The path template filled segment by segment; a segment that arguments turn into `.` or
/// `..` is refused, since URL parsers would resolve it away and leave the operation's path.
fn fill_path(template: &str, values: &[(&Field, String)]) -> Result<String, String> {
    let mut segments = Vec::new();
    for segment in template.split('/') {
        let mut filled = segment.to_owned();
        let mut used = None;
        for (field, text) in values {
            let placeholder = format!("{{{}}}", field.name);
            if filled.contains(&placeholder) {
                filled = filled.replace(&placeholder, text);
                used = used.or(Some(field.flat.as_str()));
            }
        }
        if let Some(flat) = used
            && dot_segment(&filled)
        {
            return Err(dot_segment_message(flat, &filled));
        }
        segments.push(filled);
    }
    Ok(segments.join("/"))
}

/// A value as JSON text, for a parameter described by JSON `content` ([`Style::Json`]).
fn json_text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A path parameter, encoded, in its style.
fn path_value(field: &Field, value: &Value) -> String {
    if field.style == Style::Json {
        return encode(&json_text(value));
    }
    let encoded = |v: &Value| encode(&value_text(v));
    let items = || -> Vec<String> {
        match value {
            Value::Array(items) => items.iter().map(encoded).collect(),
            Value::Object(map) => map
                .iter()
                .flat_map(|(k, v)| {
                    if field.explode {
                        vec![format!("{}={}", encode(k), encoded(v))]
                    } else {
                        vec![encode(k), encoded(v)]
                    }
                })
                .collect(),
            other => vec![encoded(other)],
        }
    };
    match field.style {
        Style::Label => {
            let sep = if field.explode { "." } else { "," };
            format!(".{}", items().join(sep))
        }
        Style::Matrix => match value {
            Value::Array(_) if field.explode => {
                items().iter().map(|v| format!(";{}={v}", field.name)).collect::<String>()
            }
            Value::Object(_) if field.explode => {
                items().iter().map(|kv| format!(";{kv}")).collect()
            }
            _ => format!(";{}={}", field.name, items().join(",")),
        },
        _ => items().join(","),
    }
}

/// The cookie pairs of one cookie parameter, encoded, as OpenAPI's table has `form`: with
/// `explode` (its default) an array is one pair per item (`color=blue; color=black`) and an
/// object one per property (`R=100; G=200`), the `&` of the query's form written as the
/// `; ` that separates cookies (RFC 6265, and OpenAPI 3.2's `cookie` style); without it,
/// one pair holding the values with commas, which go encoded, as a cookie's value may not
/// hold a bare comma.
fn cookie_pairs(field: &Field, value: &Value) -> String {
    let exploded = field.style == Style::Form && field.explode;
    match value {
        _ if field.style == Style::Json => format!("{}={}", field.name, encode(&json_text(value))),
        Value::Array(items) if exploded => items
            .iter()
            .map(|item| format!("{}={}", field.name, encode(&value_text(item))))
            .collect::<Vec<_>>()
            .join("; "),
        Value::Object(map) if exploded => map
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(&value_text(v))))
            .collect::<Vec<_>>()
            .join("; "),
        // `simple` writes an object's properties `k,v` without explode, as `form` does.
        _ => format!("{}={}", field.name, encode(&simple(value, field.explode && !exploded))),
    }
}

/// A header or cookie value in `simple` style (unencoded).
fn simple(value: &Value, explode: bool) -> String {
    match value {
        Value::Array(items) => items.iter().map(value_text).collect::<Vec<_>>().join(","),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| {
                if explode {
                    format!("{k}={}", value_text(v))
                } else {
                    format!("{k},{}", value_text(v))
                }
            })
            .collect::<Vec<_>>()
            .join(","),
        other => value_text(other),
    }
}

/// Query pairs of one parameter, encoded, in its style.
fn query_pairs(field: &Field, value: &Value, out: &mut Vec<String>) {
    if let Style::QueryString { json } = field.style {
        let whole = match value {
            _ if json => json_text(value),
            // `application/x-www-form-urlencoded`: the object's properties are the pairs.
            Value::Object(_) => {
                let form = Field { style: Style::Form, explode: true, ..field.clone() };
                return query_pairs(&form, value, out);
            }
            other => value_text(other),
        };
        // An empty query string is none (no bare `?`).
        if !whole.is_empty() {
            out.push(encode(&whole));
        }
        return;
    }
    let name = encode(&field.name);
    if field.style == Style::Json {
        out.push(format!("{name}={}", encode(&json_text(value))));
        return;
    }
    let value_encoded = |v: &str| if field.allow_reserved { encode_reserved(v) } else { encode(v) };
    let text = |v: &Value| value_encoded(&value_text(v));
    match value {
        Value::Array(_) | Value::Object(_) if field.style == Style::DeepObject => {
            let mut pairs = Vec::new();
            deep_pairs(field.name.clone(), value, Empty::Nothing, &mut pairs);
            out.extend(pairs.iter().map(|(k, v)| format!("{}={}", encode(k), value_encoded(v))));
        }
        Value::Array(items) => {
            let sep = match field.style {
                Style::SpaceDelimited => Some("%20"),
                Style::PipeDelimited => Some("|"),
                Style::TabDelimited => Some("%09"),
                _ if field.explode => None,
                _ => Some(","),
            };
            match sep {
                None => out.extend(items.iter().map(|v| format!("{name}={}", text(v)))),
                Some(sep) => {
                    out.push(format!(
                        "{name}={}",
                        items.iter().map(text).collect::<Vec<_>>().join(sep)
                    ));
                }
            }
        }
        Value::Object(map) if field.explode => {
            out.extend(map.iter().map(|(k, v)| format!("{}={}", encode(k), text(v))));
        }
        Value::Object(map) => {
            let flat: Vec<String> = map.iter().flat_map(|(k, v)| [encode(k), text(v)]).collect();
            out.push(format!("{name}={}", flat.join(",")));
        }
        other => out.push(format!("{name}={}", text(other))),
    }
}

/// A query value as OpenAPI's `allowReserved: true` writes it, RFC 6570's reserved
/// expansion: RFC 3986's reserved characters and `%XX` triples stay as they are, except
/// those that would change the query's shape, which OpenAPI leaves the client to encode:
/// `#` (it would end the query), `[` and `]` (not allowed in one), `&` and `+` (a new pair
/// and a space to a form decoder), as OpenAPI 3.1.1 and 3.2 leave clients to do.
/// Everything else but unreserved characters is encoded, a `%` outside a triple too. A
/// `'` kept here is still sent as `%27`: the WHATWG URL standard, which reqwest's URL type
/// follows, encodes it in the query of an http(s) URL, and no URL of that type holds it
/// bare (servers decode the two alike).
fn encode_reserved(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, &byte) in bytes.iter().enumerate() {
        let triple = byte == b'%'
            && bytes.get(i + 1..i + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit));
        if triple || byte.is_ascii_alphanumeric() || b"-._~:/?@!$'()*,;=".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openapi::BodySpec;
    use serde_json::json;

    fn field(flat: &str, location: Location, name: &str, style: Style, explode: bool) -> Field {
        Field {
            flat: flat.into(),
            location,
            name: name.into(),
            style,
            explode,
            allow_reserved: false,
            binary: false,
            base64: false,
            content_type: None,
        }
    }

    fn op(fields: Vec<Field>, body: Option<BodySpec>) -> Operation {
        Operation {
            name: "t".into(),
            title: None,
            description: String::new(),
            method: "POST".into(),
            path: "/items/{id}/{tags}".into(),
            server: None,
            input_schema: json!({}),
            fields,
            body,
            security: Vec::new(),
            scopes: Default::default(),
            annotations: Default::default(),
            output: None,
            declares_authorization: false,
        }
    }

    #[test]
    fn parameters_go_where_the_map_says() {
        let op = op(
            vec![
                field("id", Location::Path, "id", Style::Simple, false),
                field("tags", Location::Path, "tags", Style::Simple, false),
                field("id__query", Location::Query, "id", Style::Form, true),
                field("multi", Location::Query, "multi", Style::Form, true),
                field("csv", Location::Query, "csv", Style::Form, false),
                field("pipes", Location::Query, "pipes", Style::PipeDelimited, false),
                field("deep", Location::Query, "deep", Style::DeepObject, true),
                field("X-Trace", Location::Header, "X-Trace", Style::Simple, false),
                field("session", Location::Cookie, "session", Style::Form, true),
                field("name", Location::Body, "name", Style::Form, true),
            ],
            Some(BodySpec {
                content_type: "application/json".into(),
                encoding: BodyEncoding::Json,
                whole: None,
                required: true,
                open: false,
            }),
        );
        let args = json!({"id": "a/b", "tags": ["x", "y z"], "id__query": 7, "multi": [1, 2],
            "csv": ["a", "b"], "pipes": [1, 2], "deep": {"k": "v"}, "X-Trace": "t1",
            "session": "s 1", "name": "Rex"});
        let req = build(&op, "http://h/api/", args.as_object().unwrap()).unwrap();
        assert_eq!(
            req.url,
            "http://h/api/items/a%2Fb/x,y%20z?id=7&multi=1&multi=2&csv=a,b&pipes=1|2&deep%5Bk%5D=v"
        );
        assert_eq!(
            req.headers,
            vec![
                ("X-Trace".to_owned(), "t1".to_owned()),
                ("Content-Type".to_owned(), "application/json".to_owned())
            ]
        );
        assert_eq!(req.cookies, vec!["session=s%201".to_owned()]);
        assert_eq!(req.body, Body::Json(json!({"name": "Rex"})));
        let missing = build(&op, "http://h", json!({"tags": 1}).as_object().unwrap()).unwrap_err();
        assert_eq!(missing, "missing required path argument `id`");
    }

    /// The `Cookie` headers' pairs and the cookies make one value; a later cookie of a
    /// name replaces the earlier in its place.
    #[test]
    fn cookies_merge_into_one_header() {
        let mut req = PreparedRequest {
            method: "GET".into(),
            url: "http://h/".into(),
            headers: vec![
                ("cookie".into(), "a=1;  sid=old".into()),
                ("COOKIE".into(), "b=2".into()),
            ],
            cookies: Vec::new(),
            body: Body::None,
        };
        assert_eq!(req.cookie_header().as_deref(), Some("a=1; sid=old; b=2"));
        req.set_cookie("sid", "n w");
        req.set_cookies("c=3; c=4");
        assert_eq!(req.cookie_header().as_deref(), Some("a=1; sid=n%20w; b=2; c=4"));
        req.set_cookie("sid", "k+y/==;\"");
        assert_eq!(req.cookie_header().as_deref(), Some("a=1; sid=k+y/==%3B%22; b=2; c=4"));
        req.headers.clear();
        req.cookies.clear();
        assert_eq!(req.cookie_header(), None);
    }

    /// `null` clears a field of a JSON body (GitHub's `"milestone": null`), named or not in
    /// the schema; in a query or a form it is the argument left out.
    #[test]
    fn an_explicit_null_reaches_a_json_body_only() {
        let body = |encoding| BodySpec {
            content_type: "application/json".into(),
            encoding,
            whole: None,
            required: true,
            open: true,
        };
        let fields = || {
            vec![
                field("id", Location::Path, "id", Style::Simple, false),
                field("tags", Location::Path, "tags", Style::Simple, false),
                field("q", Location::Query, "q", Style::Form, true),
                field("milestone", Location::Body, "milestone", Style::Form, true),
            ]
        };
        let args = json!({"id": 1, "tags": "t", "q": null, "milestone": null, "note": null,
            "title": "x"});
        let json = build(
            &op(fields(), Some(body(BodyEncoding::Json))),
            "http://h",
            args.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(json.url, "http://h/items/1/t");
        assert_eq!(json.body, Body::Json(json!({"milestone": null, "note": null, "title": "x"})));
        let form = build(
            &op(fields(), Some(body(BodyEncoding::Form))),
            "http://h",
            args.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(form.body, Body::Form(vec![("title".into(), "x".into())]));
    }

    #[test]
    fn path_arguments_cannot_make_dot_segments() {
        let op = op(
            vec![
                field("id", Location::Path, "id", Style::Simple, false),
                field("tags", Location::Path, "tags", Style::Label, false),
            ],
            None,
        );
        let build = |v: Value| build(&op, "http://h/api", v.as_object().unwrap());
        assert_eq!(
            build(json!({"id": "..", "tags": "t"})).unwrap_err(),
            "path argument `id` would make the URL path segment `..`, which steps out of the \
             tool's path; `.` and `..` are refused in path arguments"
        );
        assert!(build(json!({"id": ".", "tags": "t"})).unwrap_err().contains("`id`"));
        // Label style puts a dot before the value: `.` + `.` is `..`.
        assert!(build(json!({"id": "a", "tags": "."})).unwrap_err().contains("`tags`"));
        assert_eq!(
            build(json!({"id": "../admin", "tags": "t"})).unwrap().url,
            "http://h/api/items/..%2Fadmin/.t"
        );
    }

    #[test]
    fn empty_path_arguments_are_refused() {
        let op = op(
            vec![
                field("id", Location::Path, "id", Style::Simple, false),
                field("tags", Location::Path, "tags", Style::Simple, false),
            ],
            None,
        );
        let build = |v: Value| build(&op, "http://h/api", v.as_object().unwrap());
        expect_test::expect!["path argument `id` is empty; give it a value: an empty one would leave an empty segment in the path (`/items//{tags}`), which names another resource"]
            .assert_eq(&build(json!({"id": "", "tags": "t"})).unwrap_err());
        // An empty list is as empty; `0` is a value.
        assert!(build(json!({"id": 1, "tags": []})).unwrap_err().contains("`tags` is empty"));
        assert_eq!(build(json!({"id": 0, "tags": "t"})).unwrap().url, "http://h/api/items/0/t");
    }

    #[test]
    fn unknown_arguments_are_refused_with_the_closest_name() {
        let mut op = op(
            vec![
                field("id", Location::Path, "id", Style::Simple, false),
                field("tags", Location::Path, "tags", Style::Simple, false),
                field("name", Location::Body, "name", Style::Form, true),
            ],
            Some(BodySpec {
                content_type: "application/json".into(),
                encoding: BodyEncoding::Json,
                whole: None,
                required: true,
                open: false,
            }),
        );
        let args = |v: Value| v.as_object().cloned().unwrap();
        let err = |op: &Operation, v: Value| build(op, "http://h", &args(v)).unwrap_err();
        assert_eq!(
            err(&op, json!({"id": 1, "tags": 2, "nmae": "Rex"})),
            "unknown argument `nmae`; did you mean `name`?"
        );
        assert_eq!(
            err(&op, json!({"id": 1, "tags": 2, "colour": "red"})),
            "unknown argument `colour`; the arguments are `id`, `tags`, `name`"
        );
        // Null is absent, whatever the name.
        assert!(build(&op, "http://h", &args(json!({"id": 1, "tags": 2, "x": null}))).is_ok());
        // A body open to unnamed properties takes them.
        if let Some(body) = op.body.as_mut() {
            body.open = true;
        }
        let req = build(&op, "http://h", &args(json!({"id": 1, "tags": 2, "colour": "red"})));
        assert_eq!(req.unwrap().body, Body::Json(json!({"colour": "red"})));
        op.fields.clear();
        op.body = None;
        assert_eq!(err(&op, json!({"q": 1})), "unknown argument `q`; this tool takes no arguments");
    }

    #[test]
    fn label_and_matrix_styles() {
        let f = field("p", Location::Path, "p", Style::Label, false);
        assert_eq!(path_value(&f, &json!([1, 2])), ".1,2");
        let f = field("p", Location::Path, "p", Style::Matrix, true);
        assert_eq!(path_value(&f, &json!([1, 2])), ";p=1;p=2");
        let f = field("p", Location::Path, "p", Style::Matrix, false);
        assert_eq!(path_value(&f, &json!({"a": 1})), ";p=a,1");
    }

    #[test]
    fn base64_decodes_either_alphabet_with_or_without_padding() {
        let decode =
            |text: &str| decode_base64(text).map(|b| String::from_utf8_lossy(&b).into_owned());
        assert_eq!(decode("Zm9vYmFy").unwrap(), "foobar");
        assert_eq!(decode("Zm9vYg==").unwrap(), "foob");
        assert_eq!(decode("Zm9vYg").unwrap(), "foob");
        assert_eq!(decode("Zm9v\r\nYmE=").unwrap(), "fooba");
        assert_eq!(decode_base64("-_8").unwrap(), [0xfb, 0xff]);
        assert_eq!(decode_base64("+/8=").unwrap(), [0xfb, 0xff]);
        expect_test::expect!["`!` (character 4) is no base64 digit"]
            .assert_eq(&decode("Zm9!").unwrap_err());
        expect_test::expect!["its digits end one short of a whole byte (truncated?)"]
            .assert_eq(&decode("Zm9vY").unwrap_err());
        expect_test::expect!["digits follow the `=` padding"]
            .assert_eq(&decode("Zg==Zg").unwrap_err());
    }
}
