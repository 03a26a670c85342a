//! The MCP surface: the per-session handler for both modes, the meta-tools, and the gateway
//! state they share.

pub mod callers;
pub mod gateway;
pub mod groups;
pub mod handler;
pub mod meta;
pub mod overview;
pub mod relay;
pub mod rounds;
pub mod status;
pub mod surface;
pub mod tasks;

pub use gateway::Gateway;
pub use handler::GatewayHandler;

#[cfg(test)]
mod tests;
