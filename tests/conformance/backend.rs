//! `conformance-backend [ADDR]`: the conformance server (server.rs) over streamable HTTP on ADDR
//! (default 127.0.0.1:0). Prints `http://ADDR/mcp` once listening.

#[path = "server.rs"]
mod server;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("http://{}/mcp", listener.local_addr()?);
    server::serve(listener).await?;
    Ok(())
}
