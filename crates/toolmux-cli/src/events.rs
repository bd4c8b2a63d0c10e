//! The gateway's event stream (`GET /api/events` of `toolmux serve --http`): the
//! orchestrator's events, as the server sends them.

use futures::StreamExt as _;
use futures::stream::BoxStream;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use toolmux::toolmux_mcp::server::{EventSource, ServedEvent};
use toolmux::toolmux_orchestrator::accounting::CallStatus;
use toolmux::toolmux_orchestrator::{Orchestrator, ToolEvent};

/// Every call's events of the orchestrator serving, across reloads: a stream follows the
/// new orchestrator from a reload on, and the old one's until its last calls have ended.
#[derive(Debug)]
pub(crate) struct CallEvents(pub(crate) crate::reload::Current);

/// What one stream listens to.
struct Following {
    current: crate::reload::Current,
    reloads: watch::Receiver<u64>,
    /// The orchestrators followed: the one serving, and replaced ones still draining.
    orchestrators: Vec<broadcast::Receiver<ToolEvent>>,
}

/// What happened next to a stream.
enum Next {
    Event(Box<Result<ToolEvent, RecvError>>, usize),
    Reloaded,
    /// The server stopped reloading (shutting down).
    NoMoreReloads,
}

impl EventSource for CallEvents {
    fn subscribe(&self) -> BoxStream<'static, ServedEvent> {
        let orchestrator: Orchestrator = self.0.get().orchestrator().clone();
        let following = Following {
            current: self.0.clone(),
            reloads: self.0.reloads(),
            orchestrators: vec![orchestrator.subscribe()],
        };
        futures::stream::unfold((following, true), |(mut state, mut reloading)| async move {
            loop {
                if state.orchestrators.is_empty() && !reloading {
                    return None;
                }
                let next = {
                    let events = state
                        .orchestrators
                        .iter_mut()
                        .map(|events| Box::pin(events.recv()))
                        .collect::<Vec<_>>();
                    let any_event = async {
                        if events.is_empty() {
                            std::future::pending().await
                        } else {
                            let (event, index, _) = futures::future::select_all(events).await;
                            Next::Event(Box::new(event), index)
                        }
                    };
                    let reloaded = async {
                        if !reloading {
                            std::future::pending::<()>().await;
                        }
                        match state.reloads.changed().await {
                            Ok(()) => Next::Reloaded,
                            Err(_) => Next::NoMoreReloads,
                        }
                    };
                    tokio::select! {
                        next = any_event => next,
                        next = reloaded => next,
                    }
                };
                match next {
                    Next::Reloaded => {
                        let orchestrator = state.current.get().orchestrator().clone();
                        state.orchestrators.push(orchestrator.subscribe());
                    }
                    Next::NoMoreReloads => reloading = false,
                    Next::Event(event, index) => match *event {
                        Err(RecvError::Closed) => {
                            state.orchestrators.remove(index);
                        }
                        Err(RecvError::Lagged(missed)) => {
                            let lagged = ServedEvent {
                                name: "lagged",
                                op_id: 0,
                                run_id: None,
                                tool: None,
                                data: json!({"missed": missed}),
                            };
                            return Some((lagged, (state, reloading)));
                        }
                        Ok(event) => return Some((served(event), (state, reloading))),
                    },
                }
            }
        })
        .boxed()
    }
}

/// `event` in the stream's words: camelCase, and a call's end named by how it went.
fn served(event: ToolEvent) -> ServedEvent {
    match event {
        ToolEvent::ToolStarted { op_id, parent_op_id, run_id, call_id, tool, kind, arguments } => {
            let mut data = json!({
                "opId": op_id,
                "parentOpId": parent_op_id,
                "runId": run_id,
                "callId": call_id,
                "tool": tool,
                "kind": kind,
            });
            // Only for tools shown to people (`visible`), which a user interface renders.
            if let Some(arguments) = arguments {
                data["arguments"] = arguments;
            }
            ServedEvent {
                name: "tool.started",
                op_id,
                run_id: Some(run_id),
                tool: Some(tool),
                data,
            }
        }
        ToolEvent::ToolProgress { op_id, tool, progress } => {
            let data = json!({
                "opId": op_id,
                "tool": tool,
                "progress": progress.progress,
                "total": progress.total,
                "message": progress.message,
            });
            ServedEvent { name: "tool.progress", op_id, run_id: None, tool: Some(tool), data }
        }
        ToolEvent::ToolStreaming { parent_op_id, run_id, call_id, tool, arguments_delta } => {
            let data = json!({
                "parentOpId": parent_op_id,
                "runId": run_id,
                "callId": call_id,
                "tool": tool,
                "argumentsDelta": arguments_delta,
            });
            ServedEvent {
                name: "tool.streaming",
                op_id: parent_op_id.unwrap_or(0),
                run_id: Some(run_id),
                tool: Some(tool),
                data,
            }
        }
        ToolEvent::AgentText { op_id, parent_op_id, run_id, agent, text, restart } => {
            let mut data = json!({
                "opId": op_id,
                "parentOpId": parent_op_id,
                "runId": run_id,
                "agent": agent,
                "text": text,
            });
            if restart {
                data["restart"] = json!(true);
            }
            ServedEvent { name: "agent.text", op_id, run_id: Some(run_id), tool: None, data }
        }
        ToolEvent::ToolFinished { record, result } => {
            let failed = record.status == CallStatus::Failed;
            let mut data = json!({
                "opId": record.op_id,
                "parentOpId": record.parent_op_id,
                "runId": record.run_id,
                "callId": record.call_id,
                "tool": record.tool,
                "kind": record.kind,
                "ok": !failed,
                "errorCode": record.error_code,
                "latencyMs": record.latency_ms,
                "queuedMs": record.queued_ms,
                "charsIn": record.chars_in,
                "charsOut": record.chars_out,
                "cached": record.cached,
                "spilled": record.spilled,
                "attempts": record.attempts,
            });
            if let Some(result) = result {
                data["result"] = json!(result);
            }
            ServedEvent {
                name: if failed { "tool.error" } else { "tool.done" },
                op_id: record.op_id,
                run_id: Some(record.run_id),
                tool: Some(record.tool),
                data,
            }
        }
    }
}
