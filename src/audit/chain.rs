//! How a line is sealed into the chain, and read back.
//!
//! A line is the JSON object of the action with `seq` first and `prev` (the previous line's
//! hash) last, then `"hash"`: the SHA-256 of those exact bytes (the object without its `hash`),
//! or their HMAC-SHA256 under `audit.key`. Nothing is re-serialised to verify: the hash covers
//! the bytes as written.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// `prev` of the first line of a trail.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

const HASH_FIELD: &str = ",\"hash\":\"";

/// The hash of a line's body (the object without `hash`).
pub fn digest(body: &[u8], key: Option<&[u8]>) -> String {
    match key {
        None => base16ct::lower::encode_string(&Sha256::digest(body)),
        Some(k) => {
            let mut mac = Hmac::<Sha256>::new_from_slice(k).expect("HMAC takes a key of any length");
            mac.update(body);
            base16ct::lower::encode_string(&mac.finalize().into_bytes())
        }
    }
}

/// `body` (a JSON object ending in `}`) with its hash added: the line as written, and the hash.
pub fn seal(body: &str, key: Option<&[u8]>) -> (String, String) {
    let hash = digest(body.as_bytes(), key);
    let open = body.strip_suffix('}').expect("a JSON object");
    (format!("{open}{HASH_FIELD}{hash}\"}}"), hash)
}

/// A line read back: its body as hashed, and the hash it carries.
pub fn unseal(line: &str) -> Option<(String, &str)> {
    let at = line.rfind(HASH_FIELD)?;
    let hash = line[at + HASH_FIELD.len()..].strip_suffix("\"}")?;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((format!("{}}}", &line[..at]), hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_unseals_to_its_body_and_hash() {
        let body = r#"{"seq":1,"action":"tools/call","prev":"00"}"#;
        for key in [None, Some(&b"a key of thirty-two characters..."[..])] {
            let (line, hash) = seal(body, key);
            assert!(line.ends_with(&format!(",\"hash\":\"{hash}\"}}")), "{line}");
            let (back, carried) = unseal(&line).unwrap();
            assert_eq!((back.as_str(), carried), (body, hash.as_str()));
            assert_eq!(digest(back.as_bytes(), key), hash);
        }
        assert_ne!(seal(body, None).1, seal(body, Some(b"k")).1, "the key changes the hash");
        assert!(unseal(r#"{"seq":1}"#).is_none());
        assert!(unseal(r#"{"seq":1,"hash":"xyz"}"#).is_none());
    }
}
