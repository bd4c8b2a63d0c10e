//! A server's `-32042` answer to a call (2025-11-25, "URL elicitation required"): the call
//! cannot run until the user has opened one or more URLs (to sign in to a third party,
//! say). Each URL goes to the call's caller as a URL elicitation
//! ([`CallContext::elicit_url`]: the gateway's own MCP client, a person at a terminal);
//! once every one was accepted the call is sent again, once. A caller that cannot show
//! URLs, or a user who declines, gets a tool error that names the URLs, so that a model
//! can pass them on and call again later.
//!
//! The call is sent again as soon as the user accepted; a server that has not seen the
//! user finish yet answers `-32042` again, which ends the call with the same error.

use rmcp::service::ServiceError;
use serde_json::Value;
use toolmux_core::{CallContext, ElicitationAction, ToolError, UrlElicitationRequest};

use super::{Inner, Waited};

/// JSON-RPC code of a call that needs URL elicitations first.
const URL_ELICITATION_REQUIRED: i32 = -32042;
/// At most this many URLs are shown for one call.
const MAX_URLS: usize = 4;

/// The URLs a `-32042` answer asks the user to open, if that is the answer.
pub(super) fn required(waited: &Waited) -> Option<Vec<UrlElicitationRequest>> {
    let Waited::Reply(Err(ServiceError::McpError(error))) = waited else { return None };
    if error.code.0 != URL_ELICITATION_REQUIRED {
        return None;
    }
    let listed = error.data.as_ref()?.get("elicitations")?.as_array()?;
    let urls: Vec<UrlElicitationRequest> = listed
        .iter()
        .filter_map(|e| {
            let url = e.get("url")?.as_str()?;
            let message = e.get("message").and_then(Value::as_str).unwrap_or_default();
            let id = e.get("elicitationId").and_then(Value::as_str).unwrap_or_default();
            Some(UrlElicitationRequest::new(message, url).with_elicitation_id(id))
        })
        .take(MAX_URLS)
        .collect();
    (!urls.is_empty()).then_some(urls)
}

/// The error for a call whose server still asks for URLs after they were opened.
pub(super) fn still_required(name: &str, urls: &[UrlElicitationRequest]) -> ToolError {
    ToolError::remote(
        name,
        format!(
            "the server still needs the user to open {} before `{name}` can run: finish there, then call again",
            shown(urls.iter())
        ),
    )
}

fn shown<'a>(urls: impl Iterator<Item = &'a UrlElicitationRequest>) -> String {
    let each = urls.map(|u| match u.message.trim() {
        "" => u.url.clone(),
        message => format!("{} ({message})", u.url),
    });
    each.collect::<Vec<_>>().join("; ")
}

impl Inner {
    /// Asks the caller's user to open each URL; fails unless every one was accepted.
    pub(super) async fn open_urls(
        &self,
        name: &str,
        urls: Vec<UrlElicitationRequest>,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        for request in urls {
            let url = shown(std::iter::once(&request));
            tracing::debug!(server = %self.name, tool = name, url = %request.url, "the server needs a URL opened");
            let id = request.elicitation_id.clone();
            match ctx.elicit_url(request).await {
                Ok(ElicitationAction::Accept) => {
                    if let Some(caller) = ctx.handler() {
                        self.events.url_accepted(&id, caller);
                    }
                }
                Ok(action) => {
                    let message = format!(
                        "the server needs the user to open {url} before `{name}` can run; the user did not ({action})"
                    );
                    return Err(ToolError::remote(name, message));
                }
                Err(ToolError::Unsupported { .. }) => {
                    let message = format!(
                        "the server needs the user to open {url} before `{name}` can run; nobody here can show a URL: open it, then call again"
                    );
                    return Err(ToolError::remote(name, message));
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}
