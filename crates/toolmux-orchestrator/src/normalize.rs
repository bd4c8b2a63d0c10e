//! Outputs made into what clients and model APIs take, once for every provider: an image
//! or audio part, or an embedded resource's blob, a model API would refuse (and with it the whole conversation turn) is
//! replaced by a text note naming what was wrong, an error result without content is
//! given a message, and structured content that is not a JSON object (MCP requires one)
//! is wrapped or left out.

use serde_json::{Value, json};
use toolmux_core::{ContentPart, ToolOutput, json_kind};

/// The widest or tallest image passed on, in pixels: no model API takes more (Anthropic's
/// limit is 8,000 a side), and a header declaring more is broken or hostile.
pub(crate) const MAX_IMAGE_SIDE: u32 = 100_000;

/// Normalizes `output` of `tool`, which declares an output schema when `has_output_schema`.
///
/// A non-object structured content of a tool with an output schema is left out with a note
/// and the result made an error: the schema (an object, as MCP requires) promised content
/// that does not exist, and clients refuse a success without it, as for structured content
/// over the cap. Without an output schema nothing was promised: the value is wrapped as
/// `{"result": value}`, the shape FastMCP and rmcp give a tool's non-object return, so that
/// the data reaches clients that read it and nothing is lost; `null` is left out.
pub(crate) fn normalize(output: &mut ToolOutput, tool: &str, has_output_schema: bool) {
    let mut replaced = Vec::new();
    for (index, part) in output.content.iter_mut().enumerate() {
        let (kind, problems) = match part {
            ContentPart::Image { data, mime_type } => ("image", image_problems(data, mime_type)),
            ContentPart::Audio { data, mime_type } => {
                ("audio", media_problems("audio", data, mime_type))
            }
            // An embedded resource's blob is base64 as image data is, and goes to model APIs
            // as such (an image's or audio's by its MIME type): checked alike.
            ContentPart::Resource { blob: Some(blob), mime_type, .. } => {
                ("resource", blob_problems(blob, mime_type.as_deref()))
            }
            _ => continue,
        };
        if problems.is_empty() {
            continue;
        }
        let text = format!(
            "[{kind} left out: {}; model APIs refuse such a part, so `{tool}` should be fixed to \
             send a valid one]",
            problems.join(", and ")
        );
        *part = ContentPart::Text { text };
        replaced.push(index as u64);
    }
    if !replaced.is_empty() {
        crate::media::drop_annotations(output, &replaced);
        output.extras.insert("invalid_media".into(), json!({"parts": replaced.len()}));
    }
    if output.is_error && output.content.is_empty() {
        let text = format!("`{tool}` reported an error without a message");
        output.content.push(ContentPart::Text { text });
    }
    match output.structured.take() {
        Some(object @ Value::Object(_)) => output.structured = Some(object),
        None | Some(Value::Null) => {}
        Some(other) if has_output_schema => {
            let text = format!(
                "`{tool}` returned structured content that is {}, not an object as MCP requires \
                 and its output schema promised; it was left out",
                json_kind(&other)
            );
            output.content.push(ContentPart::Text { text });
            output.is_error = true;
        }
        Some(other) => output.structured = Some(json!({"result": other})),
    }
}

/// What is wrong with an image part: what [`media_problems`] finds, else a header that
/// declares a size no model API takes.
fn image_problems(data: &str, mime_type: &str) -> Vec<String> {
    let mut problems = media_problems("image", data, mime_type);
    if problems.is_empty()
        && let Some((width, height)) = crate::media::image_dimensions(data)
        && width.max(height) > MAX_IMAGE_SIDE
    {
        problems.push(format!(
            "its header declares {width} × {height} pixels, over {MAX_IMAGE_SIDE} a side"
        ));
    }
    problems
}

/// What is wrong with an embedded resource's blob: data that is not base64, and, for an
/// image, a header that declares a size no model API takes. An empty blob is an empty
/// resource, which is valid.
fn blob_problems(blob: &str, mime_type: Option<&str>) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(why) = base64_problem(blob) {
        problems.push(format!("its blob is not base64: {why}"));
    } else if mime_type.is_some_and(|m| m.starts_with("image/"))
        && let Some((width, height)) = crate::media::image_dimensions(blob)
        && width.max(height) > MAX_IMAGE_SIDE
    {
        problems.push(format!(
            "its image's header declares {width} × {height} pixels, over {MAX_IMAGE_SIDE} a side"
        ));
    }
    problems
}

/// What is wrong with an image or audio part (`kind`) as model APIs see it: a MIME type of
/// another kind, no data, data that is not base64.
fn media_problems(kind: &str, data: &str, mime_type: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !mime_type.starts_with(&format!("{kind}/")) {
        problems.push(format!(
            "its mimeType `{}` is not an {kind} type",
            crate::suggest::echoed(mime_type)
        ));
    }
    if data.is_empty() {
        problems.push("its data is empty".to_owned());
    } else if let Some(why) = base64_problem(data) {
        problems.push(format!("its data is not base64: {why}"));
    }
    problems
}

/// Why `data` is not standard base64 (RFC 4648, padded; line breaks and spaces between
/// characters are taken, as decoders do), in one pass without decoding.
fn base64_problem(data: &str) -> Option<String> {
    let mut chars = 0usize;
    let mut padding = 0usize;
    for (at, byte) in data.bytes().enumerate() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' if padding == 0 => chars += 1,
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' => {
                return Some(format!("`=` before its end, at byte {}", at - 1));
            }
            b'=' => {
                padding += 1;
                chars += 1;
            }
            b if b.is_ascii_whitespace() => {}
            b if b.is_ascii_graphic() => {
                return Some(format!("`{}` at byte {at} is no base64 character", b as char));
            }
            b => return Some(format!("byte {at} (0x{b:02x}) is no base64 character")),
        }
    }
    if padding > 2 {
        return Some(format!("{padding} `=` at its end, more than 2"));
    }
    if !chars.is_multiple_of(4) {
        return Some(format!("{chars} characters, not a multiple of 4"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_checked_without_decoding() {
        assert_eq!(base64_problem("aGVsbG8="), None);
        assert_eq!(base64_problem("aGVs\nbG8h"), None);
        let problems: Vec<_> = ["!!!notbase64$$$", "aGVsbG8", "aG=sbG8=", "aGVsbG====", "é"]
            .into_iter()
            .map(|data| base64_problem(data).unwrap_or_default())
            .collect();
        expect_test::expect![[r#"
            [
                "`!` at byte 0 is no base64 character",
                "7 characters, not a multiple of 4",
                "`=` before its end, at byte 2",
                "4 `=` at its end, more than 2",
                "byte 0 (0xc3) is no base64 character",
            ]
        "#]]
        .assert_debug_eq(&problems);
    }
}
