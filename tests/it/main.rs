//! One integration-test binary: real backends, the gateway on 127.0.0.1:0, real MCP clients.

mod harness;

mod gateway;
mod health;
mod http;
mod search;
