//! What can go wrong while loading the configuration and assembling the tools.

use std::path::PathBuf;

/// Why toolmux could not be set up from its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolmuxError {
    /// The configuration file could not be read.
    #[error("cannot read the configuration file {file}")]
    Read {
        /// The file, as shown to the user.
        file: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is invalid: bad syntax, an unknown key, a wrong type, an unset
    /// variable, a setting that contradicts another.
    #[error("{}", located(file, *line, *column, message))]
    Config {
        /// The file, as shown to the user.
        file: String,
        /// 1-based line, when the format tells.
        line: Option<usize>,
        /// 1-based column, when the format tells.
        column: Option<usize>,
        /// What is wrong, and how to fix it when that is clear.
        message: String,
    },
    /// A provider could not be set up (an OpenAPI document could not be read or
    /// imported).
    #[error("provider `{namespace}` failed to start")]
    Provider {
        /// The provider's namespace.
        namespace: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Statistics could not be read or written.
    #[error("statistics file {path}")]
    Stats {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: toolmux_orchestrator::accounting::StatsError,
    },
}

impl ToolmuxError {
    /// Whether the configuration is at fault (as opposed to a provider or the machine).
    pub fn is_config(&self) -> bool {
        matches!(self, ToolmuxError::Read { .. } | ToolmuxError::Config { .. })
    }

    /// A configuration error about `file` with no line to point at.
    pub fn config(file: &str, message: impl Into<String>) -> ToolmuxError {
        ToolmuxError::Config {
            file: file.to_owned(),
            line: None,
            column: None,
            message: message.into(),
        }
    }
}

fn located(file: &str, line: Option<usize>, column: Option<usize>, message: &str) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!("{file}:{line}:{column}: {message}"),
        (Some(line), None) => format!("{file}:{line}: {message}"),
        _ => format!("{file}: {message}"),
    }
}
