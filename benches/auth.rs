//! What authentication costs a request: verifying a JWT (RS256, ES256, EdDSA, with the test keys
//! of `tests/fixtures/jwt`, the key set read from a file) and looking up a static bearer token
//! among 100, each through `Authenticator::authenticate` as the HTTP edge calls it.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use toolmux::auth::Authenticator;
use toolmux::config::Config;

fn key(alg: Algorithm) -> (EncodingKey, Jwk) {
    let file = match alg {
        Algorithm::RS256 => "rs256.pem",
        Algorithm::ES256 => "es256.pem",
        _ => "eddsa.pem",
    };
    let pem = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt").join(file))
        .expect("the test keys");
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        _ => EncodingKey::from_ed_pem(&pem),
    }
    .unwrap();
    let mut jwk = Jwk::from_encoding_key(&key, alg).unwrap();
    jwk.common.key_id = Some(format!("{alg:?}"));
    (key, jwk)
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let algs = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];
    let keys: Vec<_> = algs.iter().map(|a| key(*a)).collect();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, serde_json::to_string(&JwkSet { keys: keys.iter().map(|k| k.1.clone()).collect() }).unwrap())
        .unwrap();
    let config = Config::parse(&format!(
        "[auth]\nmode = \"jwt\"\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"toolmux\"]\njwks_file = \"{}\"\n",
        jwks.display()
    ))
    .unwrap();
    let jwt = rt.block_on(Authenticator::new(&config.auth));
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let claims =
        serde_json::json!({"iss": "https://idp.test", "aud": "toolmux", "sub": "alice", "groups": ["dev"], "exp": exp});

    let mut g = c.benchmark_group("authenticate");
    g.measurement_time(Duration::from_secs(3));
    for (alg, (enc, _)) in algs.iter().zip(&keys) {
        let header = Header { kid: Some(format!("{alg:?}")), ..Header::new(*alg) };
        let token = format!("Bearer {}", jsonwebtoken::encode(&header, &claims, enc).unwrap());
        assert!(rt.block_on(jwt.authenticate(Some(&token))).is_ok(), "{alg:?} verifies");
        g.bench_function(BenchmarkId::new("jwt", format!("{alg:?}")), |b| {
            b.iter(|| rt.block_on(jwt.authenticate(Some(&token))).unwrap())
        });
    }

    let mut toml = String::from("[auth]\nmode = \"bearer\"\n");
    for i in 0..100 {
        let digest = <sha2::Sha256 as sha2::Digest>::digest(format!("token-{i}").as_bytes());
        let hex = base16ct::lower::encode_string(&digest);
        toml += &format!("[[auth.tokens]]\nprincipal = \"p{i}\"\nsha256 = \"{hex}\"\n");
    }
    let bearer = rt.block_on(Authenticator::new(&Config::parse(&toml).unwrap().auth));
    let token = "Bearer token-57";
    assert_eq!(rt.block_on(bearer.authenticate(Some(token))).unwrap().principal, "p57");
    g.bench_function(BenchmarkId::new("bearer", "100 tokens"), |b| {
        b.iter(|| rt.block_on(bearer.authenticate(Some(token))).unwrap())
    });
    g.finish();
}

criterion_group!(auth, benches);
criterion_main!(auth);
