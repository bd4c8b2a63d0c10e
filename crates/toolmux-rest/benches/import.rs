//! Import speed of GitHub's REST API description (`@octokit/openapi`,
//! `generated/api.github.com.json`, about 1,200 operations and 13 MB): parsing plus import,
//! and import of an already parsed document. Results are in BENCHMARKS-rest.md.
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use std::path::PathBuf;
use std::time::Duration;
use toolmux_rest::{OpenApiConfig, RestProvider};

fn github_spec() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.peers/node/node_modules/@octokit/openapi/generated/api.github.com.json");
    assert!(path.exists(), "missing test peer @octokit/openapi: run .ci/install-peers");
    std::fs::read_to_string(path).unwrap()
}

fn import(c: &mut Criterion) {
    let text = github_spec();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Deprecated operations included, so the tool count (1,223) matches FastMCP's.
    let config = OpenApiConfig {
        include_deprecated: true,
        max_tools: Some(10_000),
        ..OpenApiConfig::default()
    };
    let mut group = c.benchmark_group("github_import");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    group.bench_function("parse_and_import", |b| {
        b.iter(|| RestProvider::openapi_from_text("github", &text, "github", &config).unwrap());
    });
    group.bench_function("import_parsed", |b| {
        b.iter_batched(
            || value.clone(),
            |doc| RestProvider::openapi_from_value("github", doc, "github", &config).unwrap(),
            criterion::BatchSize::LargeInput,
        );
    });
    group.bench_function("parse_only", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(&text).unwrap());
    });
    group.finish();
}

criterion_group!(benches, import);
criterion_main!(benches);
