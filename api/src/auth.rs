//! API tokens: JWTs signed by the service (HS256), each with a `jti` row in `api_tokens` so
//! it can be listed and revoked. The header's `kid` names the signing key, so keys rotate
//! without invalidating live tokens. Signing keys are stored sealed with the service's secret
//! key (`SHOPFLOOR_SECRET_KEY`), which is why every function here takes it.

use chrono::{Duration, Utc};
use engine::ids::{HostId, OrgId, ProjectId, UserId};
use engine::sealing::SecretKey;
use engine::store::signing_keys;
use engine::store::tenants::{self, TokenRecord};
use engine::store::{Change, StoreError};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use secrecy::ExposeSecret;
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
pub async fn issue_user_token(ch: &mut Change, key: &SecretKey, t: UserToken<'_>) -> Result<String, StoreError> {
    issue_user_token_with_id(ch, key, t).await.map(|(_, token)| token)
}

/// As [`issue_user_token`], with the token's `jti` (its id in `api_tokens`).
pub async fn issue_user_token_with_id(ch: &mut Change, key: &SecretKey, t: UserToken<'_>) -> Result<(uuid::Uuid, String), StoreError> {
    issue_user(ch, key, t, None).await
}

/// A console session made by pasting the token `from`: revoking `from` revokes it too.
pub async fn issue_session_from(ch: &mut Change, key: &SecretKey, t: UserToken<'_>, from: uuid::Uuid) -> Result<String, StoreError> {
    issue_user(ch, key, t, Some(from)).await.map(|(_, token)| token)
}

async fn issue_user(ch: &mut Change, key: &SecretKey, t: UserToken<'_>, issued_from: Option<uuid::Uuid>) -> Result<(uuid::Uuid, String), StoreError> {
    let spec =
        Spec { org: t.org, kind: "user", user: Some(t.user), host: None, project: t.project, role: t.role, name: t.name, ttl: t.ttl, sub: t.user.to_string() };
    issue(ch, key, spec, issued_from).await.map(|(jti, token, _)| (jti, token))
}

/// A token that registers one host in a project (kind `registration`, role `host`): it can
/// only call the registration route. Returns its `jti`, the signed text and its expiry.
pub async fn issue_registration_token(
    ch: &mut Change, key: &SecretKey, org: OrgId, project: ProjectId, name: &str, ttl: Duration,
) -> Result<(uuid::Uuid, String, chrono::DateTime<Utc>), StoreError> {
    let spec = Spec { org, kind: "registration", user: None, host: None, project: Some(project), role: "host", name, ttl, sub: format!("project:{project}") };
    issue(ch, key, spec, None).await
}

/// A host's credential (kind `host`, role `host`), made when a registration token registers
/// it: it can only call the host protocol, as that host. Returns its `jti`, the signed text and
/// its expiry. Deregistering the host revokes it.
pub async fn issue_host_credential(
    ch: &mut Change, key: &SecretKey, org: OrgId, project: ProjectId, host: HostId, name: &str, ttl: Duration,
) -> Result<(uuid::Uuid, String, chrono::DateTime<Utc>), StoreError> {
    let spec = Spec { org, kind: "host", user: None, host: Some(host), project: Some(project), role: "host", name, ttl, sub: format!("host:{host}") };
    issue(ch, key, spec, None).await
}

struct Spec<'a> {
    org: OrgId,
    kind: &'static str,
    user: Option<UserId>,
    host: Option<HostId>,
    project: Option<ProjectId>,
    role: &'static str,
    name: &'a str,
    ttl: Duration,
    sub: String,
}

/// Records a token's row (and the token it was `issued_from`) and signs its claims with the
/// current key.
async fn issue(
    ch: &mut Change, key: &SecretKey, t: Spec<'_>, issued_from: Option<uuid::Uuid>,
) -> Result<(uuid::Uuid, String, chrono::DateTime<Utc>), StoreError> {
    let signing = signing_keys::current(ch, key).await?;
    let kid = signing.kid.clone();
    let jti = uuid::Uuid::now_v7();
    let now = Utc::now();
    let expires_at = now + t.ttl;
    tenants::insert_token(
        ch,
        &TokenRecord {
            jti,
            org: t.org,
            kind: t.kind,
            user: t.user,
            host: t.host,
            project: t.project,
            role: t.role,
            name: t.name.to_owned(),
            kid: kid.clone(),
            expires_at,
            issued_from,
        },
    )
    .await?;
    let claims = Claims {
        jti: jti.to_string(),
        sub: t.sub,
        org: t.org.to_string(),
        project: t.project.map(|p| p.to_string()),
        role: t.role.to_owned(),
        kind: t.kind.to_owned(),
        iat: now.timestamp(),
        exp: expires_at.timestamp(),
    };
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid);
    let token = encode(&header, &claims, &EncodingKey::from_secret(signing.secret.expose_secret()))
        .map_err(|e| StoreError::Invalid(format!("cannot sign token: {e}")))?;
    Ok((jti, token, expires_at))
}
