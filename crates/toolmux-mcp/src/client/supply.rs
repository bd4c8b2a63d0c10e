//! The supply-chain check before a stdio server is started through a package runner
//! (`npx`, `bunx`, `pnpm dlx`, `yarn dlx`, `uvx`, `uv tool run`, `pipx run`): such a
//! command downloads and runs whatever the registry serves under that name, so the
//! package is first looked up in OSV (the Open Source Vulnerabilities database, the
//! `/v1/query` API) and one with a malicious-package advisory (`MAL-…`, the OpenSSF
//! malicious packages feed) is not started. As goose does, the check fails open: when OSV
//! cannot be asked (no network, a timeout, an error), the server starts and a warning
//! says the package was not checked. Answers are kept for the life of the process.

use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// Where OSV answers, unless configured otherwise.
pub(crate) const DEFAULT_OSV_URL: &str = "https://api.osv.dev";

/// How long OSV may take to answer.
const OSV_TIMEOUT: Duration = Duration::from_secs(5);

/// A package a runner would fetch and run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Package {
    /// OSV's name for the registry: `npm` or `PyPI`.
    pub(crate) ecosystem: &'static str,
    pub(crate) name: String,
    /// The exact version asked for, when one is.
    pub(crate) version: Option<String>,
}

impl std::fmt::Display for Package {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(version) => write!(f, "{} {}@{version}", self.ecosystem, self.name),
            None => write!(f, "{} {}", self.ecosystem, self.name),
        }
    }
}

/// The package `command args` would fetch and run, if it runs one through a package
/// runner and names it in a form the registry resolves (not a path, a URL or a git spec).
pub(crate) fn package_of(command: &str, args: &[String]) -> Option<Package> {
    let program = Path::new(command).file_name()?.to_str()?;
    let program = program.strip_suffix(".cmd").unwrap_or(program);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (spec, npm) = match (program, args.as_slice()) {
        ("npx" | "bunx", rest) | ("pnpm" | "yarn", ["dlx", rest @ ..]) => {
            (named(rest, &["-p", "--package"], NPX_VALUE_FLAGS, &["-c", "--call"])?, true)
        }
        ("uvx", rest) | ("uv", ["tool", "run", rest @ ..]) => {
            (named(rest, &["--from"], UV_VALUE_FLAGS, &[])?, false)
        }
        ("pipx", ["run", rest @ ..]) => (named(rest, &["--spec"], PIPX_VALUE_FLAGS, &[])?, false),
        _ => return None,
    };
    if npm { npm_spec(spec) } else { pypi_spec(spec) }
}

/// The package a runner's `args` name: the value of an `explicit` flag (`--package pkg`
/// or `--package=pkg`), else the first argument that is not a flag (nor a flag's value);
/// `None` after a flag that runs a command line instead (`npx -c`).
fn named<'a>(
    args: &[&'a str],
    explicit: &[&str],
    value_flags: &[&str],
    command_line: &[&str],
) -> Option<&'a str> {
    let mut given = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        if command_line.contains(&arg) {
            return None;
        }
        if explicit.contains(&arg) {
            given = given.or(args.get(i + 1).copied());
            i += 1;
        } else if let Some(value) = explicit
            .iter()
            .find_map(|flag| arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')))
        {
            given = given.or(Some(value));
        } else if value_flags.contains(&arg) {
            i += 1;
        } else if !arg.starts_with('-') {
            return Some(given.unwrap_or(arg));
        }
        i += 1;
    }
    given
}

/// npm runners' flags that take a value (`-p pkg`, `--package pkg`; `-c` runs a command
/// line, which names no package for certain).
const NPX_VALUE_FLAGS: &[&str] = &["--cache", "--registry", "--userconfig", "--prefix"];

/// uv's flags that take a value.
const UV_VALUE_FLAGS: &[&str] = &[
    "--with",
    "--with-editable",
    "--with-requirements",
    "--python",
    "-p",
    "--index",
    "--default-index",
    "--index-url",
    "-i",
    "--extra-index-url",
    "--find-links",
    "-f",
    "--constraints",
    "-c",
    "--overrides",
    "--build-constraints",
    "--cache-dir",
    "--directory",
    "--project",
    "--config-file",
    "--python-platform",
    "--env-file",
];

/// pipx's flags that take a value.
const PIPX_VALUE_FLAGS: &[&str] = &["--python", "--index-url", "-i", "--pip-args", "--backend"];

/// `name`, `name@1.2.3`, `@scope/name@1.2.3` (a tag or a range gives no version).
fn npm_spec(spec: &str) -> Option<Package> {
    let (name, version) = match spec.rfind('@') {
        Some(at) if at > 0 => (&spec[..at], Some(&spec[at + 1..])),
        _ => (spec, None),
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
    let valid = match name.strip_prefix('@') {
        Some(scoped) => scoped.split_once('/').is_some_and(|(scope, package)| {
            !scope.is_empty()
                && !package.is_empty()
                && (scope.chars().chain(package.chars())).all(plain)
        }),
        None => !name.is_empty() && name.chars().all(plain),
    };
    valid.then(|| Package { ecosystem: "npm", name: name.to_owned(), version: exact(version) })
}

/// `name`, `name==1.2.3`, `name@1.2.3` (uv's form), `name[extra]==1.2.3`.
fn pypi_spec(spec: &str) -> Option<Package> {
    let (name, version) = match spec.split_once("==").or_else(|| spec.split_once('@')) {
        Some((name, version)) => (name, Some(version)),
        None => (spec, None),
    };
    let name = name.split('[').next().unwrap_or(name).trim();
    let valid =
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    valid.then(|| Package {
        ecosystem: "PyPI",
        name: name.to_ascii_lowercase().replace(['_', '.'], "-"),
        version: exact(version),
    })
}

/// A version that names one release (`1.2.3`, `2026.8.31`, `1.0.0-beta.1`); tags and
/// ranges (`latest`, `^1`) do not.
fn exact(version: Option<&str>) -> Option<String> {
    let version = version?.trim();
    let valid = version.starts_with(|c: char| c.is_ascii_digit())
        && version.chars().all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c));
    valid.then(|| version.to_owned())
}

/// What OSV said of a package: its malicious-package advisories (none: it may start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) malicious: Vec<String>,
}

/// Answers kept for the life of the process, by OSV URL and package.
static KEPT: LazyLock<Mutex<HashMap<(String, Package), Verdict>>> = LazyLock::new(Mutex::default);

/// OSV URLs that could not be asked lately, with when and why: for a minute after a
/// failure servers start unchecked at once, instead of each start (and restart) waiting
/// for the same timeout again.
static UNREACHABLE: LazyLock<Mutex<HashMap<String, (std::time::Instant, String)>>> =
    LazyLock::new(Mutex::default);

/// How long OSV is taken as unreachable after a failure.
const UNREACHABLE_FOR: Duration = Duration::from_secs(60);

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    vulns: Vec<Advisory>,
}

#[derive(Deserialize)]
struct Advisory {
    id: String,
    #[serde(default)]
    summary: Option<String>,
}

/// Asks OSV at `url` about `package`; an error says why it could not be asked.
pub(crate) async fn check(url: &str, package: &Package) -> Result<Verdict, String> {
    let key = (url.to_owned(), package.clone());
    if let Some(verdict) = KEPT.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(verdict.clone());
    }
    if let Some((at, why)) = UNREACHABLE.lock().unwrap_or_else(|e| e.into_inner()).get(url)
        && at.elapsed() < UNREACHABLE_FOR
    {
        return Err(format!("{why} (less than a minute ago)"));
    }
    let asked = ask(url, package).await;
    let mut unreachable = UNREACHABLE.lock().unwrap_or_else(|e| e.into_inner());
    match &asked {
        Ok(verdict) => {
            unreachable.remove(url);
            KEPT.lock().unwrap_or_else(|e| e.into_inner()).insert(key, verdict.clone());
        }
        Err(why) => {
            unreachable.insert(url.to_owned(), (std::time::Instant::now(), why.clone()));
        }
    }
    asked
}

/// One `POST /v1/query` about `package`.
async fn ask(url: &str, package: &Package) -> Result<Verdict, String> {
    let mut query = json!({"package": {"name": package.name, "ecosystem": package.ecosystem}});
    if let Some(version) = &package.version {
        query["version"] = json!(version);
    }
    super::ensure_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(OSV_TIMEOUT)
        .redirect(reqwest::redirect::Policy::limited(3))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    // Named as errors name URLs, without what may be secret (a key in its query or user
    // information); reqwest's own messages name the whole URL.
    let shown = super::failure::shown_url(url);
    let endpoint = query_url(url).map_err(|e| format!("{shown} is no URL ({e})"))?;
    let response = client
        .post(endpoint.clone())
        .json(&query)
        .send()
        .await
        .map_err(|e| format!("{shown}: {}", super::connection::client_failure(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{shown} answered {status}"));
    }
    let answer: Answer = response.json().await.map_err(|e| {
        format!(
            "{shown} answered something that is not OSV's: {}",
            super::connection::client_failure(&e)
        )
    })?;
    let malicious = answer
        .vulns
        .into_iter()
        .filter(|v| v.id.starts_with("MAL-"))
        .map(|v| match v.summary.filter(|s| !s.trim().is_empty()) {
            Some(summary) => format!("{} ({})", v.id, summary.trim()),
            None => v.id,
        })
        .collect();
    Ok(Verdict { malicious })
}

/// OSV's query endpoint under `base`: `/v1/query` goes into the path, after the base's
/// own, and the base's query (a proxy's key, say) stays the query.
fn query_url(base: &str) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(base).map_err(|e| e.to_string())?;
    let path = format!("{}/v1/query", url.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_fragment(None);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(command: &str, args: &[&str]) -> Option<String> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        package_of(command, &args).map(|p| p.to_string())
    }

    /// OSV's URL may carry a key (in its user information, or a proxy's query): what
    /// could not be asked names it without.
    #[tokio::test]
    async fn a_failure_names_osv_without_its_credentials() {
        let app = axum::Router::new().route(
            "/v1/query",
            axum::routing::post(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down") }),
        );
        let osv = toolmux_test_support::loopback::Loopback::serve("osv-keyed", app);
        let package = Package { ecosystem: "npm", name: "keyed-mcp".to_owned(), version: None };
        let url = format!("http://user:s3cret-token@{}", osv.addr);
        let why = ask(&url, &package).await.expect_err("OSV answered 503");
        assert!(why.contains("answered 503") && !why.contains("s3cret-token"), "{why}");

        let closed = format!("http://user:s3cret-token@127.0.0.1:{}", free_port());
        let why = ask(&closed, &package).await.expect_err("nothing listens");
        assert!(why.contains("cannot reach the server") && !why.contains("s3cret-token"), "{why}");
    }

    /// A key in OSV's query (a proxy's) stays the query: `/v1/query` goes into the path,
    /// where it was appended to the query and the proxy refused what it could not route.
    #[tokio::test]
    async fn a_key_in_osvs_query_stays_its_query() {
        let app = axum::Router::new().route(
            "/proxy/v1/query",
            axum::routing::post(|query: axum::extract::RawQuery| async move {
                if query.0.as_deref() == Some("key=k") {
                    (axum::http::StatusCode::OK, r#"{"vulns": []}"#)
                } else {
                    (axum::http::StatusCode::FORBIDDEN, "no key")
                }
            }),
        );
        let osv = toolmux_test_support::loopback::Loopback::serve("osv-proxy", app);
        let package = Package { ecosystem: "npm", name: "keyed-mcp".to_owned(), version: None };
        for base in ["/proxy?key=k", "/proxy/?key=k#part"] {
            let url = format!("http://{}{base}", osv.addr);
            let verdict = ask(&url, &package).await.expect("the proxy answered");
            assert!(verdict.malicious.is_empty(), "{base}");
        }
        let why = ask("not a url?key=s3cret", &package).await.expect_err("no URL");
        assert!(why.contains("is no URL") && !why.contains("s3cret"), "{why}");
    }

    fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("bound").port()
    }

    #[test]
    fn runners_name_their_packages() {
        let cases: &[(&str, &[&str], Option<&str>)] = &[
            (
                "npx",
                &["-y", "@modelcontextprotocol/server-everything@2026.8.31", "stdio"],
                Some("npm @modelcontextprotocol/server-everything@2026.8.31"),
            ),
            ("/usr/bin/npx", &["--yes", "server-x"], Some("npm server-x")),
            ("npx", &["-y", "server-x@latest"], Some("npm server-x")),
            ("npx", &["-p", "pkg-a@1.0.0", "run-it"], Some("npm pkg-a@1.0.0")),
            ("npx", &["--package=@s/p", "bin"], Some("npm @s/p")),
            ("npx", &["-c", "echo hi"], None),
            ("npx", &["./local/path"], None),
            ("npx", &["github:user/repo"], None),
            ("bunx", &["mcp-thing@0.3.1"], Some("npm mcp-thing@0.3.1")),
            ("pnpm", &["dlx", "mcp-thing"], Some("npm mcp-thing")),
            ("pnpm", &["install"], None),
            ("uvx", &["mcp-server-fetch"], Some("PyPI mcp-server-fetch")),
            (
                "uvx",
                &["--python", "3.12", "mcp-server-time==2026.10.19"],
                Some("PyPI mcp-server-time@2026.10.19"),
            ),
            (
                "uvx",
                &["--from", "Mcp_Server.Git[cli]@1.2", "mcp-server-git"],
                Some("PyPI mcp-server-git@1.2"),
            ),
            ("uv", &["tool", "run", "ruff@0.6.0"], Some("PyPI ruff@0.6.0")),
            ("uvx", &["pkg>=1"], None),
            ("pipx", &["run", "--spec", "black==24.1.0", "black"], Some("PyPI black@24.1.0")),
            ("node", &["server.js"], None),
            ("python", &["-m", "server"], None),
        ];
        for (command, args, expected) in cases {
            assert_eq!(of(command, args).as_deref(), *expected, "{command} {args:?}");
        }
    }
}
