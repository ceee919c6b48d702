//! Which analysis endpoints the operator may call, and how an endpoint is
//! shown to people.
//!
//! Whoever may edit an OpenMedModel writes its Prometheus addresses and
//! webhook URLs, but the requests come from the operator, with the
//! operator's network position. So the endpoints are an administrator's
//! choice: `run --analysis-allow PREFIX`, repeatable, and with none given
//! nothing is asked at all. A prefix is compared as a parsed URL, never as
//! text: scheme, host and port exactly, the path segment by segment, so
//! `http://prom:9090` allows neither `http://prom:9090.evil.example` nor
//! `http://prom:9090@evil.example`. An endpoint with credentials in it
//! (`user:password@`) is never allowed: they would be sent to whoever
//! answers, and copied into every message about the endpoint.
//!
//! [`redact`] is how an endpoint appears in a status, an Event or a log:
//! without its credentials and its query, which is where tokens go.

use std::fmt;
use std::str::FromStr;

use url::{Host, Url};

/// One `--analysis-allow` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedPrefix {
    scheme: String,
    host: Host<String>,
    port: u16,
    /// The path's segments, without the empty one a trailing `/` leaves.
    segments: Vec<String>,
    /// The prefix as given, for messages.
    text: String,
}

impl AllowedPrefix {
    /// Reads a prefix: an `http://` or `https://` URL with a host, and no
    /// credentials, query or fragment (none of them can be a prefix).
    pub fn parse(text: &str) -> Result<Self, String> {
        let url = Url::parse(text).map_err(|e| format!("{}: not a URL ({e})", redact(text)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{}: must be http:// or https://", redact(text)));
        }
        if has_credentials(&url) {
            return Err(format!(
                "{}: must not contain credentials (user:password@)",
                redact(text)
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "{}: must not contain a query or a fragment",
                redact(text)
            ));
        }
        let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
            return Err(format!("{}: needs a host", redact(text)));
        };
        Ok(AllowedPrefix {
            scheme: url.scheme().to_owned(),
            host: host.to_owned(),
            port,
            segments: segments(&url),
            text: text.to_owned(),
        })
    }

    /// Whether `url` is under this prefix: the same scheme, host and port,
    /// and a path whose first segments are the prefix's.
    pub fn allows(&self, url: &Url) -> bool {
        let path = segments(url);
        url.scheme() == self.scheme
            && url.host().map(|h| h.to_owned()).as_ref() == Some(&self.host)
            && url.port_or_known_default() == Some(self.port)
            && path.len() >= self.segments.len()
            && path[..self.segments.len()] == self.segments[..]
    }
}

impl fmt::Display for AllowedPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for AllowedPrefix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        AllowedPrefix::parse(text)
    }
}

/// Every `--analysis-allow` prefix; empty, the default, allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    prefixes: Vec<AllowedPrefix>,
}

/// Why an endpoint may not be called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `--analysis-allow` was given.
    NothingAllowed,
    /// The endpoint is not a URL the operator could call.
    NotAUrl,
    /// The endpoint carries `user:password@`.
    Credentials,
    /// No prefix covers the endpoint.
    NotUnderAPrefix,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::NothingAllowed => "the operator runs without --analysis-allow",
            Refusal::NotAUrl => "not a URL",
            Refusal::Credentials => "credentials in an address (user:password@) are never sent",
            Refusal::NotUnderAPrefix => "under no --analysis-allow prefix",
        })
    }
}

impl AllowList {
    /// The list of these prefixes.
    pub fn new(prefixes: Vec<AllowedPrefix>) -> Self {
        AllowList { prefixes }
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// The prefixes, as given.
    pub fn prefixes(&self) -> &[AllowedPrefix] {
        &self.prefixes
    }

    /// The URL to call for `endpoint`, or why it may not be called.
    pub fn check(&self, endpoint: &str) -> Result<Url, Refusal> {
        let url = Url::parse(endpoint).map_err(|_| Refusal::NotAUrl)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Refusal::NotAUrl);
        }
        if has_credentials(&url) {
            return Err(Refusal::Credentials);
        }
        if self.prefixes.is_empty() {
            return Err(Refusal::NothingAllowed);
        }
        if self.prefixes.iter().any(|p| p.allows(&url)) {
            Ok(url)
        } else {
            Err(Refusal::NotUnderAPrefix)
        }
    }
}

fn has_credentials(url: &Url) -> bool {
    !url.username().is_empty() || url.password().is_some()
}

fn segments(url: &Url) -> Vec<String> {
    let mut segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_owned).collect())
        .unwrap_or_default();
    if segments.last().is_some_and(String::is_empty) {
        segments.pop();
    }
    segments
}

/// `address` as it may appear in a status, an Event or a log: credentials
/// and the query (and fragment) replaced by `***`.
pub fn redact(address: &str) -> String {
    if let Ok(url) = Url::parse(address)
        && url.has_host()
    {
        let credentials = if has_credentials(&url) { "***@" } else { "" };
        let host = url.host_str().unwrap_or_default();
        let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
        let rest = if url.query().is_some() {
            "?***"
        } else if url.fragment().is_some() {
            "#***"
        } else {
            ""
        };
        return format!(
            "{}://{credentials}{host}{port}{}{rest}",
            url.scheme(),
            url.path()
        );
    }
    // Not a URL a parser agrees on: where its credentials would end cannot
    // be told, so everything up to the last `@` goes.
    let (base, rest) = match address.find(['?', '#']) {
        Some(at) => (&address[..at], &address[at..at + 1]),
        None => (address, ""),
    };
    let base = match base.rfind('@') {
        Some(at) => format!("***@{}", &base[at + 1..]),
        None => base.to_owned(),
    };
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!("{rest}***")
    };
    format!("{base}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(prefixes: &[&str]) -> AllowList {
        AllowList::new(prefixes.iter().map(|p| p.parse().unwrap()).collect())
    }

    #[test]
    fn nothing_is_allowed_without_a_prefix() {
        assert_eq!(
            AllowList::default().check("http://prometheus.monitoring:9090"),
            Err(Refusal::NothingAllowed)
        );
    }

    #[test]
    fn scheme_host_and_port_must_be_the_prefixs_exactly() {
        let list = allow(&["http://prom.monitoring:9090"]);
        for allowed in [
            "http://prom.monitoring:9090",
            "http://prom.monitoring:9090/",
            "http://prom.monitoring:9090/api/v1/query",
            "HTTP://PROM.monitoring:9090/api",
        ] {
            assert!(list.check(allowed).is_ok(), "{allowed}");
        }
        for (refused, why) in [
            ("http://prom.monitoring:9090.evil.example", Refusal::NotAUrl),
            ("http://prom.monitoring:9090@evil", Refusal::Credentials),
            (
                "http://prom.monitoring:9090@evil:9090",
                Refusal::Credentials,
            ),
            (
                "http://user:pass@prom.monitoring:9090",
                Refusal::Credentials,
            ),
            ("http://user@prom.monitoring:9090", Refusal::Credentials),
            (
                "http://prom.monitoring.evil.example:9090",
                Refusal::NotUnderAPrefix,
            ),
            (
                "http://evil.example/prom.monitoring:9090",
                Refusal::NotUnderAPrefix,
            ),
            ("http://prom.monitoring:9091", Refusal::NotUnderAPrefix),
            ("http://prom.monitoring", Refusal::NotUnderAPrefix),
            ("https://prom.monitoring:9090", Refusal::NotUnderAPrefix),
            ("http://prom.monitoring.:9090", Refusal::NotUnderAPrefix),
            ("http://10.0.0.1:9090", Refusal::NotUnderAPrefix),
            (
                "http://169.254.169.254/latest/meta-data",
                Refusal::NotUnderAPrefix,
            ),
            ("file:///etc/passwd", Refusal::NotAUrl),
            ("prom.monitoring:9090", Refusal::NotAUrl),
        ] {
            assert_eq!(list.check(refused), Err(why), "{refused}");
        }
    }

    #[test]
    fn default_ports_are_the_same_port() {
        let list = allow(&["https://hooks.example"]);
        assert!(list.check("https://hooks.example:443/x").is_ok());
        assert!(list.check("http://hooks.example:443/x").is_err());
        assert!(list.check("https://hooks.example:8443/x").is_err());
    }

    #[test]
    fn paths_match_by_whole_segments() {
        let list = allow(&["http://hooks:8080/canary/"]);
        for allowed in [
            "http://hooks:8080/canary",
            "http://hooks:8080/canary/",
            "http://hooks:8080/canary/check?token=1",
            "http://hooks:8080/other/../canary/x",
        ] {
            assert!(list.check(allowed).is_ok(), "{allowed}");
        }
        for refused in [
            "http://hooks:8080/",
            "http://hooks:8080/canaryx",
            "http://hooks:8080/canary/../admin",
            "http://hooks:8080/canary/%2e%2e/admin",
            "http://hooks:8080/canary%2Fx",
            "http://hooks:8080/Canary",
        ] {
            assert_eq!(
                list.check(refused),
                Err(Refusal::NotUnderAPrefix),
                "{refused}"
            );
        }
    }

    #[test]
    fn ip_literals_are_allowed_only_as_themselves() {
        let list = allow(&["http://127.0.0.1:9090", "http://[::1]:9090"]);
        assert!(list.check("http://127.0.0.1:9090/api/v1/query").is_ok());
        assert!(list.check("http://[::1]:9090/").is_ok());
        assert!(list.check("http://127.0.0.2:9090").is_err());
        assert!(list.check("http://localhost:9090").is_err());
    }

    #[test]
    fn any_prefix_may_allow() {
        let list = allow(&["http://a:1", "http://b:2/x"]);
        assert!(list.check("http://a:1/y").is_ok());
        assert!(list.check("http://b:2/x/y").is_ok());
        assert!(list.check("http://b:2/y").is_err());
    }

    #[test]
    fn prefixes_that_cannot_be_prefixes_are_refused() {
        for (bad, why) in [
            ("prom:9090", "http:// or https://"),
            ("ftp://prom", "http:// or https://"),
            ("http://user:secret@prom:9090", "credentials"),
            ("http://prom:9090/?match=x", "query"),
            ("http://prom:9090/#x", "fragment"),
            ("http://prom:port", "not a URL"),
        ] {
            let error = AllowedPrefix::parse(bad).unwrap_err();
            assert!(error.contains(why), "{bad}: {error}");
            assert!(!error.contains("secret"), "{error}");
        }
        assert_eq!(
            AllowedPrefix::parse("http://prom:9090")
                .unwrap()
                .to_string(),
            "http://prom:9090"
        );
    }

    #[test]
    fn redaction_drops_credentials_and_queries() {
        for (address, shown) in [
            ("http://prom:9090", "http://prom:9090/"),
            (
                "https://hooks.example/canary",
                "https://hooks.example/canary",
            ),
            (
                "https://user:secret@hooks.example:8443/c?token=abc",
                "https://***@hooks.example:8443/c?***",
            ),
            ("http://user@hooks/x", "http://***@hooks/x"),
            ("http://hooks/x#token", "http://hooks/x#***"),
            // Not URLs: everything up to the last @ goes.
            (
                "http://user:secret@prom:bad/x?token=abc",
                "***@prom:bad/x?***",
            ),
            ("user:secret@prom:9090", "***@prom:9090"),
            ("prom:9090", "prom:9090"),
        ] {
            assert_eq!(redact(address), shown, "{address}");
        }
    }
}
