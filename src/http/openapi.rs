//! `GET /api/openapi.json`. The document is built from the `#[utoipa::path]` attributes on the
//! handlers, and the router registers those same handlers through `utoipa_axum::routes!`, which
//! takes each route's method and path from its attribute: a route cannot be served without being
//! documented, nor documented at a path it is not served on.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "seatrush", description = "Flash-sale seat booking. Every answer but a success carries a stable snake_case `status`; 503s carry `Retry-After`, and retrying a booking with the same nonce is always safe."),
    modifiers(&OperatorToken),
    tags(
        (name = "bookings", description = "What the booking page calls"),
        (name = "operator", description = "Behind `Authorization: Bearer <operator-token>`"),
        (name = "payments", description = "What a payment provider calls, signed with the webhook secret"),
        (name = "operations", description = "Health and metrics"),
    )
)]
pub(crate) struct ApiDoc;

struct OperatorToken;

impl Modify for OperatorToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("operator_token", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

#[cfg(test)]
mod tests {
    use crate::http::api_router;
    use crate::sale::answer::AnswerStatus;
    use std::collections::BTreeSet;

    fn statuses(doc: &serde_json::Value, path: &str, method: &str) -> BTreeSet<String> {
        let responses = doc["paths"][path][method]["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{method} {path} is not documented"));
        responses.keys().cloned().collect()
    }

    fn set(codes: &[&str]) -> BTreeSet<String> {
        codes.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn every_endpoint_lists_every_status_it_can_answer() {
        let (_, api) = api_router().split_for_parts();
        let doc = serde_json::to_value(&api).unwrap();
        let bookings = "/api/events/{event}/bookings";
        assert_eq!(
            statuses(&doc, bookings, "post"),
            set(&["201", "202", "400", "403", "404", "408", "409", "415", "429", "503"])
        );
        assert_eq!(
            statuses(&doc, "/api/events/{event}/waitlist", "post"),
            set(&["201", "202", "400", "403", "404", "408", "409", "415", "429", "503"])
        );
        assert_eq!(statuses(&doc, "/api/events/{event}", "get"), set(&["200", "304", "404", "503"]));
        // 400 too: the code in the path is normalised like a booking's and can fail to.
        for action in ["payment", "cancel"] {
            let path = format!("/api/events/{{event}}/bookings/{{code}}/{action}");
            assert_eq!(
                statuses(&doc, &path, "post"),
                set(&["200", "400", "401", "404", "409", "429", "503"]),
                "{path}"
            );
            assert!(doc["paths"][&path]["post"]["security"][0]["operator_token"].is_array());
        }
        let extend = "/api/events/{event}/bookings/{code}/extend";
        assert_eq!(statuses(&doc, extend, "post"), set(&["200", "400", "401", "404", "409", "429", "503"]));
        assert!(doc["paths"][extend]["post"]["security"][0]["operator_token"].is_array());
        let moving = "/api/events/{event}/bookings/{code}/move";
        assert_eq!(statuses(&doc, moving, "post"), set(&["200", "400", "401", "404", "409", "429", "503"]));
        assert!(doc["paths"][moving]["post"]["security"][0]["operator_token"].is_array());
        let lookup = "/api/events/{event}/bookings/{code}";
        assert_eq!(statuses(&doc, lookup, "get"), set(&["200", "400", "401", "404", "429", "503"]));
        assert!(doc["paths"][lookup]["get"]["security"][0]["operator_token"].is_array());
        let webhook = "/api/events/{event}/payments/webhook";
        assert_eq!(statuses(&doc, webhook, "post"), set(&["200", "400", "401", "404", "409", "503"]));
        assert!(doc["paths"][webhook]["post"]["security"].is_null(), "signed, not behind the operator token");
        assert_eq!(statuses(&doc, "/healthz", "get"), set(&["200"]));
        assert_eq!(statuses(&doc, "/readyz", "get"), set(&["200", "503"]));
        // 400: a page size outside 1-200.
        assert_eq!(statuses(&doc, "/api/ops/summary", "get"), set(&["200", "400", "401", "429", "503"]));
        let params = doc["paths"]["/api/ops/summary"]["get"]["parameters"].as_array().unwrap();
        let names: BTreeSet<&str> = params.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(names, BTreeSet::from(["events_after", "events_limit"]));
        assert_eq!(statuses(&doc, "/metrics", "get"), set(&["200"]));
        assert!(doc["components"]["securitySchemes"]["operator_token"]["scheme"] == "bearer");
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    }

    #[test]
    fn the_documented_status_strings_and_codes_come_from_the_answer_table() {
        let (_, api) = api_router().split_for_parts();
        let doc = serde_json::to_value(&api).unwrap();
        let strings: Vec<&str> = AnswerStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            doc["components"]["schemas"]["ErrorBody"]["properties"]["status"]["oneOf"][0]["enum"],
            serde_json::json!(strings)
        );
        let documented: BTreeSet<String> = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|p| p.as_object().unwrap().values())
            .flat_map(|op| op["responses"].as_object().unwrap().keys().cloned())
            .collect();
        for status in AnswerStatus::ALL {
            assert!(
                documented.contains(&status.http_code().to_string()) || status == AnswerStatus::InternalError,
                "{status:?} is answered but documented nowhere"
            );
        }
    }
}
