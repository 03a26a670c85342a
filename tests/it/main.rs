//! One integration-test binary: real backends, the gateway on 127.0.0.1:0, real MCP clients.

mod harness;

#[path = "../conformance/server.rs"]
mod conformance_server;

mod audit;
mod auth;
mod cli;
mod console;
#[cfg(unix)]
mod descriptors;
mod gateway;
mod groups;
mod health;
mod hooks;
mod http;
mod integrity;
mod limits;
mod login;
mod ops;
mod optimizer;
mod policy;
mod quality;
mod redis_server;
mod relay;
mod replicas;
mod repo;
mod results;
mod rounds;
mod scrub;
mod search;
mod sessions;
mod sleep;
mod surface;
mod tasks;
mod tenants;
