//! Connection URLs as they may be shown: the password of every `user:password@` part and of the
//! `password=`, `pass=` and `sslpassword=` query parameters replaced by `***`. Every error or log
//! line that names a Redis or database URL prints it through [`redacted`].

/// `url` with its passwords masked; the rest (scheme, user, hosts, path, other parameters) kept,
/// so the operator still sees which server was meant.
pub(crate) fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    // A Sentinel URL lists several hosts, each of which may carry its own user and password; in
    // any other URL a comma may be part of the password, so the whole authority is one part.
    let authority = if scheme.is_some_and(|s| s.contains("sentinel")) {
        authority.split(',').map(redact_sentinel_host).collect::<Vec<_>>().join(",")
    } else {
        redact_userinfo(authority)
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&authority);
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) if is_password_param(name) => format!("{name}=***"),
                _ => param.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

fn is_password_param(name: &str) -> bool {
    ["password", "pass", "sslpassword"].iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// One host of a Sentinel list. A part with no `@` that is not `host[:port]` may be the front of a
/// password with a comma in it, and is masked whole.
fn redact_sentinel_host(host: &str) -> String {
    if let Some((userinfo, host)) = host.rsplit_once('@') {
        // Without a colon the user part may be a password's tail.
        return if userinfo.contains(':') {
            redact_userinfo(&format!("{userinfo}@{host}"))
        } else {
            format!("***@{host}")
        };
    }
    let port_ok = match host.rsplit_once(':') {
        Some((name, port)) => !name.contains(':') && port.chars().all(|c| c.is_ascii_digit()),
        None => true,
    };
    if port_ok || host.starts_with('[') {
        host.to_owned()
    } else {
        "***".to_owned()
    }
}

fn redact_userinfo(host: &str) -> String {
    match host.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => host.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_are_masked_and_the_rest_is_kept() {
        assert_eq!(redacted("rediss://:s3cret@127.0.0.1:6380"), "rediss://:***@127.0.0.1:6380");
        assert_eq!(redacted("redis://app:s3cret@h:6379/2"), "redis://app:***@h:6379/2");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redacted("rediss+sentinel://:a@h1:26379,u:b@h2:26379/mymaster"),
            "rediss+sentinel://:***@h1:26379,u:***@h2:26379/mymaster"
        );
        assert_eq!(
            redacted("postgres://u:s3cret@db/sale?sslmode=verify-full&sslrootcert=/ca.pem&password=x"),
            "postgres://u:***@db/sale?sslmode=verify-full&sslrootcert=/ca.pem&password=***"
        );
        assert_eq!(redacted("postgres://u:p@ss:w@rd@db/sale"), "postgres://u:***@db/sale");
        assert_eq!(redacted("postgres://u:a,b@h1,h2/sale"), "postgres://u:***@h1,h2/sale");
        assert_eq!(
            redacted("rediss+sentinel://:a,b@h1:26379,h2:26379/m"),
            "rediss+sentinel://***,***@h1:26379,h2:26379/m"
        );
        assert_eq!(redacted("redis+unix:///run/redis.sock?pass=s3cret"), "redis+unix:///run/redis.sock?pass=***");
        assert_eq!(redacted("sqlite://seatrush.db"), "sqlite://seatrush.db");
    }
}
