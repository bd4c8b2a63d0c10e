//! What each kind of MCP client accepts in tool names and input schemas.
//!
//! A gateway's tools reach a model through its client, and clients pass on names and
//! schemas that their model's API then refuses: Claude Code shows tools as
//! `mcp__{server}__{tool}` and the Claude API takes at most 64 characters and no
//! `anyOf`/`oneOf`/`allOf` at the top of an input schema; OpenAI's API refuses the same
//! unions and an object schema without `properties`; Cursor drops tools whose server and
//! tool names are together over 60 characters; Gemini CLI shows `mcp_{server}_{tool}` in 63
//! characters and Gemini takes only an OpenAPI subset of JSON Schema. A [`ClientProfile`]
//! names the client, and the gateway serves names and schemas it accepts. Calls are still
//! routed by the original names and validated against the original schemas.

use toolmux_core::schema::SchemaRules;

/// The MCP client a gateway serves: what it accepts in tool names and input schemas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientProfile {
    /// Names and schemas as they are.
    #[default]
    Generic,
    /// Claude Code and Claude Desktop: `mcp__{server}__` before each name, 64 characters
    /// in all; no union at the top of an input schema.
    Claude,
    /// Codex: `mcp__{server}__` before each name, 64 characters in all; OpenAI's schema
    /// rules.
    Codex,
    /// OpenAI's API and Agents SDK: names of up to 64 characters; no union at the top of an
    /// input schema, and `properties` on every top-level object.
    OpenAi,
    /// Cursor: the server's name and the tool's together within 60 characters; the
    /// schema rules of the models behind it (Claude's and OpenAI's).
    Cursor,
    /// Gemini CLI: `mcp_{server}_` before each name, 63 characters in all; Gemini's OpenAPI
    /// subset of JSON Schema (`$ref`s inlined, `nullable`, string `enum`s).
    Gemini,
}

impl ClientProfile {
    /// Every profile with the name `--client` takes for it.
    pub const ALL: [(&'static str, ClientProfile); 6] = [
        ("generic", ClientProfile::Generic),
        ("claude", ClientProfile::Claude),
        ("codex", ClientProfile::Codex),
        ("openai", ClientProfile::OpenAi),
        ("cursor", ClientProfile::Cursor),
        ("gemini", ClientProfile::Gemini),
    ];

    /// The profile named `name` (see [`ClientProfile::ALL`]).
    pub fn from_name(name: &str) -> Option<ClientProfile> {
        Self::ALL.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, p)| *p)
    }

    /// The profile's name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, p)| *p == self).map_or("generic", |(n, _)| n)
    }

    /// What this client puts before each tool name when the gateway is registered with it
    /// as `server`; `None` when it puts nothing.
    pub fn name_prefix(self, server: &str) -> Option<String> {
        match self {
            ClientProfile::Generic | ClientProfile::OpenAi => None,
            ClientProfile::Claude | ClientProfile::Codex => Some(format!("mcp__{server}__")),
            ClientProfile::Cursor => Some(server.to_owned()),
            ClientProfile::Gemini => Some(format!("mcp_{server}_")),
        }
    }

    /// The characters a full name (prefix included) may have.
    pub fn name_budget(self) -> usize {
        match self {
            ClientProfile::Cursor => 60,
            ClientProfile::Gemini => 63,
            _ => toolmux_core::naming::DEFAULT_BUDGET,
        }
    }

    /// The profile of the client whose `initialize` names it `client_name`
    /// (`clientInfo.name`): Claude Code (`claude-code`) and Claude Desktop (`claude-ai`),
    /// Codex (`codex-mcp-client`), Cursor (`cursor-vscode`), Gemini CLI; `None` for
    /// another.
    pub fn detect(client_name: &str) -> Option<ClientProfile> {
        let name = client_name.to_ascii_lowercase();
        [
            ("claude", ClientProfile::Claude),
            ("codex", ClientProfile::Codex),
            ("cursor", ClientProfile::Cursor),
            ("gemini", ClientProfile::Gemini),
        ]
        .into_iter()
        .find(|(word, _)| name.contains(word))
        .map(|(_, profile)| profile)
    }

    /// How input schemas are rewritten for this client.
    pub fn schema_rules(self) -> SchemaRules {
        let plain = SchemaRules { plain_top_level: true, ..SchemaRules::default() };
        match self {
            ClientProfile::Generic => SchemaRules::default(),
            ClientProfile::Claude => plain,
            ClientProfile::Codex | ClientProfile::OpenAi | ClientProfile::Cursor => {
                SchemaRules { top_level_properties: true, ..plain }
            }
            ClientProfile::Gemini => {
                SchemaRules { inline_refs: true, openapi_subset: true, ..plain }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_told_by_the_name_they_give() {
        let detect = ClientProfile::detect;
        assert_eq!(detect("claude-code"), Some(ClientProfile::Claude));
        assert_eq!(detect("claude-ai"), Some(ClientProfile::Claude));
        assert_eq!(detect("codex-mcp-client"), Some(ClientProfile::Codex));
        assert_eq!(detect("cursor-vscode"), Some(ClientProfile::Cursor));
        assert_eq!(detect("gemini-cli-mcp-client"), Some(ClientProfile::Gemini));
        assert_eq!(detect("Visual Studio Code"), None);
        assert_eq!(detect("mcp"), None);
    }

    #[test]
    fn names_round_trip_and_every_profile_has_rules_or_names() {
        for (name, profile) in ClientProfile::ALL {
            assert_eq!(ClientProfile::from_name(name), Some(profile));
            assert_eq!(profile.name(), name);
            let changes = !profile.schema_rules().is_identity()
                || profile.name_prefix("toolmux").is_some()
                || profile.name_budget() != 64;
            assert_eq!(changes, profile != ClientProfile::Generic, "{name}");
        }
        assert_eq!(ClientProfile::from_name("Claude"), Some(ClientProfile::Claude));
        assert_eq!(ClientProfile::from_name("vim"), None);
    }
}
