//! What the load tool sends: a mix of request kinds, each with the answer a correct server gives
//! it. Registered codes are `PREFIX` + a 7-digit number, handed out once each as fresh bookings.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Recent admissions a connection remembers for retries and duplicate clicks.
const RECENT_MAX: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A registered code not sent before.
    Fresh,
    /// A lost reply: an admitted request sent again with the same nonce.
    Retry,
    /// A second click: an admitted code with a new nonce.
    Duplicate,
    /// A code not on the allowlist.
    Unregistered,
    /// The honeypot field filled.
    Bot,
    /// A waiting page's availability poll: `GET /api/events/{event}` with the `ETag` of the
    /// connection's last answer, as a browser revalidates.
    Poll,
    /// A code this connection saw told `sold_out` or `level_full` joins that level's waiting
    /// list, or asks where it stands with the nonce it joined with, as the page polls.
    Waitlist,
}

pub const KINDS: [Kind; 7] =
    [Kind::Fresh, Kind::Retry, Kind::Duplicate, Kind::Unregistered, Kind::Bot, Kind::Poll, Kind::Waitlist];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fresh => "fresh",
            Kind::Retry => "retry",
            Kind::Duplicate => "duplicate",
            Kind::Unregistered => "unregistered",
            Kind::Bot => "bot",
            Kind::Poll => "poll",
            Kind::Waitlist => "waitlist",
        }
    }
}

/// Weights of the kinds, e.g. "fresh=86,retry=4,duplicate=4,unregistered=3,bot=3" (add
/// "poll=N" for availability polls, "waitlist=N" for the waiting list once the sale is full).
#[derive(Clone, Debug, Serialize)]
pub struct Mix {
    weights: [u32; KINDS.len()],
}

impl Mix {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut weights = [0u32; KINDS.len()];
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, weight) =
                part.split_once('=').ok_or_else(|| anyhow::anyhow!("mix entry {part:?} is not name=weight"))?;
            let i = KINDS
                .iter()
                .position(|k| k.name() == name.trim())
                .ok_or_else(|| anyhow::anyhow!("unknown kind {name:?} in the mix"))?;
            weights[i] = weight.trim().parse()?;
        }
        anyhow::ensure!(weights.iter().sum::<u32>() > 0, "the mix needs a positive weight");
        Ok(Self { weights })
    }

    pub fn pick(&self, roll: u32) -> Kind {
        let mut r = roll % self.weights.iter().sum::<u32>();
        for (kind, w) in KINDS.iter().zip(self.weights) {
            if r < w {
                return *kind;
            }
            r -= w;
        }
        unreachable!("roll is below the weight sum")
    }
}

/// The registered codes, each handed out once.
pub struct Codes {
    pub prefix: String,
    pub count: u64,
    next: AtomicU64,
}

impl Codes {
    pub fn new(prefix: &str, count: u64) -> Self {
        Self::starting_at(prefix, count, 0)
    }

    /// Fresh bookings take codes `start..count`; bots pick from all of them.
    pub fn starting_at(prefix: &str, count: u64, start: u64) -> Self {
        Self { prefix: prefix.to_owned(), count, next: AtomicU64::new(start) }
    }

    pub fn code(&self, i: u64) -> String {
        format!("{}{i:07}", self.prefix)
    }

    fn take(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.count).then_some(i)
    }
}

/// An admission a connection saw, kept for retries and duplicates.
#[derive(Clone, Debug)]
pub struct Admitted {
    code: String,
    level: String,
    nonce: String,
    slot: i64,
}

/// One request to send and how to judge its answer.
pub struct Planned {
    pub kind: Kind,
    pub body: String,
    code: String,
    level: String,
    nonce: String,
    /// For a retry: the slot the first answer gave.
    slot: Option<i64>,
}

/// An answer, reduced to what the judge needs.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    pub http: u16,
    pub status: String,
    pub slot: Option<i64>,
}

impl Reply {
    pub fn parse(http: u16, body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Body {
            status: Option<String>,
            slot: Option<i64>,
        }
        let parsed: Option<Body> = serde_json::from_slice(body).ok();
        let (status, slot) = parsed.map_or((None, None), |b| (b.status, b.slot));
        Self { http, status: status.unwrap_or_else(|| format!("http_{http}")), slot }
    }
}

/// Per-connection request planner.
pub struct Planner {
    levels: Vec<String>,
    recent: VecDeque<Admitted>,
    /// Codes told the sale or their level is full, with the nonce each waits (or will wait) with.
    waiting: VecDeque<Admitted>,
    turn: u64,
}

impl Planner {
    pub fn new(levels: Vec<String>) -> Self {
        Self { levels, recent: VecDeque::with_capacity(RECENT_MAX), waiting: VecDeque::new(), turn: 0 }
    }

    pub fn next(&mut self, mix: &Mix, codes: &Codes) -> Planned {
        self.turn += 1;
        let level = self.levels[(self.turn as usize) % self.levels.len()].clone();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let kind = mix.pick(rand::random());
        let remembered = self.recent.get(rand::random_range(0..self.recent.len().max(1))).cloned();
        if kind == Kind::Waitlist {
            // The oldest refused code asks next: polls go round the connection's waiters.
            if let Some(w) = self.waiting.pop_front() {
                let planned = plan(Kind::Waitlist, w.code.clone(), w.level.clone(), w.nonce.clone(), None, "");
                self.waiting.push_back(w);
                return planned;
            }
        }
        match (kind, remembered) {
            (Kind::Retry, Some(a)) => plan(Kind::Retry, a.code, a.level, a.nonce, Some(a.slot), ""),
            (Kind::Duplicate, Some(a)) => plan(Kind::Duplicate, a.code, level, nonce, None, ""),
            (Kind::Unregistered, _) => plan(
                Kind::Unregistered,
                format!("NOPE-{:012}", rand::random::<u64>() % 1_000_000_000_000),
                level,
                nonce,
                None,
                "",
            ),
            (Kind::Poll, _) => {
                Planned { kind: Kind::Poll, body: String::new(), code: String::new(), level, nonce, slot: None }
            }
            (Kind::Bot, _) => plan(
                Kind::Bot,
                codes.code(rand::random_range(0..codes.count.max(1))),
                level,
                nonce,
                None,
                "https://spam.example",
            ),
            // Fresh, or a retry/duplicate before anything was admitted on this connection.
            _ => match codes.take() {
                Some(i) => plan(Kind::Fresh, codes.code(i), level, nonce, None, ""),
                None => plan(
                    Kind::Unregistered,
                    format!("NOPE-{:012}", rand::random::<u64>() % 1_000_000_000_000),
                    level,
                    nonce,
                    None,
                    "",
                ),
            },
        }
    }

    /// True when the answer is what a correct server gives this kind of request.
    pub fn judge(&mut self, planned: &Planned, reply: &Reply) -> bool {
        let status = reply.status.as_str();
        match planned.kind {
            Kind::Fresh => {
                if status == "admitted" {
                    if let Some(slot) = reply.slot {
                        if self.recent.len() == RECENT_MAX {
                            self.recent.pop_front();
                        }
                        let (code, level, nonce) = (planned.code.clone(), planned.level.clone(), planned.nonce.clone());
                        self.recent.push_back(Admitted { code, level, nonce, slot });
                    }
                }
                if matches!(status, "sold_out" | "level_full") && self.waiting.len() < RECENT_MAX {
                    let (code, level) = (planned.code.clone(), planned.level.clone());
                    self.waiting.push_back(Admitted {
                        code,
                        level,
                        nonce: uuid::Uuid::new_v4().simple().to_string(),
                        slot: 0,
                    });
                }
                matches!(status, "admitted" | "sold_out" | "level_full")
            }
            Kind::Retry => status == "admitted" && reply.slot == planned.slot,
            Kind::Duplicate => status == "already_admitted",
            Kind::Unregistered => status == "not_registered",
            Kind::Bot => status == "admitted",
            // The availability answer has no `status`: the HTTP status stands in for it.
            Kind::Poll => matches!(status, "http_200" | "http_304"),
            Kind::Waitlist => {
                // Answered for good: offered a seat, or told to book (or that the list is full).
                if status != "waiting" {
                    self.waiting.retain(|w| w.nonce != planned.nonce);
                }
                matches!(status, "waiting" | "admitted" | "seats_available" | "waitlist_full" | "already_admitted")
            }
        }
    }
}

fn plan(kind: Kind, code: String, level: String, nonce: String, slot: Option<i64>, website: &str) -> Planned {
    let body = serde_json::json!({ "code": code, "level": level, "nonce": nonce, "website": website }).to_string();
    Planned { kind, body, code, level, nonce, slot }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_picks_each_kind_in_proportion_to_its_weight() {
        let mix = Mix::parse("fresh=2,retry=1,duplicate=0,unregistered=1,bot=1").unwrap();
        let picks: Vec<Kind> = (0..5).map(|r| mix.pick(r)).collect();
        assert_eq!(picks, vec![Kind::Fresh, Kind::Fresh, Kind::Retry, Kind::Unregistered, Kind::Bot]);
        assert!(Mix::parse("fresh=0").is_err());
        assert!(Mix::parse("sprint=3").is_err());
    }

    #[test]
    fn a_retry_must_get_the_slot_of_the_first_answer() {
        let codes = Codes::new("T-", 10);
        let mut planner = Planner::new(vec!["A1".into()]);
        let fresh = planner.next(&Mix::parse("fresh=1").unwrap(), &codes);
        assert!(planner.judge(&fresh, &Reply { http: 201, status: "admitted".into(), slot: Some(7) }));
        let retry = planner.next(&Mix::parse("retry=1").unwrap(), &codes);
        assert_eq!(retry.kind, Kind::Retry);
        assert!(planner.judge(&retry, &Reply { http: 201, status: "admitted".into(), slot: Some(7) }));
        assert!(!planner.judge(&retry, &Reply { http: 201, status: "admitted".into(), slot: Some(8) }));
    }

    #[test]
    fn a_code_told_the_sale_is_full_waits_with_one_nonce_until_answered_for_good() {
        let codes = Codes::new("T-", 10);
        let mut planner = Planner::new(vec!["A1".into()]);
        let wait = Mix::parse("waitlist=1").unwrap();
        assert_eq!(planner.next(&wait, &codes).kind, Kind::Fresh, "nobody was refused yet: a fresh booking");
        let fresh = planner.next(&Mix::parse("fresh=1").unwrap(), &codes);
        assert!(planner.judge(&fresh, &Reply { http: 409, status: "sold_out".into(), slot: None }));
        let join = planner.next(&wait, &codes);
        assert_eq!((join.kind, join.code.as_str()), (Kind::Waitlist, fresh.code.as_str()));
        assert!(planner.judge(&join, &Reply { http: 202, status: "waiting".into(), slot: None }));
        let poll = planner.next(&wait, &codes);
        assert_eq!(poll.nonce, join.nonce, "a poll keeps the nonce it joined with");
        assert!(planner.judge(&poll, &Reply { http: 201, status: "admitted".into(), slot: Some(3) }));
        assert_ne!(planner.next(&wait, &codes).kind, Kind::Waitlist, "an offered code stops waiting");
        assert!(!planner.judge(&poll, &Reply { http: 409, status: "sold_out".into(), slot: None }));
    }
}
