//! The booking page's words in the candidate's language. English, French and German are bundled
//! (`assets/strings/*.json`, one key → text map each); an operator may add languages or change any
//! text with `--page-strings-dir DIR` (a `LANG.json` per language, read once at start). The
//! language is the event's `language` when it is one of these, else the best of the browser's
//! `Accept-Language`, else English; the page is served with `<html lang="…">` of the language it
//! speaks. Static texts are filled into the markup (`{{key}}`), the script's into a `<meta>` tag,
//! so the script and style hashes of the page's policy stay as computed at start.

use crate::domain::event::is_language_tag;
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::path::Path;

/// Key → text of one language.
type Strings = BTreeMap<String, String>;

const BUNDLED: [(&str, &str); 3] = [
    ("en", include_str!("../../assets/strings/en.json")),
    ("fr", include_str!("../../assets/strings/fr.json")),
    ("de", include_str!("../../assets/strings/de.json")),
];
/// What every language falls back to, and whose keys a new language must give.
const DEFAULT_LANGUAGE: &str = "en";
const STRINGS_META: &str = r#"<meta name="seatrush-strings" content="">"#;
/// Longest text accepted for one key.
const TEXT_CHARS_MAX: usize = 1000;

/// Every language the page can speak.
pub struct PageStrings {
    by_language: BTreeMap<String, Strings>,
}

impl PageStrings {
    /// The bundled languages, with the operator's directory (if any) laid over them.
    pub fn load(dir: Option<&Path>) -> anyhow::Result<Self> {
        let mut by_language = BTreeMap::new();
        for (language, json) in BUNDLED {
            let strings: Strings = serde_json::from_str(json).expect("the bundled strings are valid JSON");
            by_language.insert(language.to_owned(), strings);
        }
        let mut this = Self { by_language };
        if let Some(dir) = dir {
            this.overlay(dir)?;
        }
        Ok(this)
    }

    /// Each `LANG.json` of `dir`: for a bundled language its keys replace the bundled texts; a new
    /// language must give every key. An unknown key is refused (a typo would silently not show).
    fn overlay(&mut self, dir: &Path) -> anyhow::Result<()> {
        let keys: Vec<String> = self.by_language[DEFAULT_LANGUAGE].keys().cloned().collect();
        let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let language = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_owned();
            if !is_language_tag(&language) {
                bail!("{}: the file name must be a language tag such as fr.json or pt-BR.json", path.display());
            }
            let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let given: Strings = serde_json::from_str(&text)
                .with_context(|| format!("{}: expected one JSON object of key -> text", path.display()))?;
            if let Some(unknown) = given.keys().find(|k| !keys.contains(k)) {
                bail!("{}: unknown key {unknown:?}; the keys are those of assets/strings/en.json", path.display());
            }
            if let Some((key, _)) = given.iter().find(|(_, v)| v.chars().count() > TEXT_CHARS_MAX) {
                bail!("{}: the text of {key:?} is longer than {TEXT_CHARS_MAX} characters", path.display());
            }
            let strings = match self.by_language.remove(&language) {
                Some(mut bundled) => {
                    bundled.extend(given);
                    bundled
                }
                None => {
                    let missing: Vec<&String> = keys.iter().filter(|k| !given.contains_key(*k)).collect();
                    if !missing.is_empty() {
                        bail!("{}: a new language needs every key; missing {missing:?}", path.display());
                    }
                    given
                }
            };
            self.by_language.insert(language, strings);
        }
        Ok(())
    }

    /// The languages, in tag order.
    pub fn languages(&self) -> impl Iterator<Item = &str> {
        self.by_language.keys().map(String::as_str)
    }

    /// The event's language if the page speaks it, else the best of `Accept-Language` (by
    /// quality, then order; a region falls back to its language: `fr-CA` → `fr`), else English.
    pub fn choose<'a>(&'a self, event_language: Option<&str>, accept_language: Option<&str>) -> &'a str {
        if let Some(found) = event_language.and_then(|l| self.find(l)) {
            return found;
        }
        let mut wanted: Vec<(f32, &str)> = accept_language
            .unwrap_or("")
            .split(',')
            .filter_map(|part| {
                let mut fields = part.split(';');
                let tag = fields.next()?.trim();
                let quality = fields
                    .find_map(|f| f.trim().strip_prefix("q="))
                    .map_or(Some(1.0), |q| q.trim().parse::<f32>().ok())?;
                (!tag.is_empty() && quality > 0.0).then_some((quality, tag))
            })
            .collect();
        wanted.sort_by(|a, b| b.0.total_cmp(&a.0));
        wanted.iter().find_map(|(_, tag)| self.find(tag)).unwrap_or(DEFAULT_LANGUAGE)
    }

    fn find(&self, tag: &str) -> Option<&str> {
        let exact = self.by_language.keys().find(|l| l.eq_ignore_ascii_case(tag));
        let primary = tag.split('-').next().unwrap_or("");
        let base = || self.by_language.keys().find(|l| l.eq_ignore_ascii_case(primary));
        exact.or_else(base).map(String::as_str)
    }

    /// One text of `language` (English when it lacks the key).
    pub fn text(&self, language: &str, key: &str) -> &str {
        let of = |l: &str| self.by_language.get(l).and_then(|s| s.get(key));
        of(language).or_else(|| of(DEFAULT_LANGUAGE)).map_or("", String::as_str)
    }

    /// The page in `language`: `<html lang>`, every `{{key}}` of the markup, and the script's
    /// strings in their `<meta>` tag, each escaped for where it goes.
    pub fn render(&self, page: &str, language: &str) -> String {
        let strings = self.by_language.get(language).unwrap_or(&self.by_language[DEFAULT_LANGUAGE]);
        let mut out = page.replacen(r#"<html lang="en">"#, &format!(r#"<html lang="{language}">"#), 1);
        for (key, text) in &self.by_language[DEFAULT_LANGUAGE] {
            let marker = format!("{{{{{key}}}}}");
            if out.contains(&marker) {
                out = out.replace(&marker, &escape(strings.get(key).unwrap_or(text)));
            }
        }
        let json = serde_json::to_string(strings).expect("strings serialise");
        out.replacen(STRINGS_META, &format!(r#"<meta name="seatrush-strings" content="{}">"#, escape(&json)), 1)
    }
}

/// Escaped for HTML text and attribute values alike.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_language_has_every_key() {
        let strings = PageStrings::load(None).unwrap();
        let keys: Vec<&String> = strings.by_language["en"].keys().collect();
        for (language, s) in &strings.by_language {
            assert_eq!(s.keys().collect::<Vec<_>>(), keys, "{language}");
        }
        assert_eq!(strings.languages().collect::<Vec<_>>(), ["de", "en", "fr"]);
    }

    #[test]
    fn the_event_language_wins_then_the_best_accepted_then_english() {
        let s = PageStrings::load(None).unwrap();
        assert_eq!(s.choose(Some("fr"), Some("de")), "fr");
        assert_eq!(s.choose(Some("nl"), Some("de-CH,de;q=0.9")), "de", "an unknown event language falls back");
        assert_eq!(s.choose(None, Some("nl;q=1, fr-CA;q=0.8, de;q=0.5")), "fr");
        assert_eq!(s.choose(None, Some("de;q=0.4, fr;q=0.9")), "fr");
        assert_eq!(s.choose(None, Some("fr;q=0, de")), "de");
        assert_eq!(s.choose(None, Some("nl, *")), "en");
        assert_eq!(s.choose(None, None), "en");
        assert_eq!(s.choose(None, Some("garbage;;q=x")), "en");
    }

    #[test]
    fn the_page_speaks_its_language_and_escapes_what_it_fills_in() {
        let s = PageStrings::load(None).unwrap();
        let page = format!("<html lang=\"en\"><title>{{{{title}}}}</title>{STRINGS_META}</html>");
        let fr = s.render(&page, "fr");
        assert!(fr.starts_with("<html lang=\"fr\"><title>Réservez votre place</title>"), "{fr}");
        assert!(fr.contains("content=\"{&quot;a_seat&quot;:&quot;une place&quot;"), "{fr}");
    }

    #[test]
    fn an_operator_directory_overrides_texts_and_adds_whole_languages_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fr.json"), r#"{"title": "Votre place <b>"}"#).unwrap();
        let s = PageStrings::load(Some(dir.path())).unwrap();
        assert_eq!(s.text("fr", "title"), "Votre place <b>");
        assert_eq!(s.text("fr", "book"), "Réserver ma place", "the other texts stay bundled");
        assert!(s.render("<title>{{title}}</title>", "fr").contains("Votre place &lt;b&gt;"));

        std::fs::write(dir.path().join("nl.json"), r#"{"title": "Boek uw plaats"}"#).unwrap();
        let err = PageStrings::load(Some(dir.path())).err().unwrap().to_string();
        assert!(err.contains("nl.json") && err.contains("missing"), "{err}");
        let mut nl: BTreeMap<String, String> = s.by_language["en"].clone();
        nl.insert("title".into(), "Boek uw plaats".into());
        std::fs::write(dir.path().join("nl.json"), serde_json::to_string(&nl).unwrap()).unwrap();
        let s = PageStrings::load(Some(dir.path())).unwrap();
        assert_eq!(s.choose(None, Some("nl-BE")), "nl");

        std::fs::write(dir.path().join("de.json"), r#"{"titel": "x"}"#).unwrap();
        let err = PageStrings::load(Some(dir.path())).err().unwrap().to_string();
        assert!(err.contains("unknown key \"titel\""), "{err}");
    }
}
