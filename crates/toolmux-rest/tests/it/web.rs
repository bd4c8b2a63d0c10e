//! The web tools against real HTTP servers on loopback: pages as Markdown, paging, the
//! address policy (loopback refused unless allowed, redirects checked), and Tavily's
//! search API as a fake speaking its protocol.

use crate::common::{Reply, SeenRequest, keeping_server, serve};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolError, ToolOutput, ToolProvider};
use toolmux_rest::{WebConfig, WebProvider};

fn provider(config: Value) -> WebProvider {
    let config: WebConfig = serde_json::from_value(config).expect("a web section");
    WebProvider::new(&config).expect("a provider")
}

async fn call(web: &WebProvider, tool: &str, args: Value) -> Result<ToolOutput, ToolError> {
    web.call(tool, args, &CallContext::new()).await
}

fn html(body: &str) -> Reply {
    Reply {
        status: 200,
        headers: vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
        chunks: vec![(0, body.as_bytes().to_vec())],
    }
}

fn text(status: u16, content_type: &str, body: &[u8]) -> Reply {
    Reply {
        status,
        headers: vec![("Content-Type".into(), content_type.into())],
        chunks: vec![(0, body.to_vec())],
    }
}

const PAGE: &str = "<!doctype html><html><head><title>Release notes</title>\
<script>track()</script></head><body><nav><a href=\"/\">Home</a></nav><main>\
<h1>Version 2</h1><p>Adds <a href=\"/docs/patch\">patches</a> and <b>traces</b>.</p>\
</main><footer>© us</footer></body></html>";

#[tokio::test]
async fn a_page_comes_back_as_markdown_with_links_resolved() {
    let base = serve(|_| html(PAGE)).await;
    let web = provider(json!({"fetch": {"allowPrivate": true}}));
    let out = call(&web, "fetch", json!({"url": format!("{base}/notes")})).await.expect("fetched");
    let text = out.to_text();
    assert!(text.starts_with(&format!("Contents of {base}/notes:\n\n# Release notes")), "{text}");
    assert!(text.contains("Version 2"), "{text}");
    assert!(text.contains(&format!("[patches]({base}/docs/patch)")), "{text}");
    assert!(!text.contains("track()") && !text.contains("Home"), "{text}");
    assert_eq!(out.extras["truncated"], false);
    let raw = call(&web, "fetch", json!({"url": format!("{base}/notes"), "raw": true}))
        .await
        .expect("fetched")
        .to_text();
    assert!(raw.contains("<script>track()</script>"), "{raw}");
}

#[tokio::test]
async fn long_content_comes_in_pages() {
    let body: String = (0..100).map(|i| format!("line {i:03}\n")).collect();
    let base = serve(move |_| text(200, "text/plain", body.as_bytes())).await;
    let web = provider(json!({"fetch": {"allowPrivate": true, "maxLength": 100}}));
    let url = format!("{base}/log.txt");
    let first = call(&web, "fetch", json!({"url": url})).await.expect("fetched");
    let shown = first.to_text();
    assert!(shown.contains("line 000") && !shown.contains("line 011"), "{shown}");
    assert!(
        shown.ends_with("[characters 1-100 of 900; call again with start_index=100 to read on]"),
        "{shown}"
    );
    assert_eq!(first.extras["nextStartIndex"], 100);
    let last = call(&web, "fetch", json!({"url": url, "start_index": 850, "max_length": 500}))
        .await
        .expect("fetched")
        .to_text();
    assert!(
        last.contains("line 099") && last.ends_with("[characters 851-900 of 900: the end]"),
        "{last}"
    );
    let past = call(&web, "fetch", json!({"url": url, "start_index": 900})).await.unwrap_err();
    assert!(
        past.report().contains("`start_index` 900 is past the end: the content has 900 characters"),
        "{}",
        past.report()
    );
}

/// A server of [`PAGE`] on loopback counting its requests: the count, its URL and its port.
async fn counting_page() -> (Arc<Mutex<usize>>, String, String) {
    let seen = Arc::new(Mutex::new(0));
    let counter = seen.clone();
    let base = serve(move |_| {
        *counter.lock().expect("not poisoned") += 1;
        html(PAGE)
    })
    .await;
    let port = base.rsplit(':').next().expect("a port").to_owned();
    (seen, base, port)
}

#[tokio::test]
async fn loopback_and_private_addresses_are_refused_unless_allowed() {
    let (seen, base, port) = counting_page().await;
    let web = provider(json!({}));
    for url in [
        format!("{base}/"),
        format!("http://localhost:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.0.0.1/".to_owned(),
    ] {
        let error = call(&web, "fetch", json!({"url": url})).await.unwrap_err();
        assert!(matches!(error, ToolError::Denied { .. }), "{url}: {error:?}");
        assert!(error.report().contains("`web.fetch.allowPrivate`"), "{url}: {}", error.report());
    }
    for url in ["file:///etc/passwd", "ftp://example.com/x", "not a url"] {
        let error = call(&web, "fetch", json!({"url": url})).await.unwrap_err();
        assert!(!error.report().is_empty(), "{url}");
    }
    assert_eq!(*seen.lock().unwrap(), 0, "a refused fetch reached the server");
}

#[tokio::test]
async fn every_redirect_is_checked_again() {
    let base_cell: Arc<Mutex<String>> = Arc::default();
    let cell = base_cell.clone();
    let base = serve(move |request: SeenRequest| {
        let base = cell.lock().unwrap().clone();
        let port = base.rsplit(':').next().unwrap_or_default().to_owned();
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/moved" => Reply {
                status: 301,
                headers: vec![("Location".into(), "/notes".into())],
                chunks: Vec::new(),
            },
            "/away" => Reply {
                status: 302,
                headers: vec![("Location".into(), format!("http://localhost:{port}/notes"))],
                chunks: Vec::new(),
            },
            _ => html(PAGE),
        }
    })
    .await;
    *base_cell.lock().unwrap() = base.clone();
    let web = provider(json!({"fetch": {"allowPrivate": true, "allowedHosts": ["127.0.0.1"]}}));
    let moved =
        call(&web, "fetch", json!({"url": format!("{base}/moved")})).await.expect("followed");
    assert!(
        moved
            .to_text()
            .starts_with(&format!("Contents of {base}/notes (redirected from {base}/moved):")),
        "{}",
        moved.to_text()
    );
    let away = call(&web, "fetch", json!({"url": format!("{base}/away")})).await.unwrap_err();
    let report = away.report();
    assert!(matches!(away, ToolError::Denied { .. }), "{report}");
    assert!(report.contains("a redirect to http://localhost:"), "{report}");
    assert!(
        report.contains("host `localhost` is not in `web.fetch.allowedHosts` (127.0.0.1)"),
        "{report}"
    );
}

/// An address in `deniedHosts` is refused where a host name resolves to it, not only where
/// it is written: `localhost` with loopback denied (and `allowPrivate` on) was fetched, and
/// so was a redirect to it.
#[tokio::test]
async fn a_name_resolving_to_a_denied_address_is_refused() {
    let (seen, base, port) = counting_page().await;
    let denied = json!({"fetch": {"allowPrivate": true, "deniedHosts": ["127.0.0.1", "[::1]"]}});
    let web = provider(denied);
    for url in [format!("http://localhost:{port}/"), format!("{base}/")] {
        let error = call(&web, "fetch", json!({"url": url})).await.unwrap_err();
        let report = error.report();
        assert!(matches!(error, ToolError::Denied { .. }), "{url}: {report}");
        assert!(report.contains("`web.fetch.deniedHosts`"), "{url}: {report}");
    }
    assert_eq!(*seen.lock().unwrap(), 0, "a denied address was reached");
    // A redirect from an address that is not denied (127.0.0.2, loopback too) to the name.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.expect("127.0.0.2");
    let from = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut head = [0u8; 4096];
            let _ = socket.read(&mut head).await;
            let reply = format!(
                "HTTP/1.1 302 Found\r\nLocation: http://localhost:{port}/notes\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        }
    });
    let web = provider(json!({"fetch": {
        "allowPrivate": true, "deniedHosts": ["127.0.0.1", "::1"], "robotsTxt": false
    }}));
    let error =
        call(&web, "fetch", json!({"url": format!("http://{from}/away")})).await.unwrap_err();
    let report = error.report();
    assert!(matches!(error, ToolError::Denied { .. }), "{report}");
    assert!(report.contains("`localhost` resolves to 127.0.0.1"), "{report}");
    assert_eq!(*seen.lock().unwrap(), 0, "a redirect reached a denied address");
}

#[tokio::test]
async fn errors_binary_content_and_oversized_bodies_are_said_plainly() {
    let base = serve(|request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/missing" => html("<html><body><h1>Not here</h1></body></html>").with_status(404),
            "/logo.png" => text(200, "image/png", b"\x89PNG\r\n\x1a\n\0\0\0"),
            _ => text(200, "text/plain", &[b'x'; 1000]),
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true, "maxBytes": 100}}));
    let missing = call(&web, "fetch", json!({"url": format!("{base}/missing")})).await.unwrap_err();
    assert!(missing.report().contains("answered 404"), "{}", missing.report());
    assert!(missing.report().contains("Not here"), "{}", missing.report());
    let png = call(&web, "fetch", json!({"url": format!("{base}/logo.png")})).await.unwrap_err();
    assert!(png.report().contains("is image/png"), "{}", png.report());
    assert!(png.report().contains("not a web page or text"), "{}", png.report());
    let big = call(&web, "fetch", json!({"url": format!("{base}/big")})).await.expect("cut");
    let shown = big.to_text();
    assert!(shown.contains(&"x".repeat(100)) && !shown.contains(&"x".repeat(101)), "{shown}");
    assert!(
        shown.contains("longer than `web.fetch.maxBytes` (100 bytes) and was cut there"),
        "{shown}"
    );
}

/// An error page's excerpt has the provider's secrets redacted before it is cut to 600
/// characters: cut first, the head of a secret standing across the cut went out as it was.
#[tokio::test]
async fn an_error_pages_excerpt_is_redacted_before_it_is_cut() {
    let secret = "sk-live-0123456789abcdefghijklmnopqrstuv";
    let page = format!("{}{secret} and more", "x".repeat(590));
    let base = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(404, "text/plain", b""),
            _ => text(500, "text/plain", page.as_bytes()),
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true}})).with_secrets([secret]);
    let error = call(&web, "fetch", json!({"url": format!("{base}/boom")})).await.unwrap_err();
    let report = error.report();
    assert!(report.contains(&format!("{}REDACTED", "x".repeat(590))), "{report}");
    assert!(!report.contains(&secret[..8]), "{report}");
}

trait WithStatus {
    fn with_status(self, status: u16) -> Reply;
}

impl WithStatus for Reply {
    fn with_status(mut self, status: u16) -> Reply {
        self.status = status;
        self
    }
}

#[tokio::test]
async fn search_speaks_tavilys_api_and_keeps_the_key_out_of_errors() {
    let seen: Arc<Mutex<Vec<SeenRequest>>> = Arc::default();
    let log = seen.clone();
    let base = serve(move |request: SeenRequest| {
        log.lock().unwrap().push(request.clone());
        if request.header("authorization").as_deref() != Some("Bearer tvly-test-key-123") {
            return Reply::json(401, json!({"detail": {"error": "Unauthorized: missing or invalid API key."}}));
        }
        Reply::json(
            200,
            json!({
                "query": "rust mcp gateway",
                "answer": "Several exist.",
                "results": [
                    {"title": "toolmux", "url": "https://example.com/toolmux", "content": "One tool plane\nfor agents.", "score": 0.9},
                    {"title": "Other", "url": "https://example.org/other", "content": "Another one.", "score": 0.5, "published_date": "2026-11-01"}
                ],
                "response_time": 0.4
            }),
        )
    })
    .await;
    let web = provider(
        json!({"fetch": {"enabled": false}, "search": {"apiKey": "tvly-test-key-123", "url": base}}),
    );
    let names: Vec<String> = web.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["search"]);
    let out = call(
        &web,
        "search",
        json!({"query": "rust mcp gateway", "max_results": 2, "topic": "news", "include_domains": ["example.com"]}),
    )
    .await
    .expect("searched");
    let text = out.to_text();
    assert_eq!(
        text,
        "Answer: Several exist.\n\n1. toolmux\n   https://example.com/toolmux\n   One tool plane for agents.\n\n\
         2. Other (2026-11-01)\n   https://example.org/other\n   Another one."
    );
    let request = seen.lock().unwrap()[0].clone();
    assert!(request.request_line().starts_with("POST /search "), "{}", request.head);
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["query"], "rust mcp gateway");
    assert_eq!(body["max_results"], 2);
    assert_eq!(body["topic"], "news");
    assert_eq!(body["include_domains"], json!(["example.com"]));

    let wrong = provider(json!({"search": {"apiKey": "tvly-wrong-key-456", "url": base}}));
    let error = call(&wrong, "search", json!({"query": "x"})).await.unwrap_err().report();
    assert!(error.contains("401") && error.contains("check `web.search.apiKey`"), "{error}");
    assert!(!error.contains("tvly-wrong-key-456"), "{error}");
    assert!(!format!("{wrong:?}").contains("tvly-wrong-key-456"));
}

/// What the search API echoes of the key (or of another secret the provider was given)
/// is redacted from the results and from an error, before either is cut; an answer longer
/// than 4 MiB is not read on (it was read whole, then cut and failed as not JSON).
#[tokio::test]
async fn search_results_and_errors_are_redacted_and_answers_capped() {
    let key = "tvly-echoed-key-0123456789";
    let other = "sk-other-secret-abcdef";
    let base = serve(move |request: SeenRequest| {
        let query: Value = serde_json::from_slice(&request.body).unwrap_or_default();
        match query["query"].as_str().unwrap_or_default() {
            "refused" => {
                Reply::json(400, json!({"detail": format!("{}bad key {key}", "x".repeat(370))}))
            }
            "huge" => {
                let mut reply = Reply::json(200, json!({}));
                reply.chunks = vec![(0, br#"{"results": [{"content": ""#.to_vec())];
                reply.chunks.extend((0..80).map(|_| (0, vec![b'x'; 64 * 1024])));
                reply.chunks.push((0, br#""}]}"#.to_vec()));
                reply
            }
            _ => Reply::json(
                200,
                json!({
                    "answer": format!("The key is {key}."),
                    "results": [{
                        "title": format!("About {other}"),
                        "url": format!("https://example.com/?key={key}"),
                        "content": format!("{}{key}", "y ".repeat(595)),
                    }]
                }),
            ),
        }
    })
    .await;
    let web =
        provider(json!({"fetch": {"enabled": false}, "search": {"apiKey": key, "url": base}}))
            .with_secrets([other]);
    let out = call(&web, "search", json!({"query": "echo"})).await.expect("searched");
    let text = serde_json::to_string(&out).unwrap();
    assert!(text.contains("The key is REDACTED.") && text.contains("About REDACTED"), "{text}");
    assert!(text.contains("y y REDACTED"), "the excerpt was cut before it was redacted: {text}");
    assert!(!text.contains("tvly-echo") && !text.contains("sk-other"), "{text}");
    let refused = call(&web, "search", json!({"query": "refused"})).await.unwrap_err().report();
    assert!(refused.contains("bad key REDACTED"), "{refused}");
    assert!(!refused.contains("tvly-echo"), "{refused}");
    let huge = call(&web, "search", json!({"query": "huge"})).await.unwrap_err().report();
    assert!(huge.contains("the search API's answer is longer than 4 MiB"), "{huge}");
}

/// A search that cannot connect says why (reqwest's own message only says a request
/// failed); one the search API never answers ends at the call's deadline, well before the
/// 30 s `timeoutMs`, as the tool's timeout.
#[tokio::test]
async fn search_errors_say_why_and_the_calls_deadline_holds() {
    let closed = provider(json!({"search": {"apiKey": "k", "url": "http://127.0.0.1:9"}}));
    let error = call(&closed, "search", json!({"query": "x"})).await.unwrap_err().report();
    assert!(error.to_lowercase().contains("connection refused"), "{error}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let stalling = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let web = provider(json!({"search": {"apiKey": "k", "url": format!("http://{address}")}}));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
    let ctx = CallContext::new().with_deadline(deadline);
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        web.call("search", json!({"query": "x"}), &ctx),
    )
    .await
    .expect("the search ends at the call's deadline, not at its own 30 s timeout");
    match result {
        Err(ToolError::Timeout { tool, after, .. }) => {
            assert_eq!(tool, "web__search");
            assert!(after <= std::time::Duration::from_millis(300), "{after:?}");
        }
        other => panic!("expected the tool's timeout, got {other:?}"),
    }
    stalling.abort();
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let bad = |config: Value| {
        let config: WebConfig = serde_json::from_value(config).expect("parses");
        WebProvider::new(&config).expect_err("refused")
    };
    assert!(
        bad(json!({"fetch": {"allowedHosts": ["http://example.com"]}})).contains("not a host name")
    );
    assert!(bad(json!({"search": {"apiKey": ""}})).contains("apiKey is empty"));
    assert!(
        bad(json!({"search": {"apiKey": "k", "url": "ftp://x"}}))
            .contains("not an http or https URL")
    );
    let unknown = serde_json::from_value::<WebConfig>(json!({"fetch": {"allowPrivat": true}}));
    assert!(unknown.unwrap_err().to_string().contains("allowPrivat"));
}

/// Each hop of a redirect chain is asked of its site's robots.txt before it is requested:
/// a chain through a disallowed page is refused without that page being fetched, even
/// when the chain ends on an allowed one.
#[tokio::test]
async fn a_redirect_through_a_disallowed_page_does_not_fetch_it() {
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = asked.clone();
    let base = serve(move |request: SeenRequest| {
        let path = request.request_line().split(' ').nth(1).unwrap_or_default().to_owned();
        log.lock().unwrap().push(path.clone());
        let to = |location: &str| Reply {
            status: 302,
            headers: vec![("Location".into(), location.into())],
            chunks: Vec::new(),
        };
        match path.as_str() {
            "/robots.txt" => text(200, "text/plain", b"User-agent: *\nDisallow: /private/\n"),
            "/start" => to("/private/hop"),
            "/private/hop" => to("/public/end"),
            _ => html(PAGE),
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true}}));
    let refused = call(&web, "fetch", json!({"url": format!("{base}/start")})).await.unwrap_err();
    assert!(matches!(refused, ToolError::Denied { .. }), "{}", refused.report());
    assert!(
        refused.report().contains(&format!(
            "{base}/robots.txt disallows {base}/private/hop for `toolmux` (`Disallow: /private/`)"
        )),
        "{}",
        refused.report()
    );
    assert_eq!(*asked.lock().unwrap(), ["/robots.txt", "/start"], "the hop was not requested");
}

/// robots.txt is obeyed: a path it disallows for `toolmux` is refused with the rule, one it
/// allows is read; the file is read once for many fetches; a failing one (5xx) allows
/// nothing, a missing one everything; a redirect to another site asks that site's too;
/// `robotsTxt: false` reads anyway.
#[tokio::test]
async fn robots_txt_is_obeyed() {
    let robots_reads = Arc::new(Mutex::new(0));
    let reads = robots_reads.clone();
    let other = serve(|request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(200, "text/plain", b"User-agent: *\nDisallow: /\n"),
            _ => html(PAGE),
        }
    })
    .await;
    let other_page = format!("{other}/notes");
    let base = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => {
                *reads.lock().unwrap() += 1;
                text(
                    200,
                    "text/plain",
                    b"User-agent: *\nDisallow: /\n\nUser-agent: toolmux\nDisallow: /private/\n",
                )
            }
            "/elsewhere" => Reply {
                status: 302,
                headers: vec![("Location".into(), other_page.clone())],
                chunks: Vec::new(),
            },
            "/open" => Reply {
                status: 302,
                headers: vec![("Location".into(), "/private/plans".into())],
                chunks: Vec::new(),
            },
            _ => html(PAGE),
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true}}));
    let page = call(&web, "fetch", json!({"url": format!("{base}/notes")})).await;
    assert!(page.expect("allowed for toolmux").to_text().contains("Version 2"));
    let refused =
        call(&web, "fetch", json!({"url": format!("{base}/private/plans")})).await.unwrap_err();
    let report = refused.report();
    assert!(matches!(refused, ToolError::Denied { .. }), "{report}");
    assert!(
        report.contains(&format!(
            "{base}/robots.txt disallows {base}/private/plans for `toolmux` (`Disallow: /private/`)"
        )) && report.contains("`web.fetch.robotsTxt: false`"),
        "{report}"
    );
    let moved = call(&web, "fetch", json!({"url": format!("{base}/elsewhere")})).await.unwrap_err();
    assert!(
        moved.report().contains(&format!("{other}/robots.txt disallows")),
        "{}",
        moved.report()
    );
    // A redirect on the same site to a disallowed page is refused as well.
    let inward = call(&web, "fetch", json!({"url": format!("{base}/open")})).await.unwrap_err();
    assert!(matches!(inward, ToolError::Denied { .. }), "{}", inward.report());
    assert!(
        inward.report().contains(&format!(
            "{base}/robots.txt disallows {base}/private/plans for `toolmux` (`Disallow: /private/`)"
        )),
        "{}",
        inward.report()
    );
    assert_eq!(*robots_reads.lock().unwrap(), 1, "robots.txt is read once a site");

    let anyway = provider(json!({"fetch": {"allowPrivate": true, "robotsTxt": false}}));
    let page = call(&anyway, "fetch", json!({"url": format!("{base}/private/plans")})).await;
    assert!(page.expect("read anyway").to_text().contains("Version 2"));
    assert_eq!(*robots_reads.lock().unwrap(), 1, "not even asked");

    let failing = serve(|request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(503, "text/plain", b"down"),
            _ => html(PAGE),
        }
    })
    .await;
    let error = call(&web, "fetch", json!({"url": format!("{failing}/notes")})).await.unwrap_err();
    assert!(
        error.report().contains(
            "/robots.txt answered 503 Service Unavailable; a site whose robots.txt fails"
        ),
        "{}",
        error.report()
    );
    let missing = serve(|request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(404, "text/plain", b"no such file"),
            _ => html(PAGE),
        }
    })
    .await;
    let page = call(&web, "fetch", json!({"url": format!("{missing}/notes")})).await;
    assert!(page.expect("no robots.txt: allowed").to_text().contains("Version 2"));

    // A robots.txt redirected where the fetch may not go counts as unavailable: allowed.
    let elsewhere = serve(|request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => Reply {
                status: 302,
                headers: vec![("Location".into(), "http://localhost:9/robots.txt".into())],
                chunks: Vec::new(),
            },
            _ => html(PAGE),
        }
    })
    .await;
    let only = provider(json!({"fetch": {"allowPrivate": true, "allowedHosts": ["127.0.0.1"]}}));
    let page = call(&only, "fetch", json!({"url": format!("{elsewhere}/notes")})).await;
    assert!(page.expect("robots.txt unavailable: allowed").to_text().contains("Version 2"));
}

/// A site's `Crawl-delay` paces fetches from it: concurrent fetches reach it that far apart
/// (the agent's own group before `*`'s), and a turn further off than the call may wait is a
/// rate-limit error saying when to call again, not a hang.
#[tokio::test]
async fn crawl_delay_paces_fetches_per_site() {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let base = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(
                200,
                "text/plain",
                b"User-agent: *\nCrawl-delay: 20\n\nUser-agent: toolmux\nCrawl-delay: 0.3\n",
            ),
            _ => {
                seen.lock().unwrap().push(std::time::Instant::now());
                html(PAGE)
            }
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true}}));
    let fetches = (0..3).map(|i| call(&web, "fetch", json!({"url": format!("{base}/p{i}")})));
    for page in futures::future::join_all(fetches).await {
        assert!(page.expect("fetched in turn").to_text().contains("Version 2"));
    }
    let mut at = arrivals.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), 3);
    for pair in at.windows(2) {
        let apart = pair[1] - pair[0];
        assert!(apart >= std::time::Duration::from_millis(290), "only {apart:?} apart");
    }

    // Another agent falls under `*`: 20 s apart, more than half of a 4 s call may wait.
    let other = provider(json!({"fetch": {"allowPrivate": true, "timeoutMs": 4000,
        "userAgent": "otherbot/1.0"}}));
    let first = call(&other, "fetch", json!({"url": format!("{base}/a")})).await;
    assert!(first.expect("the first fetch waits for nothing").to_text().contains("Version 2"));
    let error = call(&other, "fetch", json!({"url": format!("{base}/b")})).await.unwrap_err();
    let ToolError::RateLimited { retry_after, .. } = &error else {
        panic!("not a rate limit: {}", error.report())
    };
    assert!(*retry_after > std::time::Duration::from_secs(18), "{retry_after:?}");
    assert!(
        error.report().contains(&format!(
            "is rate limited ({base} asks for 20s between fetches in its robots.txt \
             (`Crawl-delay`)): call it again in"
        )),
        "{}",
        error.report()
    );
    // Without robots.txt nothing is paced.
    let anyway = provider(json!({"fetch": {"allowPrivate": true, "robotsTxt": false}}));
    for path in ["c", "d"] {
        let page = call(&anyway, "fetch", json!({"url": format!("{base}/{path}")})).await;
        assert!(page.expect("not paced").to_text().contains("Version 2"));
    }
}

/// A redirect hop sends the same headers whether robots.txt is obeyed (each hop is then
/// asked of its site's robots.txt and requested on its own) or not: the page it was
/// redirected from as `Referer`, without that URL's user info and fragment. With
/// robotsTxt on, the hop carried no `Referer`.
#[tokio::test]
async fn a_redirect_hop_sends_the_same_headers_with_robots_txt_on_or_off() {
    let (end, seen) = keeping_server().await;
    let to = format!("{end}/landed");
    let start = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(404, "text/plain", b""),
            _ => Reply {
                status: 302,
                headers: vec![("Location".into(), to.clone())],
                chunks: Vec::new(),
            },
        }
    })
    .await;
    let from = start.replacen("http://", "http://reader:secret@", 1);
    let mut hops = Vec::new();
    for robots in [false, true] {
        seen.lock().unwrap().clear();
        let web = provider(json!({"fetch": {"allowPrivate": true, "robotsTxt": robots}}));
        let url = format!("{from}/from?q=1#part");
        call(&web, "fetch", json!({"url": url})).await.expect("followed");
        let hop = seen
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.request_line().starts_with("GET /landed "))
            .cloned()
            .expect("the hop was requested");
        let referer = hop.header("referer");
        assert_eq!(referer, Some(format!("{start}/from?q=1")), "robotsTxt: {robots}");
        let mut names: Vec<String> = hop
            .head
            .lines()
            .skip(1)
            .filter_map(|line| Some(line.split_once(':')?.0.to_ascii_lowercase()))
            .collect();
        names.sort();
        assert!(!names.contains(&"authorization".to_owned()), "robotsTxt: {robots}: {names:?}");
        hops.push(names);
    }
    assert_eq!(hops[0], hops[1], "the hop's headers without and with robots.txt");
}

/// A 300 (Multiple Choices) with a `Location` is an answer, not a redirect, with robotsTxt
/// on as off: reqwest does not follow it, and the hop-by-hop following did.
#[tokio::test]
async fn a_multiple_choices_answer_is_not_followed_with_robots_txt_on_or_off() {
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = asked.clone();
    let base = serve(move |request: SeenRequest| {
        let path = request.request_line().split(' ').nth(1).unwrap_or_default().to_owned();
        log.lock().unwrap().push(path.clone());
        match path.as_str() {
            "/robots.txt" => text(404, "text/plain", b""),
            "/choices" => Reply {
                status: 300,
                headers: vec![
                    ("Location".into(), "/landed".into()),
                    ("Content-Type".into(), "text/plain".into()),
                ],
                chunks: vec![(0, b"pick one: /landed or /other".to_vec())],
            },
            _ => html(PAGE),
        }
    })
    .await;
    for robots in [false, true] {
        asked.lock().unwrap().clear();
        let web = provider(json!({"fetch": {"allowPrivate": true, "robotsTxt": robots}}));
        let out = call(&web, "fetch", json!({"url": format!("{base}/choices")})).await;
        let text = out.expect("the answer").to_text();
        assert!(text.ends_with("pick one: /landed or /other"), "robotsTxt: {robots}: {text}");
        assert!(!asked.lock().unwrap().contains(&"/landed".to_owned()), "robotsTxt: {robots}");
    }
}

/// A redirect chain bouncing between two sites ends after `maxRedirects` hops, with
/// robotsTxt on (hop by hop) as off (reqwest following), each site's robots.txt read once.
#[tokio::test]
async fn a_redirect_loop_between_two_sites_ends_at_the_hop_limit() {
    let asked = Arc::new(Mutex::new(Vec::<String>::new()));
    let (a_cell, b_cell): (Arc<Mutex<String>>, Arc<Mutex<String>>) = Default::default();
    let bouncer = |other: Arc<Mutex<String>>, log: Arc<Mutex<Vec<String>>>| {
        move |request: SeenRequest| {
            let path = request.request_line().split(' ').nth(1).unwrap_or_default().to_owned();
            let to = other.lock().unwrap().clone();
            log.lock().unwrap().push(format!("{to} {path}"));
            match path.as_str() {
                "/robots.txt" => text(404, "text/plain", b""),
                _ => Reply {
                    status: 302,
                    headers: vec![("Location".into(), format!("{to}/bounce"))],
                    chunks: Vec::new(),
                },
            }
        }
    };
    let a = serve(bouncer(b_cell.clone(), asked.clone())).await;
    let b = serve(bouncer(a_cell.clone(), asked.clone())).await;
    *a_cell.lock().unwrap() = a.clone();
    *b_cell.lock().unwrap() = b.clone();
    for robots in [false, true] {
        asked.lock().unwrap().clear();
        let web = provider(json!({"fetch": {
            "allowPrivate": true, "maxRedirects": 3, "robotsTxt": robots
        }}));
        let error = call(&web, "fetch", json!({"url": format!("{a}/start")})).await.unwrap_err();
        let report = error.report();
        assert!(report.contains("more than 3 redirects"), "robotsTxt: {robots}: {report}");
        let asked = asked.lock().unwrap().clone();
        let pages = asked.iter().filter(|line| !line.ends_with("/robots.txt")).count();
        let robots_reads = asked.len() - pages;
        // The first request and three hops; the fourth redirect is not followed.
        assert_eq!(pages, 4, "robotsTxt: {robots}: {asked:?}");
        assert_eq!(robots_reads, if robots { 2 } else { 0 }, "robotsTxt: {robots}: {asked:?}");
    }
}

/// A redirect to a site that sets a `Crawl-delay` takes that site's turn as a fetch of it
/// does: the hop was requested at once, however lately the site had been fetched.
#[tokio::test]
async fn a_redirect_hop_waits_for_its_sites_crawl_delay() {
    let pages = Arc::new(Mutex::new(0));
    let counted = pages.clone();
    let paced = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(200, "text/plain", b"User-agent: *\nCrawl-delay: 20\n"),
            _ => {
                *counted.lock().unwrap() += 1;
                html(PAGE)
            }
        }
    })
    .await;
    let to = format!("{paced}/page");
    let redirecting = serve(move |request: SeenRequest| {
        match request.request_line().split(' ').nth(1).unwrap_or_default() {
            "/robots.txt" => text(404, "text/plain", b""),
            _ => Reply {
                status: 302,
                headers: vec![("Location".into(), to.clone())],
                chunks: Vec::new(),
            },
        }
    })
    .await;
    let web = provider(json!({"fetch": {"allowPrivate": true, "timeoutMs": 4000}}));
    let first = call(&web, "fetch", json!({"url": format!("{paced}/page")})).await;
    assert!(first.expect("the first fetch waits for nothing").to_text().contains("Version 2"));
    let error = call(&web, "fetch", json!({"url": format!("{redirecting}/go")})).await.unwrap_err();
    let ToolError::RateLimited { retry_after, .. } = &error else {
        panic!("not a rate limit: {}", error.report())
    };
    assert!(*retry_after > std::time::Duration::from_secs(18), "{retry_after:?}");
    assert!(
        error.report().contains(&format!("{paced} asks for 20s between fetches")),
        "{}",
        error.report()
    );
    assert_eq!(*pages.lock().unwrap(), 1, "the hop was requested before its turn");
}
