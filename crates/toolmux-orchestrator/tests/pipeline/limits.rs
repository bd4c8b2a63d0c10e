//! Run budget, size cap (spill and truncate), context-token budget, retries, redaction.

use crate::{call, start};
use expect_test::expect;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{
    CallContext, ContentPart, ToolCall, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};
use toolmux_orchestrator::{
    MAX_HINTED_RESPONSE_BYTES, Orchestrator, OrchestratorConfig, OversizeMode, RetryPolicy,
    RunBudgetConfig, ToolEvent, ToolSettings,
};
use toolmux_test_support::mock::{Behavior, MockProvider};

#[tokio::test(start_paused = true)]
async fn run_budget_limits_calls_per_run() {
    let p = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Echo));
    let config = OrchestratorConfig::default()
        .with_run_budget(RunBudgetConfig { max_calls: Some(2), max_tool_time: None });
    let o = start(config, vec![p.clone()]).await;
    let run = CallContext::new().with_run_id("r1");
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
    let r = o.execute(ToolCall::new("m__t", json!({})), &run).await;
    expect![
        "(tool failed: run budget exhausted before `m__t`: the run may make at most 2 tool calls)"
    ]
    .assert_eq(&r.conversation_text());
    let other = CallContext::new().with_run_id("r2");
    assert!(o.execute(ToolCall::new("m__t", json!({})), &other).await.ok, "budgets are per run");
    assert_eq!(o.run_flags("r1").calls, 2);
    assert_eq!(p.total_calls(), 3);
    // The caller's own bookkeeping (a listener's polls) is neither counted nor refused.
    let polls = run.clone().outside_budget();
    assert!(o.execute(ToolCall::new("m__t", json!({})), &polls).await.ok);
    assert_eq!(o.run_flags("r1").calls, 2);
}

/// The run's calls are those that reached a provider (`RunFlags::calls`): a call refused
/// by a rate limit or a busy queue, or cancelled while it waited for a slot, spends none of
/// the run's budget.
#[tokio::test(start_paused = true)]
async fn calls_that_never_reach_their_tool_spend_no_run_budget() {
    use toolmux_orchestrator::{QueueConfig, RateLimit};
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("t", Behavior::Echo)
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let mut config = OrchestratorConfig::default()
        .with_run_budget(RunBudgetConfig { max_calls: Some(2), max_tool_time: None })
        .with_queue("q", QueueConfig::new(1).with_wait_timeout(Duration::from_secs(1)))
        .with_tool_settings("m__slow", ToolSettings::default().with_queue("q"));
    config.tools.insert(
        "m__t".into(),
        ToolSettings {
            rate_limit: Some(RateLimit {
                calls: 1,
                per: Duration::from_secs(60),
                wait: Duration::ZERO,
            }),
            ..ToolSettings::default()
        },
    );
    let o = start(config, vec![p.clone()]).await;
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
    let refused = o.execute(ToolCall::new("m__t", json!({})), &run).await;
    assert_eq!(refused.extras.get("code"), Some(&json!("rate_limited")), "{refused:?}");
    assert_eq!(o.run_flags("r").calls, 1, "a call refused by a rate limit");
    // Another run holds the queue's one slot: this run's calls find it busy, or give up.
    let holder = {
        let o = o.clone();
        tokio::spawn(async move { call(&o, "m__slow", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = o.execute(ToolCall::new("m__slow", json!({})), &run).await;
    assert_eq!(busy.extras.get("code"), Some(&json!("queue_busy")), "{busy:?}");
    assert_eq!(o.run_flags("r").calls, 1, "a call that found its queue busy");
    let cancel = tokio_util::sync::CancellationToken::new();
    let waiting = {
        let (o, ctx) = (o.clone(), run.clone().with_cancel(cancel.clone()));
        tokio::spawn(async move { o.execute(ToolCall::new("m__slow", json!({})), &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    assert_eq!(waiting.await.unwrap().extras.get("code"), Some(&json!("cancelled")));
    assert_eq!(o.run_flags("r").calls, 1, "a call cancelled while it waited for a slot");
    // A call dropped while it waits is given back too.
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        o.execute(ToolCall::new("m__slow", json!({})), &run),
    )
    .await;
    assert!(dropped.is_err());
    assert_eq!(o.run_flags("r").calls, 1, "a call dropped while it waited for a slot");
    assert!(holder.await.unwrap().ok);
    assert!(o.execute(ToolCall::new("m__slow", json!({})), &run).await.ok, "the second call");
    assert_eq!(o.run_flags("r").calls, 2);
    assert_eq!(p.total_calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn run_budget_limits_tool_time_and_shortens_the_last_timeout() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("nap", Behavior::Sleep(Duration::from_secs(3)))
            .with_tool("long", Behavior::Sleep(Duration::from_secs(30))),
    );
    let config = OrchestratorConfig::default().with_run_budget(RunBudgetConfig {
        max_calls: None,
        max_tool_time: Some(Duration::from_secs(5)),
    });
    let o = start(config, vec![p]).await;
    assert!(call(&o, "m__nap", json!({})).await.ok);
    let started = tokio::time::Instant::now();
    let e = o.call_tool("m__long", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(e.code(), "timeout");
    // The error names the run's budget, not the tool's timeout, as the limit that applied.
    expect!["timeout: `m__long` did not finish within 2s: the run's tool time ran out: 2s of its `defaults.maxToolTimeMs` (5s) was left when the call started, less than the tool's timeout (60s); the run's next call fails with budget_exhausted"]
        .assert_eq(&e.to_string());
    let r = call(&o, "m__nap", json!({})).await;
    expect![
        "(tool failed: run budget exhausted before `m__nap`: the run may spend at most 5s in tools)"
    ]
    .assert_eq(&r.conversation_text());
}

/// The run's tool time holds for the whole call: progress that resets the timeout does not
/// carry a call past it, and no retry starts that it would not let finish.
#[tokio::test(start_paused = true)]
async fn run_tool_time_bounds_progress_resets_and_retries() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("steps", Behavior::Progress { steps: 10, interval: Duration::from_secs(2) })
            .with_tool("flaky", Behavior::FailTransient { times: 10 }),
    );
    let config = OrchestratorConfig::default()
        .with_run_budget(RunBudgetConfig {
            max_calls: None,
            max_tool_time: Some(Duration::from_secs(7)),
        })
        .with_tool_settings(
            "m__steps",
            ToolSettings::default()
                .with_timeout(Duration::from_secs(3))
                .with_progress_reset(Duration::from_secs(60)),
        )
        .with_tool_settings(
            "m__flaky",
            ToolSettings::default().with_retry(RetryPolicy {
                max_retries: 100,
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(1),
            }),
        );
    let o = start(config, vec![p.clone()]).await;
    let r = call(&o, "m__steps", json!({})).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)");
    assert_eq!(r.latency_ms, 7000, "20s of work with progress, 7s of tool time");

    let o = start(o.config().clone(), vec![p.clone()]).await;
    let started = tokio::time::Instant::now();
    let r = call(&o, "m__flaky", json!({})).await;
    assert!(!r.ok, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(7), "{:?}", started.elapsed());
    assert_eq!(p.calls_of("flaky"), 7, "attempts at 0, 1, ... 6s; none at 7s");
}

#[tokio::test(start_paused = true)]
async fn oversize_outputs_are_spilled_and_read_back() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("big", Behavior::Big(10_000))
            .with_tool("small", Behavior::Big(100))
            .with_tool("bad", Behavior::ErrorOutput("e".repeat(5000))),
    );
    let o = start(OrchestratorConfig::default().with_response_max_bytes(1000), vec![p]).await;
    let r = call(&o, "m__big", json!({})).await;
    assert!(r.ok);
    let message: serde_json::Value = serde_json::from_str(r.result.as_deref().unwrap()).unwrap();
    let spill = &message["tool_output"];
    assert_eq!(spill["reason"], "size_limit_exceeded");
    assert_eq!(spill["bytes"], 10_000);
    assert_eq!(spill["lines"], 100);
    assert_eq!(spill["tokens"], 2500);
    let handle = spill["handle"].as_str().unwrap();
    let page = o.read_output(handle, 98, 10).await.unwrap();
    assert_eq!((page.lines, page.total_lines), (2, 100));
    assert_eq!(page.text.lines().next().unwrap().len(), 99);
    assert_eq!(call(&o, "m__small", json!({})).await.result.unwrap().len(), 100);
    // An error output is stored with its head kept: the model must see why the call failed.
    let r = call(&o, "m__bad", json!({})).await;
    let error = r.error.unwrap();
    assert!(error.starts_with("eeee"), "{error}");
    assert!(error.contains("more bytes of this error message (5000 in all"), "{error}");
    assert!(error.len() <= 1000, "{} bytes", error.len());
    assert_eq!(o.read_output(&handle_in(&error), 0, 1).await.unwrap().text, "e".repeat(5000));
}

/// The handle a capped error's note names.
fn handle_in(text: &str) -> String {
    let at = text.rfind("handle `").expect("a handle") + "handle `".len();
    text[at..].split('`').next().expect("a closing backquote").to_owned()
}

/// The temporary store the tests' orchestrators keep outputs in is removed, outputs and
/// all, when the orchestrator is dropped: every test left one behind before.
#[tokio::test(start_paused = true)]
async fn a_test_orchestrators_output_directory_goes_with_it() {
    let p = Arc::new(MockProvider::new("m").with_tool("big", Behavior::Big(10_000)));
    let store = crate::TemporaryStore::new();
    let dir = store.path().to_owned();
    let o = Orchestrator::builder(OrchestratorConfig::default().with_response_max_bytes(1000))
        .output_store(store)
        .provider(p)
        .build()
        .expect("valid configuration");
    assert!(o.warmup().await.is_ok());
    let r = call(&o, "m__big", json!({})).await;
    assert!(r.result.unwrap().contains("size_limit_exceeded"));
    assert_ne!(std::fs::read_dir(&dir).expect("the store's directory").count(), 0);
    drop(o);
    assert!(!dir.exists(), "{} is left", dir.display());
}

/// An orchestrator over `provider` with a 1000-byte cap, outputs stored in a fresh
/// temporary directory and the secret `s3cr3t-value` to redact.
async fn start_capped(oversize: OversizeMode, provider: Arc<MockProvider>) -> Orchestrator {
    let config = OrchestratorConfig {
        oversize,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    let o = Orchestrator::builder(config)
        .output_store(crate::TemporaryStore::new())
        .provider(provider)
        .secrets(["s3cr3t-value".to_owned()])
        .build()
        .expect("valid configuration");
    assert!(o.warmup().await.is_ok());
    o
}

/// An upstream error message (a JSON-RPC error turned into a remote error) is capped as an
/// output is: stored whole with its head kept in spill mode, cut in truncate mode, its
/// secrets redacted before either, so that no cut leaves a secret's head.
#[tokio::test(start_paused = true)]
async fn a_huge_error_message_is_capped_with_its_secrets_redacted() {
    let message = "the server says: s3cr3t-value ".repeat(10_000);
    let p = Arc::new(MockProvider::new("m").with_tool("bad", Behavior::Fail(message.clone())));
    let o = start_capped(OversizeMode::Spill, p.clone()).await;
    let error = call(&o, "m__bad", json!({})).await.error.unwrap();
    assert!(error.len() <= 1000, "{} bytes: {error}", error.len());
    assert!(error.starts_with("the server says: [redacted]"), "{error}");
    assert!(!error.contains("s3c"), "{error}");
    assert!(error.contains("of this error message"), "{error}");
    let stored = o.read_output(&handle_in(&error), 0, 1).await.unwrap().text;
    assert_eq!(stored, message.replace("s3cr3t-value", "[redacted]"));
    // The variant, and so the error's code, stays.
    let err = o.call_tool("m__bad", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(err.code(), "remote");
    assert!(err.report().len() <= 1000);

    let o = start_capped(OversizeMode::Truncate, p).await;
    let error = call(&o, "m__bad", json!({})).await.error.unwrap();
    assert!(error.len() <= 1000, "{} bytes: {error}", error.len());
    assert!(error.contains("bytes omitted: error message over"), "{error}");
    assert!(!error.contains("s3c") && !error.contains("output__read"), "{error}");
}

/// Images (which the text cap does not count; they have a cap of their own) stay in a
/// capped output, after its text, with their annotations moved to where they are now; a
/// spilled output stored only the text.
#[tokio::test(start_paused = true)]
async fn a_capped_output_keeps_its_images() {
    let image = ContentPart::Image { data: "aGVsbG8=".into(), mime_type: "image/png".into() };
    let mut output = ToolOutput::text("x".repeat(5000));
    output.content.push(image.clone());
    let output = output.with_extra(
        "annotations",
        json!([{"index": 0, "annotations": {"priority": 0.1}},
               {"index": 1, "annotations": {"audience": ["user"]}}]),
    );
    let p = Arc::new(MockProvider::new("m").with_tool("shot", Behavior::Output(output)));
    for oversize in [OversizeMode::Spill, OversizeMode::Truncate] {
        let config = OrchestratorConfig {
            oversize,
            ..OrchestratorConfig::default().with_response_max_bytes(1000)
        };
        let o = start(config, vec![p.clone()]).await;
        let out = o.call_tool("m__shot", json!({}), &CallContext::new()).await.unwrap();
        assert_eq!(out.content.len(), 2, "{oversize:?}: {out:?}");
        assert!(matches!(&out.content[0], ContentPart::Text { text } if text.len() < 1500));
        assert_eq!(out.content[1], image, "{oversize:?}");
        assert_eq!(
            out.extras["annotations"],
            json!([{"index": 1, "annotations": {"audience": ["user"]}}]),
            "{oversize:?}"
        );
    }
}

/// A PNG's first bytes, base64: the signature and an `IHDR` of `width` × `height`, padded
/// with `pad` bytes of base64 so that its size can be chosen.
fn png(width: u32, height: u32, pad: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    let mut data = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            data.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        data.extend(std::iter::repeat_n('=', 3 - chunk.len()));
    }
    // 24 bytes, so no padding: more base64 may follow.
    data + &"A".repeat(pad)
}

fn shots(count: usize, bytes: usize) -> ToolOutput {
    let mut output = ToolOutput::text("screenshots:");
    for _ in 0..count {
        output.content.push(ContentPart::Image {
            data: png(800, 600, bytes - 32),
            mime_type: "image/png".into(),
        });
    }
    output
}

/// Images and audio share a cap of their own, apart from the text's: the parts past it
/// are each replaced by a note naming their type and size, their annotations gone; a cap
/// set on the tool moves it.
#[tokio::test(start_paused = true)]
async fn images_over_the_media_cap_are_left_out_with_a_note() {
    let output = shots(5, 400).with_extra(
        "annotations",
        json!([{"index": 1, "annotations": {"priority": 1.0}},
               {"index": 4, "annotations": {"audience": ["user"]}}]),
    );
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("shots", Behavior::Output(output.clone()))
            .with_tool("roomy", Behavior::Output(output.clone())),
    );
    let config = OrchestratorConfig { media_max_bytes: 1000, ..OrchestratorConfig::default() }
        .with_tool_settings(
            "m__roomy",
            ToolSettings { media_max_bytes: Some(2000), ..ToolSettings::default() },
        );
    let o = start(config, vec![p]).await;
    let out = o.call_tool("m__shots", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.content.len(), 6);
    assert_eq!(out.content[1..3], output.content[1..3], "the first two fit in 1000 bytes");
    let notes: Vec<&str> = out.content[3..]
        .iter()
        .filter_map(|p| match p {
            ContentPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), 3, "{out:?}");
    expect!["[image left out (image/png, 400 bytes of base64): this result's media (images, audio, resource blobs) are over the 1000-byte cap for media; ask `m__shots` for fewer or smaller ones, or raise `defaults.mediaResponseMaxBytes` (or `tools.m__shots.mediaResponseMaxBytes`)]"]
        .assert_eq(notes[0]);
    assert_eq!(out.extras["capped_media"], json!({"parts": 3, "bytes": 1200}));
    assert_eq!(out.extras["annotations"], json!([{"index": 1, "annotations": {"priority": 1.0}}]));
    let roomy = o.call_tool("m__roomy", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(roomy, output, "five of 400 bytes fit in the tool's own 2000");
}

/// An embedded resource's blob (a screenshot sent as `file:///shot.png`) is media, as an
/// image part is: the text cap does not count it, so it is passed on (and beside the
/// envelope to an agent) rather than spilled as a placeholder; the media cap does, and a
/// run's context budget counts it as the image it is. (A 150 KB one was spilled and lost.)
#[tokio::test(start_paused = true)]
async fn embedded_resource_blobs_are_media() {
    let mut output = ToolOutput::text("the screen:");
    output.content.push(ContentPart::Resource {
        uri: "file:///shot.png".into(),
        mime_type: Some("image/png".into()),
        text: None,
        blob: Some(png(800, 600, 150_000 - 32)),
    });
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("shot", Behavior::Output(output.clone()))
            .with_tool("small", Behavior::Output(output.clone())),
    );
    let config = OrchestratorConfig::default().with_response_max_bytes(1000).with_tool_settings(
        "m__small",
        ToolSettings { media_max_bytes: Some(1000), ..ToolSettings::default() },
    );
    let o = start(config, vec![p]).await;
    let out = o.call_tool("m__shot", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out, output, "passed on whole");
    let (r, images) =
        o.execute_with_images(ToolCall::new("m__shot", json!({})), &CallContext::new()).await;
    assert!(r.ok && !r.extras.contains_key("spilled"), "{r:?}");
    assert_eq!(images, output.content[1..]);
    let out = o.call_tool("m__small", json!({}), &CallContext::new()).await.unwrap();
    let ContentPart::Text { text } = &out.content[1] else { panic!("{out:?}") };
    assert!(text.starts_with("[resource left out (image/png, 150000 bytes of base64)"), "{text}");
    assert_eq!(out.extras["capped_media"], json!({"parts": 1, "bytes": 150_000}));
    // 640 tokens for the image, as the image part's, not 37,500 for its base64 as text.
    let budget = OrchestratorConfig::default().with_context_token_budget(1000);
    let p = Arc::new(MockProvider::new("m").with_tool("shot", Behavior::Output(output)));
    let o = start(budget, vec![p]).await;
    let run = CallContext::new().with_run_id("r");
    let r = o.execute(ToolCall::new("m__shot", json!({})), &run).await;
    assert!(r.ok, "{r:?}");
}

/// Twenty images of 1 MiB: a gateway's client gets 10 MiB of them by default, not 20.
#[tokio::test(start_paused = true)]
async fn the_default_media_cap_is_ten_mebibytes() {
    let p =
        Arc::new(MockProvider::new("m").with_tool("shots", Behavior::Output(shots(20, 1 << 20))));
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let out = o.call_tool("m__shots", json!({}), &CallContext::new()).await.unwrap();
    let images = out.content.iter().filter(|p| matches!(p, ContentPart::Image { .. })).count();
    assert_eq!(images, 10);
    assert!(out.byte_len() < 11 << 20, "{}", out.byte_len());
    assert_eq!(out.extras["capped_media"], json!({"parts": 10, "bytes": 10 << 20}));
}

/// Images count in the run's context-token budget: 800 × 600 / 750 = 640 tokens each,
/// by the size their PNG header gives, however few bytes they take.
#[tokio::test(start_paused = true)]
async fn images_count_in_the_context_budget() {
    let p = Arc::new(MockProvider::new("m").with_tool("shots", Behavior::Output(shots(2, 64))));
    let o = start(OrchestratorConfig::default().with_context_token_budget(2000), vec![p]).await;
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("m__shots", json!({})), &run).await.ok);
    let r = o.execute(ToolCall::new("m__shots", json!({})), &run).await;
    assert_eq!(r.conversation_text(), "(tool failed: context window budget exceeded)");
    assert!(o.run_flags("r").context_budget_exceeded);
}

#[tokio::test(start_paused = true)]
async fn truncate_mode_keeps_head_and_tail() {
    let p = Arc::new(MockProvider::new("m").with_tool("big", Behavior::Big(10_000)));
    let config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    let o = start(config, vec![p]).await;
    let r = call(&o, "m__big", json!({})).await;
    let text = r.result.unwrap();
    assert!(text.contains("[... 9055 bytes omitted: output over 1000 bytes ...]"), "{text}");
    assert!(text.len() <= 1000, "{}", text.len());
    assert_eq!(r.extras["capped"]["bytes"], 10_000);
}

/// An output over the cap is cut with its secrets redacted first, in truncate mode and
/// when the store fails in spill mode: cut first, the piece of a secret on either side of
/// the cut was shorter than the redactor looks for and stayed (up to 13 of the secret's 40
/// characters). Wherever the cut falls in the secret, no 6 of its characters in a row are
/// left, neither in what the gateway serves nor in what a call answers.
#[tokio::test(start_paused = true)]
async fn a_cut_through_a_secret_leaves_none_of_it() {
    const TOKEN: &str = "Qz7-Wd4K-pL9m-Rt2v-Hs8n-Bc3j-Yf6g-Nk1e01";
    let pieces: Vec<&str> = (0..=TOKEN.len() - 6).map(|i| &TOKEN[i..i + 6]).collect();
    let dir = tempfile::tempdir().expect("temporary directory");
    // A store under a file cannot write: spill mode then cuts the output instead.
    let file = tempfile::NamedTempFile::new().expect("temporary file");
    let stores = [
        (OversizeMode::Truncate, dir.path().to_owned()),
        (OversizeMode::Spill, file.path().join("outputs")),
    ];
    for (oversize, root) in stores {
        let config = OrchestratorConfig {
            oversize,
            ..OrchestratorConfig::default().with_response_max_bytes(200)
        };
        let p = Arc::new(MockProvider::new("m").with_tool("echo", Behavior::Echo));
        let o = Orchestrator::builder(config)
            .output_store(Arc::new(toolmux_orchestrator::store::DirectoryStore::new(root)))
            .provider(p)
            .secrets([TOKEN.to_owned()])
            .build()
            .expect("valid configuration");
        assert!(o.warmup().await.is_ok());
        for at in 0..400 {
            let text = format!("{}{TOKEN}{}", "a".repeat(at), "b".repeat(400 - at));
            let served = o.call_tool("m__echo", json!({"t": text}), &CallContext::new()).await;
            let served = served.unwrap().to_text();
            assert!(served.contains("omitted: output over 200 bytes"), "{served}");
            let answered = call(&o, "m__echo", json!({"t": text})).await.result.unwrap();
            for shown in [served, answered] {
                let left = pieces.iter().find(|piece| shown.contains(*piece));
                assert!(left.is_none(), "{oversize:?}, secret at {at}: {left:?} in {shown}");
            }
        }
    }
}

/// A truncated result fits its cap with the marker; a cap too small for the marker keeps
/// what fits and leaves the telling to the `capped` extra.
#[tokio::test(start_paused = true)]
async fn a_truncated_result_fits_even_a_tiny_cap() {
    let p = Arc::new(MockProvider::new("m").with_tool("big", Behavior::Big(100)));
    let config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(10)
    };
    let o = start(config, vec![p]).await;
    let r = call(&o, "m__big", json!({})).await;
    let text = r.result.unwrap();
    assert_eq!(text.len(), 10, "{text}");
    assert_eq!(r.extras["capped"], json!({"bytes": 100, "omitted": 90}));
}

/// A tool's own size hint (MCP `_meta` `anthropic/maxResultSizeChars`) moves its cap, up to
/// a bound; a cap set on the tool wins over the hint; the cap in force is listed.
#[tokio::test(start_paused = true)]
async fn a_tools_size_hint_moves_its_cap_within_bounds() {
    let spec = |name: &str, hint: usize| {
        ToolSpec::new(name, "big", json!({"type": "object"})).with_max_result_size(hint)
    };
    let p = Arc::new(
        MockProvider::new("m")
            .with_spec(spec("roomy", 50_000), Behavior::Big(10_000))
            .with_spec(spec("tight", 500), Behavior::Big(1_000))
            .with_spec(spec("greedy", 10_000_000), Behavior::Big(600_000))
            .with_spec(spec("configured", 50_000), Behavior::Big(10_000)),
    );
    let mut config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    config.tools.insert(
        "m__configured".into(),
        ToolSettings { response_max_bytes: Some(2000), ..ToolSettings::default() },
    );
    let o = start(config, vec![p]).await;
    let roomy = call(&o, "m__roomy", json!({})).await;
    assert!(roomy.extras.get("capped").is_none(), "{:?}", roomy.extras);
    let tight = call(&o, "m__tight", json!({})).await;
    assert_eq!(tight.extras["capped"]["omitted"], 553);
    let greedy = call(&o, "m__greedy", json!({})).await;
    assert_eq!(greedy.extras["capped"]["omitted"], 600_000 - MAX_HINTED_RESPONSE_BYTES + 58);
    let configured = call(&o, "m__configured", json!({})).await;
    assert_eq!(configured.extras["capped"]["omitted"], 8055);
    let listed: Vec<(String, Option<usize>)> =
        o.tools().into_iter().map(|t| (t.name, t.max_result_size)).collect();
    assert_eq!(
        listed,
        [
            ("m__roomy".to_owned(), Some(50_000)),
            ("m__tight".to_owned(), Some(500)),
            ("m__greedy".to_owned(), Some(MAX_HINTED_RESPONSE_BYTES)),
            ("m__configured".to_owned(), Some(2000)),
        ]
    );
}

/// A tool that cut its own output (a file tool's match limit) says so in `truncated`; the
/// size cap on top says so in `capped` and leaves the tool's word in place.
#[tokio::test(start_paused = true)]
async fn the_cap_keeps_a_tool_s_own_truncated_extra() {
    let own = ToolOutput::text("x".repeat(5000)).with_extra("truncated", json!(true));
    let p = Arc::new(MockProvider::new("m").with_tool("grep", Behavior::Output(own)));
    let config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    let o = start(config, vec![p]).await;
    let r = call(&o, "m__grep", json!({})).await;
    assert_eq!(r.extras["truncated"], true, "{:?}", r.extras);
    assert_eq!(r.extras["capped"]["bytes"], 5000, "{:?}", r.extras);
    assert_eq!(r.extras["capped"]["omitted"], 4054, "{:?}", r.extras);
}

#[tokio::test(start_paused = true)]
async fn context_budget_refuses_outputs_and_sets_the_flag() {
    let p = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Big(400)));
    let o = start(OrchestratorConfig::default().with_context_token_budget(150), vec![p]).await;
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
    assert!(!o.run_flags("r").context_budget_exceeded);
    let r = o.execute(ToolCall::new("m__t", json!({})), &run).await;
    assert_eq!(r.conversation_text(), "(tool failed: context window budget exceeded)");
    assert!(o.run_flags("r").context_budget_exceeded);
    o.set_context_budget("r", 10_000);
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
}

/// An external call that was made and is pending reaches its caller with its callId even
/// past the context budget (without it the result could never be collected); it spends the
/// budget and says so, and the run's next output is refused.
#[tokio::test(start_paused = true)]
async fn a_pending_handle_reaches_its_caller_past_the_context_budget() {
    // The shape toolmux-external answers an `isAsync` call with, marked as its handle.
    let pending = json!({"status": "pending", "callId": "ext-7", "pendingToolCallId": "ext-7"});
    let handle = ToolOutput::json(pending.clone()).with_extra("pendingHandle", json!(true));
    let p = Arc::new(
        MockProvider::new("external")
            .with_kind(ToolKind::External)
            .with_tool("big", Behavior::Big(400))
            .with_tool("job", Behavior::Output(handle)),
    );
    let o = start(OrchestratorConfig::default().with_context_token_budget(110), vec![p]).await;
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("external__big", json!({})), &run).await.ok);
    let output = o.call_tool("external__job", json!({}), &run).await.unwrap();
    assert_eq!(output.content[0], ContentPart::Json { value: pending });
    let ContentPart::Text { text } = &output.content[1] else { panic!("{output:?}") };
    expect!["note: the run's context budget (`defaults.contextTokenBudget`) is spent (this answer takes about 17 tokens, 10 were left): this pending call's handle is passed on so that its result can be collected by its callId, but the run's next tool output will be refused"]
        .assert_eq(text);
    assert!(o.run_flags("r").context_budget_exceeded);
    let r = o.execute(ToolCall::new("external__big", json!({})), &run).await;
    assert_eq!(r.conversation_text(), "(tool failed: context window budget exceeded)");
}

/// Only toolmux-external's own handle passes a spent context budget: a synchronous external
/// call's result shaped like one (unmarked), or a marked one carrying 20 kB of text beside it,
/// is refused as any other output is.
#[tokio::test(start_paused = true)]
async fn a_result_shaped_like_a_pending_handle_is_under_the_context_budget() {
    let pending = json!({"status": "pending", "callId": "ext-7"});
    let mut padded = ToolOutput::json(pending.clone()).with_extra("pendingHandle", json!(true));
    padded.content.push(ContentPart::Text { text: "x".repeat(20_000) });
    let p = Arc::new(
        MockProvider::new("external")
            .with_kind(ToolKind::External)
            .with_tool("sync", Behavior::Output(ToolOutput::json(pending)))
            .with_tool("padded", Behavior::Output(padded)),
    );
    let o = start(OrchestratorConfig::default().with_context_token_budget(5), vec![p]).await;
    for (tool, run) in [("external__sync", "r1"), ("external__padded", "r2")] {
        let run = CallContext::new().with_run_id(run);
        let e = o.call_tool(tool, json!({}), &run).await.unwrap_err();
        assert_eq!(e.code(), "context_budget_exceeded", "{tool}: {e}");
    }
}

/// A run's budget set by its caller (an agent knows its context window) holds without any
/// budget in the configuration.
#[tokio::test(start_paused = true)]
async fn a_context_budget_set_for_a_run_holds_without_a_configured_one() {
    let p = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Big(400)));
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    o.set_context_budget("r", 150);
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("m__t", json!({})), &run).await.ok);
    let r = o.execute(ToolCall::new("m__t", json!({})), &run).await;
    assert_eq!(r.conversation_text(), "(tool failed: context window budget exceeded)");
    assert!(o.run_flags("r").context_budget_exceeded);
    let other = CallContext::new().with_run_id("other");
    for _ in 0..3 {
        assert!(o.execute(ToolCall::new("m__t", json!({})), &other).await.ok, "other runs");
    }
}

#[tokio::test(start_paused = true)]
async fn transient_failures_of_idempotent_tools_are_retried() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_read_only_tool("flaky", Behavior::FailTransient { times: 2 })
            .with_tool("write", Behavior::FailTransient { times: 2 }),
    );
    let config = OrchestratorConfig::default()
        .with_provider_settings("m", ToolSettings::default().with_retry(RetryPolicy::retries(3)));
    let o = start(config, vec![p.clone()]).await;
    let r = call(&o, "m__flaky", json!({"x": 1})).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(p.calls_of("flaky"), 3);
    // 200 ms + 400 ms of backoff on the paused clock.
    assert!((600..700).contains(&r.latency_ms), "{}", r.latency_ms);
    let r = call(&o, "m__write", json!({})).await;
    expect!["(tool failed: m: connection reset (failure 1 of 2))"]
        .assert_eq(&r.conversation_text());
    assert_eq!(p.calls_of("write"), 1, "not idempotent: no retry");

    // Retries set on the tool itself: the user says a second run is safe.
    let p =
        Arc::new(MockProvider::new("m").with_tool("write", Behavior::FailTransient { times: 2 }));
    let config = OrchestratorConfig::default().with_tool_settings(
        "m__write",
        ToolSettings::default().with_retry(RetryPolicy::retries(3)),
    );
    let o = start(config, vec![p.clone()]).await;
    assert!(call(&o, "m__write", json!({})).await.ok);
    assert_eq!(p.calls_of("write"), 3);
}

#[tokio::test(start_paused = true)]
async fn secrets_never_leave_the_pipeline() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("leak", Behavior::Text("token=s3cr3t-value here".into()))
            .with_tool("fail", Behavior::Fail("auth s3cr3t-value rejected".into())),
    );
    let o = crate::start_with_secret(p).await;
    assert_eq!(call(&o, "m__leak", json!({})).await.result.unwrap(), "token=[redacted] here");
    assert_eq!(call(&o, "m__fail", json!({})).await.error.unwrap(), "auth [redacted] rejected");
}

/// Text a provider cut before it reached the pipeline (an MCP server's error body quoted up
/// to 200 characters, a preview) comes out without the piece of a secret the cut left in
/// it, in results, errors and what the gateway serves.
#[tokio::test(start_paused = true)]
async fn a_secret_cut_before_the_pipeline_is_redacted() {
    let padding = "x".repeat(182);
    let body = format!("HTTP 400: {padding}s3cr3t-valu");
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("fail", Behavior::Fail(body))
            .with_tool("preview", Behavior::Text("preview: (token s3cr3t-val…)".into()))
            .with_tool("tail", Behavior::ErrorOutput("cr3t-value\" was refused".into())),
    );
    let o = crate::start_with_secret(p).await;
    let error = call(&o, "m__fail", json!({})).await.error.unwrap();
    assert_eq!(error, format!("HTTP 400: {padding}[redacted]"));
    let preview = call(&o, "m__preview", json!({})).await.result.unwrap();
    assert_eq!(preview, "preview: (token [redacted]…)");
    let served = ToolProvider::call(&o, "m__tail", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(served.to_text(), "[redacted]\" was refused");
    let served = ToolProvider::call(&o, "m__fail", json!({}), &CallContext::new()).await;
    let shown = served.unwrap_err().report();
    assert!(shown.ends_with("x[redacted]") && !shown.contains("s3cr"), "{shown}");
}

/// What the gateway serves (`call_tool`) is redacted in every part that carries text, not
/// only text parts: an API's JSON answer echoing its key, structured content, a resource,
/// extras. (The JSON parts and structured content reached MCP clients unredacted.)
#[tokio::test(start_paused = true)]
async fn secrets_are_redacted_from_json_structured_content_and_resources() {
    let output = ToolOutput {
        content: vec![
            ContentPart::Json { value: json!({"next": "/p?api_key=s3cr3t-value", "n": 2}) },
            ContentPart::Resource {
                uri: "mem://s3cr3t-value".into(),
                mime_type: None,
                text: Some("key s3cr3t-value".into()),
                blob: None,
            },
        ],
        structured: Some(json!({"headers": {"x-key": "s3cr3t-value"}})),
        is_error: false,
        extras: [("url".to_owned(), json!("https://h/?k=s3cr3t-value"))].into_iter().collect(),
    };
    let p = Arc::new(MockProvider::new("m").with_tool("api", Behavior::Output(output)));
    let o = crate::start_with_secret(p).await;
    let served = ToolProvider::call(&o, "m__api", json!({}), &CallContext::new()).await.unwrap();
    let shown = serde_json::to_string(&served).unwrap();
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert_eq!(served.structured, Some(json!({"headers": {"x-key": "[redacted]"}})));
    assert_eq!(
        served.content[0],
        ContentPart::Json { value: json!({"next": "/p?api_key=[redacted]", "n": 2}) }
    );
    assert_eq!(served.extras["url"], json!("https://h/?k=[redacted]"));
    // And what a call answers (its extras an MCP server's `_meta`, which `toolmux tools
    // call --json` prints).
    let answered = o.execute(ToolCall::new("m__api", json!({})), &CallContext::new()).await;
    let shown = serde_json::to_string(&answered).unwrap();
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert_eq!(answered.extras["url"], json!("https://h/?k=[redacted]"));
}

/// A secret holding characters JSON escapes (a PEM key's line breaks, a quote, a
/// backslash) does not appear literally once JSON is written out as text, so it is
/// redacted in the values before they are written, and in text that embeds it as JSON:
/// in what a call answers, the events' arguments and results, a spilled structured
/// content and a schema violation's text. (Each of these held `line-two-secret`.)
#[tokio::test(start_paused = true)]
async fn secrets_that_json_escapes_are_redacted_wherever_json_becomes_text() {
    const PEM: &str = "line-one-secret\nline-two-secret";
    const QUOTED: &str = "quote\"and\\slash-secret";
    let visible = |text: &str| {
        ["line-one-secret", "line-two-secret", "quote", "slash-secret"]
            .iter()
            .any(|line| text.contains(line))
    };
    let rows: Vec<String> = (0..50).map(|i| format!("row {i}")).collect();
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
    let typed = |name: &str| {
        ToolSpec::new(name, "typed", json!({"type": "object"})).with_output_schema(schema.clone())
    };
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("json", Behavior::Output(ToolOutput::json(json!({"k": PEM, "q": QUOTED}))))
            .with_tool("embedded", Behavior::Text(json!({"k": PEM, "q": QUOTED}).to_string()))
            .with_tool("echo", Behavior::Echo)
            .with_spec(
                typed("big"),
                Behavior::Output(ToolOutput {
                    structured: Some(json!({"k": PEM, "rows": rows})),
                    ..ToolOutput::text("rows")
                }),
            )
            .with_spec(
                typed("wrong"),
                Behavior::Output(ToolOutput {
                    structured: Some(json!({"n": PEM})),
                    ..ToolOutput::text("n")
                }),
            ),
    );
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = OrchestratorConfig {
        structured_max_bytes: 200,
        ..OrchestratorConfig::default().with_response_max_bytes(200)
    };
    let o = Orchestrator::builder(config)
        .output_store(Arc::new(toolmux_orchestrator::store::DirectoryStore::new(dir.path())))
        .provider(p)
        .secrets([PEM.to_owned(), QUOTED.to_owned()])
        .build()
        .expect("valid configuration");
    assert!(o.warmup().await.is_ok());
    let mut events = o.subscribe();
    for tool in ["m__json", "m__embedded", "m__wrong"] {
        let answered = call(&o, tool, json!({})).await;
        let shown = format!("{:?} {:?}", answered.result, answered.error);
        assert!(shown.contains("[redacted]") && !visible(&shown), "{tool}: {shown}");
        let served = o.call_tool(tool, json!({}), &CallContext::new()).await.unwrap();
        let shown = serde_json::to_string(&served).unwrap();
        assert!(!visible(&shown), "{tool}: {shown}");
    }
    let answered = call(&o, "m__echo", json!({"k": PEM, "q": QUOTED})).await;
    assert_eq!(answered.result.as_deref(), Some(r#"{"k":"[redacted]","q":"[redacted]"}"#));
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let ToolEvent::ToolStarted { arguments, .. } = &seen[seen.len() - 2] else {
        panic!("{seen:?}")
    };
    assert_eq!(arguments.as_ref(), Some(&json!({"k": "[redacted]", "q": "[redacted]"})));
    for event in &seen {
        let shown = format!("{event:?}");
        assert!(!visible(&shown), "{shown}");
    }
    let big = call(&o, "m__big", json!({})).await;
    let big = big.error.or(big.result).expect("a note naming the stored content");
    let handle = big.rsplit('`').nth(1).expect(&big);
    let stored = o.read_output(handle, 0, 10).await.unwrap().text;
    assert!(stored.contains("[redacted]") && !visible(&stored), "{stored}");
}

/// Tools `m__typed` (with an output schema: `rows` of JSON type `rows`) and `m__untyped`
/// (without), both answering `output`.
fn typed_and_untyped(output: ToolOutput, rows: &str) -> Arc<MockProvider> {
    let schema = json!({"type": "object", "properties": {"rows": {"type": rows}}});
    let typed =
        ToolSpec::new("typed", "rows", json!({"type": "object"})).with_output_schema(schema);
    Arc::new(
        MockProvider::new("m")
            .with_spec(typed, Behavior::Output(output.clone()))
            .with_tool("untyped", Behavior::Output(output)),
    )
}

/// An output over the cap of a tool that declares an output schema keeps its structured
/// content (clients such as the official SDKs refuse a result without it), spilled or cut;
/// a tool without one loses it with the rest.
#[tokio::test(start_paused = true)]
async fn capped_outputs_keep_the_structured_content_their_schema_promises() {
    let big = ToolOutput {
        structured: Some(json!({"rows": 500})),
        ..ToolOutput::text("x".repeat(5_000))
    };
    let p = typed_and_untyped(big, "integer");
    for oversize in [OversizeMode::Spill, OversizeMode::Truncate] {
        let config = OrchestratorConfig {
            oversize,
            ..OrchestratorConfig::default().with_response_max_bytes(1000)
        };
        let o = start(config, vec![p.clone()]).await;
        let ctx = CallContext::new();
        let typed = ToolProvider::call(&o, "m__typed", json!({}), &ctx).await.unwrap();
        assert!(typed.to_text().len() < 1_100, "{oversize:?}: {}", typed.to_text());
        assert_eq!(typed.structured, Some(json!({"rows": 500})), "{oversize:?}");
        let untyped = ToolProvider::call(&o, "m__untyped", json!({}), &ctx).await.unwrap();
        assert_eq!(untyped.structured, None, "{oversize:?}");
    }
}

/// Structured content over the cap, beside a short text: a tool without an output schema
/// loses it; one with a schema cannot be cut, so the result says the call succeeded, is an
/// error result (no content to conform), and stores the content whole for reading by pages.
#[tokio::test(start_paused = true)]
async fn structured_content_over_the_cap_is_stored_not_passed_on() {
    let rows: Vec<String> = (0..400).map(|i| format!("row {i}")).collect();
    let big =
        ToolOutput { structured: Some(json!({"rows": rows})), ..ToolOutput::text("400 rows") };
    let p = typed_and_untyped(big, "array");
    for oversize in [OversizeMode::Spill, OversizeMode::Truncate] {
        let config = OrchestratorConfig {
            oversize,
            structured_max_bytes: 1000,
            ..OrchestratorConfig::default().with_response_max_bytes(500)
        };
        let o = start(config, vec![p.clone()]).await;
        let ctx = CallContext::new();
        let untyped = ToolProvider::call(&o, "m__untyped", json!({}), &ctx).await.unwrap();
        assert_eq!((untyped.to_text().as_str(), &untyped.structured), ("400 rows", &None));
        assert!(!untyped.is_error);
        assert_eq!(untyped.extras["capped_structured"]["bytes"], 3_900, "{oversize:?}");

        let typed = ToolProvider::call(&o, "m__typed", json!({}), &ctx).await.unwrap();
        assert!(typed.is_error && typed.structured.is_none(), "{oversize:?}: {typed:?}");
        let text = typed.to_text();
        assert!(
            text.starts_with("400 rows\n`m__typed` succeeded, but its structured content is 3900 bytes, over the 1000-byte cap for structured content, and content promised by an output schema cannot be cut; "),
            "{text}"
        );
        if oversize == OversizeMode::Spill {
            let handle = text.rsplit('`').nth(1).unwrap();
            let page = o.read_output(handle, 0, 10).await.unwrap();
            let stored: serde_json::Value = serde_json::from_str(&page.text).unwrap();
            assert_eq!(stored["rows"][399], "row 399");
        } else {
            assert!(
                text.ends_with("raise `defaults.structuredResponseMaxBytes` (or `tools.m__typed.responseMaxBytes`) above 3900 to receive it"),
                "{text}"
            );
        }
    }
}

/// A tool that works `work`, then fails with a transient error (a connection lost halfway).
#[derive(Debug)]
struct SlowFlaky {
    work: Duration,
    calls: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl ToolProvider for SlowFlaky {
    fn kind(&self) -> ToolKind {
        ToolKind::Rest
    }
    fn namespace(&self) -> &str {
        "f"
    }
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        Ok(vec![ToolSpec::new("flaky", "fails slowly", json!({"type": "object"}))])
    }
    async fn call(
        &self,
        _name: &str,
        _args: serde_json::Value,
        _ctx: &CallContext,
    ) -> Result<ToolOutput, toolmux_core::ToolError> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        tokio::time::sleep(self.work).await;
        Err(toolmux_core::ToolError::Transport {
            provider: "f".into(),
            message: format!("connection reset (attempt {n})"),
            source: None,
        })
    }
}

/// Starts `f__flaky` working `work` per attempt, with a 5 s timeout and up to 5 retries
/// after `backoff` each.
async fn slow_flaky(work: Duration, backoff: Duration) -> (Arc<SlowFlaky>, Orchestrator) {
    let p = Arc::new(SlowFlaky { work, calls: Default::default() });
    let settings = ToolSettings::default()
        .with_timeout(Duration::from_secs(5))
        .with_retry(RetryPolicy { max_retries: 5, initial_backoff: backoff, max_backoff: backoff });
    let config = OrchestratorConfig::default().with_tool_settings("f__flaky", settings);
    let o = start(config, vec![p.clone()]).await;
    (p, o)
}

/// A call has one deadline, which its retries share: a retry runs within what the earlier
/// attempts and the backoff after them left of the timeout, where each got a whole timeout
/// (six attempts of 2.5 s and five 1 s backoffs: 20 s for a 5 s timeout).
#[tokio::test(start_paused = true)]
async fn retries_share_the_call_s_timeout() {
    let (p, o) = slow_flaky(Duration::from_millis(2500), Duration::from_secs(1)).await;
    let started = tokio::time::Instant::now();
    let e = o.call_tool("f__flaky", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(5), "{e}");
    assert_eq!(p.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(e.code(), "timeout");
    expect!["timeout: `f__flaky` did not finish within 5s: its time limit (5s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) holds for all of its attempts and the backoff between them: attempt 2 ran 1.5s after 3.5s of earlier attempts and backoff"]
        .assert_eq(&e.to_string());
}

/// No retry starts once its backoff would end past the call's deadline: the call fails
/// at once, saying how many attempts ran and which limit ended them, where it slept and
/// tried again with a whole new timeout each time.
#[tokio::test(start_paused = true)]
async fn no_retry_starts_past_the_call_s_deadline() {
    let (p, o) = slow_flaky(Duration::from_secs(1), Duration::from_secs(2)).await;
    let started = tokio::time::Instant::now();
    let e = o.call_tool("f__flaky", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(4), "attempts at 0 and 3s; {e}");
    assert_eq!(p.calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    expect!["timeout: `f__flaky` did not finish within 4s: all 2 of its attempts failed, the last with `f: connection reset (attempt 2)`, and a retry after its backoff (2s) would start after its time limit (5s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`), which its attempts and the backoff between them share, passes, so none was made"]
        .assert_eq(&e.to_string());
    // The caller's deadline ends them alike, named as the limit.
    let (p, o) = slow_flaky(Duration::from_secs(1), Duration::from_secs(2)).await;
    let ctx =
        CallContext::new().with_deadline(tokio::time::Instant::now() + Duration::from_secs(2));
    let e = o.call_tool("f__flaky", json!({}), &ctx).await.unwrap_err();
    assert_eq!(p.calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    expect!["timeout: `f__flaky` did not finish within 1s: its one attempt failed, the last with `f: connection reset (attempt 1)`, and a retry after its backoff (2s) would start after its caller's deadline passes, so none was made"]
        .assert_eq(&e.to_string());
}
