//! `Debug` of `Settings` and `Overrides`, written by hand so that neither prints a secret: the
//! admin token as `***`, the database URL through `redact_url`, a route's and its status URL
//! through `redact_route_url`.

use std::fmt;

use oncebox_core::route::Route;

use super::{Overrides, Settings, redact_route_url, redact_url};

/// By hand because `GatewayConfig`'s derived `Debug` would print the admin token and the
/// routes' URLs, and a database URL may carry a password.
impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gw = &self.gateway;
        let routes: Vec<_> = gw.routes.iter().map(ShownRoute).collect();
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("database", &redact_url(&self.database))
            .field("storage", &self.storage)
            .field("sources", &gw.sources)
            .field("open_sources", &gw.open_sources)
            .field("admin_token", &gw.admin_token.as_ref().map(|_| "***"))
            .field("limits", &gw.limits)
            .field("routes", &routes)
            .field("relay", &self.relay)
            .field("consumers", &self.consumers)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// A route as its derived `Debug` would print it, with its URLs redacted: a receiver's URL may
/// carry a token in its user info or its query.
struct ShownRoute<'r>(&'r Route);

impl fmt::Debug for ShownRoute<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured without `..`: a field added to `Route` must be looked at here, since it
        // may hold a secret.
        let Route {
            name,
            sources,
            filter,
            url,
            timeout,
            signing_secret,
            idempotent,
            status_url,
            retry,
            concurrency,
            rate,
            ca_pem,
        } = self.0;
        f.debug_struct("Route")
            .field("name", name)
            .field("sources", sources)
            .field("filter", filter)
            .field("url", &redact_route_url(url))
            .field("timeout", timeout)
            .field("signing_secret", signing_secret)
            .field("idempotent", idempotent)
            .field("status_url", &status_url.as_deref().map(redact_route_url))
            .field("retry", retry)
            .field("concurrency", concurrency)
            .field("rate", rate)
            // Public certificates: their size says enough.
            .field("ca_pem", &ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Overrides")
            .field("config", &self.config)
            .field("listen", &self.listen)
            .field("database", &self.database.as_deref().map(redact_url))
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field("secrets", &self.secrets)
            .finish()
    }
}
