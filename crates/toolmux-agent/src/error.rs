//! What can be wrong with agents before they run.

/// A configuration of agents that cannot work, or a run that cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No agent of that name is configured.
    #[error("unknown agent `{name}`{}", known_agents(.known))]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The configured agents.
        known: Vec<String>,
    },
    /// The configuration of agents is inconsistent.
    #[error("agents.{agent}: {message}")]
    Config {
        /// The agent (or `router`) whose configuration is wrong.
        agent: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The agents' orchestrator is gone or was never attached.
    #[error("agents are not attached to a running orchestrator")]
    Detached,
    /// A run cannot resume as asked.
    #[error("cannot resume: {0}")]
    Resume(String),
}

fn known_agents(names: &[String]) -> String {
    if names.is_empty() {
        "; no agents are configured (add one under `agents`)".to_owned()
    } else {
        format!("; configured: {}", names.join(", "))
    }
}
