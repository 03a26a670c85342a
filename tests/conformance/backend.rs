//! `conformance-backend [ADDR] [--unlinked]`: the conformance server (server.rs) over streamable
//! HTTP on ADDR (default 127.0.0.1:0). Prints `http://ADDR/mcp` once listening. With
//! `--unlinked`, its sampling and elicitation requests are sent unlinked to the calls that need
//! them (on the session's standalone stream).

#[path = "server.rs"]
mod server;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let unlinked = args.iter().any(|a| a == "--unlinked");
    let addr = args.iter().find(|a| !a.starts_with("--")).map_or("127.0.0.1:0", String::as_str);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("http://{}/mcp", listener.local_addr()?);
    server::serve(listener, unlinked).await?;
    Ok(())
}
