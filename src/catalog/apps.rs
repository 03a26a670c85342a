//! MCP Apps (the `io.modelcontextprotocol/ui` extension): a tool links the HTML of its App, a
//! `ui://` resource, from `_meta.ui.resourceUri` (and the older flat key `_meta["ui/resourceUri"]`).
//! Two backends may both serve `ui://app/index.html`, so the gateway serves each backend's UI
//! resources under its name, `ui://<backend>/<the backend's own URI after ui://>`, rewrites the
//! links in the tools it exposes to match, and maps a read of such a URI back to the backend.

use rmcp::model::Tool;
use serde_json::Value;

pub const SCHEME: &str = "ui://";
/// `_meta.ui`: the App's settings, `resourceUri` among them.
pub const META_UI: &str = "ui";
/// The flat key earlier drafts and SDKs still write beside `_meta.ui.resourceUri`.
pub const META_FLAT: &str = "ui/resourceUri";

/// `backend`'s own `ui://` URI as the gateway serves it; `None` for any other URI.
pub fn exposed(backend: &str, uri: &str) -> Option<String> {
    uri.strip_prefix(SCHEME).map(|rest| format!("{SCHEME}{backend}/{rest}"))
}

/// The backend and its own URI behind an exposed `ui://<backend>/…` URI.
pub fn original(uri: &str) -> Option<(&str, String)> {
    let (backend, rest) = uri.strip_prefix(SCHEME)?.split_once('/')?;
    (!backend.is_empty() && !rest.is_empty()).then(|| (backend, format!("{SCHEME}{rest}")))
}

/// Rewrites `tool`'s links to its App for `backend` (both keys, where present).
pub fn rewrite(tool: &mut Tool, backend: &str) {
    let Some(meta) = tool.meta.as_mut() else { return };
    if let Some(Value::Object(ui)) = meta.0.get_mut(META_UI)
        && let Some(Value::String(uri)) = ui.get_mut("resourceUri")
        && let Some(mine) = exposed(backend, uri)
    {
        *uri = mine;
    }
    if let Some(Value::String(uri)) = meta.0.get_mut(META_FLAT)
        && let Some(mine) = exposed(backend, uri)
    {
        *uri = mine;
    }
}

/// The `ui://` resource `tool` (as exposed) shows its App from, if any.
pub fn resource_uri(tool: &Tool) -> Option<&str> {
    let meta = &tool.meta.as_ref()?.0;
    let nested = meta.get(META_UI).and_then(|ui| ui.get("resourceUri")).and_then(Value::as_str);
    nested.or_else(|| meta.get(META_FLAT).and_then(Value::as_str)).filter(|u| u.starts_with(SCHEME))
}

/// What a host needs to render `tool`'s App when it learns of the tool other than from
/// `tools/list` (find_tool's answer, call_tool's result): its `_meta.ui`, and the flat key.
pub fn meta_of(tool: &Tool) -> Option<serde_json::Map<String, Value>> {
    let uri = resource_uri(tool)?;
    let meta = &tool.meta.as_ref()?.0;
    let mut ui = meta.get(META_UI).and_then(Value::as_object).cloned().unwrap_or_default();
    ui.insert("resourceUri".into(), uri.into());
    let mut out = serde_json::Map::new();
    out.insert(META_UI.into(), Value::Object(ui));
    out.insert(META_FLAT.into(), uri.into());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(meta: Value) -> Tool {
        serde_json::from_value(serde_json::json!({
            "name": "t", "inputSchema": {"type": "object"}, "_meta": meta
        }))
        .unwrap()
    }

    #[test]
    fn ui_links_are_served_under_the_backends_name_and_map_back() {
        assert_eq!(exposed("vanilla", "ui://basic/app.html").as_deref(), Some("ui://vanilla/basic/app.html"));
        assert_eq!(exposed("vanilla", "https://x"), None);
        assert_eq!(original("ui://vanilla/basic/app.html"), Some(("vanilla", "ui://basic/app.html".into())));
        assert_eq!(original("ui://vanilla"), None);
        assert_eq!(original("ui:///x"), None);
        let mut t = tool(
            serde_json::json!({"ui": {"resourceUri": "ui://a/b", "visibility": ["model", "app"]}, "ui/resourceUri": "ui://a/b"}),
        );
        rewrite(&mut t, "k");
        let meta = &t.meta.as_ref().unwrap().0;
        assert_eq!(
            (meta["ui"]["resourceUri"].as_str(), meta["ui/resourceUri"].as_str()),
            (Some("ui://k/a/b"), Some("ui://k/a/b"))
        );
        assert_eq!(meta["ui"]["visibility"], serde_json::json!(["model", "app"]), "the rest is untouched");
        assert_eq!(resource_uri(&t), Some("ui://k/a/b"));
        let carried = meta_of(&t).unwrap();
        assert_eq!(
            (carried["ui"]["visibility"].clone(), carried["ui/resourceUri"].clone()),
            (serde_json::json!(["model", "app"]), "ui://k/a/b".into())
        );
        // The flat key alone still links the App.
        let mut flat = tool(serde_json::json!({"ui/resourceUri": "ui://a/b"}));
        rewrite(&mut flat, "k");
        assert_eq!(resource_uri(&flat), Some("ui://k/a/b"));
        assert_eq!(meta_of(&flat).unwrap()["ui"]["resourceUri"], "ui://k/a/b");
        assert_eq!(resource_uri(&tool(serde_json::json!({"ui": {"resourceUri": "https://x"}}))), None);
    }
}
