//! A real `redis-server` for the tests that share state through Redis (replicas, limits).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use crate::harness::eventually;

/// A `redis-server` on 127.0.0.1 at a free port, with no persistence: a restart loses every key.
pub struct Redis {
    pub port: u16,
    /// `requirepass`, if any.
    password: Option<String>,
    /// TLS only, with the test certificate of `tests/fixtures/redis-tls`.
    tls: bool,
    child: Option<tokio::process::Child>,
}

impl Redis {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    pub async fn start_with(password: Option<&str>) -> Self {
        Self::launch(password, false).await
    }

    pub async fn launch(password: Option<&str>, tls: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut r = Self { port, password: password.map(str::to_owned), tls, child: None };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        let auth = self.password.as_ref().map(|p| format!(":{p}@")).unwrap_or_default();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{auth}127.0.0.1:{}/0", self.port)
    }

    /// A client of it (with TLS, trusting the test CA).
    pub fn client(&self) -> redis::Client {
        match self.tls {
            false => redis::Client::open(self.url()).unwrap(),
            true => {
                let root_cert = Some(std::fs::read(fixture_tls("ca.pem")).unwrap());
                redis::Client::build_with_tls(self.url(), redis::TlsCertificates { client_tls: None, root_cert })
                    .unwrap()
            }
        }
    }

    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
            let _ = c.wait().await;
        }
    }

    /// The key of the session `id`'s record.
    pub fn record_key(id: &str) -> String {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(id.as_bytes());
        format!("toolmux:session:{}", base16ct::lower::encode_string(&digest))
    }

    /// The stored record of the session `id`, as its fields.
    pub async fn record(&self, id: &str) -> HashMap<String, String> {
        let mut c = self.client().get_multiplexed_async_connection().await.unwrap();
        redis::cmd("HGETALL").arg(Self::record_key(id)).query_async::<HashMap<String, String>>(&mut c).await.unwrap()
    }

    /// (Re)starts it on the same port, empty, and waits until it answers.
    pub async fn restart(&mut self) {
        self.kill().await;
        let server = std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join("redis-server")).find(|f| f.is_file()))
            .expect("redis-server is not installed; scripts/test.sh installs it (Debian package redis-server)");
        let mut args = vec!["--port".to_string(), self.port.to_string()];
        if self.tls {
            args = vec!["--port".into(), "0".into(), "--tls-port".into(), self.port.to_string()];
            args.extend([
                "--tls-cert-file".into(),
                fixture_tls("cert.pem"),
                "--tls-key-file".into(),
                fixture_tls("key.pem"),
            ]);
            args.extend(["--tls-auth-clients", "no"].map(String::from));
        }
        args.extend(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"].map(String::from));
        // DEBUG SLEEP makes it stop answering for a while: a slow store, on demand.
        args.extend(["--enable-debug-command", "yes"].map(String::from));
        if let Some(p) = &self.password {
            args.extend(["--requirepass".to_string(), p.clone()]);
        }
        let child = tokio::process::Command::new(server)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let client = self.client();
        let up = eventually(Duration::from_secs(10), || {
            let client = client.clone();
            async move {
                let Ok(mut c) = client.get_multiplexed_async_connection().await else { return false };
                redis::cmd("PING").query_async::<String>(&mut c).await.is_ok()
            }
        })
        .await;
        assert!(up, "redis-server answers on port {}", self.port);
    }
}

/// A file of the test certificates: a CA, and a certificate it signed for 127.0.0.1.
pub fn fixture_tls(file: &str) -> String {
    format!("{}/tests/fixtures/redis-tls/{file}", env!("CARGO_MANIFEST_DIR"))
}
