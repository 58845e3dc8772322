//! Browser protections on every answer (docs/design.md#browser-protections): `nosniff`, no
//! referrer, no framing, and a Content-Security-Policy. API answers get `default-src 'none'` (a
//! JSON body has nothing to load); each page gets `default-src 'self'` with its own inline
//! `<script>` and `<style>` allowed by their SHA-256, never by `'unsafe-inline'`, so a script
//! injected into the page would not run and the booking button cannot be framed by another site.

use super::AppState;
use axum::extract::{Request, State};
use axum::http::header::{
    CONTENT_SECURITY_POLICY, REFERRER_POLICY, STRICT_TRANSPORT_SECURITY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The policy of an answer that is not a page.
const API_POLICY: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
/// A year, for operators who terminate TLS in front and turn `hsts` on.
const HSTS: &str = "max-age=31536000";

/// Adds the protections to every answer; a page's own policy (set by its handler) is kept.
pub async fn protect(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.entry(CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(API_POLICY));
    if app.edge.settings.hsts {
        headers.insert(STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(HSTS));
    }
    response
}

/// The policy of one page: its own origin, and exactly its inline scripts and styles.
pub fn page_policy(html: &str) -> HeaderValue {
    let scripts = hashes(html, "script");
    let styles = hashes(html, "style");
    let policy = format!(
        "default-src 'self'; script-src 'self'{scripts}; style-src 'self'{styles}; img-src 'self' data:; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
    );
    HeaderValue::from_str(&policy).expect("a policy is ASCII")
}

/// ` 'sha256-…'` for the text of every `<tag>…</tag>` in `html`.
fn hashes(html: &str, tag: &str) -> String {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = String::new();
    let mut rest = html;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let Some(end) = body.find(&close) else { break };
        let digest = Sha256::digest(&body.as_bytes()[..end]);
        out.push_str(&format!(" 'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest)));
        rest = &body[end + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_policy_names_each_inline_block_by_hash_and_nothing_unsafe() {
        let html = "<html><style>p{}</style><script>go()</script><script>more()</script></html>";
        let policy = page_policy(html).to_str().unwrap().to_owned();
        let digest = |s: &str| base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s.as_bytes()));
        assert!(policy.contains(&format!(
            "script-src 'self' 'sha256-{}' 'sha256-{}';",
            digest("go()"),
            digest("more()")
        )));
        assert!(policy.contains(&format!("style-src 'self' 'sha256-{}';", digest("p{}"))));
        assert!(policy.contains("frame-ancestors 'none'") && policy.contains("default-src 'self'"));
        assert!(!policy.contains("unsafe") && !policy.contains('*'), "{policy}");
    }

    #[test]
    fn every_inline_block_of_the_shipped_pages_is_a_bare_tag_the_hash_finds() {
        // An attribute on a tag (`<script type=…>`) would hide the block from the hash and break
        // the page under its own policy.
        for page in [include_str!("../../assets/booking.html"), include_str!("../../assets/ops.html")] {
            assert_eq!(page.matches("<script").count(), page.matches("<script>").count());
            assert_eq!(page.matches("<style").count(), page.matches("<style>").count());
            assert!(!page.contains(" style=\""), "inline style attributes need 'unsafe-inline'");
            let policy = page_policy(page).to_str().unwrap().to_owned();
            assert_eq!(
                policy.matches("'sha256-").count(),
                page.matches("<script>").count() + page.matches("<style>").count()
            );
        }
    }
}
