//! External `$ref`s (`./pet.yaml#/Pet`): the files they name, read and put into the
//! document under [`BUNDLE_KEY`] with every reference rewritten to a local one, so that
//! the rest of the import only ever follows local pointers.
//!
//! What a reference may read depends on where the document came from. From a file: files
//! in the document's folder or in a folder `refDirs` names (symbolic links resolved
//! first), never a URL. From a URL: URLs of the document's own origin, fetched as the
//! document was, never a local file (a document from the network must not make toolmux
//! read the machine's files) nor another host. Given as text, a document has no folder of
//! its own: its references name files in the folders `refDirs` names, tried in order, and
//! without `refDirs` it follows none. Files are read once however often they
//! are named, which also ends cycles between them; their number, their nesting and their
//! total size are bounded. A reference that cannot be followed is left as it is, with the
//! reason, and only the operations reaching it are left out.

use super::document::{Document, parse_value, percent_decode};
use crate::OpenApiConfig;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// Why a document given as text follows no external reference without `refDirs`.
pub(crate) const TEXT_WITHOUT_FOLDERS: &str = "the document was given as text, so it has no \
    folder to look the file up in; give the document as a file (`spec`) instead, or name \
    the folders of its files in the import's `refDirs`";
/// The member of the document's root holding the external files, by number:
/// `#/x-toolmux-external/0/Pet` is `#/Pet` of the first file read.
pub(crate) const BUNDLE_KEY: &str = "x-toolmux-external";
/// Most external files one document may reach.
const MAX_FILES: usize = 256;
/// Deepest chain of files naming files.
const MAX_DEPTH: usize = 16;
/// Most bytes of all external files together.
const MAX_BYTES: usize = 64 * 1024 * 1024;

/// Where a document was read from, which decides what its references may read.
#[derive(Debug)]
pub(crate) enum Origin<'a> {
    /// A file: references to files under `roots` (the document's folder and the import's
    /// `refDirs`).
    File { path: PathBuf, roots: Vec<PathBuf> },
    /// A URL: references on its origin, fetched with the import's settings.
    Url { url: reqwest::Url, config: &'a OpenApiConfig },
    /// Text: references to files under `roots` (the import's `refDirs`), a relative one
    /// looked up in each in turn. Its files are read with `std::fs`, so that bundling it
    /// never waits ([`bundle_text`]).
    Text { roots: Vec<PathBuf> },
}

/// The external files of a document, once bundled.
#[derive(Debug, Default)]
pub(crate) struct Externals {
    /// How each file under [`BUNDLE_KEY`] is named in messages (a path relative to the
    /// document's folder, or a URL), by number.
    pub(crate) names: Vec<String>,
    /// Why each reference that was not followed was not, by the reference as it now
    /// stands in the document.
    pub(crate) unfollowed: HashMap<String, String>,
}

impl Externals {
    /// The number and the pointer inside the file of a bundled pointer
    /// (`/x-toolmux-external/3/Pet` is `(3, "/Pet")`).
    pub(crate) fn split(pointer: &str) -> Option<(usize, &str)> {
        let rest = pointer.strip_prefix('/')?.strip_prefix(BUNDLE_KEY)?.strip_prefix('/')?;
        let (number, inner) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        Some((number.parse().ok()?, inner))
    }

    /// The name of file `number` without its folder and extension (`pet` for
    /// `schemas/pet.yaml`), for the definition a reference to the whole file makes.
    pub(crate) fn stem(&self, number: usize) -> Option<&str> {
        let name = self.names.get(number)?;
        let last = name.rsplit(['/', '\\']).next().unwrap_or(name);
        Some(last.split_once('.').map_or(last, |(stem, _)| stem))
    }
}

/// A place a reference leads to: a canonical file path or a URL without its fragment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Place {
    File(PathBuf),
    Url(reqwest::Url),
    /// A document given as text, which is no file.
    Text,
}

/// The text of an external file of at most `left` bytes (see
/// [`crate::provider::read_document_file`]: never a FIFO or a device).
fn read_file(path: &Path, left: usize, too_large: fn() -> String) -> Result<String, String> {
    let size = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if size.is_file() && size.len() > left as u64 {
        return Err(too_large());
    }
    crate::provider::read_document_file(path, left).map_err(|why| format!("cannot read it: {why}"))
}

/// Bundles a document given as text ([`Origin::Text`]) at once, without a runtime.
pub(crate) fn bundle_text(doc: &mut Document, roots: Vec<PathBuf>) {
    let origin = Origin::Text { roots };
    let mut future = std::pin::pin!(bundle(doc, origin));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    // Invariant: with `Origin::Text` every file is read with `std::fs` and nothing is
    // fetched, so no step of the bundling waits: it is done after one poll.
    let done = future.as_mut().poll(&mut context).is_ready();
    assert!(done, "bundling a document given as text never waits");
}

/// Reads every file the references of `doc` reach and rewrites them to local ones.
pub(crate) async fn bundle(doc: &mut Document, origin: Origin<'_>) {
    let mut wanted = BTreeSet::new();
    external_refs(&doc.root, &mut wanted);
    if wanted.is_empty() {
        return;
    }
    let (root, shown_dir, roots) = match &origin {
        Origin::File { path, roots } => {
            let Ok(canonical) = tokio::fs::canonicalize(path).await else { return };
            let mut allowed = Vec::new();
            for dir in canonical.parent().into_iter().chain(roots.iter().map(PathBuf::as_path)) {
                if let Ok(dir) = tokio::fs::canonicalize(dir).await {
                    allowed.push(dir);
                }
            }
            let shown = normalize(path.parent().unwrap_or(Path::new("")));
            (Place::File(canonical), Some(shown), allowed)
        }
        Origin::Text { roots } => {
            let allowed = roots.iter().filter_map(|dir| std::fs::canonicalize(dir).ok()).collect();
            (Place::Text, roots.first().map(|dir| normalize(dir)), allowed)
        }
        Origin::Url { url, .. } => {
            let mut url = url.clone();
            url.set_fragment(None);
            (Place::Url(url), None, Vec::new())
        }
    };
    let mut bundler = Bundler {
        origin: &origin,
        roots,
        shown_dir,
        root: root.clone(),
        numbers: HashMap::new(),
        files: Vec::new(),
        bytes: 0,
        externals: Externals::default(),
    };
    // The document first, then each file in the order they were found.
    let mut root_value = std::mem::take(&mut doc.root);
    bundler.rewrite_value(&mut root_value, &root, None).await;
    let mut next = 0;
    while next < bundler.files.len() {
        let mut value = std::mem::take(&mut bundler.files[next].value);
        let place = bundler.files[next].place.clone();
        bundler.rewrite_value(&mut value, &place, Some(next)).await;
        bundler.files[next].value = value;
        next += 1;
    }
    if !bundler.files.is_empty()
        && let Value::Object(map) = &mut root_value
    {
        let files = bundler.files.iter_mut().map(|f| std::mem::take(&mut f.value)).collect();
        map.insert(BUNDLE_KEY.to_owned(), Value::Array(files));
    }
    bundler.externals.names = bundler.files.iter().map(|f| f.shown.clone()).collect();
    doc.root = root_value;
    doc.externals = bundler.externals;
}

/// One external file read.
#[derive(Debug)]
struct File {
    place: Place,
    shown: String,
    /// How many files lie between the document and it (1: named by the document).
    depth: usize,
    value: Value,
}

#[derive(Debug)]
struct Bundler<'a> {
    origin: &'a Origin<'a>,
    /// Canonical folders files may be read from.
    roots: Vec<PathBuf>,
    /// The document's folder as given, for messages.
    shown_dir: Option<PathBuf>,
    root: Place,
    numbers: HashMap<Place, usize>,
    files: Vec<File>,
    bytes: usize,
    externals: Externals,
}

impl Bundler<'_> {
    /// Rewrites the references of `value`, the content of `place` (file `number`, or the
    /// document itself for `None`), reading the files they name.
    async fn rewrite_value(&mut self, value: &mut Value, place: &Place, number: Option<usize>) {
        let mut refs = BTreeSet::new();
        all_refs(value, &mut refs);
        let depth = number.map_or(0, |n| self.files[n].depth);
        let mut rewritten: HashMap<String, String> = HashMap::new();
        for reference in refs {
            let (target, fragment) = reference.split_once('#').unwrap_or((&reference, ""));
            let local = |n: Option<usize>| match n {
                Some(n) => format!("#/{BUNDLE_KEY}/{n}{fragment}"),
                None => format!("#{fragment}"),
            };
            if target.is_empty() {
                if number.is_some() {
                    rewritten.insert(reference.clone(), local(number));
                }
                continue;
            }
            if !fragment.is_empty() && !fragment.starts_with('/') {
                let why = "only JSON Pointer fragments (`#/…`) are followed in external \
                           references";
                self.unfollowed(&mut rewritten, &reference, reference.clone(), why.into());
                continue;
            }
            match self.reach(target, place, depth).await {
                Ok(Some(n)) => rewritten.insert(reference.clone(), local(Some(n))),
                Ok(None) => rewritten.insert(reference.clone(), local(None)),
                Err((shown_target, why)) => {
                    let shown = match fragment {
                        "" => shown_target,
                        fragment => format!("{shown_target}#{fragment}"),
                    };
                    self.unfollowed(&mut rewritten, &reference, shown, why);
                    continue;
                }
            };
        }
        rewrite(value, &rewritten);
    }

    fn unfollowed(
        &mut self,
        rewritten: &mut HashMap<String, String>,
        reference: &str,
        shown: String,
        why: String,
    ) {
        self.externals.unfollowed.insert(shown.clone(), why);
        rewritten.insert(reference.to_owned(), shown);
    }

    /// The file `target` names from `base`: `None` for the document itself, else its
    /// number, read now if it was not yet. Errors are the target as shown and why.
    async fn reach(
        &mut self,
        target: &str,
        base: &Place,
        depth: usize,
    ) -> Result<Option<usize>, (String, String)> {
        let (place, shown) = self.locate(target, base).await?;
        if place == self.root {
            return Ok(None);
        }
        if let Some(&n) = self.numbers.get(&place) {
            return Ok(Some(n));
        }
        let fail = |why: String| Err((shown.clone(), why));
        if depth + 1 > MAX_DEPTH {
            return fail(format!("references nest more than {MAX_DEPTH} files deep"));
        }
        if self.files.len() >= MAX_FILES {
            return fail(format!("the document reaches more than {MAX_FILES} files"));
        }
        let text = match self.read(&place).await {
            Ok(text) => text,
            Err(why) => return fail(why),
        };
        self.bytes += text.len();
        let value = match parse_value(&text, &shown) {
            Ok(value) => value,
            Err(e) => return fail(e.to_string()),
        };
        let n = self.files.len();
        self.numbers.insert(place.clone(), n);
        self.files.push(File { place, shown, depth: depth + 1, value });
        Ok(Some(n))
    }

    /// Where `target` leads from `base`, if the document's origin lets it be read.
    async fn locate(
        &self,
        target: &str,
        base: &Place,
    ) -> Result<(Place, String), (String, String)> {
        let refuse = |why: &str| Err((target.to_owned(), why.to_owned()));
        match (self.origin, base) {
            (Origin::File { .. } | Origin::Text { .. }, Place::File(base)) => {
                self.locate_file(target, &[base.parent().unwrap_or(Path::new("/"))]).await
            }
            (Origin::Text { roots }, Place::Text) => {
                if roots.is_empty() {
                    return refuse(TEXT_WITHOUT_FOLDERS);
                }
                let folders: Vec<&Path> = roots.iter().map(PathBuf::as_path).collect();
                self.locate_file(target, &folders).await
            }
            (Origin::Url { url: root, .. }, Place::Url(base)) => {
                let Ok(mut url) = base.join(target) else {
                    return refuse("not a URL reference");
                };
                url.set_fragment(None);
                if !crate::http::same_origin(root, &url) {
                    return Err((
                        crate::request::url_for_messages(url.as_str()),
                        "a document read from a URL follows references on its own origin only"
                            .into(),
                    ));
                }
                Ok((Place::Url(url.clone()), crate::request::url_for_messages(url.as_str())))
            }
            _ => refuse("the reference's origin is unknown"),
        }
    }

    /// Where the file `target` names lies, looked up in `folders` in turn (a relative
    /// path), if it is under one of the roots.
    async fn locate_file(
        &self,
        target: &str,
        folders: &[&Path],
    ) -> Result<(Place, String), (String, String)> {
        let refuse = |why: &str| Err((target.to_owned(), why.to_owned()));
        let scheme = target.split_once(':').map(|(s, _)| s).filter(|s| {
            s.len() > 1 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        });
        let candidates: Vec<PathBuf> = match scheme {
            Some(s) if s.eq_ignore_ascii_case("file") => {
                match reqwest::Url::parse(target).ok().and_then(|u| u.to_file_path().ok()) {
                    Some(path) => vec![path],
                    None => return refuse("not a file URL toolmux can read"),
                }
            }
            Some(_) if matches!(self.origin, Origin::Text { .. }) => {
                return refuse(
                    "a document given as text follows references to files in `refDirs` only",
                );
            }
            Some(_) => {
                return refuse("a document read from a file follows references to files only");
            }
            None => {
                folders.iter().map(|dir| normalize(&dir.join(percent_decode(target)))).collect()
            }
        };
        let mut first_failure = None;
        for path in candidates {
            let shown = self.show_path(&path);
            let canonical = match self.canonicalize(&path).await {
                Ok(canonical) => canonical,
                Err(e) => {
                    first_failure.get_or_insert((shown, format!("cannot read it: {e}")));
                    continue;
                }
            };
            if !self.roots.iter().any(|root| canonical.starts_with(root)) {
                let fix = match self.origin {
                    Origin::Text { .. } => "name its folder in the import's `refDirs` to read it",
                    _ => {
                        "the file is outside the document's folder; name its folder in the \
                          import's `refDirs` to read it"
                    }
                };
                let why = match self.origin {
                    Origin::Text { .. } => {
                        format!("the file is outside every folder of `refDirs`; {fix}")
                    }
                    _ => fix.to_owned(),
                };
                return Err((shown, why));
            }
            return Ok((Place::File(canonical), shown));
        }
        match first_failure {
            Some((shown, why)) if folders.len() > 1 => {
                Err((shown, format!("{why} (nor in any other folder of `refDirs`)")))
            }
            Some(failure) => Err(failure),
            None => refuse("no folder to look it up in"),
        }
    }

    /// `path` made canonical, without waiting for a document given as text.
    async fn canonicalize(&self, path: &Path) -> std::io::Result<PathBuf> {
        match self.origin {
            Origin::Text { .. } => std::fs::canonicalize(path),
            _ => tokio::fs::canonicalize(path).await,
        }
    }

    /// The text of an external file, within the size left.
    async fn read(&self, place: &Place) -> Result<String, String> {
        let left = MAX_BYTES.saturating_sub(self.bytes);
        fn too_large() -> String {
            format!("the document's external files would be larger than {} MiB", MAX_BYTES >> 20)
        }
        match (place, self.origin) {
            (Place::File(path), Origin::Text { .. }) => read_file(path, left, too_large),
            (Place::File(path), _) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || read_file(&path, left, too_large))
                    .await
                    .map_err(|e| format!("cannot read it: {e}"))?
            }
            (Place::Url(url), Origin::Url { config, .. }) => {
                let text = crate::provider::fetch_document(url.as_str(), config)
                    .await
                    .map_err(|e| e.to_string())?;
                if text.len() > left {
                    return Err(too_large());
                }
                Ok(text)
            }
            (Place::Url(_), Origin::File { .. } | Origin::Text { .. }) => {
                Err("a document read from a file follows references to files only".into())
            }
            (Place::Text, _) => Err("the document itself is no file".into()),
        }
    }

    /// A path for messages: relative to the document's folder when inside it.
    fn show_path(&self, path: &Path) -> String {
        match self.shown_dir.as_deref().and_then(|dir| path.strip_prefix(dir).ok()) {
            Some(inside) => inside.display().to_string(),
            None => path.display().to_string(),
        }
    }
}

/// `path` with `.` and `..` components resolved without the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Every `$ref` of `value` that is not local (`#…`).
fn external_refs(value: &Value, out: &mut BTreeSet<String>) {
    let mut all = BTreeSet::new();
    all_refs(value, &mut all);
    out.extend(all.into_iter().filter(|r| !r.starts_with('#')));
}

/// Every `$ref` string of `value`.
fn all_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, member) in map {
                match member {
                    Value::String(reference) if key == "$ref" => {
                        out.insert(reference.clone());
                    }
                    other => all_refs(other, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| all_refs(v, out)),
        _ => {}
    }
}

/// Replaces each `$ref` of `value` that `rewritten` names.
fn rewrite(value: &mut Value, rewritten: &HashMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                match member {
                    Value::String(reference) if key == "$ref" => {
                        if let Some(new) = rewritten.get(reference.as_str()) {
                            *reference = new.clone();
                        }
                    }
                    other => rewrite(other, rewritten),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, rewritten)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_pointers_split_into_file_and_place() {
        assert_eq!(
            Externals::split("/x-toolmux-external/3/Pet/properties"),
            Some((3, "/Pet/properties"))
        );
        assert_eq!(Externals::split("/x-toolmux-external/0"), Some((0, "")));
        assert_eq!(Externals::split("/components/schemas/Pet"), None);
    }

    #[test]
    fn paths_normalize_without_the_file_system() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d.yaml")), PathBuf::from("/a/c/d.yaml"));
    }
}
