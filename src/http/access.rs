//! Who may call this: the admin and service keys, a user's own token (or,
//! under development auth, `?viewer=`), and the charge of a read against
//! the read budgets. Handlers ask it and get an answer or an error; it
//! imports no handler.

use actix_web::http::StatusCode;
use actix_web::HttpRequest;
use serde::Deserialize;

use super::{client_addr, ApiError, AppState};
use crate::auth::AuthError;
use crate::protocol::ErrorCode;

/// Marks the public listener of a node that serves operations elsewhere.
#[derive(Debug, Clone, Copy)]
pub(super) struct PublicOnly;

/// Marks the `--internal-listen` listener, where `/metrics` needs no key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Internal;

/// Who reads: `?viewer=` in dev mode, a token with JWT.
#[derive(Deserialize)]
pub(crate) struct As {
    viewer: Option<String>,
    pub(super) token: Option<String>,
}

impl As {
    /// `?viewer=`.
    pub(super) fn viewer(&self) -> Option<&str> {
        self.viewer.as_deref()
    }

    /// `?token=`.
    pub(super) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

/// Checks that the request acts for `user`: the admin key (which acts for
/// any user), or the user's own token (`query_token` or the bearer; under
/// development auth, anyone). Another user's token is a 403. The write is
/// charged to the caller's read budget as one user (a `429` beyond it).
pub(super) async fn require_self_or_admin(
    req: &HttpRequest,
    state: &AppState,
    user: &str,
    query_token: Option<&str>,
) -> Result<(), ApiError> {
    if is_admin(req, state) {
        return state.charge_read(req, Payer::Service, 1);
    }
    let acting = state.auth.viewer(req, query_token, Some(user)).await?;
    if acting.as_deref() != Some(user) {
        return Err(AuthError::Mismatch {
            token: acting.unwrap_or_default(),
            asked: user.to_string(),
        }
        .into());
    }
    // A write is one Redis script: it counts as one user read against the
    // client's budget (its address's, and its token's user's).
    state.charge_read(req, Payer::Client(acting.as_deref()), 1)
}

/// True when the request carries the admin key.
pub(super) fn is_admin(req: &HttpRequest, state: &AppState) -> bool {
    let Some(key) = state.admin_key.as_deref() else {
        return false;
    };
    // With --internal-listen the admin key works only there.
    if req.app_data::<PublicOnly>().is_some() {
        return false;
    }
    bearer_is(req, key)
}

/// True when the request may read the service view: the admin key (where
/// it works) or the service key (on either listener: it reads, nothing more).
pub(super) fn is_service(req: &HttpRequest, state: &AppState) -> bool {
    is_admin(req, state)
        || state
            .service_key
            .as_deref()
            .is_some_and(|key| bearer_is(req, key))
}

/// True when the bearer token is `key`.
pub(super) fn bearer_is(req: &HttpRequest, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    let given = crate::auth::bearer(req).unwrap_or("");
    // Same time whatever the key, so it cannot be guessed byte by byte
    // (a length mismatch is told at once, which gives away only the length).
    given.as_bytes().ct_eq(key.as_bytes()).into()
}

/// The service or admin key, or `401`.
pub(super) fn require_service(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if is_service(req, state) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        "this read needs Authorization: Bearer <service key> (or the admin key)",
    ))
}

pub(super) fn require_admin(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if state.admin_key.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            "the admin API is off: start the server with --admin-key",
        ));
    }
    if !is_admin(req, state) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the admin API needs Authorization: Bearer <admin key>",
        ));
    }
    Ok(())
}

/// Who pays for an HTTP read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payer<'a> {
    /// The admin or service key: their shared budget.
    Service,
    /// A client: its address, and the user it reads as.
    Client(Option<&'a str>),
}

impl AppState {
    /// The budgets `payer` is charged to on `req`: the keys' shared one, or
    /// the client address's and, under JWT, its token's user's (under
    /// development auth `?viewer=` is anyone's to claim, so it has none).
    fn charge_of<'a>(&self, req: &HttpRequest, payer: Payer<'a>) -> crate::admission::Charge<'a> {
        use crate::admission::Charge;
        match payer {
            Payer::Service => Charge::Service,
            Payer::Client(user) => Charge::Client {
                ip: client_addr(req, &self.node.config)
                    .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                user: match *self.auth {
                    crate::auth::Auth::Jwt(_) => user,
                    crate::auth::Auth::Dev => None,
                },
            },
        }
    }

    /// Charges a read of `cost` users (or rooms) to `payer`'s budgets. A
    /// refusal is `429` with `Retry-After`, and nothing of the read is done.
    pub(crate) fn charge_read(
        &self,
        req: &HttpRequest,
        payer: Payer<'_>,
        cost: usize,
    ) -> Result<(), ApiError> {
        let cost = u32::try_from(cost).unwrap_or(u32::MAX);
        self.budgets
            .charge(self.charge_of(req, payer), cost)
            .map_err(|wait| {
                crate::metrics::METRICS.admission.http_rate_limited.inc();
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::RateLimited,
                    format!(
                        "read budget spent ({} users per second); try again in {} ms",
                        self.budgets.client_rate().per_sec,
                        wait.as_millis().max(1)
                    ),
                )
                .retry_after(wait)
            })
    }

    /// A read of `cost` users, devices or rooms by `payer`: a place among
    /// its reads in flight (`429` when it has the most), then its charge
    /// (`429` when its budget is spent; nothing of the read is done then).
    /// Both before any of the read's work, so that a read cancelled
    /// midway (its client gone, its deadline passed) has paid all the
    /// same. The place is held until the permit is dropped.
    pub(crate) fn admit_read(
        &self,
        req: &HttpRequest,
        payer: Payer<'_>,
        cost: usize,
    ) -> Result<crate::admission::ReadPermit, ApiError> {
        let permit = self
            .in_flight
            .enter(self.charge_of(req, payer))
            .ok_or_else(|| {
                crate::metrics::METRICS.admission.http_rate_limited.inc();
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::RateLimited,
                    format!(
                        "{} reads of this client are in flight, the most allowed; \
                         try again when one has answered",
                        self.in_flight.cap()
                    ),
                )
                .retry_after(std::time::Duration::from_secs(1))
            })?;
        self.charge_read(req, payer, cost)?;
        Ok(permit)
    }
}
