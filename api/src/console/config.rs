//! `ConsoleConfig`: the console's settings, flags and `SHOPFLOOR_*` variables of `serve` and `api`.

use secrecy::SecretString;

/// The console's settings: `SHOPFLOOR_PUBLIC_URL` (the address people use, e.g.
/// `https://shopfloor.example.com`; it makes the OAuth callback URL and, when `https`, marks
/// cookies `Secure`; by default the request's `Host` over plain HTTP, or HTTPS when a proxy
/// says `X-Forwarded-Proto: https`), `SHOPFLOOR_GITHUB_CLIENT_ID` and
/// `SHOPFLOOR_GITHUB_CLIENT_SECRET` (a GitHub OAuth App's; without them only token sign-in is
/// offered), `SHOPFLOOR_GITHUB_OAUTH_URL` (default `https://github.com`),
/// `SHOPFLOOR_GITHUB_OAUTH_API_URL` (default `https://api.github.com`; both point at a fake in
/// tests, or at a GitHub Enterprise server), `SHOPFLOOR_GITHUB_APP_SLUG` (the install flow of
/// "Connect GitHub"), `SHOPFLOOR_CONSOLE_SESSION_HOURS` (12).
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleConfig {
    /// The console's public base URL.
    #[arg(long = "public-url", env = "SHOPFLOOR_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The GitHub OAuth App's client id.
    #[arg(long = "github-client-id", env = "SHOPFLOOR_GITHUB_CLIENT_ID")]
    pub github_client_id: Option<String>,
    /// The GitHub OAuth App's client secret.
    #[arg(long = "github-client-secret", env = "SHOPFLOOR_GITHUB_CLIENT_SECRET", hide_env_values = true)]
    pub github_client_secret: Option<SecretString>,
    /// Where GitHub's OAuth pages are (`/login/oauth/authorize`, `/login/oauth/access_token`).
    #[arg(long = "github-oauth-url", env = "SHOPFLOOR_GITHUB_OAUTH_URL", default_value = "https://github.com")]
    pub github_oauth_url: String,
    /// GitHub's REST API as people's tokens reach it: `/user` during sign-in, and
    /// `/user/installations`, the proof an installation claim needs.
    #[arg(long = "github-oauth-api-url", env = "SHOPFLOOR_GITHUB_OAUTH_API_URL", default_value = "https://api.github.com")]
    pub github_oauth_api_url: String,
    /// The GitHub App's slug (`github.com/apps/<slug>`): "Connect GitHub" sends people to its
    /// install page. The App's setup URL is `<public url>/github/setup`, and
    /// `<public url>/github/setup/callback` is one of its OAuth callback URLs.
    #[arg(long = "github-app-slug", env = "SHOPFLOOR_GITHUB_APP_SLUG")]
    pub github_app_slug: Option<String>,
    /// How long a console session lasts.
    #[arg(long = "console-session-hours", env = "SHOPFLOOR_CONSOLE_SESSION_HOURS", default_value_t = 12)]
    pub session_hours: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            public_url: None,
            github_client_id: None,
            github_client_secret: None,
            github_oauth_url: "https://github.com".into(),
            github_oauth_api_url: "https://api.github.com".into(),
            github_app_slug: None,
            session_hours: 12,
        }
    }
}

impl ConsoleConfig {
    pub(super) fn github_enabled(&self) -> bool {
        self.github_client_id.is_some() && self.github_client_secret.is_some()
    }
}
