//! MCP Apps through the gateway (`catalog::apps`): a backend's `ui://` resources listed and read
//! under its name, each App readable by the callers who may use a tool that shows it, and the
//! link to the App carried by call_tool's result for hosts that meet the tool only there.

use std::sync::Arc;

use rmcp::model::{CallToolResponse, ReadResourceRequestParams, ReadResourceResult, Resource, ResourceContents};

use super::GatewayHandler;
use crate::catalog::apps;
use crate::session::{Access, Caller, Snapshot};
use crate::upstream::Backend;

impl GatewayHandler {
    /// The backend behind an App's exposed `ui://<backend>/…` URI, and `request` for its own
    /// URI, when `caller` may read it: it may use that backend whole, or a tool in its scope
    /// (`snap`) shows this App. Anything else comes back as it came, to be looked up as any
    /// resource (and not found, for an App the caller has no tool of).
    pub(super) fn app_resource(
        &self,
        caller: &Caller,
        snap: &Snapshot,
        mut request: ReadResourceRequestParams,
    ) -> Result<(Arc<Backend>, ReadResourceRequestParams), ReadResourceRequestParams> {
        let Some((name, original)) = apps::original(&request.uri) else { return Err(request) };
        let Some(backend) = self.advertisable_backends().find(|b| b.name() == name) else { return Err(request) };
        let whole = self.gw.policy().backend(caller, name) == Access::All;
        let shown = || {
            snap.tools().any(|t| &*t.key.backend == name && apps::resource_uri(&t.tool) == Some(request.uri.as_str()))
        };
        if !whole && !shown() {
            return Err(request);
        }
        request.uri = original;
        Ok((backend, request))
    }
}

/// The tool an App calls by its backend's own name (`get-time`: the App's code was written for
/// its server, not for the gateway, which exposes the tool as `vanilla_get-time`): the one tool
/// in the caller's scope with that name on a backend whose tools show Apps; none when two
/// backends have one.
pub(super) fn app_named<'a>(snap: &'a Snapshot, name: &str) -> Option<&'a crate::catalog::CatalogTool> {
    let shows_apps =
        |backend: &str| snap.tools().any(|t| &*t.key.backend == backend && apps::resource_uri(&t.tool).is_some());
    let mut named = snap.tools().filter(|t| &*t.key.tool == name && shows_apps(&t.key.backend));
    let one = named.next()?;
    named.next().is_none().then_some(one)
}

/// One of `backend`'s resources as listed: an App's under the backend's name.
pub(super) fn serve_resource(backend: &str, r: &mut Resource) {
    if let Some(uri) = apps::exposed(backend, &r.uri) {
        r.uri = uri;
    }
}

/// `backend`'s answer to a read as the client asked for it: its Apps' URIs under its name.
pub(super) fn served_as(backend: &str, result: &mut ReadResourceResult) {
    for c in &mut result.contents {
        let (ResourceContents::TextResourceContents { uri, .. } | ResourceContents::BlobResourceContents { uri, .. }) =
            c
        else {
            continue;
        };
        if let Some(mine) = apps::exposed(backend, uri) {
            *uri = mine;
        }
    }
}

/// call_tool's `answer` for the tool exposed as `name`, with the link to its App in `_meta` (a
/// host that met the tool through find_tool renders the App from it); the result's own keys win.
pub(super) fn with_app(snap: &Snapshot, name: &str, mut answer: CallToolResponse) -> CallToolResponse {
    if let (CallToolResponse::Complete(r), Some(ui)) =
        (&mut answer, snap.tool(name).and_then(|t| apps::meta_of(&t.tool)))
    {
        let meta = r.meta.get_or_insert_with(Default::default);
        for (k, v) in ui {
            meta.0.entry(k).or_insert(v);
        }
    }
    answer
}
