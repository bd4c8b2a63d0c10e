//! Turns a fetched HTML page into readable Markdown text for a language model.
//!
//! A small, tolerant tokenizer feeds a tree builder that keeps only a stack of open
//! elements (no DOM, no recursion), and a renderer writes Markdown as events arrive.
//! The document is walked twice: once to survey it (title, `<base>`, main content,
//! table kinds) and once to render. Both passes run in linear time on any input.

use reqwest::Url;

use std::borrow::Cow;
use std::collections::HashMap;
use std::mem;

/// A page read as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// The text of `<title>`, whitespace collapsed, entities decoded; None when absent/empty.
    pub(crate) title: Option<String>,
    /// The page's content as Markdown.
    pub(crate) text: String,
}

/// Converts `html` to Markdown; `base` (the page's final URL) resolves relative links and
/// image sources (a `<base href>` in the document overrides it).
pub(crate) fn to_markdown(html: &str, base: Option<&Url>) -> Page {
    let html = html.strip_prefix('\u{feff}').unwrap_or(html);
    let mut survey = Survey::default();
    let meta = walk(html, &mut survey);
    let base = effective_base(base, meta.base.as_deref());
    let mode = if survey.mains > 0 {
        Mode::Main
    } else if survey.articles == 1 {
        Mode::Article
    } else {
        Mode::Body
    };
    let mut text = render(html, mode, base.clone(), &survey.data_tables);
    if text.is_empty() && mode != Mode::Body {
        text = render(html, Mode::Body, base, &survey.data_tables);
    }
    Page { title: meta.title, text }
}

/// Renders the document in the given content mode.
fn render(html: &str, mode: Mode, base: Option<Url>, data_tables: &[bool]) -> String {
    let mut renderer = Renderer::new(mode, base, data_tables);
    walk(html, &mut renderer);
    renderer.finish()
}

/// The base URL for links: the page URL, overridden by a usable `<base href>`.
fn effective_base(page: Option<&Url>, base_href: Option<&str>) -> Option<Url> {
    let page = page.cloned();
    let Some(href) = base_href.map(str::trim).filter(|h| !h.is_empty()) else {
        return page;
    };
    let parsed = match &page {
        Some(page) => page.join(href),
        None => Url::parse(href),
    };
    parsed.ok().filter(|u| !u.cannot_be_a_base()).or(page)
}

// ---------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------

/// A start tag: lowercase name and attributes (lowercase names, decoded values).
#[derive(Debug, Default)]
struct Tag {
    /// Lowercase element name.
    name: String,
    /// Attributes in document order, first occurrence of a name wins.
    attrs: Vec<(String, String)>,
}

impl Tag {
    /// The value of attribute `name`, if present.
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// One lexical item of the document.
#[derive(Debug)]
enum Token<'a> {
    /// Character data, entities already decoded.
    Text(Cow<'a, str>),
    /// A start tag.
    Start(Tag),
    /// An end tag (lowercase name).
    End(String),
}

/// Elements whose content is raw text, ended only by their own end tag.
const RAW_TEXT: &[&str] =
    &["script", "style", "xmp", "iframe", "noembed", "noframes", "noscript", "textarea", "title"];

/// Most attributes kept per tag; later ones are parsed and ignored.
const MAX_ATTRS: usize = 64;

/// Splits `html` into tokens, calling `emit` for each one.
fn tokenize<'a>(html: &'a str, mut emit: impl FnMut(Token<'a>)) {
    let bytes = html.as_bytes();
    let mut pos = 0;
    while pos < bytes.len() {
        let lt = find_byte(bytes, pos, b'<').unwrap_or(bytes.len());
        if lt > pos {
            emit(Token::Text(decode(&html[pos..lt])));
        }
        if lt >= bytes.len() {
            break;
        }
        pos = markup(html, lt, &mut emit);
    }
}

/// Handles the markup starting at the `<` at `lt`; returns the position after it.
fn markup<'a>(html: &'a str, lt: usize, emit: &mut impl FnMut(Token<'a>)) -> usize {
    let bytes = html.as_bytes();
    let rest = &html[lt..];
    match bytes.get(lt + 1).copied() {
        Some(b'!') if rest.starts_with("<!--") => skip_comment(html, lt + 4),
        Some(b'!') if rest.starts_with("<![CDATA[") => cdata(html, lt + 9, emit),
        Some(b'!' | b'?') => skip_past(bytes, lt + 2, b'>'),
        Some(b'/') => end_tag(html, lt, emit),
        Some(c) if c.is_ascii_alphabetic() => start_tag(html, lt, emit),
        _ => {
            emit(Token::Text(Cow::Borrowed("<")));
            lt + 1
        }
    }
}

/// Skips a comment whose body starts at `body`; an unterminated one runs to the end.
fn skip_comment(html: &str, body: usize) -> usize {
    let rest = &html[body..];
    if rest.starts_with('>') {
        return body + 1;
    }
    if rest.starts_with("->") {
        return body + 2;
    }
    rest.find("-->").map_or(html.len(), |i| body + i + 3)
}

/// Emits a CDATA section's content (starting at `start`) as literal text.
fn cdata<'a>(html: &'a str, start: usize, emit: &mut impl FnMut(Token<'a>)) -> usize {
    let rest = &html[start..];
    let (text, next) = match rest.find("]]>") {
        Some(i) => (&rest[..i], start + i + 3),
        None => (rest, html.len()),
    };
    if !text.is_empty() {
        emit(Token::Text(Cow::Borrowed(text)));
    }
    next
}

/// Handles `</...` at `lt`.
fn end_tag<'a>(html: &'a str, lt: usize, emit: &mut impl FnMut(Token<'a>)) -> usize {
    let bytes = html.as_bytes();
    match bytes.get(lt + 2).copied() {
        Some(c) if c.is_ascii_alphabetic() => {
            let (tag, next) = parse_tag(html, lt + 2);
            if let Some(tag) = tag {
                emit(Token::End(tag.name));
            }
            next
        }
        Some(b'>') => lt + 3,
        Some(_) => skip_past(bytes, lt + 2, b'>'),
        None => {
            emit(Token::Text(Cow::Borrowed("</")));
            bytes.len()
        }
    }
}

/// Handles a start tag at `lt`, including the content of raw-text elements.
fn start_tag<'a>(html: &'a str, lt: usize, emit: &mut impl FnMut(Token<'a>)) -> usize {
    let (tag, next) = parse_tag(html, lt + 1);
    let Some(tag) = tag else { return next };
    if !RAW_TEXT.contains(&tag.name.as_str()) {
        emit(Token::Start(tag));
        return next;
    }
    let name = tag.name.clone();
    emit(Token::Start(tag));
    let (content_end, after) = raw_text_end(html, next, &name);
    if matches!(name.as_str(), "title" | "textarea") {
        emit(Token::Text(decode(&html[next..content_end])));
    }
    emit(Token::End(name));
    after
}

/// Parses a tag name and attributes starting at `start` (just after `<` or `</`).
/// Returns None for a tag cut off by the end of input, and the position after the tag.
fn parse_tag(html: &str, start: usize) -> (Option<Tag>, usize) {
    let bytes = html.as_bytes();
    let len = bytes.len();
    let mut i = start;
    while i < len && !is_space(bytes[i]) && bytes[i] != b'/' && bytes[i] != b'>' {
        i += 1;
    }
    let mut tag = Tag { name: html[start..i].to_ascii_lowercase(), attrs: Vec::new() };
    loop {
        while i < len && (is_space(bytes[i]) || bytes[i] == b'/') {
            i += 1;
        }
        match bytes.get(i) {
            None => return (None, len),
            Some(b'>') => return (Some(tag), i + 1),
            Some(_) => {}
        }
        let name_start = i;
        i += 1;
        while i < len && !is_space(bytes[i]) && !matches!(bytes[i], b'/' | b'>' | b'=') {
            i += 1;
        }
        let name = &html[name_start..i];
        while i < len && is_space(bytes[i]) {
            i += 1;
        }
        let mut value = Cow::Borrowed("");
        if bytes.get(i) == Some(&b'=') {
            let Some((parsed, next)) = attr_value(html, i + 1) else {
                return (None, len);
            };
            value = parsed;
            i = next;
        }
        add_attr(&mut tag, name, value);
    }
}

/// Parses an attribute value after `=` (at `start`): the decoded value and the position
/// after it, or None when a quoted value runs to the end of input.
fn attr_value(html: &str, start: usize) -> Option<(Cow<'_, str>, usize)> {
    let bytes = html.as_bytes();
    let mut i = start;
    while i < bytes.len() && is_space(bytes[i]) {
        i += 1;
    }
    if let Some(&quote @ (b'"' | b'\'')) = bytes.get(i) {
        let end = find_byte(bytes, i + 1, quote)?;
        return Some((decode(&html[i + 1..end]), end + 1));
    }
    let value_start = i;
    while i < bytes.len() && !is_space(bytes[i]) && bytes[i] != b'>' {
        i += 1;
    }
    Some((decode(&html[value_start..i]), i))
}

/// Adds an attribute unless the tag already has it or has too many.
fn add_attr(tag: &mut Tag, name: &str, value: Cow<'_, str>) {
    if tag.attrs.len() >= MAX_ATTRS {
        return;
    }
    let name = name.to_ascii_lowercase();
    if tag.attrs.iter().all(|(n, _)| *n != name) {
        tag.attrs.push((name, value.into_owned()));
    }
}

/// Finds the end tag of raw-text element `name` from `from`, case-insensitively.
/// Returns where the content ends and where scanning resumes.
fn raw_text_end(html: &str, from: usize, name: &str) -> (usize, usize) {
    let bytes = html.as_bytes();
    let mut i = from;
    while let Some(found) = html[i..].find("</") {
        let at = i + found;
        let name_end = at + 2 + name.len();
        let name_matches =
            bytes.get(at + 2..name_end).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()));
        let boundary = bytes.get(name_end).is_none_or(|&c| is_space(c) || c == b'/' || c == b'>');
        if name_matches && boundary {
            return (at, skip_past(bytes, name_end, b'>'));
        }
        i = at + 2;
    }
    (bytes.len(), bytes.len())
}

/// Position of the first `byte` at or after `from`.
fn find_byte(bytes: &[u8], from: usize, byte: u8) -> Option<usize> {
    bytes.get(from..)?.iter().position(|&b| b == byte).map(|p| p + from)
}

/// Position just after the first `byte` at or after `from`, or the end.
fn skip_past(bytes: &[u8], from: usize, byte: u8) -> usize {
    find_byte(bytes, from, byte).map_or(bytes.len(), |p| p + 1)
}

/// HTML whitespace as a byte.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0c)
}

/// Whitespace collapsed in text (HTML whitespace plus no-break space).
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\u{0c}' | '\u{a0}')
}

/// Joins the words of `text` with single spaces.
fn collapse(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split(is_ws).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

// ---------------------------------------------------------------------------
// Character references
// ---------------------------------------------------------------------------

/// Decodes character references; unknown ones stay as written.
fn decode(text: &str) -> Cow<'_, str> {
    if !text.contains('&') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        if let Some((c, used)) = reference(after) {
            out.push(c);
            rest = &after[used..];
        } else {
            out.push('&');
            rest = after;
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Decodes the reference at the start of `s` (just after `&`): char and bytes used.
fn reference(s: &str) -> Option<(char, usize)> {
    if let Some(digits) = s.strip_prefix('#') {
        return numeric_reference(digits).map(|(c, used)| (c, used + 1));
    }
    let len = s.bytes().take(32).take_while(u8::is_ascii_alphanumeric).count();
    if len == 0 || s.as_bytes().get(len) != Some(&b';') {
        return None;
    }
    named_entity(&s[..len]).map(|c| (c, len + 1))
}

/// Decodes `NNN;` or `xHH;` (the part after `&#`); the `;` is optional.
fn numeric_reference(s: &str) -> Option<(char, usize)> {
    let bytes = s.as_bytes();
    let (radix, start) = match bytes.first() {
        Some(b'x' | b'X') => (16, 1),
        _ => (10, 0),
    };
    let mut i = start;
    let mut value: u32 = 0;
    while let Some(digit) = bytes.get(i).and_then(|&b| char::from(b).to_digit(radix)) {
        value = value.saturating_mul(radix).saturating_add(digit);
        i += 1;
    }
    if i == start {
        return None;
    }
    if bytes.get(i) == Some(&b';') {
        i += 1;
    }
    Some((code_point(value), i))
}

/// Windows-1252 characters for references to code points 0x80..=0x9F (0 = keep).
const CP1252: [u16; 32] = [
    0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039,
    0x0152, 0, 0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC,
    0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178,
];

/// The character a numeric reference stands for; invalid values give U+FFFD.
fn code_point(value: u32) -> char {
    let value = match value {
        0x80..=0x9F => match CP1252.get((value - 0x80) as usize) {
            Some(&mapped) if mapped != 0 => u32::from(mapped),
            _ => value,
        },
        _ => value,
    };
    if value == 0 {
        return '\u{fffd}';
    }
    char::from_u32(value).unwrap_or('\u{fffd}')
}

/// Entity names for U+00A0..=U+00FF.
const LATIN1: [&str; 96] = [
    "nbsp", "iexcl", "cent", "pound", "curren", "yen", "brvbar", "sect", "uml", "copy", "ordf",
    "laquo", "not", "shy", "reg", "macr", "deg", "plusmn", "sup2", "sup3", "acute", "micro",
    "para", "middot", "cedil", "sup1", "ordm", "raquo", "frac14", "frac12", "frac34", "iquest",
    "Agrave", "Aacute", "Acirc", "Atilde", "Auml", "Aring", "AElig", "Ccedil", "Egrave", "Eacute",
    "Ecirc", "Euml", "Igrave", "Iacute", "Icirc", "Iuml", "ETH", "Ntilde", "Ograve", "Oacute",
    "Ocirc", "Otilde", "Ouml", "times", "Oslash", "Ugrave", "Uacute", "Ucirc", "Uuml", "Yacute",
    "THORN", "szlig", "agrave", "aacute", "acirc", "atilde", "auml", "aring", "aelig", "ccedil",
    "egrave", "eacute", "ecirc", "euml", "igrave", "iacute", "icirc", "iuml", "eth", "ntilde",
    "ograve", "oacute", "ocirc", "otilde", "ouml", "divide", "oslash", "ugrave", "uacute", "ucirc",
    "uuml", "yacute", "thorn", "yuml",
];

/// Entity names for U+0391..=U+03A9 (U+03A2 is unassigned).
const GREEK_UPPER: [&str; 25] = [
    "Alpha", "Beta", "Gamma", "Delta", "Epsilon", "Zeta", "Eta", "Theta", "Iota", "Kappa",
    "Lambda", "Mu", "Nu", "Xi", "Omicron", "Pi", "Rho", "", "Sigma", "Tau", "Upsilon", "Phi",
    "Chi", "Psi", "Omega",
];

/// Entity names for U+03B1..=U+03C9.
const GREEK_LOWER: [&str; 25] = [
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigmaf", "sigma", "tau", "upsilon", "phi",
    "chi", "psi", "omega",
];

/// Looks `name` up in a table of consecutive code points starting at `first`.
fn table_entity(table: &[&str], first: u32, name: &str) -> Option<char> {
    let index = table.iter().position(|n| *n == name)?;
    char::from_u32(first + u32::try_from(index).ok()?)
}

/// The character for a named entity (without `&` and `;`).
fn named_entity(name: &str) -> Option<char> {
    let c = match name {
        "amp" | "AMP" => '&',
        "lt" | "LT" => '<',
        "gt" | "GT" => '>',
        "quot" | "QUOT" => '"',
        "apos" => '\'',
        "COPY" => '©',
        "REG" => '®',
        "trade" | "TRADE" => '™',
        "hellip" => '…',
        "mdash" => '—',
        "ndash" => '–',
        "lsquo" => '‘',
        "rsquo" => '’',
        "sbquo" => '‚',
        "ldquo" => '“',
        "rdquo" => '”',
        "bdquo" => '„',
        "lsaquo" => '‹',
        "rsaquo" => '›',
        "bull" => '•',
        "dagger" => '†',
        "Dagger" => '‡',
        "permil" => '‰',
        "prime" => '′',
        "Prime" => '″',
        "euro" => '€',
        "larr" => '←',
        "rarr" => '→',
        "uarr" => '↑',
        "darr" => '↓',
        "harr" => '↔',
        "lArr" => '⇐',
        "rArr" => '⇒',
        "hArr" => '⇔',
        "hearts" => '♥',
        "spades" => '♠',
        "clubs" => '♣',
        "diams" => '♦',
        "check" => '✓',
        "minus" => '−',
        "le" => '≤',
        "ge" => '≥',
        "ne" => '≠',
        "asymp" => '≈',
        "equiv" => '≡',
        "infin" => '∞',
        "sum" => '∑',
        "radic" => '√',
        "ensp" => '\u{2002}',
        "emsp" => '\u{2003}',
        "thinsp" => '\u{2009}',
        "zwnj" => '\u{200c}',
        "zwj" => '\u{200d}',
        "lrm" => '\u{200e}',
        "rlm" => '\u{200f}',
        "OElig" => 'Œ',
        "oelig" => 'œ',
        "Scaron" => 'Š',
        "scaron" => 'š',
        "Yuml" => 'Ÿ',
        "fnof" => 'ƒ',
        "circ" => 'ˆ',
        "tilde" => '˜',
        _ => {
            return table_entity(&LATIN1, 0xA0, name)
                .or_else(|| table_entity(&GREEK_LOWER, 0x3B1, name))
                .or_else(|| table_entity(&GREEK_UPPER, 0x391, name));
        }
    };
    Some(c)
}

// ---------------------------------------------------------------------------
// Tree builder
// ---------------------------------------------------------------------------

/// Receives the balanced element events of a document walk.
trait Sink {
    /// An element starts (void elements get an immediate `end`).
    fn start(&mut self, tag: &Tag);
    /// The most recently started open element ends.
    fn end(&mut self, name: &str);
    /// Decoded character data.
    fn text(&mut self, text: &str);
}

/// Document facts the builder collects on the way.
#[derive(Debug, Default)]
struct Meta {
    /// First non-empty `<title>`, collapsed.
    title: Option<String>,
    /// First `<base href>` value.
    base: Option<String>,
}

/// An open element on the builder's stack.
#[derive(Debug)]
struct Frame {
    /// Lowercase element name.
    name: String,
    /// This element and everything inside it is not reported.
    dropped: bool,
    /// Inside `svg`, `math` or `template` (their `title`/`base` don't count).
    foreign: bool,
    /// Index of the innermost open `li` within the innermost list.
    li: Option<usize>,
    /// Index of the innermost open table cell within the innermost row.
    cell: Option<usize>,
    /// Index of the innermost open `tr` within the innermost table.
    row: Option<usize>,
}

/// Elements without content or end tag.
fn is_void(name: &str) -> bool {
    matches!(
        name,
        "area"
            | "base"
            | "basefont"
            | "bgsound"
            | "br"
            | "col"
            | "embed"
            | "frame"
            | "hr"
            | "img"
            | "input"
            | "keygen"
            | "link"
            | "meta"
            | "param"
            | "source"
            | "track"
            | "wbr"
    )
}

/// Elements that may stay inside `<head>`.
fn is_head_element(name: &str) -> bool {
    matches!(
        name,
        "title"
            | "meta"
            | "link"
            | "style"
            | "script"
            | "base"
            | "noscript"
            | "template"
            | "basefont"
            | "bgsound"
            | "noframes"
    )
}

/// Whether the element's content is never shown.
fn drops_content(tag: &Tag) -> bool {
    let name = tag.name.as_str();
    matches!(
        name,
        "head"
            | "title"
            | "script"
            | "style"
            | "noscript"
            | "template"
            | "svg"
            | "math"
            | "iframe"
            | "object"
            | "canvas"
            | "textarea"
            | "select"
            | "xmp"
            | "noembed"
            | "noframes"
    ) || (name == "dialog" && tag.attr("open").is_none())
        || is_hidden(tag)
}

/// Whether attributes hide the element: `hidden`, `aria-hidden="true"`, `display:none`.
fn is_hidden(tag: &Tag) -> bool {
    if tag.attr("hidden").is_some() {
        return true;
    }
    if tag.attr("aria-hidden").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return true;
    }
    tag.attr("style").is_some_and(|style| {
        let compact: String =
            style.chars().filter(|c| !c.is_whitespace()).map(|c| c.to_ascii_lowercase()).collect();
        compact.contains("display:none")
    })
}

/// Walks `html`, sending balanced events to `sink`; returns title and base.
fn walk<S: Sink>(html: &str, sink: &mut S) -> Meta {
    let mut builder =
        Builder { sink, stack: Vec::new(), open: HashMap::new(), meta: Meta::default() };
    tokenize(html, |token| builder.token(token));
    builder.finish()
}

/// Turns tokens into balanced events, closing elements the way browsers roughly do.
struct Builder<'s, S: Sink> {
    /// Where events go.
    sink: &'s mut S,
    /// Open elements, outermost first.
    stack: Vec<Frame>,
    /// How many elements of each name are open (skips unmatched end tags in O(1)).
    open: HashMap<String, usize>,
    /// Title and base found so far.
    meta: Meta,
}

impl<S: Sink> Builder<'_, S> {
    /// Handles one token.
    fn token(&mut self, token: Token<'_>) {
        match token {
            Token::Text(text) => self.text(&text),
            Token::Start(tag) => self.start(tag),
            Token::End(name) => self.end(&name),
        }
    }

    /// Handles character data.
    fn text(&mut self, text: &str) {
        if self.top_is("head") && !text.chars().all(is_ws) {
            self.end("head");
        }
        let Some(top) = self.stack.last() else {
            self.sink.text(text);
            return;
        };
        if top.name == "title" && !top.foreign {
            if self.meta.title.is_none() {
                let title = collapse(text);
                if !title.is_empty() {
                    self.meta.title = Some(title);
                }
            }
        } else if !top.dropped {
            self.sink.text(text);
        }
    }

    /// Handles a start tag.
    fn start(&mut self, tag: Tag) {
        if self.top_is("head") && !is_head_element(&tag.name) {
            self.end("head");
        }
        let implied = match tag.name.as_str() {
            "li" => self.stack.last().and_then(|f| f.li),
            "td" | "th" => self.stack.last().and_then(|f| f.cell),
            "tr" => self.stack.last().and_then(|f| f.row),
            _ => None,
        };
        if let Some(index) = implied {
            self.close_to(index);
        }
        let parent = self.stack.last();
        let name = tag.name.as_str();
        let foreign =
            parent.is_some_and(|p| p.foreign) || matches!(name, "svg" | "math" | "template");
        let dropped = parent.is_some_and(|p| p.dropped) || drops_content(&tag);
        if name == "base" && !foreign && self.meta.base.is_none() {
            self.meta.base = tag.attr("href").map(str::to_owned);
        }
        if is_void(name) {
            if !dropped {
                self.sink.start(&tag);
                self.sink.end(name);
            }
            return;
        }
        let index = self.stack.len();
        let frame = Frame {
            li: match name {
                "li" => Some(index),
                "ul" | "ol" | "menu" => None,
                _ => parent.and_then(|p| p.li),
            },
            cell: match name {
                "td" | "th" => Some(index),
                "tr" | "table" => None,
                _ => parent.and_then(|p| p.cell),
            },
            row: match name {
                "tr" => Some(index),
                "table" => None,
                _ => parent.and_then(|p| p.row),
            },
            name: tag.name.clone(),
            dropped,
            foreign,
        };
        if !dropped {
            self.sink.start(&tag);
        }
        *self.open.entry(tag.name).or_default() += 1;
        self.stack.push(frame);
    }

    /// Handles an end tag: closes the innermost open element of that name.
    fn end(&mut self, name: &str) {
        if self.open.get(name).copied().unwrap_or(0) == 0 {
            // Browsers turn a stray `</br>` into `<br>` and a stray `</p>` into `<p></p>`.
            if matches!(name, "br" | "p") && !self.stack.last().is_some_and(|f| f.dropped) {
                let tag = Tag { name: name.to_owned(), attrs: Vec::new() };
                self.sink.start(&tag);
                self.sink.end(name);
            }
            return;
        }
        while let Some(frame) = self.stack.last() {
            let found = frame.name == name;
            self.pop();
            if found {
                break;
            }
        }
    }

    /// Pops elements until the stack has `len` entries.
    fn close_to(&mut self, len: usize) {
        while self.stack.len() > len {
            self.pop();
        }
    }

    /// Pops the innermost open element.
    fn pop(&mut self) {
        let Some(frame) = self.stack.pop() else {
            return;
        };
        if let Some(count) = self.open.get_mut(&frame.name) {
            *count = count.saturating_sub(1);
        }
        if !frame.dropped {
            self.sink.end(&frame.name);
        }
    }

    /// Whether the innermost open element is `name`.
    fn top_is(&self, name: &str) -> bool {
        self.stack.last().is_some_and(|f| f.name == name)
    }

    /// Closes everything still open and returns the collected facts.
    fn finish(mut self) -> Meta {
        self.close_to(0);
        self.meta
    }
}

// ---------------------------------------------------------------------------
// Survey pass
// ---------------------------------------------------------------------------

/// What the first pass learns about the document.
#[derive(Debug, Default)]
struct Survey {
    /// Number of `<main>` (or `role="main"`) elements.
    mains: usize,
    /// Number of `<article>` elements.
    articles: usize,
    /// Per table, in document order: whether it looks like a data table.
    data_tables: Vec<bool>,
    /// Indexes (into `data_tables`) of the open tables.
    open_tables: Vec<usize>,
}

/// Whether the element is the page's main content.
fn is_main(tag: &Tag) -> bool {
    tag.name == "main" || tag.attr("role").is_some_and(|r| r.trim().eq_ignore_ascii_case("main"))
}

impl Sink for Survey {
    fn start(&mut self, tag: &Tag) {
        if is_main(tag) {
            self.mains += 1;
        }
        match tag.name.as_str() {
            "article" => self.articles += 1,
            "table" => {
                // A table holding another table is used for layout.
                if let Some(&parent) = self.open_tables.last()
                    && let Some(flag) = self.data_tables.get_mut(parent)
                {
                    *flag = false;
                }
                let role = tag.attr("role").map(str::trim).unwrap_or_default();
                let layout =
                    role.eq_ignore_ascii_case("presentation") || role.eq_ignore_ascii_case("none");
                self.open_tables.push(self.data_tables.len());
                self.data_tables.push(!layout);
            }
            _ => {}
        }
    }

    fn end(&mut self, name: &str) {
        if name == "table" {
            self.open_tables.pop();
        }
    }

    fn text(&mut self, _text: &str) {}
}

// ---------------------------------------------------------------------------
// Renderer
// ---------------------------------------------------------------------------

/// Which part of the document is rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The whole body, minus `nav`, `footer` and `aside`.
    Body,
    /// Only the content of `<main>` elements.
    Main,
    /// Only the content of the single `<article>`.
    Article,
}

/// Inline Markdown markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// `**bold**`
    Bold,
    /// `*italic*`
    Italic,
    /// `` `code` ``
    Code,
    /// `[text](url)`
    Link,
}

impl Mark {
    /// Index into per-mark counters.
    fn index(self) -> usize {
        match self {
            Mark::Bold => 0,
            Mark::Italic => 1,
            Mark::Code => 2,
            Mark::Link => 3,
        }
    }

    /// The opening marker.
    fn opener(self) -> &'static str {
        match self {
            Mark::Bold => "**",
            Mark::Italic => "*",
            Mark::Code => "`",
            Mark::Link => "[",
        }
    }
}

/// What to undo when an element ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Nothing.
    Inert,
    /// The chosen main content element.
    Selected,
    /// A `nav`/`footer`/`aside` being skipped.
    Suppressed,
    /// A block asking for this many line breaks around it.
    Block(u8),
    /// A heading.
    Heading,
    /// A list; nested lists get no blank lines.
    List { nested: bool },
    /// A list item; `container` when it pushed a line prefix.
    Item { container: bool },
    /// A blockquote; `container` when it pushed a line prefix.
    Quote { container: bool },
    /// A preformatted block being collected.
    Pre,
    /// A line-like element inside `pre`.
    PreBlock,
    /// A table.
    Table,
    /// A data-table row.
    Row,
    /// A data-table cell.
    Cell,
    /// An inline marker.
    Mark(Mark),
}

/// Something that prefixes every line inside it.
#[derive(Debug)]
enum Container {
    /// `> ` lines; `started` once a line was written inside.
    Quote { started: bool },
    /// A list item; the marker waits for the item's first line.
    Item { marker: Option<String> },
}

/// An open list.
#[derive(Debug)]
struct ListState {
    /// `ol` rather than `ul`.
    ordered: bool,
    /// Number of the next item.
    next: i64,
    /// Output length when the list started.
    out_len: usize,
}

/// An open table.
#[derive(Debug, Default)]
struct TableState {
    /// Rendered as `| a | b |` rows.
    data: bool,
    /// Cells in the current row.
    cells: usize,
    /// Rows finished so far.
    rows: usize,
    /// The current row has a `th`.
    has_th: bool,
}

/// The open link.
#[derive(Debug)]
struct LinkState {
    /// Resolved target.
    url: String,
    /// Target as written.
    href: String,
    /// Output position of the current `[`.
    start: usize,
}

/// A `pre` block being collected.
#[derive(Debug)]
struct PreState {
    /// Raw text so far.
    buf: String,
    /// Language from a `language-xxx`/`lang-xxx` class.
    lang: Option<String>,
}

/// Most nested quotes and list items that get their own line prefix.
const MAX_CONTAINERS: usize = 32;

/// Writes Markdown from element events.
struct Renderer<'t> {
    /// Which content is rendered.
    mode: Mode,
    /// Base for relative URLs.
    base: Option<Url>,
    /// Data-table flags from the survey, by table order.
    data_tables: &'t [bool],
    /// Tables seen so far.
    table_ordinal: usize,
    /// The Markdown written so far.
    out: String,
    /// One entry per open element.
    stack: Vec<Kind>,
    /// Line breaks wanted before the next content (0, 1 or 2).
    pending: u8,
    /// A space is wanted before the next content.
    pending_space: bool,
    /// The last line written is a blank separator line.
    last_blank: bool,
    /// Line prefixes (quotes, list items), outermost first.
    containers: Vec<Container>,
    /// Open lists.
    lists: Vec<ListState>,
    /// Open tables.
    tables: Vec<TableState>,
    /// Inside a heading or table cell: line breaks become spaces.
    inline_only: usize,
    /// `## ` waiting for the heading's first content.
    heading_prefix: Option<String>,
    /// Open elements per mark.
    depth: [usize; 4],
    /// Active marks in opening order, with whether the opener was written.
    marks: Vec<(Mark, bool)>,
    /// The open link.
    link: Option<LinkState>,
    /// The open `pre`.
    pre: Option<PreState>,
    /// Open selected (main content) elements.
    selected: usize,
    /// Open suppressed elements.
    suppressed: usize,
}

impl Sink for Renderer<'_> {
    fn start(&mut self, tag: &Tag) {
        let data_table = tag.name == "table" && self.next_table_is_data();
        let kind = self.open(tag, data_table);
        self.stack.push(kind);
    }

    fn end(&mut self, _name: &str) {
        if let Some(kind) = self.stack.pop() {
            self.close(kind);
        }
    }

    fn text(&mut self, text: &str) {
        if !self.active() {
            return;
        }
        if let Some(pre) = self.pre.as_mut() {
            pre.buf.push_str(text);
            return;
        }
        self.inline_text(text);
    }
}

impl<'t> Renderer<'t> {
    /// A renderer for `mode`.
    fn new(mode: Mode, base: Option<Url>, data_tables: &'t [bool]) -> Self {
        Renderer {
            mode,
            base,
            data_tables,
            table_ordinal: 0,
            out: String::new(),
            stack: Vec::new(),
            pending: 0,
            pending_space: false,
            last_blank: false,
            containers: Vec::new(),
            lists: Vec::new(),
            tables: Vec::new(),
            inline_only: 0,
            heading_prefix: None,
            depth: [0; 4],
            marks: Vec::new(),
            link: None,
            pre: None,
            selected: 0,
            suppressed: 0,
        }
    }

    /// The finished text.
    fn finish(self) -> String {
        self.out.trim().to_owned()
    }

    /// Whether content is currently rendered.
    fn active(&self) -> bool {
        match self.mode {
            Mode::Body => self.suppressed == 0,
            Mode::Main | Mode::Article => self.selected > 0,
        }
    }

    /// Whether `tag` is the chosen main content.
    fn selects(&self, tag: &Tag) -> bool {
        match self.mode {
            Mode::Main => is_main(tag),
            Mode::Article => tag.name == "article",
            Mode::Body => false,
        }
    }

    /// Takes the survey's verdict for the next table.
    fn next_table_is_data(&mut self) -> bool {
        let data = self.data_tables.get(self.table_ordinal).copied().unwrap_or(false);
        self.table_ordinal += 1;
        data
    }

    /// Starts an element and says how to end it.
    fn open(&mut self, tag: &Tag, data_table: bool) -> Kind {
        let name = tag.name.as_str();
        if self.selects(tag) {
            self.selected += 1;
            self.request_break(2);
            return Kind::Selected;
        }
        if !self.active() {
            return Kind::Inert;
        }
        if self.mode == Mode::Body && matches!(name, "nav" | "footer" | "aside") {
            self.suppressed += 1;
            return Kind::Suppressed;
        }
        if self.pre.is_some() {
            return self.open_in_pre(tag);
        }
        match name {
            "br" => self.line_break(),
            "hr" => self.rule(),
            "img" => self.image(tag),
            "a" => return self.open_link(tag),
            "strong" | "b" => return self.open_mark(Mark::Bold),
            "em" | "i" => return self.open_mark(Mark::Italic),
            "code" | "kbd" | "samp" => return self.open_mark(Mark::Code),
            "h1" => return self.heading(1),
            "h2" => return self.heading(2),
            "h3" => return self.heading(3),
            "h4" => return self.heading(4),
            "h5" => return self.heading(5),
            "h6" => return self.heading(6),
            "ul" | "menu" => return self.list(tag, false),
            "ol" => return self.list(tag, true),
            "li" => return self.item(tag),
            "blockquote" => return self.quote(),
            "pre" | "listing" => return self.open_pre(tag),
            "table" => return self.table(data_table),
            "tr" => return self.row(),
            "td" | "th" => return self.cell(name == "th"),
            "p" | "dl" => return self.block(2),
            _ if is_block(name) => return self.block(1),
            _ => {}
        }
        Kind::Inert
    }

    /// Ends an element.
    fn close(&mut self, kind: Kind) {
        match kind {
            Kind::Inert => {}
            Kind::Selected => {
                self.selected = self.selected.saturating_sub(1);
                self.request_break(2);
            }
            Kind::Suppressed => self.suppressed = self.suppressed.saturating_sub(1),
            Kind::Block(n) => self.request_break(n),
            Kind::Heading => {
                self.inline_only = self.inline_only.saturating_sub(1);
                self.heading_prefix = None;
                self.request_break(2);
            }
            Kind::List { nested } => {
                self.lists.pop();
                self.request_break(if nested { 1 } else { 2 });
            }
            Kind::Item { container } => {
                if container {
                    self.containers.pop();
                }
                self.request_break(1);
            }
            Kind::Quote { container } => {
                if container {
                    self.containers.pop();
                }
                self.request_break(2);
            }
            Kind::Pre => self.finish_pre(),
            Kind::PreBlock => {
                if let Some(pre) = self.pre.as_mut()
                    && !pre.buf.is_empty()
                    && !pre.buf.ends_with('\n')
                {
                    pre.buf.push('\n');
                }
            }
            Kind::Table => {
                self.finish_row();
                let data = self.tables.pop().is_some_and(|t| t.data);
                self.request_break(if data { 2 } else { 1 });
            }
            Kind::Row => self.finish_row(),
            Kind::Cell => self.inline_only = self.inline_only.saturating_sub(1),
            Kind::Mark(mark) => self.close_mark(mark),
        }
    }

    // --- output primitives ---

    /// Asks for `n` line breaks before the next content.
    fn request_break(&mut self, n: u8) {
        if self.inline_only > 0 {
            self.pending_space = true;
            return;
        }
        // An item that has written nothing yet keeps its marker line tight.
        let n = match self.containers.last() {
            Some(Container::Item { marker: Some(_) }) => n.min(1),
            _ => n,
        };
        self.pending = self.pending.max(n);
    }

    /// Whether the output is at the start of a line.
    fn at_line_start(&self) -> bool {
        self.out.is_empty() || self.out.ends_with('\n')
    }

    /// Ends the current line, dropping trailing spaces.
    fn end_line(&mut self) {
        let kept = self.out.trim_end_matches([' ', '\t']).len();
        self.out.truncate(kept);
        self.out.push('\n');
    }

    /// Writes the pending line breaks.
    fn flush_breaks(&mut self) {
        let n = mem::take(&mut self.pending);
        if n == 0 || self.out.is_empty() {
            return;
        }
        self.close_open_marks();
        if !self.at_line_start() {
            self.end_line();
        }
        if n >= 2 && !self.last_blank {
            let prefix = self.blank_prefix();
            self.out.push_str(&prefix);
            self.end_line();
            self.last_blank = true;
        }
    }

    /// The prefix of a blank line: quote markers of quotes already written into.
    fn blank_prefix(&self) -> String {
        let mut prefix = String::new();
        for container in &self.containers {
            match container {
                Container::Quote { started: true } => prefix.push_str("> "),
                Container::Quote { started: false } => break,
                Container::Item { .. } => prefix.push_str("  "),
            }
        }
        prefix.truncate(prefix.trim_end().len());
        prefix
    }

    /// Writes the line prefix: quote markers, list indentation or marker, heading marker.
    fn write_prefix(&mut self) {
        for container in &mut self.containers {
            match container {
                Container::Quote { started } => {
                    self.out.push_str("> ");
                    *started = true;
                }
                Container::Item { marker } => match marker.take() {
                    Some(marker) => self.out.push_str(&marker),
                    None => self.out.push_str("  "),
                },
            }
        }
        if let Some(heading) = self.heading_prefix.take() {
            self.out.push_str(&heading);
        }
    }

    /// Prepares to write content: line breaks, prefix or a pending space.
    fn begin_content(&mut self) {
        self.flush_breaks();
        if self.at_line_start() {
            self.write_prefix();
        } else if self.pending_space && !self.out.ends_with(' ') {
            self.out.push(' ');
        }
        self.pending_space = false;
        self.last_blank = false;
    }

    /// Writes inline content, opening pending marks first.
    fn emit(&mut self, text: &str) {
        self.begin_content();
        self.open_pending_marks();
        self.out.push_str(text);
    }

    /// Writes structural text (table pipes, rules) without opening marks.
    fn emit_raw(&mut self, text: &str) {
        self.begin_content();
        self.out.push_str(text);
    }

    /// Writes text with whitespace collapsed.
    fn inline_text(&mut self, text: &str) {
        if text.starts_with(is_ws) {
            self.pending_space = true;
        }
        let body = collapse(text);
        if !body.is_empty() {
            self.emit(&body);
        }
        if text.ends_with(is_ws) {
            self.pending_space = true;
        }
    }

    // --- inline marks ---

    /// Starts bold, italic or code.
    fn open_mark(&mut self, mark: Mark) -> Kind {
        if mark != Mark::Code && self.depth[Mark::Code.index()] > 0 {
            return Kind::Inert;
        }
        let depth = &mut self.depth[mark.index()];
        *depth += 1;
        if *depth == 1 {
            self.marks.push((mark, false));
        }
        Kind::Mark(mark)
    }

    /// Starts a link, unless it goes nowhere useful or a link is already open.
    fn open_link(&mut self, tag: &Tag) -> Kind {
        let href = tag.attr("href").map_or("", str::trim);
        let scheme =
            |s: &[u8]| href.as_bytes().get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
        if href.is_empty()
            || href.starts_with('#')
            || scheme(b"javascript:")
            || scheme(b"data:")
            || self.depth[Mark::Link.index()] > 0
        {
            return Kind::Inert;
        }
        self.depth[Mark::Link.index()] = 1;
        self.link = Some(LinkState { url: self.resolve(href), href: href.to_owned(), start: 0 });
        // Open before marks not yet written, so `<code><a>x</a></code>` gives [`x`](u).
        let at = self.marks.iter().rposition(|&(_, written)| written).map_or(0, |i| i + 1);
        self.marks.insert(at, (Mark::Link, false));
        Kind::Mark(Mark::Link)
    }

    /// Ends a mark, writing its closer if its opener was written.
    fn close_mark(&mut self, mark: Mark) {
        let depth = &mut self.depth[mark.index()];
        *depth = depth.saturating_sub(1);
        if *depth > 0 {
            return;
        }
        let Some(at) = self.marks.iter().rposition(|&(m, _)| m == mark) else {
            return;
        };
        for i in (at + 1..self.marks.len()).rev() {
            if self.marks[i].1 {
                self.marks[i].1 = false;
                self.write_closer(self.marks[i].0);
            }
        }
        let (_, written) = self.marks.remove(at);
        if written {
            self.write_closer(mark);
        }
        if mark == Mark::Link {
            self.link = None;
        }
    }

    /// Writes the openers of marks waiting for content.
    fn open_pending_marks(&mut self) {
        for i in 0..self.marks.len() {
            let (mark, written) = self.marks[i];
            if written {
                continue;
            }
            if mark == Mark::Link
                && let Some(link) = self.link.as_mut()
            {
                link.start = self.out.len();
            }
            self.out.push_str(mark.opener());
            self.marks[i].1 = true;
        }
    }

    /// Closes all written marks (before a line break); they reopen on the next content.
    fn close_open_marks(&mut self) {
        for i in (0..self.marks.len()).rev() {
            if self.marks[i].1 {
                self.marks[i].1 = false;
                self.write_closer(self.marks[i].0);
            }
        }
    }

    /// Writes the closer of `mark`.
    fn write_closer(&mut self, mark: Mark) {
        match mark {
            Mark::Link => self.finish_link(),
            other => self.out.push_str(other.opener()),
        }
    }

    /// Writes `](url)`, or replaces `[text` by the URL when the text is the URL.
    fn finish_link(&mut self) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        let text = self.out.get(link.start + 1..).unwrap_or_default();
        let plain = same_url(text, &link.url) || same_url(text, &link.href);
        if plain && self.out.is_char_boundary(link.start) {
            self.out.truncate(link.start);
            self.out.push_str(&link.url);
        } else {
            self.out.push_str("](");
            self.out.push_str(&link.url);
            self.out.push(')');
        }
    }

    /// Resolves `href` against the base.
    fn resolve(&self, href: &str) -> String {
        let href = href.trim();
        match &self.base {
            Some(base) => base.join(href).map_or_else(|_| href.to_owned(), String::from),
            None => href.to_owned(),
        }
    }

    // --- inline elements ---

    /// `<br>`: one line break, two in a row make a blank line.
    fn line_break(&mut self) {
        if self.inline_only > 0 {
            self.pending_space = true;
        } else {
            let n = (self.pending + 1).min(2);
            self.request_break(n);
        }
    }

    /// `<hr>`: `---` on its own line.
    fn rule(&mut self) {
        if self.inline_only > 0 {
            self.pending_space = true;
            return;
        }
        self.request_break(2);
        self.emit_raw("---");
        self.request_break(2);
    }

    /// `<img>`: `![alt](src)` when it has alt text.
    fn image(&mut self, tag: &Tag) {
        let alt = collapse(tag.attr("alt").unwrap_or_default());
        if alt.is_empty() {
            return;
        }
        let src = [tag.attr("src"), tag.attr("data-src")]
            .into_iter()
            .flatten()
            .map(str::trim)
            .find(|s| !s.is_empty());
        match src {
            Some(src) if !src.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("data:")) => {
                let url = self.resolve(src);
                self.emit(&format!("![{alt}]({url})"));
            }
            _ => self.inline_text(&alt),
        }
    }

    // --- blocks ---

    /// A plain block with `n` line breaks around it.
    fn block(&mut self, n: u8) -> Kind {
        self.request_break(n);
        Kind::Block(n)
    }

    /// `<hN>`.
    fn heading(&mut self, level: usize) -> Kind {
        if self.inline_only > 0 {
            return self.block(1);
        }
        self.request_break(2);
        self.heading_prefix = Some(format!("{} ", "#".repeat(level)));
        self.inline_only += 1;
        Kind::Heading
    }

    /// `<ul>` / `<ol>`.
    fn list(&mut self, tag: &Tag, ordered: bool) -> Kind {
        if self.inline_only > 0 {
            return self.block(1);
        }
        let nested = self.containers.iter().any(|c| matches!(c, Container::Item { .. }));
        self.request_break(if nested { 1 } else { 2 });
        let next =
            tag.attr("start").filter(|_| ordered).and_then(|s| s.trim().parse().ok()).unwrap_or(1);
        self.lists.push(ListState { ordered, next, out_len: self.out.len() });
        Kind::List { nested }
    }

    /// `<li>`.
    fn item(&mut self, tag: &Tag) -> Kind {
        if self.inline_only > 0 {
            return self.block(1);
        }
        let out_len = self.out.len();
        let (marker, follows) = match self.lists.last_mut() {
            Some(list) => {
                let marker = if list.ordered {
                    let number =
                        tag.attr("value").and_then(|v| v.trim().parse().ok()).unwrap_or(list.next);
                    list.next = number.saturating_add(1);
                    format!("{number}. ")
                } else {
                    "- ".to_owned()
                };
                (marker, out_len > list.out_len)
            }
            None => ("- ".to_owned(), false),
        };
        if follows {
            // Items after the first are separated by a single line break.
            self.pending = 1;
        } else {
            self.request_break(1);
        }
        let container = self.containers.len() < MAX_CONTAINERS;
        if container {
            self.containers.push(Container::Item { marker: Some(marker) });
        }
        Kind::Item { container }
    }

    /// `<blockquote>`.
    fn quote(&mut self) -> Kind {
        if self.inline_only > 0 {
            return self.block(1);
        }
        self.request_break(2);
        let container = self.containers.len() < MAX_CONTAINERS;
        if container {
            self.containers.push(Container::Quote { started: false });
        }
        Kind::Quote { container }
    }

    /// `<pre>`: collected and written as a fenced block at its end.
    fn open_pre(&mut self, tag: &Tag) -> Kind {
        if self.inline_only > 0 {
            return self.open_mark(Mark::Code);
        }
        self.request_break(2);
        self.pre = Some(PreState { buf: String::new(), lang: code_language(tag) });
        Kind::Pre
    }

    /// An element inside `pre`: tags are stripped, `br` and line-like blocks keep lines.
    fn open_in_pre(&mut self, tag: &Tag) -> Kind {
        let Some(pre) = self.pre.as_mut() else {
            return Kind::Inert;
        };
        match tag.name.as_str() {
            "br" => pre.buf.push('\n'),
            "code" if pre.lang.is_none() => pre.lang = code_language(tag),
            "div" | "p" | "li" | "tr" => return Kind::PreBlock,
            _ => {}
        }
        Kind::Inert
    }

    /// Writes the collected `pre` as a fenced code block.
    fn finish_pre(&mut self) {
        let Some(pre) = self.pre.take() else { return };
        let code = clean_code(&pre.buf);
        if !code.is_empty() {
            let fence = "`".repeat(longest_backtick_run(&code).max(2) + 1);
            self.begin_content();
            self.out.push_str(&fence);
            if let Some(lang) = &pre.lang {
                self.out.push_str(lang);
            }
            for line in code.split('\n') {
                self.end_line();
                self.write_prefix();
                self.out.push_str(line);
            }
            self.end_line();
            self.write_prefix();
            self.out.push_str(&fence);
        }
        self.request_break(2);
    }

    /// `<table>`: data tables become pipe rows, layout tables plain lines.
    fn table(&mut self, data: bool) -> Kind {
        if self.inline_only > 0 {
            return self.block(1);
        }
        self.request_break(if data { 2 } else { 1 });
        self.tables.push(TableState { data, ..TableState::default() });
        Kind::Table
    }

    /// Whether rows and cells currently render as a pipe table.
    fn in_data_table(&self) -> bool {
        self.inline_only == 0 && self.tables.last().is_some_and(|t| t.data)
    }

    /// `<tr>`.
    fn row(&mut self) -> Kind {
        if !self.in_data_table() {
            return self.block(1);
        }
        self.finish_row();
        self.request_break(1);
        Kind::Row
    }

    /// `<td>` / `<th>`.
    fn cell(&mut self, header: bool) -> Kind {
        if !self.in_data_table() {
            return self.block(1);
        }
        // Marks opened outside the table close at each cell edge and reopen inside.
        self.close_open_marks();
        let first = self.tables.last().is_some_and(|t| t.cells == 0);
        if first {
            self.emit_raw("| ");
        } else {
            self.pending = 0;
            self.out.push_str(" | ");
        }
        if let Some(table) = self.tables.last_mut() {
            table.cells += 1;
            table.has_th |= header;
        }
        self.pending_space = false;
        self.inline_only += 1;
        Kind::Cell
    }

    /// Ends the current data-table row, adding the header separator after a first `th` row.
    fn finish_row(&mut self) {
        let Some(table) = self.tables.last_mut() else {
            return;
        };
        if !table.data || table.cells == 0 {
            return;
        }
        let cells = mem::take(&mut table.cells);
        let header = mem::take(&mut table.has_th);
        table.rows += 1;
        let first = table.rows == 1;
        self.close_open_marks();
        self.out.push_str(" |");
        self.pending_space = false;
        if first && header {
            self.request_break(1);
            let mut separator = String::from("|");
            separator.push_str(&" --- |".repeat(cells));
            self.emit_raw(&separator);
        }
        self.request_break(1);
    }
}

/// Elements that start a new line.
fn is_block(name: &str) -> bool {
    matches!(
        name,
        "div"
            | "section"
            | "article"
            | "main"
            | "header"
            | "footer"
            | "nav"
            | "aside"
            | "figure"
            | "figcaption"
            | "form"
            | "fieldset"
            | "legend"
            | "address"
            | "details"
            | "summary"
            | "dt"
            | "dd"
            | "caption"
            | "center"
            | "hgroup"
            | "search"
            | "dialog"
            | "option"
            | "html"
            | "body"
    )
}

/// The language named by a `language-xxx` or `lang-xxx` class.
fn code_language(tag: &Tag) -> Option<String> {
    tag.attr("class")?
        .split_ascii_whitespace()
        .find_map(|c| c.strip_prefix("language-").or_else(|| c.strip_prefix("lang-")))
        .filter(|lang| !lang.is_empty())
        .map(str::to_owned)
}

/// Normalizes `pre` text: CRLF and NBSP, no leading blank lines, no trailing whitespace.
fn clean_code(raw: &str) -> String {
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                text.push('\n');
            }
            '\u{a0}' => text.push(' '),
            _ => text.push(c),
        }
    }
    let end = text.trim_end().len();
    let lead = end - text[..end].trim_start().len();
    let start = text[..lead].rfind('\n').map_or(0, |i| i + 1);
    text[start..end].to_owned()
}

/// Length of the longest run of backticks in `text`.
fn longest_backtick_run(text: &str) -> usize {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

/// Whether link text and URL are the same (ignoring a trailing slash).
fn same_url(text: &str, url: &str) -> bool {
    !url.is_empty() && text.trim_end_matches('/') == url.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Converts without a base URL and returns the text.
    fn md(html: &str) -> String {
        to_markdown(html, None).text
    }

    /// Converts against `base` and returns the text.
    fn md_at(html: &str, base: &str) -> String {
        let base = Url::parse(base).expect("test base URL");
        to_markdown(html, Some(&base)).text
    }

    const PAGE: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Rust &amp; Friends &mdash;   Guide</title>
  <link rel="stylesheet" href="/style.css">
  <style>body { color: red; } p > a::after { content: "</p>" }</style>
  <script>var x = "<p>not text</p>"; if (a < b) { document.write("</div>"); }</script>
</head>
<body>
  <nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
  <main>
    <h1>Getting   started</h1>
    <p>Rust is <em>fast</em> and <strong>safe</strong>. See the
       <a href="../book/intro.html">official book</a> or run <code>cargo new</code>.</p>
    <ul>
      <li>Install rustup</li>
      <li>Pick an editor
        <ol>
          <li>VS Code</li>
          <li>Helix</li>
        </ol>
      </li>
    </ul>
    <pre><code class="language-rust">fn main() {
    if 1 &lt; 2 { println!("hi"); }
}
</code></pre>
    <table>
      <tr><th>Tool</th><th>Use</th></tr>
      <tr><td>cargo</td><td>build &amp; test</td></tr>
    </table>
    <blockquote><p>Fearless concurrency.</p><p>Second line.</p></blockquote>
    <p><img src="img/logo.png" alt="Rust logo"> <img src="spacer.gif"></p>
  </main>
  <footer>&copy; 2024 Example</footer>
</body>
</html>"#;

    const PAGE_MD: &str = "# Getting started

Rust is *fast* and **safe**. See the [official book](https://example.com/book/intro.html) or run `cargo new`.

- Install rustup
- Pick an editor
  1. VS Code
  2. Helix

```rust
fn main() {
    if 1 < 2 { println!(\"hi\"); }
}
```

| Tool | Use |
| --- | --- |
| cargo | build & test |

> Fearless concurrency.
>
> Second line.

![Rust logo](https://example.com/guide/img/logo.png)";

    #[test]
    fn realistic_page() {
        let base = Url::parse("https://example.com/guide/start.html").expect("base");
        let page = to_markdown(PAGE, Some(&base));
        assert_eq!(page.title.as_deref(), Some("Rust & Friends — Guide"));
        assert_eq!(page.text, PAGE_MD);
    }

    #[test]
    fn title_absent_or_empty_is_none() {
        assert_eq!(to_markdown("<p>x</p>", None).title, None);
        assert_eq!(to_markdown("<title> \n </title><p>x</p>", None).title, None);
        let page = to_markdown("<svg><title>icon</title></svg><title>Real</title>body", None);
        assert_eq!(page.title.as_deref(), Some("Real"));
        assert_eq!(page.text, "body");
        let page = to_markdown("<TITLE>a &lt;b&gt;</TITLE>", None);
        assert_eq!(page.title.as_deref(), Some("a <b>"));
        assert_eq!(page.text, "");
    }

    #[test]
    fn links_resolve_against_the_page_url() {
        let html = r#"<p><a href="other.html">rel</a> <a href="/root">abs path</a>
            <a href="//cdn.example.net/x">proto</a> <a href="https://b.org/">full</a>
            <a href="?q=1&amp;r=2">query</a></p>"#;
        assert_eq!(
            md_at(html, "https://example.com/dir/page.html"),
            "[rel](https://example.com/dir/other.html) [abs path](https://example.com/root) \
             [proto](https://cdn.example.net/x) [full](https://b.org/) \
             [query](https://example.com/dir/page.html?q=1&r=2)"
        );
        assert_eq!(md(r#"<a href="/x">x link</a>"#), "[x link](/x)");
    }

    #[test]
    fn base_href_overrides_the_page_url() {
        let html = r#"<head><base href="https://cdn.example.org/root/"></head>
            <a href="page">p</a> <img alt="i" src="i.png">"#;
        assert_eq!(
            md_at(html, "https://example.com/a/b"),
            "[p](https://cdn.example.org/root/page) ![i](https://cdn.example.org/root/i.png)"
        );
        assert_eq!(
            md(html),
            "[p](https://cdn.example.org/root/page) ![i](https://cdn.example.org/root/i.png)"
        );
        let relative = r#"<base href="/sub/"><a href="page">p</a>"#;
        assert_eq!(md_at(relative, "https://example.com/a/b"), "[p](https://example.com/sub/page)");
        let second_ignored = r#"<base href="/one/"><base href="/two/"><a href="x">x1</a>"#;
        assert_eq!(md_at(second_ignored, "https://e.com/"), "[x1](https://e.com/one/x)");
    }

    #[test]
    fn links_that_go_nowhere_keep_only_their_text() {
        let html = r##"<a href="#top">Top</a> <a href="javascript:void(0)">Click</a>
            <a href="JavaScript:x()">Up</a> <a>No href</a> <a href="/x"></a>
            <a href="/y"><img src=a.png></a> <a href="https://e.com">https://e.com</a>
            <a href="https://e.com/p"> https://e.com/p/ </a>"##;
        assert_eq!(md(html), "Top Click Up No href https://e.com https://e.com/p");
    }

    #[test]
    fn links_around_blocks_and_inside_code() {
        let html = "<a href='/p'><h3>Card</h3><p>excerpt</p></a>\
                    <p><code><a href='/v'>Vec</a></code> and <a href='/w'><code>W</code></a></p>";
        assert_eq!(md(html), "### [Card](/p)\n\n[excerpt](/p)\n\n[`Vec`](/v) and [`W`](/w)");
    }

    #[test]
    fn comments_doctype_processing_instructions_and_cdata() {
        let html = "<!DOCTYPE html><?xml version='1.0'?><!-- a <p>comment</p> -->\
                    <p>x<!-- y -->z<!---->w<!-->v</p><p><![CDATA[ 1 < 2 && <b>raw</b> ]]></p>";
        assert_eq!(md(html), "xzwv\n\n1 < 2 && <b>raw</b>");
    }

    #[test]
    fn raw_text_elements_are_dropped() {
        let html = "<p>a<script>if (a<b) document.write('</div><p>x</p>')</SCRIPT >b</p>\
                    <style>p::after { content: '</p>' }</style>\
                    <noscript><p>enable js</p></noscript><textarea><p>typed</p></textarea>\
                    <select><option>opt</option></select><template><p>tpl</p></template>\
                    <iframe src=x><p>frame</p></iframe><svg><text>svg</text></svg>\
                    <math><mi>x</mi></math><object><p>obj</p></object><canvas>cv</canvas><p>end</p>";
        assert_eq!(md(html), "ab\n\nend");
    }

    #[test]
    fn unterminated_script_swallows_the_rest() {
        assert_eq!(md("<p>before</p><script>var a = '<p>'; </scrip"), "before");
        assert_eq!(md("<p>x</p><script>a</scriptx>b</script>c"), "x\n\nc");
    }

    #[test]
    fn head_content_is_dropped() {
        let html = "<html><head><meta name=x content=y><link rel=icon href=f.ico>\
                    <title>T</title></head><body><p>body</p></body></html>";
        assert_eq!(md(html), "body");
        // A body element inside an unclosed head ends the head.
        assert_eq!(md("<head><title>T</title><p>shown</p>"), "shown");
        assert_eq!(md("<head><title>T</title>loose text"), "loose text");
    }

    #[test]
    fn malformed_input_gives_sensible_text() {
        assert_eq!(md("<div>a<<b>b</b> < c > d"), "a<**b** < c > d");
        assert_eq!(md("<p>unclosed <b>bold <i>both"), "unclosed **bold *both***");
        assert_eq!(md("<P CLASS=X>Upper</P><DIV>Case</DIV>"), "Upper\n\nCase");
        assert_eq!(
            md("<div title='a>b'>text</div><p class=a=b>q</p><p \"weird\">r</p><a href=/x/>s</a>"),
            "text\n\nq\n\nr\n\n[s](/x/)"
        );
        assert_eq!(md(r#"<a href="/x" title="1 > 0">one</a>"#), "[one](/x)");
        assert_eq!(md("text<"), "text<");
        assert_eq!(md("a </ b"), "a");
        assert_eq!(md("a </>b"), "a b");
        assert_eq!(md("1 <2 and 3> 2"), "1 <2 and 3> 2");
        assert_eq!(md("<p>x</p><a href='/a'"), "x");
        assert_eq!(md("<p>a</p><!-- never ends <p>b</p>"), "a");
        assert_eq!(md("<p>a</p></div></span></p>b"), "a\n\nb");
        assert_eq!(
            md("<ul><li>a<li>b<ul><li>c<li>d</ul><li>e</ul>"),
            "- a\n- b\n  - c\n  - d\n- e"
        );
        assert_eq!(md("<table><tr><td>a<td>b<tr><td>c<td>d</table>"), "| a | b |\n| c | d |");
        assert_eq!(md("<b>bold<p>para</p>still</b>"), "**bold**\n\n**para**\n\n**still**");
        assert_eq!(md("</br>x<br/>y"), "x\ny");
    }

    #[test]
    fn hidden_elements_are_dropped() {
        let html = r#"<div hidden><p>secret</p><div>more</div></div>
            <p>visible <span aria-hidden="TRUE">icon</span>text <span aria-hidden="false">shown</span></p>
            <div><input hidden>after <img hidden alt="gone" src="g.png"></div>
            <div style="display: none"><div>nested</div></div>
            <dialog><p>closed dialog</p></dialog><dialog open>open dialog</dialog>"#;
        assert_eq!(md(html), "visible text shown\n\nafter\nopen dialog");
    }

    #[test]
    fn entities_decode() {
        let cases = [
            ("&amp;", "&"),
            ("&lt;&gt;", "<>"),
            ("&quot;&apos;&#39;", "\"''"),
            ("a&nbsp;b", "a b"),
            ("&#65;&#x41;&#X42;&#x6a", "AABj"),
            ("&#0;&#x110000;&#xD800;&#99999999999;", "\u{fffd}\u{fffd}\u{fffd}\u{fffd}"),
            ("&#150;&#146;", "–’"),
            ("&copy;&reg;&trade;&hellip;&mdash;&ndash;", "©®™…—–"),
            ("&lsquo;&rsquo;&ldquo;&rdquo;&laquo;&raquo;", "‘’“”«»"),
            ("&bull;&middot;&times;&divide;&deg;&plusmn;&para;&sect;", "•·×÷°±¶§"),
            ("&euro;&pound;&yen;&cent;&frac12;&frac14;&frac34;", "€£¥¢½¼¾"),
            ("&larr;&rarr;&uarr;&darr;&hearts;", "←→↑↓♥"),
            ("&eacute;&Uuml;&szlig;&alpha;&Omega;&sigmaf;", "éÜßαΩς"),
            ("&foo; &amp &copy & ; &#; &#x; &", "&foo; &amp &copy & ; &#; &#x; &"),
            ("&ampx;", "&ampx;"),
        ];
        for (html, want) in cases {
            assert_eq!(md(html), want, "decoding {html}");
        }
        assert_eq!(decode("x=1&y=2"), "x=1&y=2");
        assert_eq!(md(r#"<a href="/s?a=1&amp;b=2">q</a>"#), "[q](/s?a=1&b=2)");
    }

    #[test]
    fn whitespace_collapses() {
        let html = "<p>  lots   of\n\n whitespace&nbsp;&nbsp;here\t</p>   <p>\u{a0}x </p>\
                    <div>\n  <span>a</span>\n  <span>b</span>\n</div><p>a<b>b</b>c <i> </i> d<b></b>e</p>";
        assert_eq!(md(html), "lots of whitespace here\n\nx\n\na b\n\na**b**c de");
        assert_eq!(
            md("<div><div><div>deep</div></div></div><p></p><p></p><div>x</div>"),
            "deep\n\nx"
        );
        assert_eq!(md("   \n\t  "), "");
        assert_eq!(md(""), "");
    }

    #[test]
    fn main_is_preferred_then_a_single_article() {
        let html = "<header>Site</header><nav>menu</nav><aside>ad</aside>\
                    <article><h2>A</h2><p>body</p></article><footer>f</footer>";
        assert_eq!(md(html), "## A\n\nbody");
        let two = "<header>Site</header><article>one</article><article>two</article><nav>n</nav>\
                   <aside>a</aside><footer>f</footer>";
        assert_eq!(md(two), "Site\none\ntwo");
        let main = "<article>teaser</article><main><nav>inner nav</nav>content<footer>mf</footer></main>\
                    <p>outside</p>";
        assert_eq!(md(main), "inner nav\ncontent\nmf");
        assert_eq!(md("<div role=main>r</div><p>o</p>"), "r");
        // An empty main falls back to the whole body.
        assert_eq!(md("<main></main><p>rest</p>"), "rest");
        // A hidden main does not count.
        assert_eq!(md("<main hidden>h</main><p>rest</p>"), "rest");
    }

    #[test]
    fn headings_rules_and_breaks() {
        let html = "<h1>Title <br> more</h1><h3></h3><h6>six</h6><p>one<br>two<br><br>three</p><hr><p>x</p>";
        assert_eq!(md(html), "# Title more\n\n###### six\n\none\ntwo\n\nthree\n\n---\n\nx");
    }

    #[test]
    fn lists() {
        assert_eq!(md("<ol start=5><li>a<li value=9>b<li>c</ol>"), "5. a\n9. b\n10. c");
        assert_eq!(
            md("<p>intro</p><ul><li><p>a</p></li><li><p>b</p><p>c</p></li></ul><p>after</p>"),
            "intro\n\n- a\n- b\n\n  c\n\nafter"
        );
        assert_eq!(
            md(
                "<ul><li>x<pre>code\nline2</pre></li><li><blockquote>q</blockquote></li><li></li></ul>"
            ),
            "- x\n\n  ```\n  code\n  line2\n  ```\n- > q"
        );
        assert_eq!(md("<li>stray</li>"), "- stray");
        assert_eq!(
            md("<ul><li>1<ul><li>2<ul><li>3</li></ul></li></ul></li></ul>"),
            "- 1\n  - 2\n    - 3"
        );
    }

    #[test]
    fn blockquotes() {
        assert_eq!(
            md("<p>x</p><blockquote>q1<blockquote>q2</blockquote>q3</blockquote><p>y</p>"),
            "x\n\n> q1\n>\n> > q2\n>\n> q3\n\ny"
        );
        assert_eq!(
            md("<blockquote>a<br>b<pre>c\nd</pre></blockquote>"),
            "> a\n> b\n>\n> ```\n> c\n> d\n> ```"
        );
    }

    #[test]
    fn code_blocks() {
        assert_eq!(
            md("<pre class=\"lang-py\">\n\nprint('```')\n   indented\n\n</pre>"),
            "````py\nprint('```')\n   indented\n````"
        );
        assert_eq!(
            md("<pre>  <b>keep</b>  spaces\r\n<span>x</span>&amp;<br>y</pre>"),
            "```\n  keep  spaces\nx&\ny\n```"
        );
        assert_eq!(md("<pre><div>l1</div><div>l2</div></pre>"), "```\nl1\nl2\n```");
        assert_eq!(md("<pre>  \n </pre><p>p</p>"), "p");
        assert_eq!(md("<p>use <code> a  b </code>!</p>"), "use `a b` !");
        assert_eq!(md("<code><b>x</b></code>"), "`x`");
    }

    #[test]
    fn tables() {
        assert_eq!(
            md("<table><caption>Cap</caption><thead><tr><th>A<th>B</thead>\
                <tbody><tr><td><p>x</p><p>y</p><td><ul><li>1<li>2</ul></tbody></table>"),
            "Cap\n| A | B |\n| --- | --- |\n| x y | 1 2 |"
        );
        assert_eq!(md("<table><tr><td>a</td><td></td></tr></table>"), "| a |  |");
        assert_eq!(
            md("<b><table><tr><td>a<td>b</table></b><a href=/u><table><tr><td>c</table></a>"),
            "| **a** | **b** |\n\n| [c](/u) |"
        );
        // A table holding a table is layout: its cells become lines.
        assert_eq!(
            md(
                "<table><tr><td><table><tr><td>inner</td></tr></table></td><td>cell2</td></tr></table>"
            ),
            "| inner |\n\ncell2"
        );
        assert_eq!(md("<table role=presentation><tr><td>a</td><td>b</td></tr></table>"), "a\nb");
    }

    #[test]
    fn images() {
        let html = "<img alt=\"inline\" src=\"data:image/png;base64,AAA\"> <img alt=\"\" src=x.png>\
                    <img src=y.png> <img alt=Pic src=\"/p.png\"> <img alt=Lazy data-src=l.png>";
        assert_eq!(
            md_at(html, "https://e.com/d/"),
            "inline ![Pic](https://e.com/p.png) ![Lazy](https://e.com/d/l.png)"
        );
    }

    #[test]
    fn emphasis_markers() {
        assert_eq!(
            md("<strong>s</strong> <b> b </b> <em>e</em><i></i> <b><i>bi</i></b>"),
            "**s** **b** *e* ***bi***"
        );
        assert_eq!(md("<b>a<b>nested</b>b</b>"), "**anestedb**");
        assert_eq!(md("<h2><b></b></h2><p><em> </em></p>"), "");
    }

    /// A tiny xorshift generator for the fuzz test.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).expect("small")
        }
    }

    #[test]
    fn fuzz_never_panics_and_never_leaks_script() {
        // `script` only appears as whole tags: a bare word could legitimately be printed
        // after a stray `<` (as in `<<b>script`), just as browsers show it.
        const FRAGMENTS: &[&str] = &[
            "<",
            ">",
            "</",
            "/>",
            "a",
            "p",
            "b",
            "li",
            "ul",
            "ol",
            "pre",
            "code",
            "table",
            "td",
            "tr",
            "th",
            "h1",
            "blockquote",
            "main",
            "article",
            "nav",
            "br",
            "hr",
            "img",
            "href",
            "src",
            "=",
            "\"",
            "'",
            "&",
            ";",
            "#",
            "#x41",
            "#0",
            "amp",
            "nbsp",
            "<!--",
            "-->",
            "<!",
            "?",
            "<script>",
            "<SCRIPT type=x>",
            "</script>",
            "</ScRiPt>",
            "<script>x = '</p><p>'",
            "style",
            "hidden",
            "title",
            "svg",
            " ",
            "\n",
            "\t",
            "x",
            "y",
            "é",
            "\u{a0}",
            "语",
            "🦀",
            "-",
            "[",
            "]",
            "`",
        ];
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..2_000 {
            let len = rng.below(60);
            let html: String = (0..len).map(|_| FRAGMENTS[rng.below(FRAGMENTS.len())]).collect();
            let page = to_markdown(&html, None);
            assert!(
                !page.text.to_ascii_lowercase().contains("<script"),
                "script leaked from {html:?}: {:?}",
                page.text
            );
            assert!(!page.text.contains("\n\n\n") || html.contains("pre"), "{html:?}");
            assert!(page.text.lines().all(|l| !l.ends_with(' ')), "{html:?}");
            assert_eq!(page.text.trim(), page.text);
            let base = Url::parse("https://example.com/a/").expect("base");
            let _ = to_markdown(&html, Some(&base));
        }
    }

    #[test]
    fn large_and_deep_inputs() {
        let big = "<p>word</p>".repeat(200_000);
        let text = md(&big);
        assert!(text.starts_with("word\n\nword\n\n"));
        assert_eq!(text.matches("word").count(), 200_000);

        let deep = format!("{}x{}", "<div>".repeat(100_000), "</div>".repeat(100_000));
        assert_eq!(md(&deep), "x");

        let unclosed = format!("{}y", "<div><span><b>".repeat(100_000));
        assert_eq!(md(&unclosed), "**y**");

        let lists = format!("{}z{}", "<ul><li>".repeat(50_000), "<br>w".repeat(1_000));
        let text = md(&lists);
        assert!(text.ends_with('w'));

        let cells = format!("<table><tr>{}</tr></table>", "<td>c".repeat(50_000));
        assert!(md(&cells).starts_with("| c | c |"));

        let items =
            format!("<ul><li>a<ol>{}</ol>", "<div>".repeat(20_000) + &"<li>i</li>".repeat(20_000));
        assert!(md(&items).contains("1. i"));

        let attrs = format!("<p {}>q</p>", "a=1 ".repeat(100_000));
        assert_eq!(md(&attrs), "q");

        let stray = "<".repeat(100_000) + &"&".repeat(100_000) + &"</".repeat(50_000);
        assert!(md(&stray).starts_with("<<<"));

        let raw = format!("<script>{}</script>after", "</scrip".repeat(100_000));
        assert_eq!(md(&raw), "after");
    }

    /// Multi-byte characters next to every kind of markup: no slice ever falls inside a
    /// character.
    #[test]
    fn fuzz_with_multibyte_characters_never_panics() {
        const FRAGMENTS: &[&str] = &[
            "<",
            ">",
            "</",
            "é",
            "ü",
            "€",
            "😀",
            "&",
            ";",
            "#x",
            "#",
            "1F600",
            "amp",
            "<!--",
            "-->",
            "<![CDATA[",
            "]]>",
            "<pre>",
            "</pre>",
            "<a href='",
            "'",
            "\"",
            "=",
            "<p>",
            "<script>",
            "</script>",
            "<title>",
            "</title>",
            " ",
            "\n",
            "ß",
            "<td>",
            "<li>",
        ];
        let mut rng = XorShift(0xdead_beef_cafe_f00d);
        for _ in 0..3_000 {
            let count = 1 + rng.below(40);
            let input: String = (0..count).map(|_| FRAGMENTS[rng.below(FRAGMENTS.len())]).collect();
            let page = to_markdown(&input, None);
            assert!(!page.text.contains('\0'), "{input:?}");
        }
    }
}
