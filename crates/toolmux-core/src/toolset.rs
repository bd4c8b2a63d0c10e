//! A provider built from closures, with input schemas derived from Rust types.

use crate::{
    CallContext, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
    schema_for,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

type Handler = Arc<
    dyn Fn(Value, CallContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync,
>;

/// A [`ToolProvider`] made of tools given as async closures.
///
/// Typed tools take a Rust type as input; its JSON Schema (via `schemars`) is the tool's
/// input schema and arguments are deserialized into it before the closure runs.
#[derive(Clone)]
pub struct ToolSet {
    namespace: String,
    kind: ToolKind,
    instructions: Option<String>,
    specs: Vec<ToolSpec>,
    handlers: HashMap<String, Handler>,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("ToolSet")
            .field("namespace", &self.namespace)
            .field("kind", &self.kind)
            .field("tools", &names)
            .finish()
    }
}

impl ToolSet {
    /// An empty set under `namespace`.
    pub fn new(namespace: impl Into<String>, kind: ToolKind) -> Self {
        ToolSet {
            namespace: namespace.into(),
            kind,
            instructions: None,
            specs: Vec::new(),
            handlers: HashMap::new(),
        }
    }

    /// Sets the instructions returned by [`ToolProvider::instructions`].
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Adds a tool taking raw JSON arguments. A tool of the same name is replaced.
    pub fn with_tool<F, Fut>(mut self, spec: ToolSpec, handler: F) -> Self
    where
        F: Fn(Value, CallContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |args, ctx| Box::pin(handler(args, ctx)));
        self.specs.retain(|s| s.name != spec.name);
        self.handlers.insert(spec.name.clone(), handler);
        self.specs.push(spec);
        self
    }

    /// The set without the tool `name` (as it was when `name` is none of its tools).
    pub fn without_tool(mut self, name: &str) -> Self {
        self.specs.retain(|s| s.name != name);
        self.handlers.remove(name);
        self
    }

    /// Adds a tool whose input is the Rust type `I`.
    pub fn with_typed<I, F, Fut>(self, name: &str, description: &str, handler: F) -> Self
    where
        I: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(I, CallContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        self.with_typed_annotated(name, description, ToolAnnotations::default(), handler)
    }

    /// Adds a typed tool with annotations.
    pub fn with_typed_annotated<I, F, Fut>(
        self,
        name: &str,
        description: &str,
        annotations: ToolAnnotations,
        handler: F,
    ) -> Self
    where
        I: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        F: Fn(I, CallContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        let spec =
            ToolSpec::new(name, description, schema_for::<I>()).with_annotations(annotations);
        let tool = name.to_owned();
        let handler = Arc::new(handler);
        self.with_tool(spec, move |args: Value, ctx| {
            let parsed = serde_json::from_value::<I>(args)
                .map_err(|e| ToolError::invalid_arguments(tool.clone(), e.to_string()));
            let handler = handler.clone();
            async move { handler(parsed?, ctx).await }
        })
    }
}

#[async_trait]
impl ToolProvider for ToolSet {
    fn kind(&self) -> ToolKind {
        self.kind
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.specs.clone())
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.handlers.contains_key(name)
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some(handler) = self.handlers.get(name) else {
            return Err(ToolError::UnknownTool {
                name: format!("{}__{name}", self.namespace),
                suggestions: Vec::new(),
            });
        };
        handler(arguments, ctx.clone()).await
    }

    fn instructions(&self) -> Option<String> {
        self.instructions.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Echo {
        /// What to echo.
        text: String,
        /// How often.
        times: Option<u32>,
    }

    #[tokio::test]
    async fn typed_tool_schema_and_call() {
        let set = ToolSet::new("demo", ToolKind::Builtin).with_typed(
            "echo",
            "Echo text",
            |input: Echo, _ctx| async move { Ok(ToolOutput::text(input.text)) },
        );
        let tools = set.list_tools().await.unwrap();
        let schema = &tools[0].input_schema;
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["text"]));
        assert_eq!(schema["properties"]["text"]["description"], "What to echo.");
        assert!(schema.get("title").is_none());
        let out = set.call("echo", json!({"text": "hi"}), &CallContext::new()).await.unwrap();
        assert_eq!(out.to_text(), "hi");
        let err = set.call("echo", json!({"txt": "hi"}), &CallContext::new()).await.unwrap_err();
        assert_eq!(err.code(), "invalid_arguments");
        assert!(set.has_tool("echo").await);
        assert!(!set.has_tool("nope").await);
    }
}
