//! GitHub's webhook signature: `X-Hub-Signature-256: sha256=<hex of HMAC-SHA256(secret, body)>`.
//!
//! The comparison is constant-time (`hmac`'s `verify_slice`), so the time a refusal takes says
//! nothing about how many leading bytes of a forged signature were right.

use data_encoding::HEXLOWER_PERMISSIVE;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Whether `header` is the signature of `body` under `secret`.
pub fn verify(secret: &SecretString, body: &[u8], header: &str) -> bool {
    let Some(hex) = header.trim().strip_prefix("sha256=") else { return false };
    let Ok(expected) = HEXLOWER_PERMISSIVE.decode(hex.as_bytes()) else { return false };
    let Ok(mut mac) = HmacSha256::new_from_slice(secret.expose_secret().as_bytes()) else { return false };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

/// The header value GitHub would send for `body`: for tests and tools that sign deliveries.
pub fn sign(secret: &str, body: &[u8]) -> String {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(body);
    format!("sha256={}", data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_githubs_documented_example() {
        // https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
        let secret = SecretString::from("It's a Secret to Everybody");
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert!(verify(&secret, b"Hello, World!", header));
        assert_eq!(sign("It's a Secret to Everybody", b"Hello, World!"), header);
        assert!(!verify(&secret, b"Hello, World?", header));
        assert!(!verify(&secret, b"Hello, World!", "sha1=757107ea"));
        assert!(!verify(&secret, b"Hello, World!", "sha256=zz"));
        assert!(!verify(&secret, b"Hello, World!", ""));
    }
}
