//! An OpenAPI import whose document could not be read when it was configured: it is read
//! again when the provider is started, and the orchestrator tries that again in the
//! background until it works, as for an MCP server that does not start.

use crate::{OpenApiConfig, RestError, RestProvider};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Mutex;
use toolmux_core::{CallContext, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec};

/// The provider of an import whose first reading failed ([`OpenApiImport::start`]).
pub struct OpenApiImport {
    name: String,
    namespace: String,
    config: OpenApiConfig,
    /// The loader's values from the environment ([`RestProvider::with_secrets`]).
    secrets: Vec<String>,
    /// The first reading's failure, reported by the first start without reading again.
    first: Mutex<Option<String>>,
    built: tokio::sync::OnceCell<RestProvider>,
    /// Set by [`ToolProvider::shutdown`]: the import stays shut down, its document never
    /// read after that. Looked at and set under its lock together with `built`, so that a
    /// reading under way when the import is shut down is shut down by one or the other.
    shut_down: Mutex<bool>,
}

/// Names the import, without its configuration and secrets.
impl std::fmt::Debug for OpenApiImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenApiImport")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("read", &self.built.initialized())
            .finish_non_exhaustive()
    }
}

impl OpenApiImport {
    /// Tries the import of `config` under `name` now: the provider when the document reads
    /// and imports, else one that tries again when started ([`ToolProvider::warmup`]),
    /// with the error. A namespace that can never be valid is an error at once.
    pub async fn start(
        name: &str,
        config: &OpenApiConfig,
    ) -> Result<Result<RestProvider, (OpenApiImport, RestError)>, RestError> {
        let namespace = config.namespace.as_deref().unwrap_or(name).to_owned();
        crate::provider::check_namespace(&namespace)?;
        match RestProvider::openapi(name, config).await {
            Ok(provider) => Ok(Ok(provider)),
            Err(error) => {
                let later = OpenApiImport {
                    name: name.to_owned(),
                    namespace,
                    config: config.clone(),
                    secrets: Vec::new(),
                    first: Mutex::new(Some(error.to_string())),
                    built: tokio::sync::OnceCell::new(),
                    shut_down: Mutex::new(false),
                };
                Ok(Err((later, error)))
            }
        }
    }

    /// The values the loader took from the environment, given to the provider once the
    /// document is read ([`RestProvider::with_secrets`]).
    pub fn with_secrets<I, S>(mut self, values: I) -> OpenApiImport
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.secrets.extend(values.into_iter().map(|v| v.as_ref().to_owned()));
        self
    }

    /// Whether the import was shut down.
    fn is_shut_down(&self) -> bool {
        *self.shut_down.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The import, read now if it was not yet: never once it is shut down.
    async fn provider(&self) -> Result<&RestProvider, ToolError> {
        let unavailable = |message: String| ToolError::Unavailable {
            provider: self.namespace.clone(),
            message: crate::secrets::scrub(&message, &crate::secrets::forms_of(&self.secrets)),
        };
        if self.is_shut_down() {
            return Err(unavailable("shut down".into()));
        }
        if let Some(provider) = self.built.get() {
            return Ok(provider);
        }
        if let Some(first) = self.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(unavailable(first));
        }
        let provider = self
            .built
            .get_or_try_init(|| async {
                let provider = RestProvider::openapi(&self.name, &self.config)
                    .await
                    .map_err(|e| unavailable(e.to_string()))?
                    .with_secrets(&self.secrets);
                tracing::info!(openapi = %self.name, "the OpenAPI document was read: its tools join");
                for warning in provider.warnings() {
                    tracing::warn!("openapi `{}`: {warning}", self.name);
                }
                Ok(provider)
            })
            .await?;
        // Shut down while the document was read: the provider read is shut down too (by
        // `shutdown` when it found it built, else here), and not used.
        if self.is_shut_down() {
            provider.shutdown().await?;
            return Err(unavailable("shut down".into()));
        }
        Ok(provider)
    }
}

#[async_trait]
impl ToolProvider for OpenApiImport {
    fn kind(&self) -> ToolKind {
        ToolKind::Rest
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn warmup(&self) -> Result<(), ToolError> {
        self.provider().await.map(|_| ())
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        self.provider().await?.list_tools().await
    }

    async fn has_tool(&self, name: &str) -> bool {
        match self.built.get() {
            Some(provider) => provider.has_tool(name).await,
            None => false,
        }
    }

    fn cache_partition(&self, tool: &str, ctx: &CallContext) -> Option<String> {
        self.built.get()?.cache_partition(tool, ctx)
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.provider().await?.call(name, arguments, ctx).await
    }

    /// Shuts the provider down if the document was read, and the import for good: a later
    /// start or call fails saying it was shut down, without reading the document.
    async fn shutdown(&self) -> Result<(), ToolError> {
        let built = {
            let mut shut_down = self.shut_down.lock().unwrap_or_else(|e| e.into_inner());
            *shut_down = true;
            self.built.get()
        };
        match built {
            Some(provider) => provider.shutdown().await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document that is missing when configured is reported, and read when it appears.
    #[tokio::test]
    async fn a_document_that_appears_later_is_read_on_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let config: OpenApiConfig =
            serde_json::from_value(serde_json::json!({"spec": "api.json"})).unwrap();
        let config = config.with_base_dir(dir.path().to_path_buf());
        let Err((later, error)) = OpenApiImport::start("api", &config).await.unwrap() else {
            panic!("the document is missing");
        };
        assert!(error.to_string().contains("api.json"), "{error}");
        // The first start reports the first failure, without reading again.
        let first = later.warmup().await.unwrap_err().to_string();
        assert!(first.contains("api.json"), "{first}");
        assert!(later.list_tools().await.is_err());
        std::fs::write(
            dir.path().join("api.json"),
            r#"{"openapi": "3.0.0", "info": {"title": "t", "version": "1"},
                "servers": [{"url": "http://127.0.0.1:9"}],
                "paths": {"/ping": {"get": {"operationId": "ping", "responses": {"200": {"description": "ok"}}}}}}"#,
        )
        .unwrap();
        later.warmup().await.unwrap();
        let names: Vec<String> =
            later.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["ping"]);
        assert!(later.has_tool("ping").await);
    }

    /// An import shut down before its document was read stays shut down: a later start,
    /// listing or call fails saying so, and the document, there by then, is not read. It
    /// was read, and the provider built, as if the import had not been shut down.
    #[tokio::test]
    async fn an_import_shut_down_before_its_document_was_read_stays_shut_down() {
        let dir = tempfile::tempdir().unwrap();
        let config: OpenApiConfig =
            serde_json::from_value(serde_json::json!({"spec": "api.json"})).unwrap();
        let config = config.with_base_dir(dir.path().to_path_buf());
        let Err((later, _)) = OpenApiImport::start("api", &config).await.unwrap() else {
            panic!("the document is missing");
        };
        std::fs::write(
            dir.path().join("api.json"),
            r#"{"openapi": "3.0.0", "info": {"title": "t", "version": "1"},
                "servers": [{"url": "http://127.0.0.1:9"}],
                "paths": {"/ping": {"get": {"operationId": "ping", "responses": {"200": {"description": "ok"}}}}}}"#,
        )
        .unwrap();
        later.shutdown().await.unwrap();
        for failed in [
            later.warmup().await.unwrap_err(),
            later.list_tools().await.unwrap_err(),
            later.call("ping", Value::Null, &CallContext::new()).await.unwrap_err(),
        ] {
            assert!(
                matches!(&failed, ToolError::Unavailable { message, .. } if message == "shut down"),
                "{failed:?}"
            );
        }
        assert!(!later.has_tool("ping").await);
        assert!(format!("{later:?}").contains("read: false"), "{later:?}");
    }

    #[tokio::test]
    async fn a_bad_namespace_is_an_error_at_once() {
        let config: OpenApiConfig =
            serde_json::from_value(serde_json::json!({"spec": "x.json", "namespace": "a b"}))
                .unwrap();
        assert!(OpenApiImport::start("api", &config).await.is_err());
    }
}
