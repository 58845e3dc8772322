//! axe-core (from the npm registry, pinned in `package.json`; `npm ci` at the repository root
//! installs it, `.ci/run` does) injected into the page under test: no serious or critical
//! violation of WCAG 2.1 A/AA or axe's best practices in the state the page is in.

use crate::webdriver::Browser;
use serde_json::{json, Value};
use std::path::Path;

const AXE: &str = "node_modules/axe-core/axe.min.js";

fn axe_source() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(AXE);
    std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!("{} is missing: the accessibility checks need axe-core. Run `npm ci` at the repository root (.ci/run does), then run the tests again.", path.display())
    })
}

/// Runs axe on the page as it is now; panics listing every serious or critical violation.
pub async fn assert_accessible(browser: &Browser, state: &str) {
    if browser.eval("return typeof window.axe === 'undefined';", json!([])).await == Value::Bool(true) {
        browser.eval(&format!("{}\nreturn true;", axe_source()), json!([])).await;
    }
    let violations = browser
        .eval_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, { runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice'] } })
               .then((r) => done(r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')) }))))
               .catch((e) => done([{ id: 'axe-error', impact: 'critical', help: String(e), nodes: [] }]));",
            json!([]),
        )
        .await;
    let grave: Vec<&Value> = violations
        .as_array()
        .expect("axe answers a list")
        .iter()
        .filter(|v| v["impact"] == "serious" || v["impact"] == "critical")
        .collect();
    assert!(
        grave.is_empty(),
        "axe-core: serious or critical violations in the {state} state:\n{}",
        serde_json::to_string_pretty(&grave).unwrap()
    );
}
