//! The service-wide JWT signing keys: the current one (made on first use), rotation,
//! retirement, sealing the plaintext keys of earlier releases, and the read that verification
//! makes. Secrets are stored sealed with the service's secret key (`crate::sealing`) and opened
//! only in memory.
//!
//! A key signs new tokens until it is rotated out or retired (`retired_at`); it verifies the
//! tokens it signed until they expire, or until the grace of its retirement ends
//! (`verify_until`). There is always a current key after a retirement: retiring the current key
//! makes its successor in the same change.
//!
//! No audit entry: audit entries belong to one org and are read by its admins, and a signing key
//! is no org's (it signs every org's tokens). The rows themselves are the record (when each key
//! was made, stopped signing, stops verifying; no row is ever deleted), and the commands that
//! change them run as the operator, on the operator's own log.

use std::time::Duration;

use crate::db::Db;
use chrono::{DateTime, Utc};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox};

use super::{Change, Result, StoreError};
use crate::sealing::{Sealed, SecretKey};

/// One writer at a time, so two processes starting together agree on one current key.
const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('shopfloor.signing_keys'))";

/// A row as stored: sealed, or (written by an earlier release) in plaintext.
#[derive(sqlx::FromRow)]
struct KeyRow {
    kid: String,
    sealed: Option<Vec<u8>>,
    secret: Option<Vec<u8>>,
    /// Seconds until its tokens stop verifying (negative once over); read by verification only.
    #[sqlx(default)]
    left_secs: Option<f64>,
}

/// A signing key, opened.
pub struct SigningKey {
    pub kid: String,
    pub secret: SecretBox<[u8]>,
}

/// The key new tokens are signed with: the newest one not retired, made (sealed) on first use.
/// A current key an earlier release stored in plaintext is sealed here.
pub async fn current(ch: &mut Change, key: &SecretKey) -> Result<SigningKey> {
    sqlx::query(LOCK).execute(&mut *ch.tx).await?;
    let row: Option<KeyRow> = sqlx::query_as("SELECT kid, sealed, secret FROM signing_keys WHERE retired_at IS NULL ORDER BY created_at DESC LIMIT 1")
        .fetch_optional(&mut *ch.tx)
        .await?;
    match row {
        Some(KeyRow { kid, sealed: Some(sealed), .. }) => {
            let secret = key.open(Sealed::SigningKey(&kid), &sealed)?;
            Ok(SigningKey { kid, secret })
        }
        Some(KeyRow { kid, sealed: None, secret: Some(plaintext), .. }) => {
            seal_row(ch, key, &kid, &plaintext).await?;
            Ok(SigningKey { kid, secret: SecretBox::new(plaintext.into_boxed_slice()) })
        }
        // The table's CHECK keeps one of the two.
        Some(KeyRow { kid, sealed: None, secret: None, .. }) => Err(StoreError::Invalid(format!("signing key `{kid}` has no secret"))),
        None => create(ch, key).await,
    }
}

/// What a rotation did.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// The key that signs from now on.
    pub kid: String,
    /// The keys that stopped signing; they still verify their tokens.
    pub previous: Vec<String>,
}

/// Makes a new current key. The previous ones stop signing but go on verifying the tokens
/// they signed, so a rotation logs no one out.
pub async fn rotate(ch: &mut Change, key: &SecretKey) -> Result<Rotation> {
    sqlx::query(LOCK).execute(&mut *ch.tx).await?;
    let made = create(ch, key).await?;
    let previous: Vec<String> = sqlx::query_scalar("UPDATE signing_keys SET retired_at = now() WHERE retired_at IS NULL AND kid <> $1 RETURNING kid")
        .bind(&made.kid)
        .fetch_all(&mut *ch.tx)
        .await?;
    Ok(Rotation { kid: made.kid, previous })
}

/// What a retirement did.
#[derive(Debug, Clone)]
pub struct Retirement {
    pub kid: String,
    /// When the key's tokens stop verifying.
    pub verify_until: DateTime<Utc>,
    /// The key made to sign in its place, when it was the current one.
    pub successor: Option<String>,
}

/// Retires a key: it signs nothing more, and the tokens it signed stop verifying once `grace`
/// has passed. A retirement only ever brings that moment closer (retiring again with a longer
/// grace keeps the earlier end). Retiring the current key makes a new one, so tokens can
/// still be issued. An unknown `kid` is refused with the list of known ones.
pub async fn retire(ch: &mut Change, key: &SecretKey, kid: &str, grace: Duration) -> Result<Retirement> {
    sqlx::query(LOCK).execute(&mut *ch.tx).await?;
    let until: Option<DateTime<Utc>> = sqlx::query_scalar(
        "UPDATE signing_keys SET retired_at = COALESCE(retired_at, now()), \
                verify_until = LEAST(COALESCE(verify_until, 'infinity'), now() + make_interval(secs => $2)) \
         WHERE kid = $1 RETURNING verify_until",
    )
    .bind(kid)
    .bind(grace.as_secs_f64())
    .fetch_optional(&mut *ch.tx)
    .await?;
    let Some(verify_until) = until else {
        let known: Vec<String> = sqlx::query_scalar("SELECT kid FROM signing_keys ORDER BY created_at").fetch_all(&mut *ch.tx).await?;
        let known = if known.is_empty() { "there are none yet".to_owned() } else { format!("the keys are {}", known.join(", ")) };
        return Err(StoreError::Invalid(format!("no signing key `{kid}`; {known}")));
    };
    let current: Option<String> = sqlx::query_scalar("SELECT kid FROM signing_keys WHERE retired_at IS NULL LIMIT 1").fetch_optional(&mut *ch.tx).await?;
    let successor = match current {
        Some(_) => None,
        None => Some(create(ch, key).await?.kid),
    };
    Ok(Retirement { kid: kid.to_owned(), verify_until, successor })
}

/// Seals every key an earlier release stored in plaintext, clearing the plaintext in the same
/// statement; returns their kids. The secrets are the same, so the tokens they signed still
/// verify.
pub async fn seal_plaintext(ch: &mut Change, key: &SecretKey) -> Result<Vec<String>> {
    sqlx::query(LOCK).execute(&mut *ch.tx).await?;
    let rows: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT kid, secret FROM signing_keys WHERE sealed IS NULL AND secret IS NOT NULL ORDER BY created_at FOR UPDATE")
            .fetch_all(&mut *ch.tx)
            .await?;
    let mut sealed = Vec::with_capacity(rows.len());
    for (kid, plaintext) in rows {
        seal_row(ch, key, &kid, &plaintext).await?;
        sealed.push(kid);
    }
    Ok(sealed)
}

/// Opens every sealed key, so that a process given the wrong secret key refuses to start
/// instead of refusing every token. Returns how many keys there are, and how many of them are
/// still in plaintext.
pub async fn check_opens(db: &Db, key: &SecretKey) -> Result<(usize, usize)> {
    let rows: Vec<(String, Option<Vec<u8>>)> = sqlx::query_as("SELECT kid, sealed FROM signing_keys ORDER BY created_at").fetch_all(db).await?;
    let mut plaintext = 0;
    for (kid, sealed) in &rows {
        match sealed {
            Some(sealed) => drop(key.open(Sealed::SigningKey(kid), sealed)?),
            None => plaintext += 1,
        }
    }
    Ok((rows.len(), plaintext))
}

/// A key as verification needs it.
pub struct VerifyingKey {
    pub secret: SecretBox<[u8]>,
    /// How much longer it verifies, by the database's clock: `None` for as long as its tokens
    /// live, zero when its retirement's grace is over.
    pub verifies_for: Option<Duration>,
}

/// Reads and opens a key by `kid` for verification; `None` when there is no such key. A key
/// still in plaintext (written by an earlier release's replica) is used as it is; the next
/// start or the next token issued seals it.
pub async fn verifying(db: &Db, key: &SecretKey, kid: &str) -> Result<Option<VerifyingKey>> {
    let row: Option<KeyRow> =
        sqlx::query_as("SELECT kid, sealed, secret, EXTRACT(EPOCH FROM verify_until - now())::float8 AS left_secs FROM signing_keys WHERE kid = $1")
            .bind(kid)
            .fetch_optional(db)
            .await?;
    let Some(KeyRow { sealed, secret: plaintext, left_secs, .. }) = row else { return Ok(None) };
    let secret = match (sealed, plaintext) {
        (Some(sealed), _) => key.open(Sealed::SigningKey(kid), &sealed)?,
        (None, Some(plaintext)) => SecretBox::new(plaintext.into_boxed_slice()),
        (None, None) => return Err(StoreError::Invalid(format!("signing key `{kid}` has no secret"))),
    };
    // A grace already over is negative here: nothing left.
    Ok(Some(VerifyingKey { secret, verifies_for: left_secs.map(|secs| Duration::from_secs_f64(secs.max(0.0))) }))
}

/// Makes a new current key, sealed.
async fn create(ch: &mut Change, key: &SecretKey) -> Result<SigningKey> {
    let mut secret = vec![0u8; 32].into_boxed_slice();
    rand::rng().fill_bytes(&mut secret);
    let secret = SecretBox::new(secret);
    // Time-ordered and unique even for two keys made in the same second.
    let kid = format!("k{}-{:08x}", Utc::now().format("%Y%m%d%H%M%S"), rand::random::<u32>());
    sqlx::query("INSERT INTO signing_keys (kid, sealed) VALUES ($1, $2)")
        .bind(&kid)
        .bind(key.seal(Sealed::SigningKey(&kid), secret.expose_secret()))
        .execute(&mut *ch.tx)
        .await?;
    Ok(SigningKey { kid, secret })
}

async fn seal_row(ch: &mut Change, key: &SecretKey, kid: &str, plaintext: &[u8]) -> Result<()> {
    sqlx::query("UPDATE signing_keys SET sealed = $2, secret = NULL WHERE kid = $1")
        .bind(kid)
        .bind(key.seal(Sealed::SigningKey(kid), plaintext))
        .execute(&mut *ch.tx)
        .await?;
    Ok(())
}
