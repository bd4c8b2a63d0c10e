//! Response bodies in charsets other than UTF-8, as a loopback server sends them: decoded
//! by the charset their `Content-Type` names (or their byte order mark), JSON included.
#![allow(clippy::unwrap_used)]

use crate::common::{Reply, serve};
use serde_json::{Value, json};
use toolmux_core::{CallContext, ContentPart, ToolProvider};
use toolmux_rest::{RestProvider, RestToolConfig};

/// UTF-16 with a byte order mark, little or big endian.
fn utf16(text: &str, big_endian: bool) -> Vec<u8> {
    let mut bytes = if big_endian { vec![0xFE, 0xFF] } else { vec![0xFF, 0xFE] };
    for unit in text.encode_utf16() {
        bytes.extend(if big_endian { unit.to_be_bytes() } else { unit.to_le_bytes() });
    }
    bytes
}

/// What the server answers on each path: status, content type and body.
fn answer(path: &str) -> (u16, &'static str, Vec<u8>) {
    match path {
        "/latin1" => (200, "text/plain; charset=iso-8859-1", b"caf\xe9".to_vec()),
        "/cp1252" => (200, "text/plain; charset=\"windows-1252\"", b"\x80 5 \x93ok\x94".to_vec()),
        "/utf16" => (200, "text/plain; charset=utf-16", utf16("h\u{e9} \u{65e5}", false)),
        "/bom" => (200, "text/plain", utf16("big \u{e9}", true)),
        "/json" => {
            (200, "application/json; charset=iso-8859-1", b"{\"name\":\"Jos\xe9\"}".to_vec())
        }
        "/json16" => (
            200,
            "application/json; charset=utf-16",
            utf16("{\"name\":\"caf\u{e9} \u{65e5}\"}", false),
        ),
        "/failed" => (500, "text/plain; charset=iso-8859-1", b"\xfcbel".to_vec()),
        "/unknown" => (200, "text/plain; charset=x-klingon", b"ab\xffcd".to_vec()),
        _ => (404, "text/plain", b"no".to_vec()),
    }
}

async fn provider() -> RestProvider {
    let base = serve(|seen| {
        let path = seen.request_line().split(' ').nth(1).unwrap_or_default().to_owned();
        let (status, content_type, body) = answer(&path);
        Reply {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            chunks: vec![(0, body)],
        }
    })
    .await;
    let mut tools: serde_json::Map<String, Value> =
        ["latin1", "cp1252", "utf16", "bom", "json", "json16", "failed", "unknown"]
            .iter()
            .map(|name| {
                let tool = json!({"description": "A body.", "url": format!("{base}/{name}")});
                ((*name).to_owned(), tool)
            })
            .collect();
    for (name, path, select) in [
        ("json_name", "json", json!("/name")),
        ("json16_name", "json16", json!("/name")),
        ("json16_fields", "json16", json!({"who": "/name"})),
    ] {
        let tool =
            json!({"description": "A part.", "url": format!("{base}/{path}"), "select": select});
        tools.insert(name.to_owned(), tool);
    }
    let tools: std::collections::BTreeMap<String, RestToolConfig> =
        serde_json::from_value(Value::Object(tools)).unwrap();
    RestProvider::inline(&tools).unwrap()
}

async fn text_of(provider: &RestProvider, name: &str) -> (bool, String) {
    let out = provider.call(name, json!({}), &CallContext::new()).await.unwrap();
    (out.is_error, out.to_text())
}

#[tokio::test]
async fn text_in_the_named_charset_or_with_a_byte_order_mark_is_decoded() {
    let provider = provider().await;
    assert_eq!(text_of(&provider, "latin1").await, (false, "café".to_owned()));
    assert_eq!(text_of(&provider, "cp1252").await, (false, "€ 5 “ok”".to_owned()));
    assert_eq!(text_of(&provider, "utf16").await, (false, "hé 日".to_owned()));
    assert_eq!(text_of(&provider, "bom").await, (false, "big é".to_owned()));
    assert_eq!(
        text_of(&provider, "failed").await,
        (true, "HTTP 500 Internal Server Error: übel".to_owned())
    );
}

/// A JSON body in another charset is parsed from its text: it came back as text with
/// U+FFFD where the Latin-1 `é` stood.
#[tokio::test]
async fn json_in_another_charset_is_parsed_after_decoding() {
    let provider = provider().await;
    let out = provider.call("json", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert!(
        matches!(out.content.as_slice(), [ContentPart::Json { value }] if value == &json!({"name": "José"})),
        "{:?}",
        out.content
    );
}

/// The part `select` names of JSON in another charset is the decoded value: it was
/// written back as UTF-8 and then decoded again in the charset the response named
/// (`José` came back as `JosÃ©`, UTF-16 as CJK garbage).
#[tokio::test]
async fn a_selected_part_of_json_in_another_charset_is_decoded_once() {
    let provider = provider().await;
    for (name, expected) in [
        ("json_name", json!("José")),
        ("json16_name", json!("caf\u{e9} \u{65e5}")),
        ("json16_fields", json!({"who": "caf\u{e9} \u{65e5}"})),
    ] {
        let out = provider.call(name, json!({}), &CallContext::new()).await.unwrap();
        assert!(!out.is_error, "{name}: {}", out.to_text());
        assert!(
            matches!(out.content.as_slice(), [ContentPart::Json { value }] if value == &expected),
            "{name}: {:?}",
            out.content
        );
    }
}

/// A charset toolmux cannot decode is said, and the body shown as UTF-8 as well as it
/// goes, where it was reported as binary.
#[tokio::test]
async fn an_unknown_charset_is_said() {
    let provider = provider().await;
    let (is_error, text) = text_of(&provider, "unknown").await;
    assert!(!is_error);
    assert_eq!(
        text,
        "ab\u{fffd}cd\n\n(the response's charset `x-klingon` is not one toolmux knows: the \
         body is shown as UTF-8, U+FFFD standing for bytes that are not)"
    );
}
