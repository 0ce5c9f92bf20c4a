//! Identifiers, made only by parsing or by minting, so a string from outside never becomes an
//! id without passing the same check.
//!
//! Runs and steps are shown as `run-<base32>` / `step-<base32>`: the 16 bytes of a UUIDv7
//! (time-ordered, so keyset paging by id follows creation) in lowercase RFC 4648 base32.

use std::fmt;
use std::str::FromStr;

use data_encoding::BASE32_NOPAD;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a valid {what} id (expected `{prefix}-` followed by 26 base32 letters)")]
pub struct BadId {
    pub what: &'static str,
    pub prefix: &'static str,
    pub text: String,
}

macro_rules! prefixed_id {
    ($name:ident, $prefix:literal, $what:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type)]
        #[sqlx(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            pub fn mint() -> Self {
                $name(Uuid::now_v7())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}-{}", $prefix, BASE32_NOPAD.encode(self.0.as_bytes()).to_lowercase())
            }
        }

        impl FromStr for $name {
            type Err = BadId;

            fn from_str(s: &str) -> Result<Self, BadId> {
                let bad = || BadId { what: $what, prefix: $prefix, text: s.chars().take(80).collect() };
                let rest = s.strip_prefix(concat!($prefix, "-")).ok_or_else(bad)?;
                if rest.len() != 26 {
                    return Err(bad());
                }
                let bytes = BASE32_NOPAD.decode(rest.to_ascii_uppercase().as_bytes()).map_err(|_| bad())?;
                let bytes: [u8; 16] = bytes.try_into().map_err(|_| bad())?;
                Ok($name(Uuid::from_bytes(bytes)))
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(RunId, "run", "run");
prefixed_id!(StepId, "step", "step");

/// Ids that never leave the service in URLs (those use slugs) are plain UUIDs.
macro_rules! plain_id {
    ($name:ident) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type, serde::Serialize, serde::Deserialize)]
        #[sqlx(transparent)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub fn mint() -> Self {
                $name(Uuid::now_v7())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

plain_id!(OrgId);
plain_id!(ProjectId);
plain_id!(WorkflowId);
plain_id!(UserId);
plain_id!(HostId);
plain_id!(ItemId);

/// Whether `s` is 1 to `max` lowercase letters, digits and bytes of `extra`, starting with a
/// letter or digit: the rule of slugs and of hosts' capabilities (`hosts::Capability`).
pub(crate) fn is_word(s: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// An org or project slug: lowercase letters, digits and dashes, 1–63 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slug(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a valid slug: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit")]
pub struct BadSlug(pub String);

impl Slug {
    pub fn parse(s: &str) -> Result<Slug, BadSlug> {
        if is_word(s, 63, b"-") { Ok(Slug(s.to_owned())) } else { Err(BadSlug(s.chars().take(80).collect())) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Slug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_round_trip_through_their_text_form() {
        let id = RunId::mint();
        let text = id.to_string();
        assert!(text.starts_with("run-") && text.len() == 30, "{text}");
        assert_eq!(text.parse::<RunId>().unwrap(), id);
    }

    #[test]
    fn malformed_ids_are_refused_with_the_expected_shape() {
        for bad in ["", "run-", "step-aaaaaaaaaaaaaaaaaaaaaaaaaa", "run-../../etc/passwd", "run-0000000000000000000000000!"] {
            let err = bad.parse::<RunId>().unwrap_err();
            assert!(err.to_string().contains("run-"), "{err}");
        }
    }

    #[test]
    fn slugs_accept_lowercase_words_only() {
        assert!(Slug::parse("acme-2").is_ok());
        for bad in ["", "-acme", "Acme", "a/b", &"x".repeat(64)] {
            assert!(Slug::parse(bad).is_err(), "{bad}");
        }
    }
}
