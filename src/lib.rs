//! toolmux: an MCP gateway. Many backend MCP servers behind one endpoint, in passthrough mode
//! (every tool, prefixed) or optimizer mode (`find_tool` + `call_tool` over an on-host semantic
//! index).
//!
//! Layers, lowest first; a module imports only from those above it in this list:
//!
//! | module     | owns |
//! |------------|------|
//! | `config`   | the TOML file → validated [`config::Config`] |
//! | `catalog`  | tool identity, exposed names, conflict resolution, search text (pure) |
//! | `embed`    | the sentence model on its own thread, model files, the vector cache |
//! | `index`    | exact/HNSW dense search, BM25, fusion over dense slot ids |
//! | `store`    | the shared store: one generation = catalog + vectors + indexes |
//! | `telemetry`| a request's W3C trace context, and toolmux's spans joined to it |
//! | `upstream` | backend MCP clients: connect, list, forward, reconnect |
//! | `health`   | probes, status, circuit breaker, change notifier |
//! | `session`  | per-session scope snapshots behind ArcSwap, resync |
//! | `auth`     | who is calling (bearer tokens, JWT) and what they may use (`[[policy]]`) |
//! | `limits`   | how much they may use (`[[limits]]`): rates and quotas, here or in Redis |
//! | `audit`    | the trail of who did what (`[audit]`): chained JSON lines, verified and summarised |
//! | `hooks`    | the company's guard services around a call (`[[hooks]]`): allow, deny, replace |
//! | `mcp`      | the MCP surface: passthrough and optimizer handlers |
//! | `http`     | the axum router: /mcp, /healthz, /readyz, limits |
//! | `app`      | the composition root: builds and owns everything |
//!
//! `import` reads agent hosts' MCP server lists into a configuration and writes toolmux into
//! them (`toolmux import`, `toolmux connect`); it uses `config` only. `demo` holds the built-in
//! demo backends; `eval` the retrieval evaluation; `simd` the one
//! macro that compiles numeric loops for wider vector units, used by `embed` and `index`, and
//! the name of the vector path this CPU runs; `redact` takes secrets out of error text before
//! it is logged or shown; `memory` and `descriptors` are what the process holds (freed heap
//! handed back; the descriptor limit, raised at start).

pub mod app;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod console;
pub mod demo;
pub mod descriptors;
pub mod embed;
pub mod eval;
pub mod fence;
pub mod health;
pub mod hooks;
pub mod http;
pub mod import;
pub mod index;
pub mod limits;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod redact;
pub mod results;
pub mod scrub;
pub mod session;
pub mod simd;
pub mod store;
pub mod telemetry;
pub mod upstream;
