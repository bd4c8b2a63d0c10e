//! Images, audio and embedded resources' blobs in outputs: the cap on how much of them
//! one result passes on, and what they cost in a run's context-token budget.
//!
//! The text cap does not count them (they are not read as text), so without this a tool
//! returning twenty 1 MiB screenshots passed 27 MB to a gateway's client and the budget
//! never noticed.

use serde_json::{Value, json};
use toolmux_core::{ContentPart, ToolOutput};

/// The default of [`crate::OrchestratorConfig::media_max_bytes`]: 10 MiB of base64.
pub(crate) const DEFAULT_MEDIA_MAX_BYTES: usize = 10 << 20;

/// What an image whose size its header does not give is taken to cost: about what
/// Anthropic's models charge for the largest image they take whole (1.15 megapixels).
pub(crate) const IMAGE_TOKENS: u64 = 1_600;

/// Decoded bytes of audio per token: 32 tokens a second (Gemini's rate) at 128 kbit/s.
pub(crate) const AUDIO_BYTES_PER_TOKEN: u64 = 500;

/// Whether `part` is media, passed on as it is rather than read as text: an image, audio,
/// or an embedded resource with a blob (a screenshot sent as `file:///shot.png`).
pub(crate) fn is_media(part: &ContentPart) -> bool {
    matches!(
        part,
        ContentPart::Image { .. }
            | ContentPart::Audio { .. }
            | ContentPart::Resource { blob: Some(_), .. }
    )
}

/// What the media parts ([`is_media`]) of `output` cost in a model's context: an image
/// `width × height / 750` tokens (Anthropic's estimate) up to [`IMAGE_TOKENS`] when its PNG,
/// JPEG, GIF or WebP header gives its size, else [`IMAGE_TOKENS`]; audio one token per
/// [`AUDIO_BYTES_PER_TOKEN`] decoded bytes; a resource's blob as the image or audio its
/// MIME type says it is, else (a PDF, an archive) a token per four decoded bytes, as text.
pub(crate) fn media_tokens(output: &ToolOutput) -> u64 {
    output.content.iter().map(part_tokens).sum()
}

fn part_tokens(part: &ContentPart) -> u64 {
    let image = |data: &str| {
        image_dimensions(data).map_or(IMAGE_TOKENS, |(w, h)| {
            (u64::from(w) * u64::from(h)).div_ceil(750).clamp(1, IMAGE_TOKENS)
        })
    };
    let audio = |data: &str| (decoded_len(data) as u64).div_ceil(AUDIO_BYTES_PER_TOKEN).max(1);
    match part {
        ContentPart::Image { data, .. } => image(data),
        ContentPart::Audio { data, .. } => audio(data),
        ContentPart::Resource { blob: Some(data), mime_type, .. } => {
            match mime_type.as_deref().unwrap_or_default() {
                mime if mime.starts_with("image/") => image(data),
                mime if mime.starts_with("audio/") => audio(data),
                _ => (decoded_len(data) as u64).div_ceil(4),
            }
        }
        _ => 0,
    }
}

/// Leaves out the media ([`is_media`]) of `output` past `max` bytes of base64, in order: the
/// first part that does not fit and every media part after it are each replaced by a text
/// part naming its type and size and how to get it; their `annotations` extras go, and
/// `capped_media` says how much was left out. `tool` names the tool in the note.
pub(crate) fn cap_media(output: &mut ToolOutput, max: usize, tool: &str) {
    let mut used = 0usize;
    let mut full = false;
    let mut dropped = Vec::new();
    let mut dropped_bytes = 0usize;
    for (index, part) in output.content.iter_mut().enumerate() {
        let (kind, size, mime) = match part {
            ContentPart::Image { data, mime_type } => ("image", data.len(), mime_type.as_str()),
            ContentPart::Audio { data, mime_type } => ("audio", data.len(), mime_type.as_str()),
            ContentPart::Resource { blob: Some(blob), mime_type, .. } => {
                ("resource", blob.len(), mime_type.as_deref().unwrap_or("application/octet-stream"))
            }
            _ => continue,
        };
        if !full && used + size <= max {
            used += size;
            continue;
        }
        full = true;
        let note = format!(
            "[{kind} left out ({mime}, {size} bytes of base64): this result's media \
             (images, audio, resource blobs) are over the {max}-byte cap for media; ask `{tool}` for fewer or smaller ones, or \
             raise `defaults.mediaResponseMaxBytes` (or `tools.{tool}.mediaResponseMaxBytes`)]"
        );
        *part = ContentPart::Text { text: note };
        dropped.push(index as u64);
        dropped_bytes += size;
    }
    if dropped.is_empty() {
        return;
    }
    drop_annotations(output, &dropped);
    output
        .extras
        .insert("capped_media".into(), json!({"parts": dropped.len(), "bytes": dropped_bytes}));
}

/// Removes the `annotations` extras of the parts of `output` at `indices`, which were
/// replaced by notes.
pub(crate) fn drop_annotations(output: &mut ToolOutput, indices: &[u64]) {
    if let Some(Value::Array(annotated)) = output.extras.get_mut("annotations") {
        annotated.retain(|entry| {
            entry.get("index").and_then(Value::as_u64).is_none_or(|i| !indices.contains(&i))
        });
        if annotated.is_empty() {
            output.extras.remove("annotations");
        }
    }
}

/// Width and height from the header of a base64 PNG, GIF, WebP or JPEG.
pub(crate) fn image_dimensions(data: &str) -> Option<(u32, u32)> {
    let head = decode_prefix(data, 64);
    let be16 =
        |b: &[u8], at: usize| Some(u32::from(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?])));
    let le16 =
        |b: &[u8], at: usize| Some(u32::from(u16::from_le_bytes([*b.get(at)?, *b.get(at + 1)?])));
    let be32 = |b: &[u8], at: usize| Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let size = if head.starts_with(b"\x89PNG\r\n\x1a\n") && head.get(12..16) == Some(b"IHDR") {
        (be32(&head, 16)?, be32(&head, 20)?)
    } else if head.starts_with(b"GIF8") {
        (le16(&head, 6)?, le16(&head, 8)?)
    } else if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP") {
        let le24 = |at: usize| Some(le16(&head, at)? | u32::from(*head.get(at + 2)?) << 16);
        match head.get(12..16)? {
            b"VP8 " => (le16(&head, 26)? & 0x3fff, le16(&head, 28)? & 0x3fff),
            b"VP8L" => {
                let bits = u32::from_le_bytes(head.get(21..25)?.try_into().ok()?);
                ((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            }
            b"VP8X" => (le24(24)? + 1, le24(27)? + 1),
            _ => return None,
        }
    } else if head.starts_with(b"\xff\xd8") {
        // The frame header (SOFn) may follow large metadata (EXIF with a thumbnail).
        let jpeg = decode_prefix(data, 256 << 10);
        jpeg_dimensions(&jpeg, be16)?
    } else {
        return None;
    };
    (size.0 > 0 && size.1 > 0).then_some(size)
}

fn jpeg_dimensions(b: &[u8], be16: impl Fn(&[u8], usize) -> Option<u32>) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        if *b.get(at)? != 0xff {
            return None;
        }
        let marker = *b.get(at + 1)?;
        if marker == 0xff {
            at += 1;
            continue;
        }
        let length = be16(b, at + 2)? as usize;
        // SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC).
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            return Some((be16(b, at + 7)?, be16(b, at + 5)?));
        }
        at += 2 + length;
    }
}

/// About how many bytes the base64 `data` decodes to.
fn decoded_len(data: &str) -> usize {
    let trimmed = data.trim_end_matches('=');
    trimmed.bytes().filter(|b| !b.is_ascii_whitespace()).count() * 3 / 4
}

/// The first `limit` or so bytes base64 `data` decodes to (standard or URL-safe alphabet,
/// whitespace skipped), up to the first character of neither. Only headers are read, so
/// a twenty-line decoder serves rather than a crate.
fn decode_prefix(data: &str, limit: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(limit.min(data.len()) + 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in data.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            c if c.is_ascii_whitespace() => continue,
            _ => break,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
        if out.len() >= limit {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::new();
        for chunk in bytes.chunks(3) {
            let n =
                chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
            s.extend(std::iter::repeat_n('=', 3 - chunk.len()));
        }
        s
    }

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 6, 0, 0, 0]);
        b
    }

    #[test]
    fn reads_image_sizes() {
        assert_eq!(image_dimensions(&b64(&png(800, 600))), Some((800, 600)));
        assert_eq!(image_dimensions(&b64(b"GIF89a\x40\x01\xf0\x00")), Some((320, 240)));
        // A JPEG with an APP0 segment before its baseline frame header.
        let mut jpeg =
            b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00".to_vec();
        jpeg.extend(b"\xff\xc0\x00\x11\x08\x01\xe0\x02\x80\x03");
        assert_eq!(image_dimensions(&b64(&jpeg)), Some((640, 480)));
        assert_eq!(image_dimensions(&b64(b"not an image at all")), None);
        assert_eq!(image_dimensions("!!"), None);
    }

    #[test]
    fn counts_images_by_size_and_audio_by_length() {
        let image = |data: String| ContentPart::Image { data, mime_type: "image/png".into() };
        let mut output = ToolOutput::text("x");
        output.content.push(image(b64(&png(750, 100))));
        output.content.push(image(b64(&png(4000, 3000))));
        output.content.push(image(b64(b"opaque")));
        output
            .content
            .push(ContentPart::Audio { data: b64(&[0; 5000]), mime_type: "audio/wav".into() });
        assert_eq!(media_tokens(&output), 100 + IMAGE_TOKENS + IMAGE_TOKENS + 10);
    }
}
