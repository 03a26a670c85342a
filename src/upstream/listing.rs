//! What a backend offers: its tools, prompts, resources and templates, and what it says of
//! itself, read in one pass after it connects.

use std::sync::Arc;

use rmcp::model::Tool;
use rmcp::service::{Peer, RoleClient};

use crate::catalog::ledger::Parts;
use crate::catalog::text::server_label;

/// What a backend offers, as last listed.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The server's label for search text: its `serverInfo` title or name ([`server_label`]).
    pub server: Option<String>,
    /// What the server says it is for: its `serverInfo` description, else its instructions.
    pub about: Option<String>,
    /// Its `initialize` instructions, if any.
    pub instructions: Option<String>,
    pub tools: Vec<Tool>,
    /// Its prompts, resources and resource templates.
    pub parts: Arc<Parts>,
}

pub(super) async fn list_everything(peer: &Peer<RoleClient>) -> anyhow::Result<Listing> {
    let info = peer.peer_info();
    let caps = info.as_ref().map(|i| i.capabilities.clone()).unwrap_or_default();
    let server =
        info.as_ref().and_then(|i| i.server_info.as_ref()).and_then(|s| server_label(s.title.as_deref(), &s.name));
    let tools = if caps.tools.is_some() { peer.list_all_tools().await? } else { Vec::new() };
    let (mut resources, mut templates, mut prompts) = (Vec::new(), Vec::new(), Vec::new());
    if caps.resources.is_some() {
        resources = peer.list_all_resources().await.unwrap_or_else(|e| {
            tracing::warn!(%e, "resources/list failed");
            Vec::new()
        });
        templates = peer.list_all_resource_templates().await.unwrap_or_default();
    }
    if caps.prompts.is_some() {
        prompts = peer.list_all_prompts().await.unwrap_or_else(|e| {
            tracing::warn!(%e, "prompts/list failed");
            Vec::new()
        });
    }
    let instructions = info.as_ref().and_then(|i| i.instructions.clone()).filter(|s| !s.trim().is_empty());
    let about = info
        .as_ref()
        .and_then(|i| i.server_info.as_ref())
        .and_then(|s| s.description.clone())
        .filter(|s| !s.trim().is_empty())
        .or_else(|| instructions.clone());
    let parts = Arc::new(Parts { prompts, resources, templates });
    Ok(Listing { server, about, instructions, tools, parts })
}
