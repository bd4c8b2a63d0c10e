//! Request bodies of imported operations as a loopback server receives them: their
//! content type, form and multipart fields as the media type's `encoding` says, and
//! `deepObject` query parameters, which nest brackets as form fields do.
#![allow(clippy::unwrap_used)]

use crate::common::{SeenRequest, keeping_server};
use serde_json::{Value, json};
use std::sync::Mutex;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

/// One `POST /op` operation (`op`) whose request body is `media` with `content`.
fn import(base: &str, media: &str, content: Value) -> RestProvider {
    let doc = json!({"openapi": "3.0.3", "info": {"title": "b", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op",
            "requestBody": {"required": true, "content": {media: content}}}}}});
    RestProvider::openapi_from_value("b", doc, "b.json", &OpenApiConfig::default()).unwrap()
}

/// The request `op` sends with `args`.
async fn sent(provider: &RestProvider, seen: &Mutex<Vec<SeenRequest>>, args: Value) -> SeenRequest {
    let out = provider.call("op", args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    seen.lock().unwrap().last().cloned().unwrap()
}

/// A text body is sent with its media type once: two `Content-Type` headers (which the
/// raw body's type and the operation's both added) are refused by strict servers and
/// read as `text/plain, text/plain` by others.
#[tokio::test]
async fn a_text_body_carries_one_content_type() {
    let (base, seen) = keeping_server().await;
    let provider = import(&base, "text/plain", json!({"schema": {"type": "string"}}));
    let request = sent(&provider, &seen, json!({"body": "hello"})).await;
    let types: Vec<&str> = request
        .head
        .lines()
        .filter(|line| line.to_ascii_lowercase().starts_with("content-type:"))
        .collect();
    assert_eq!(types, ["content-type: text/plain"], "{}", request.head);
    assert_eq!(request.body, b"hello");
}

/// The `name=value` pairs of a form body, decoded and sorted.
fn form_pairs(body: &[u8]) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        percent_encoding::percent_decode_str(&s).decode_utf8().unwrap().into_owned()
    };
    let text = std::str::from_utf8(body).unwrap();
    let mut pairs: Vec<(String, String)> = text
        .split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect();
    pairs.sort();
    pairs
}

/// A form body's properties go as its `encoding` says (Stripe's documents mark nested
/// properties `style: deepObject`): `metadata[order]=6735`, `line_items[0][price]=…`,
/// `tags=a,b` for `explode: false`; an object property without a style is its JSON text,
/// the default content type of an object.
#[tokio::test]
async fn form_fields_follow_their_encoding() {
    let (base, seen) = keeping_server().await;
    let deep = json!({"style": "deepObject", "explode": true});
    let provider = import(
        &base,
        "application/x-www-form-urlencoded",
        json!({
            "schema": {"type": "object", "properties": {
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                "expand": {"type": "array", "items": {"type": "string"}},
                "line_items": {"type": "array", "items": {"type": "object", "properties": {
                    "price": {"type": "string"}, "quantity": {"type": "integer"}}}},
                "shipping": {"type": "object", "properties": {"name": {"type": "string"}}},
                "tags": {"type": "array", "items": {"type": "string"}},
                "labels": {"type": "array", "items": {"type": "string"}},
                "note": {"type": "string"}}},
            "encoding": {"metadata": deep, "expand": deep, "line_items": deep,
                "tags": {"style": "form", "explode": false},
                "labels": {"style": "pipeDelimited", "explode": false}}
        }),
    );
    let args = json!({"metadata": {"order": "6735", "gift wrap": "yes"},
        "expand": ["customer", "invoice"], "line_items": [{"price": "price_1", "quantity": 2}],
        "shipping": {"name": "Rex"}, "tags": ["a", "b"], "labels": ["x", "y"], "note": "x y&z"});
    let request = sent(&provider, &seen, args).await;
    assert_eq!(
        request.header("content-type").as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    let expected: Vec<(String, String)> = [
        ("expand[0]", "customer"),
        ("expand[1]", "invoice"),
        ("labels", "x|y"),
        ("line_items[0][price]", "price_1"),
        ("line_items[0][quantity]", "2"),
        ("metadata[gift wrap]", "yes"),
        ("metadata[order]", "6735"),
        ("note", "x y&z"),
        ("shipping", r#"{"name":"Rex"}"#),
        ("tags", "a,b"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(form_pairs(&request.body), expected);
}

/// The parts of a multipart body: `(headers, content)` by field name.
fn parts(request: &SeenRequest) -> Vec<(String, String, String)> {
    let kind = request.header("content-type").unwrap();
    let boundary = kind.split("boundary=").nth(1).unwrap();
    let body = String::from_utf8(request.body.clone()).unwrap();
    let mut out = Vec::new();
    for part in body.split(&format!("--{boundary}")) {
        let Some((head, content)) = part.split_once("\r\n\r\n") else { continue };
        let name = head.split("name=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
        let content_type = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(str::to_owned))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        out.push((name, content_type, content.trim_end_matches("\r\n").to_owned()));
    }
    out.sort();
    out
}

/// Multipart parts carry the content type their `encoding` gives (`image/png` for the
/// avatar), an object property goes as JSON labelled `application/json` (its default), a
/// file without one as `application/octet-stream`, and text as plain text.
#[tokio::test]
async fn multipart_parts_carry_their_content_types() {
    let (base, seen) = keeping_server().await;
    let provider = import(
        &base,
        "multipart/form-data",
        json!({
            "schema": {"type": "object", "properties": {
                "profile": {"type": "object", "properties": {"name": {"type": "string"}}},
                "avatar": {"type": "string", "format": "binary"},
                "attachment": {"type": "string", "format": "binary"},
                "count": {"type": "integer"}}},
            "encoding": {"avatar": {"contentType": "image/png, image/jpeg"}}
        }),
    );
    let args = json!({"profile": {"name": "Rex"}, "avatar": "PNG", "attachment": "bytes",
        "count": 3});
    let request = sent(&provider, &seen, args).await;
    let to_owned = |(a, b, c): (&str, &str, &str)| (a.to_owned(), b.to_owned(), c.to_owned());
    let expected: Vec<(String, String, String)> = [
        ("attachment", "application/octet-stream", "bytes"),
        ("avatar", "image/png", "PNG"),
        ("count", "", "3"),
        ("profile", "application/json", r#"{"name":"Rex"}"#),
    ]
    .into_iter()
    .map(to_owned)
    .collect();
    assert_eq!(parts(&request), expected);
}

/// A `deepObject` query parameter nests brackets for nested values
/// (`filter[range][gte]=1`, `filter[tags][0]=a`), as it does in form bodies, instead of
/// putting JSON text inside one bracket.
#[tokio::test]
async fn deep_object_queries_nest_brackets() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "q", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/search": {"get": {"operationId": "search", "parameters": [{"name": "filter",
            "in": "query", "style": "deepObject", "explode": true,
            "schema": {"type": "object"}}]}}}});
    let provider =
        RestProvider::openapi_from_value("q", doc, "q.json", &OpenApiConfig::default()).unwrap();
    let args = json!({"filter": {"range": {"gte": 1}, "tags": ["a", "b c"], "state": "open"}});
    provider.call("search", args, &CallContext::new()).await.unwrap();
    let line = seen.lock().unwrap().last().unwrap().request_line().to_owned();
    let query = line.split(' ').nth(1).unwrap().split_once('?').unwrap().1.to_owned();
    let expected: Vec<(String, String)> = [
        ("filter[range][gte]", "1"),
        ("filter[state]", "open"),
        ("filter[tags][0]", "a"),
        ("filter[tags][1]", "b c"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(form_pairs(query.as_bytes()), expected, "{line}");
}

/// The lines of a request's head that set `name` (any case).
fn header_lines<'a>(request: &'a SeenRequest, name: &str) -> Vec<&'a str> {
    let prefix = format!("{}:", name.to_ascii_lowercase());
    request.head.lines().filter(|line| line.to_ascii_lowercase().starts_with(&prefix)).collect()
}

/// An import's `headers` replace what an operation would send under the same name: a
/// JSON body goes with one `Content-Type`, and a header the document also declares as a
/// parameter goes with the configured value once; that parameter is no argument, so a
/// model can never override what the configuration sets (a key, an API version).
#[tokio::test]
async fn configured_headers_replace_the_operations_own() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "h", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op", "parameters": [
                {"name": "X-Api-Version", "in": "header", "schema": {"type": "string"}},
                {"name": "X-Trace", "in": "header", "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                "properties": {"name": {"type": "string"}}}}}}}}}});
    let headers = [("Content-Type", "application/json"), ("x-api-version", "2024-06-01")];
    let config = OpenApiConfig {
        headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..OpenApiConfig::default()
    };
    let provider = RestProvider::openapi_from_value("h", doc, "h.json", &config).unwrap();
    let properties = provider.specs()[0].input_schema["properties"].clone();
    let names: Vec<&String> = properties.as_object().unwrap().keys().collect();
    assert_eq!(names, ["X-Trace", "name"]);
    let request = sent(&provider, &seen, json!({"name": "Rex", "X-Trace": "t1"})).await;
    assert_eq!(header_lines(&request, "content-type"), ["content-type: application/json"]);
    assert_eq!(header_lines(&request, "x-api-version"), ["x-api-version: 2024-06-01"]);
    assert_eq!(request.header("x-trace").as_deref(), Some("t1"));
    assert_eq!(request.body, br#"{"name":"Rex"}"#);
    let refused = provider.call("op", json!({"X-Api-Version": "1999"}), &CallContext::new()).await;
    assert!(refused.unwrap_err().to_string().contains("unknown argument `X-Api-Version`"));
}

/// Cookies go in one `Cookie` header, as RFC 6265 asks: those of the import's `Cookie`
/// header, the operation's cookie parameters and an API key sent as a cookie (two headers
/// went, and a server may read either). A cookie the configured header sets is no
/// argument, and the API key replaces one of its name.
#[tokio::test]
async fn cookies_go_in_one_cookie_header() {
    let (base, seen) = keeping_server().await;
    let cookie = |name: &str| json!({"name": name, "in": "cookie", "schema": {"type": "string"}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "c", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op", "security": [{"key": []}],
            "parameters": [cookie("theme"), cookie("a")]}}},
        "components": {"securitySchemes": {
            "key": {"type": "apiKey", "in": "cookie", "name": "sid"}}}});
    let mut config = OpenApiConfig {
        headers: [("Cookie".to_owned(), "a=1; sid=stale".to_owned())].into(),
        ..OpenApiConfig::default()
    };
    config.auth.insert(
        "key".into(),
        toolmux_rest::Credentials { api_key: Some("x".into()), ..Default::default() },
    );
    let provider = RestProvider::openapi_from_value("c", doc, "c.json", &config).unwrap();
    let properties = provider.specs()[0].input_schema["properties"].clone();
    let names: Vec<&String> = properties.as_object().unwrap().keys().collect();
    assert_eq!(names, ["theme"]);
    let request = sent(&provider, &seen, json!({"theme": "dark"})).await;
    assert_eq!(header_lines(&request, "cookie"), ["cookie: theme=dark; a=1; sid=x"]);
}

/// An inline tool's `Cookie` headers, however their names are written, go as one.
#[tokio::test]
async fn inline_tools_send_one_cookie_header() {
    let (base, seen) = keeping_server().await;
    let tools = json!({"t": {"description": "T.", "url": format!("{base}/t"),
        "headers": {"Cookie": "a=1", "cookie": "sid=${parameters.sid}"}}});
    let tools: std::collections::BTreeMap<String, toolmux_rest::RestToolConfig> =
        serde_json::from_value(tools).unwrap();
    let provider = RestProvider::inline(&tools).unwrap();
    let out = provider.call("t", json!({"sid": "x"}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let request = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(header_lines(&request, "cookie"), ["cookie: a=1; sid=x"]);
}

/// A query parameter with `allowReserved: true` keeps RFC 3986's reserved characters and
/// `%XX` triples as they are (`q=a/b`, a URL as a value), except those that would change
/// the query's structure (`#`, `&`, `+`, `[`, `]`), which are encoded with spaces and
/// the rest, as OpenAPI 3.1.1 and 3.2 leave clients to do; a parameter without it has
/// them all encoded. `'` reaches the server as `%27` all the same: the WHATWG URL
/// standard, which the HTTP client's URL type follows, encodes it in an http(s) query.
#[tokio::test]
async fn allow_reserved_query_values_keep_reserved_characters() {
    let (base, seen) = keeping_server().await;
    let param = |name: &str, reserved: bool| {
        json!({"name": name, "in": "query", "allowReserved": reserved,
            "schema": {"type": "array", "items": {"type": "string"}}, "explode": false})
    };
    let doc = json!({"openapi": "3.0.3", "info": {"title": "r", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/find": {"get": {"operationId": "find",
            "parameters": [param("q", true), param("plain", false)]}}}});
    let provider =
        RestProvider::openapi_from_value("r", doc, "r.json", &OpenApiConfig::default()).unwrap();
    let value = "a/b?c=d:e;f@g!$'()*";
    let args = json!({"q": [value, "x y&z+1#[2]", "%2F 5%"], "plain": ["a/b"]});
    provider.call("find", args, &CallContext::new()).await.unwrap();
    let line = seen.lock().unwrap().last().unwrap().request_line().to_owned();
    assert_eq!(
        line,
        "GET /find?q=a/b?c=d:e;f@g!$%27()*,x%20y%26z%2B1%23%5B2%5D,%2F%205%25&plain=a%2Fb HTTP/1.1"
    );
}

/// An empty object or array under `deepObject` in a form body goes as `name=`: Stripe
/// clears an object's metadata when it receives `metadata=`, and sending nothing left
/// no way to do it; nested, the empty member goes alike (`shipping[address]=`).
#[tokio::test]
async fn empty_deep_objects_in_forms_go_as_empty_values() {
    let (base, seen) = keeping_server().await;
    let deep = json!({"style": "deepObject", "explode": true});
    let provider = import(
        &base,
        "application/x-www-form-urlencoded",
        json!({
            "schema": {"type": "object", "properties": {
                "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                "expand": {"type": "array", "items": {"type": "string"}},
                "shipping": {"type": "object"}}},
            "encoding": {"metadata": deep, "expand": deep, "shipping": deep}
        }),
    );
    let args = json!({"metadata": {}, "expand": [], "shipping": {"name": "Rex", "address": {}}});
    let request = sent(&provider, &seen, args).await;
    let expected: Vec<(String, String)> =
        [("expand", ""), ("metadata", ""), ("shipping[address]", ""), ("shipping[name]", "Rex")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    assert_eq!(form_pairs(&request.body), expected);
}

/// One part of a multipart body as bytes: name, file name, content type and content.
type BinaryPart = (String, Option<String>, String, Vec<u8>);

/// The parts of a multipart body, whatever bytes they hold, in the order sent.
fn binary_parts(request: &SeenRequest) -> Vec<BinaryPart> {
    let kind = request.header("content-type").unwrap();
    let boundary = format!("--{}", kind.split("boundary=").nth(1).unwrap());
    let body = &request.body;
    let starts: Vec<usize> =
        (0..body.len()).filter(|&i| body[i..].starts_with(boundary.as_bytes())).collect();
    let mut out = Vec::new();
    for pair in starts.windows(2) {
        let part = &body[pair[0] + boundary.len() + 2..pair[1] - 2];
        let split = part.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8(part[..split].to_vec()).unwrap();
        let quoted = |key: &str| {
            head.split(&format!("{key}=\""))
                .nth(1)
                .map(|rest| rest.split('"').next().unwrap().to_owned())
        };
        let content_type = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(str::to_owned))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        out.push((
            quoted(" name").unwrap(),
            quoted("filename"),
            content_type,
            part[split + 4..].to_vec(),
        ));
    }
    out
}

/// Multipart file fields carry bytes: base64 arguments (`format: byte`, or
/// `contentEncoding: base64`; a `data:` URL's type labels the part) are decoded into the
/// part, and a list of files (`items: {format: binary}`) goes as one file part each;
/// base64 that does not decode is an invalid argument naming the field.
#[tokio::test]
async fn multipart_files_take_base64_and_lists() {
    let (base, seen) = keeping_server().await;
    let provider = import(
        &base,
        "multipart/form-data",
        json!({"schema": {"type": "object", "properties": {
            "avatar": {"type": "string", "format": "byte"},
            "scan": {"type": "string", "contentEncoding": "base64"},
            "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
            "blobs": {"type": "array", "items": {"type": "string", "format": "byte"}}}}}),
    );
    let args = json!({"avatar": "iVBORwD/", "scan": "data:image/gif;base64,R0lG",
        "files": ["one", "two"], "blobs": ["AQI=", "AwQ"]});
    let request = sent(&provider, &seen, args).await;
    let octets = "application/octet-stream";
    let part = |name: &str, kind: &str, bytes: &[u8]| -> BinaryPart {
        (name.to_owned(), Some(name.to_owned()), kind.to_owned(), bytes.to_vec())
    };
    let expected = vec![
        part("avatar", octets, &[0x89, b'P', b'N', b'G', 0, 0xff]),
        part("blobs", octets, &[1, 2]),
        part("blobs", octets, &[3, 4]),
        part("files", octets, b"one"),
        part("files", octets, b"two"),
        part("scan", "image/gif", b"GIF"),
    ];
    assert_eq!(binary_parts(&request), expected);
    let bad = provider.call("op", json!({"avatar": "not base64!"}), &CallContext::new()).await;
    let error = bad.unwrap_err().to_string();
    assert!(error.contains("`avatar`") && error.contains("base64"), "{error}");
    let bad_item = provider.call("op", json!({"blobs": ["AQI=", "%%"]}), &CallContext::new()).await;
    let error = bad_item.unwrap_err().to_string();
    assert!(error.contains("`blobs`") && error.contains("item 1"), "{error}");
}

/// OpenAPI 3.1 writes a file part of a multipart body as a string with a
/// `contentMediaType` (no `format: binary`): it goes as a file part of that type, its
/// argument its content as text as for `format: binary` (base64 when `contentEncoding`
/// says so), a list as one file part each; the `encoding`'s `contentType` still wins, a
/// wildcard type labels the part as any file, and a plain string stays text.
#[tokio::test]
async fn content_media_type_strings_go_as_file_parts_of_their_type() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.1.0", "info": {"title": "b", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op", "requestBody": {"content": {
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {
                    "photo": {"type": "string", "contentMediaType": "image/png"},
                    "blob": {"type": "string", "contentMediaType": "application/octet-stream"},
                    "scan": {"type": "string", "contentMediaType": "image/gif",
                        "contentEncoding": "base64"},
                    "pages": {"type": "array",
                        "items": {"type": "string", "contentMediaType": "application/pdf"}},
                    "any": {"type": "string", "contentMediaType": "image/*"},
                    "doc": {"type": "string", "contentMediaType": "text/plain"},
                    "note": {"type": "string"}}},
                "encoding": {"doc": {"contentType": "text/markdown"}}}}}}}}});
    let provider =
        RestProvider::openapi_from_value("b", doc, "b.json", &OpenApiConfig::default()).unwrap();
    let args = json!({"photo": "PNG", "blob": "raw", "scan": "R0lG", "pages": ["p1", "p2"],
        "any": "img", "doc": "# hi", "note": "plain"});
    let request = sent(&provider, &seen, args).await;
    let file = |name: &str, kind: &str, bytes: &[u8]| -> BinaryPart {
        (name.to_owned(), Some(name.to_owned()), kind.to_owned(), bytes.to_vec())
    };
    let mut got = binary_parts(&request);
    got.sort();
    let expected = vec![
        file("any", "application/octet-stream", b"img"),
        file("blob", "application/octet-stream", b"raw"),
        file("doc", "text/markdown", b"# hi"),
        ("note".to_owned(), None, String::new(), b"plain".to_vec()),
        file("pages", "application/pdf", b"p1"),
        file("pages", "application/pdf", b"p2"),
        file("photo", "image/png", b"PNG"),
        file("scan", "image/gif", b"GIF"),
    ];
    assert_eq!(got, expected);
}

/// One name in every location (path, query, header, cookie and a JSON body property) is
/// five arguments, each reaching its own place: the body's property keeps the name and
/// the parameters take `__{location}`. FastMCP's rule suffixes only parameters clashing
/// with the body, so its query and header parameters of one name overwrite each other (its
/// own test asserts only that at least one survives).
#[tokio::test]
async fn one_name_in_every_location_reaches_each_place() {
    let (base, seen) = keeping_server().await;
    let param = |place: &str| json!({"name": "id", "in": place, "required": place == "path", "schema": {"type": "string"}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "i", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/items/{id}": {"post": {"operationId": "op",
            "parameters": [param("path"), param("query"), param("header"), param("cookie")],
            "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                "properties": {"id": {"type": "string"}}}}}}}}}});
    let provider =
        RestProvider::openapi_from_value("i", doc, "i.json", &OpenApiConfig::default()).unwrap();
    let properties = provider.specs()[0].input_schema["properties"].clone();
    let names: Vec<&String> = properties.as_object().unwrap().keys().collect();
    assert_eq!(names, ["id", "id__cookie", "id__header", "id__path", "id__query"]);
    let args = json!({"id__path": "p", "id__query": "q", "id__header": "h", "id__cookie": "c",
        "id": "b"});
    let request = sent(&provider, &seen, args).await;
    assert_eq!(request.request_line(), "POST /items/p?id=q HTTP/1.1");
    assert_eq!(header_lines(&request, "id"), ["id: h"]);
    assert_eq!(header_lines(&request, "cookie"), ["cookie: id=c"]);
    assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap(), json!({"id": "b"}));
}

/// Header names are case-insensitive, so an operation's `x-api-version` replaces its path
/// item's `X-Api-Version` as an operation's parameter replaces its path item's of the same
/// name and location: one argument, the operation's (required, its `enum`), and one
/// header sent. Both were arguments, and both went as headers.
#[tokio::test]
async fn an_operations_header_replaces_its_path_items_whatever_the_case() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "h", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {
            "parameters": [{"name": "X-Api-Version", "in": "header", "schema": {"type": "string"}}],
            "post": {"operationId": "op", "parameters": [{"name": "x-api-version", "in": "header",
                "required": true, "schema": {"type": "string", "enum": ["2"]}}]}}}});
    let provider =
        RestProvider::openapi_from_value("h", doc, "h.json", &OpenApiConfig::default()).unwrap();
    let schema = provider.specs()[0].input_schema.clone();
    assert_eq!(
        *schema,
        json!({"type": "object", "additionalProperties": false, "required": ["x-api-version"],
            "properties": {"x-api-version": {"type": "string", "enum": ["2"]}}})
    );
    let request = sent(&provider, &seen, json!({"x-api-version": "2"})).await;
    assert_eq!(header_lines(&request, "x-api-version"), ["x-api-version: 2"]);
}

/// Cookie parameters follow OpenAPI's serialization table for `form`, whose `explode`
/// defaults to true: an exploded array is one cookie per item and an exploded object one
/// per property (the query's `&` written as the `; ` between cookies), where both went as
/// one cookie holding the encoded `a,b`; without `explode`, one cookie with the values
/// joined by (encoded) commas. A configured cookie replaces only the pair of its name
/// among an exploded object's.
#[tokio::test]
async fn exploded_cookie_parameters_are_one_cookie_per_item() {
    let (base, seen) = keeping_server().await;
    let cookie = |name: &str, schema: Value, explode: Option<bool>| {
        let mut param = json!({"name": name, "in": "cookie", "schema": schema});
        if let Some(explode) = explode {
            param["explode"] = json!(explode);
            param["style"] = json!("form");
        }
        param
    };
    let array = json!({"type": "array", "items": {"type": "string"}});
    let object = json!({"type": "object", "additionalProperties": {"type": "integer"}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "c", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op", "parameters": [
            cookie("colors", array.clone(), None),
            cookie("rgb", object.clone(), Some(true)),
            cookie("tags", array, Some(false)),
            cookie("pt", object, Some(false))]}}}});
    let config = OpenApiConfig {
        headers: [("Cookie".to_owned(), "keep=1; G=9".to_owned())].into(),
        ..OpenApiConfig::default()
    };
    let provider = RestProvider::openapi_from_value("c", doc, "c.json", &config).unwrap();
    let args = json!({"colors": ["blue", "black brown"], "rgb": {"R": 100, "G": 200},
        "tags": ["a", "b"], "pt": {"x": 1, "y": 2}});
    let request = sent(&provider, &seen, args).await;
    assert_eq!(
        header_lines(&request, "cookie"),
        ["cookie: colors=blue; colors=black%20brown; R=100; tags=a%2Cb; pt=x%2C1%2Cy%2C2; \
          keep=1; G=9"]
    );
}
