//! An event's `payment_url`: the template of the pay link the booking page shows after a `201`.
//! Parsed once, when the event file is read; the page fills the placeholders in the browser,
//! each URL-encoded: `{event}`, `{level}`, `{seat}` and `{code}` (the candidate's normalised
//! code, which the provider sends back as `code` in its signed notice).

/// The placeholders a template may hold.
pub const PLACEHOLDERS: [&str; 4] = ["{event}", "{level}", "{seat}", "{code}"];
/// Longest template accepted.
pub const PAYMENT_URL_CHARS_MAX: usize = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PaymentUrlError {
    #[error("payment_url must start with https:// (or http:// for a test provider)")]
    Scheme,
    #[error("payment_url is longer than {PAYMENT_URL_CHARS_MAX} characters")]
    Length,
    #[error("payment_url holds {0:?}; the placeholders are {{event}}, {{level}}, {{seat}} and {{code}}")]
    Placeholder(String),
    #[error("payment_url may not hold spaces, quotes, < > or control characters")]
    Characters,
}

/// Checks a template; returns it unchanged when it is one.
pub fn parse_payment_url(template: &str) -> Result<String, PaymentUrlError> {
    if !(template.starts_with("https://") || template.starts_with("http://")) {
        return Err(PaymentUrlError::Scheme);
    }
    if template.chars().count() > PAYMENT_URL_CHARS_MAX {
        return Err(PaymentUrlError::Length);
    }
    if template.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '<' | '>' | '`')) {
        return Err(PaymentUrlError::Characters);
    }
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').map(|e| start + e + 1).unwrap_or(rest.len());
        let placeholder = &rest[start..end];
        if !PLACEHOLDERS.contains(&placeholder) {
            return Err(PaymentUrlError::Placeholder(placeholder.to_owned()));
        }
        rest = &rest[end..];
    }
    if rest.contains('}') || template.matches('}').count() != template.matches('{').count() {
        return Err(PaymentUrlError::Placeholder("}".into()));
    }
    Ok(template.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_with_known_placeholders_parse() {
        let t = "https://pay.example.org/checkout?event={event}&seat={seat}&level={level}&ref={code}";
        assert_eq!(parse_payment_url(t).unwrap(), t);
        assert!(parse_payment_url("http://127.0.0.1:9/pay").is_ok());
    }

    #[test]
    fn other_schemes_unknown_placeholders_and_markup_are_refused() {
        assert_eq!(parse_payment_url("javascript:alert(1)"), Err(PaymentUrlError::Scheme));
        assert_eq!(parse_payment_url("https://p/{name}"), Err(PaymentUrlError::Placeholder("{name}".into())));
        assert!(parse_payment_url("https://p/{seat").is_err());
        assert!(parse_payment_url("https://p/seat}").is_err());
        assert_eq!(parse_payment_url("https://p/\"><script>"), Err(PaymentUrlError::Characters));
        assert_eq!(
            parse_payment_url(&format!("https://{}", "a".repeat(PAYMENT_URL_CHARS_MAX))),
            Err(PaymentUrlError::Length)
        );
    }
}
