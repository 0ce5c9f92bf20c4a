//! The service's secret key (`SHOPFLOOR_SECRET_KEY`) and what it seals at rest: the JWT signing
//! keys' secrets and the outgoing webhook subscriptions' secrets ([`Sealed`]).
//!
//! The key is 32 random bytes, written in base64 (`openssl rand -base64 32`). Sealing is
//! XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`) with a random 24-byte nonce, so nonces
//! need no counter shared between processes; the associated data names what is sealed (its kind
//! and its row's id), so a sealed secret copied onto another row, or from one kind of secret to
//! another, does not open there. A sealed value is
//! `version (1) || nonce (24) || ciphertext || tag (16)`.
//!
//! Stream positions are sealed another way ([`SecretKey::seal_position`]): deterministically
//! (AES-SIV, RFC 5297, RustCrypto's `aes-siv`, under a key derived from the secret key), so
//! the same position reads the same each time it is given out.
//!
//! Neither the key nor what it opens is ever printed: `Debug` shows neither, and errors say
//! which value failed, not what it held.

use std::sync::Arc;

use aes_siv::siv::Aes128Siv;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox, SecretString};

/// The first byte of every sealed value: the format, so a later one can be told apart.
const VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;

/// What a sealed value is the secret of: its seal is bound to it.
#[derive(Debug, Clone, Copy)]
pub enum Sealed<'a> {
    /// A JWT signing key's secret, by `kid`.
    SigningKey(&'a str),
    /// An outgoing webhook subscription's secret (the HMAC key of its deliveries), by id.
    WebhookSecret(uuid::Uuid),
}

impl Sealed<'_> {
    /// The associated data of its seal: a label of the kind, then the row's id.
    fn associated_data(self) -> Vec<u8> {
        match self {
            Sealed::SigningKey(kid) => format!("shopfloor.signing_key:{kid}"),
            Sealed::WebhookSecret(id) => format!("shopfloor.webhook_secret:{id}"),
        }
        .into_bytes()
    }
}

/// The secret key that seals what [`Sealed`] names, and positions. Cheap to clone (one
/// allocation shared).
#[derive(Clone)]
pub struct SecretKey(Arc<Keys>);

struct Keys {
    /// The key as given: XChaCha20-Poly1305's.
    given: SecretBox<[u8; 32]>,
    /// AES-SIV's key for positions, derived once from `given` (HMAC-SHA256 with a label of
    /// its own), so it is no other use's key.
    positions: SecretBox<[u8; 32]>,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

/// Why a text is not a secret key. The text itself is never repeated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("is empty")]
    Empty,
    #[error("is not base64")]
    NotBase64,
    #[error("decodes to {0} bytes, not 32")]
    WrongLength(usize),
}

/// A sealed value that does not open with this key. It names the value, never what it holds.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} does not open with this SHOPFLOOR_SECRET_KEY; set the SHOPFLOOR_SECRET_KEY that sealed the {kind} (the same on every process of this database)"
)]
pub struct OpenError {
    /// Which value: ``signing key `k…` `` or `the secret of webhook <id>`.
    pub what: String,
    /// The values of its kind: `signing keys` or `webhook secrets`.
    pub kind: &'static str,
}

impl OpenError {
    fn of(sealed: Sealed<'_>) -> OpenError {
        match sealed {
            Sealed::SigningKey(kid) => OpenError { what: format!("signing key `{kid}`"), kind: "signing keys" },
            Sealed::WebhookSecret(id) => OpenError { what: format!("the secret of webhook {id}"), kind: "webhook secrets" },
        }
    }
}

impl SecretKey {
    /// Reads a key written in base64 (standard or URL-safe alphabet, padded or not; spaces
    /// and line ends around it are ignored).
    pub fn parse(text: &str) -> Result<SecretKey, KeyError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(KeyError::Empty);
        }
        let decoded = [data_encoding::BASE64, data_encoding::BASE64_NOPAD, data_encoding::BASE64URL, data_encoding::BASE64URL_NOPAD]
            .iter()
            .find_map(|encoding| encoding.decode(text.as_bytes()).ok())
            .ok_or(KeyError::NotBase64)?;
        let bytes: [u8; 32] = decoded.as_slice().try_into().map_err(|_| KeyError::WrongLength(decoded.len()))?;
        Ok(SecretKey::of(Box::new(bytes)))
    }

    /// A fresh random key.
    pub fn generate() -> SecretKey {
        let mut bytes = Box::new([0u8; 32]);
        rand::rng().fill_bytes(bytes.as_mut());
        SecretKey::of(bytes)
    }

    fn of(given: Box<[u8; 32]>) -> SecretKey {
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(given.as_slice()).expect("HMAC takes keys of any length");
        mac.update(b"shopfloor.stream_position");
        let positions = Box::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
        SecretKey(Arc::new(Keys { given: SecretBox::new(given), positions: SecretBox::new(positions) }))
    }

    /// The key in standard base64, as [`SecretKey::parse`] reads it (to write it to a file).
    pub fn to_base64(&self) -> SecretString {
        SecretString::from(data_encoding::BASE64.encode(self.0.given.expose_secret()))
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.0.given.expose_secret().into())
    }

    /// Seals a secret, bound to what it is the secret of.
    pub fn seal(&self, sealed: Sealed<'_>, secret: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let aad = sealed.associated_data();
        // Encryption fails only for messages of gigabytes; a secret here is at most 256 characters.
        let sealed = self
            .cipher()
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: secret, aad: &aad })
            .unwrap_or_else(|_| unreachable!("XChaCha20-Poly1305 seals any short message"));
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what [`SecretKey::seal`] sealed for `what`. Another key, another row or kind, a
    /// format this binary does not know, or any changed byte: an error, never a panic.
    pub fn open(&self, what: Sealed<'_>, sealed: &[u8]) -> Result<SecretBox<[u8]>, OpenError> {
        let refuse = || OpenError::of(what);
        if sealed.len() < 1 + NONCE_LEN + TAG_LEN || sealed[0] != VERSION {
            return Err(refuse());
        }
        let (nonce, body) = sealed[1..].split_at(NONCE_LEN);
        let aad = what.associated_data();
        let opened = self.cipher().decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad: &aad }).map_err(|_| refuse())?;
        Ok(SecretBox::new(opened.into_boxed_slice()))
    }

    /// A position in a stream of `scope` (16 bytes), as an opaque token (43 characters of
    /// URL-safe base64): it shows nothing of what it holds, opens only for `scope`, and reads
    /// the same each time, so a client sees one id per event however often it reconnects.
    pub fn seal_position(&self, scope: uuid::Uuid, position: &[u8; 16]) -> String {
        // Fails only for more headers than SIV takes (126) or plaintexts shorter than its tag.
        let sealed = self.position_cipher().encrypt([scope.as_bytes()], position).unwrap_or_else(|_| unreachable!("AES-SIV seals 16 bytes under one header"));
        data_encoding::BASE64URL_NOPAD.encode(&sealed)
    }

    /// Opens what [`SecretKey::seal_position`] made for `scope`; `None` for anything else.
    pub fn open_position(&self, scope: uuid::Uuid, token: &str) -> Option<[u8; 16]> {
        let sealed = data_encoding::BASE64URL_NOPAD.decode(token.trim().as_bytes()).ok()?;
        self.position_cipher().decrypt([scope.as_bytes()], &sealed).ok()?.try_into().ok()
    }

    /// A tag of `text` for the use `label` (HMAC-SHA256 with the key, over the label, a zero
    /// byte and the text; 43 characters of URL-safe base64): a value this server hands out and
    /// later checks it made (the console's pre-sign-in cookie).
    pub fn tag(&self, label: &str, text: &str) -> String {
        data_encoding::BASE64URL_NOPAD.encode(&self.tag_mac(label, text).finalize().into_bytes())
    }

    /// Whether `tag` is [`SecretKey::tag`]'s for `label` and `text` (compared in constant time).
    pub fn tag_holds(&self, label: &str, text: &str, tag: &str) -> bool {
        let Ok(bytes) = data_encoding::BASE64URL_NOPAD.decode(tag.as_bytes()) else { return false };
        self.tag_mac(label, text).verify_slice(&bytes).is_ok()
    }

    fn tag_mac(&self, label: &str, text: &str) -> Hmac<sha2::Sha256> {
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(self.0.given.expose_secret()).expect("HMAC takes keys of any length");
        mac.update(label.as_bytes());
        mac.update(&[0]);
        mac.update(text.as_bytes());
        mac
    }

    fn position_cipher(&self) -> Aes128Siv {
        Aes128Siv::new(self.0.positions.expose_secret().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_holds_for_its_label_text_and_key_only() {
        let key = SecretKey::generate();
        let tag = key.tag("pre", "nonce");
        assert!(key.tag_holds("pre", "nonce", &tag));
        assert!(!key.tag_holds("pre", "other", &tag) && !key.tag_holds("post", "nonce", &tag));
        assert!(!SecretKey::generate().tag_holds("pre", "nonce", &tag) && !key.tag_holds("pre", "nonce", "not base64!"));
    }

    #[test]
    fn a_sealed_secret_opens_with_its_key_and_kid_only() {
        let key = SecretKey::generate();
        let k1 = Sealed::SigningKey("k1");
        let sealed = key.seal(k1, b"the signing secret");
        assert!(!sealed.windows(6).any(|w| w == b"secret"), "no plaintext in the seal");
        assert_eq!(key.open(k1, &sealed).unwrap().expose_secret(), b"the signing secret");
        assert!(key.open(Sealed::SigningKey("k2"), &sealed).is_err(), "bound to its kid");
        assert!(SecretKey::generate().open(k1, &sealed).is_err(), "another key does not open it");
        for i in 0..sealed.len() {
            let mut changed = sealed.clone();
            changed[i] ^= 1;
            assert!(key.open(k1, &changed).is_err(), "byte {i} changed");
        }
        assert!(key.open(k1, &sealed[..20]).is_err(), "truncated");
        assert!(key.open(k1, b"").is_err(), "empty");
        assert_ne!(key.seal(k1, b"x"), key.seal(k1, b"x"), "a fresh nonce each time");
    }

    #[test]
    fn a_webhook_secret_opens_for_its_subscription_only_and_never_as_a_signing_key() {
        let key = SecretKey::generate();
        let id = uuid::Uuid::now_v7();
        let sealed = key.seal(Sealed::WebhookSecret(id), b"whsec-of-the-receiver");
        assert_eq!(key.open(Sealed::WebhookSecret(id), &sealed).unwrap().expose_secret(), b"whsec-of-the-receiver");
        let other = key.open(Sealed::WebhookSecret(uuid::Uuid::now_v7()), &sealed).unwrap_err();
        assert!(other.to_string().starts_with("the secret of webhook "), "{other}");
        assert!(other.to_string().contains("sealed the webhook secrets"), "{other}");
        assert!(!other.to_string().contains("whsec"), "an error never repeats the secret: {other}");
        // The same id written as a kid does not open it either: the kind is bound too.
        assert!(key.open(Sealed::SigningKey(&id.to_string()), &sealed).is_err());
    }

    #[test]
    fn a_position_reads_the_same_each_time_and_opens_for_its_scope_and_key_only() {
        let key = SecretKey::generate();
        let (web, other) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let position: [u8; 16] = *b"\0\0\0\0\0\x01\x02\x03\0\0\0\0\0\0\0\x2a";
        let token = key.seal_position(web, &position);
        assert_eq!(token, key.seal_position(web, &position), "deterministic");
        assert_eq!(token.len(), 43);
        assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{token}");
        assert_eq!(key.open_position(web, &token), Some(position));
        assert_ne!(key.seal_position(other, &position), token, "another scope, another token");
        assert_eq!(key.open_position(other, &token), None, "bound to its scope");
        assert_eq!(SecretKey::generate().open_position(web, &token), None, "another key does not open it");
        let mut next = position;
        next[15] += 1;
        assert_ne!(key.seal_position(web, &next)[..8], token[..8], "neighbours do not look alike");
        for bad in ["", "1234.42", "../../x", &token[..42], &format!("{token}A")] {
            assert_eq!(key.open_position(web, bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_are_32_bytes_of_base64() {
        let key = SecretKey::generate();
        let text = key.to_base64();
        let again = SecretKey::parse(&format!(" {}\n", text.expose_secret())).unwrap();
        assert_eq!(again.open(Sealed::SigningKey("k"), &key.seal(Sealed::SigningKey("k"), b"s")).unwrap().expose_secret(), b"s");
        let url_safe = data_encoding::BASE64URL_NOPAD.encode(&[0xfb; 32]);
        assert!(SecretKey::parse(&url_safe).is_ok());
        assert_eq!(SecretKey::parse("").unwrap_err(), KeyError::Empty);
        assert_eq!(SecretKey::parse("not base64!").unwrap_err(), KeyError::NotBase64);
        assert_eq!(SecretKey::parse(&data_encoding::BASE64.encode(&[1; 16])).unwrap_err(), KeyError::WrongLength(16));
        assert_eq!(format!("{key:?}"), "SecretKey(..)");
    }
}
