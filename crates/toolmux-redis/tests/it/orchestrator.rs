//! Two orchestrators ("replicas") sharing a Redis queue of one slot: their calls of a
//! slow tool never overlap.

use crate::replica;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ToolCall, ToolProvider};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, QueueConfig, ToolSettings};
use toolmux_test_support::mock::{Behavior, MockProvider};
use toolmux_test_support::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_orchestrators_sharing_a_queue_of_one_never_overlap() {
    let server = RedisServer::start();
    // One provider behind both orchestrators: its count of calls in flight is the count
    // over both replicas.
    let provider = Arc::new(
        MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_millis(40))),
    );
    let mut orchestrators = Vec::new();
    for _ in 0..2 {
        let config = OrchestratorConfig::default()
            .with_queue("one", QueueConfig::new(1).with_wait_timeout(Duration::from_secs(30)))
            .with_provider_settings("m", ToolSettings::default().with_queue("one"));
        let orchestrator = Orchestrator::builder(config)
            .queue_backend(Arc::new(replica(&server).queues()))
            .provider(provider.clone() as Arc<dyn ToolProvider>)
            .build()
            .unwrap();
        assert!(orchestrator.warmup().await.is_ok());
        orchestrators.push(orchestrator);
    }
    let calls = (0..8).map(|i| {
        let orchestrator = orchestrators[i % 2].clone();
        tokio::spawn(async move {
            orchestrator.execute(ToolCall::new("m__slow", json!({})), &CallContext::new()).await
        })
    });
    for call in calls.collect::<Vec<_>>() {
        let result = call.await.unwrap();
        assert!(result.ok, "{result:?}");
    }
    assert_eq!(provider.total_calls(), 8);
    assert_eq!(provider.max_in_flight(), 1, "calls of the two replicas overlapped");
}
