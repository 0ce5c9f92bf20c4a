//! API tokens: JWTs signed by the service (HS256), each with a `jti` row in `api_tokens` so
//! it can be listed and revoked. The header's `kid` names the signing key, so keys rotate
//! without invalidating live tokens.

use chrono::{Duration, Utc};
use engine::ids::{OrgId, ProjectId, UserId};
use engine::store::tenants::{self, TokenRecord};
use engine::store::{Change, StoreError};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

/// What a token says. `org` is the org's id; `role` one of owner, admin, member, viewer, host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub jti: String,
    pub sub: String,
    pub org: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub role: String,
    pub kind: String,
    pub iat: i64,
    pub exp: i64,
}

/// A person's token for one org.
pub struct UserToken<'a> {
    pub org: OrgId,
    pub user: UserId,
    pub project: Option<ProjectId>,
    pub role: &'static str,
    pub name: &'a str,
    pub ttl: Duration,
}

/// Records a token and returns it signed. The signed text is shown once and never stored.
pub async fn issue_user_token(ch: &mut Change, t: UserToken<'_>) -> Result<String, StoreError> {
    issue_user_token_with_id(ch, t).await.map(|(_, token)| token)
}

/// As [`issue_user_token`], with the token's `jti` (its id in `api_tokens`).
pub async fn issue_user_token_with_id(ch: &mut Change, t: UserToken<'_>) -> Result<(uuid::Uuid, String), StoreError> {
    let (kid, secret) = tenants::current_signing_key(ch).await?;
    let jti = uuid::Uuid::now_v7();
    let now = Utc::now();
    let expires_at = now + t.ttl;
    tenants::insert_token(
        ch,
        &TokenRecord {
            jti,
            org: t.org,
            kind: "user",
            user: Some(t.user),
            host: None,
            project: t.project,
            role: t.role,
            name: t.name.to_owned(),
            kid: kid.clone(),
            expires_at,
        },
    )
    .await?;
    let claims = Claims {
        jti: jti.to_string(),
        sub: t.user.to_string(),
        org: t.org.to_string(),
        project: t.project.map(|p| p.to_string()),
        role: t.role.to_owned(),
        kind: "user".to_owned(),
        iat: now.timestamp(),
        exp: expires_at.timestamp(),
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid);
    let token = encode(&header, &claims, &EncodingKey::from_secret(&secret)).map_err(|e| StoreError::Invalid(format!("cannot sign token: {e}")))?;
    Ok((jti, token))
}
