//! The Lua scripts (one file each under `lua/`), how they are called, and how their replies decode.
//! Calls are built as plain `EVALSHA` commands so they can ride in a pipeline; `NOSCRIPT` after a
//! restart or failover is answered by loading the script and calling again.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::nonce::Nonce;
use crate::redis_io::keys::{pending_member, EventKeys};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

/// One script: its source and SHA-1.
pub struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    pub(crate) fn new(source: &'static str) -> Self {
        Self { source, sha: redis::Script::new(source).get_hash().to_owned() }
    }

    /// The `EVALSHA` command for these keys and arguments.
    pub fn call(&self, keys: &[&str], args: &[&str]) -> Cmd {
        // Sized up front: grown argument by argument, a call reallocated its buffers four times.
        let bytes = "EVALSHA".len() + self.sha.len() + 2 + keys.iter().chain(args).map(|a| a.len()).sum::<usize>();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
        cmd
    }

    /// `SCRIPT LOAD`, for after a `NOSCRIPT`.
    pub fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }

    /// Loads the script into the server's cache: the one answer to a `NOSCRIPT` (restart,
    /// failover, `SCRIPT FLUSH`), after which the caller runs again the calls that missed.
    pub async fn load<C: redis::aio::ConnectionLike>(&self, conn: &mut C) -> RedisResult<()> {
        let sha: String = self.load_cmd().query_async(conn).await?;
        if sha != self.sha {
            return Err(RedisError::from((ErrorKind::Parse, "SCRIPT LOAD answered another SHA-1", sha)));
        }
        Ok(())
    }
}

/// All of seatrush's scripts, loaded from `lua/` at compile time.
pub struct Scripts {
    pub admit: Script,
    pub undo: Script,
    pub release: Script,
    pub heal: Script,
    pub heal_seats: Script,
    pub waitlist: Script,
}

const ADMIT_SOURCE: &str = include_str!("../../lua/admit.lua");
/// The offer of a freed seat to its level's first waiter, spliced into the scripts that free one.
const OFFER_FRAGMENT: &str = include_str!("../../lua/with_offer.lua");

/// `script` with `lua/with_offer.lua` spliced in after its first line (the `#!lua` flags line,
/// which must stay first), so the seat is freed and offered in one script
/// (docs/design.md#the-waiting-list). Made once per process, at start.
pub fn with_offer(script: &str) -> &'static str {
    let (flags, body) = script.split_once('\n').expect("a script starts with its #!lua line");
    assert!(flags.starts_with("#!lua"), "a script that frees a seat starts with its #!lua line");
    Box::leak(format!("{flags}\n{OFFER_FRAGMENT}{body}").into_boxed_str())
}

/// close.lua: the state and the waiting list (`close`, and the heal putting a lost close back).
pub static CLOSE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/close.lua")));

/// close.lua under the operator lock `owner` (reply: 1 closed, 0 not loaded, -1 not the lock's).
pub fn close_call(keys: &EventKeys, owner: &str) -> Cmd {
    CLOSE.call(&[&keys.meta, &keys.lock, &keys.waitq, &keys.waiters], &[owner])
}

/// The retry check of admit.lua, which `BrokenGuard::RetryCheck` switches off.
#[cfg(feature = "fault-hooks")]
const RETRY_CHECK: &str = "if held_nonce == nonce then";

impl Scripts {
    pub fn new() -> Self {
        Self::with_broken_guard(None)
    }

    /// The scripts, with one guard switched off for the fault runner's checker test (only in a
    /// build with the `fault-hooks` feature; a plain build always loads the real scripts).
    pub fn with_broken_guard(broken: Option<crate::fault_hooks::BrokenGuard>) -> Self {
        let admit: &'static str = match broken {
            #[cfg(feature = "fault-hooks")]
            Some(crate::fault_hooks::BrokenGuard::RetryCheck) => {
                assert!(ADMIT_SOURCE.contains(RETRY_CHECK), "admit.lua lost its retry check line");
                Box::leak(ADMIT_SOURCE.replace(RETRY_CHECK, "if false then").into_boxed_str())
            }
            _ => ADMIT_SOURCE,
        };
        Self {
            admit: Script::new(admit),
            undo: Script::new(with_offer(include_str!("../../lua/undo.lua"))),
            release: Script::new(with_offer(include_str!("../../lua/release.lua"))),
            heal: Script::new(include_str!("../../lua/heal.lua")),
            heal_seats: Script::new(with_offer(include_str!("../../lua/heal_seats.lua"))),
            waitlist: Script::new(include_str!("../../lua/waitlist.lua")),
        }
    }

    /// The scripts with another admit source, for tests that need Redis to answer one event's
    /// call in a way a real server only does in a race (a `fault-hooks` build only).
    #[cfg(feature = "fault-hooks")]
    pub fn with_admit_source(admit: &'static str) -> Self {
        Self { admit: Script::new(admit), ..Self::new() }
    }

    pub fn all(&self) -> [&Script; 6] {
        [&self.admit, &self.undo, &self.release, &self.heal, &self.heal_seats, &self.waitlist]
    }

    /// One admit attempt in its own call.
    pub fn admit_call(&self, keys: &EventKeys, code: &CodeHash, nonce: &Nonce, level: &str, admission: &str) -> Cmd {
        self.admit_batch_call(keys, [AdmitArgs { code, nonce, level, admission, retry_only: false }])
    }

    /// One admit call for many attempts on one event, decided in order (a committer round); its
    /// reply splits with [`admit_replies`].
    pub fn admit_batch_call<'a>(&self, keys: &EventKeys, attempts: impl IntoIterator<Item = AdmitArgs<'a>>) -> Cmd {
        let args: Vec<&str> = attempts
            .into_iter()
            .flat_map(|a| {
                [
                    a.code.as_str(),
                    a.nonce.as_str(),
                    a.level,
                    a.admission,
                    if a.retry_only { "retry-only" } else { "admit" },
                ]
            })
            .collect();
        self.admit.call(&[&keys.adm, &keys.taken, &keys.cap, &keys.free, &keys.pending, &keys.meta], &args)
    }

    /// The guarded undo of one admission (only while it is pending); the room it makes goes to
    /// the first waiter of a level with room, if there is one (reply: [`decode_freed`]).
    pub fn undo_call(&self, keys: &EventKeys, admission: &Admission) -> Cmd {
        self.undo_with(keys, admission, "free")
    }

    /// The undo for an admission whose seat the database says another booking holds: the seat
    /// stays out of the pool; the level's count comes down, and the room that makes (with
    /// event-wide numbering, a seat elsewhere in the pool) goes to the list.
    pub fn undo_seat_held_call(&self, keys: &EventKeys, admission: &Admission) -> Cmd {
        self.undo_with(keys, admission, "seat-held")
    }

    fn undo_with(&self, keys: &EventKeys, admission: &Admission, seat: &str) -> Cmd {
        let offer = fresh_admission_id();
        let mut names = vec![keys.adm.as_str(), &keys.taken, &keys.free, &keys.pending];
        names.extend(keys.offer_keys());
        self.undo.call(&names, &[admission.code.as_str(), admission.nonce.as_str(), &admission.id, seat, &offer])
    }

    /// The guarded release of one admission (any state that holds a seat); the room it makes
    /// goes to the first waiter of a level with room, if there is one (reply: [`decode_freed`]).
    pub fn release_call(&self, keys: &EventKeys, admission: &Admission) -> Cmd {
        let offer = fresh_admission_id();
        let mut names = vec![keys.adm.as_str(), &keys.taken, &keys.free, &keys.pending, &keys.syncs];
        names.extend(keys.offer_keys());
        self.release.call(&names, &[admission.code.as_str(), admission.nonce.as_str(), &admission.id, &offer])
    }

    /// heal_seats.lua for `seats` under the operator lock `owner`, with an admission id for each
    /// offer the seats returned may make (reply: [`decode_returned`]).
    pub fn heal_seats_call(&self, keys: &EventKeys, owner: &str, seats: &[String]) -> Cmd {
        let ids: Vec<String> = seats.iter().map(|_| fresh_admission_id()).collect();
        let mut names = vec![keys.adm.as_str(), &keys.free, &keys.lock, &keys.moves, &keys.pending];
        names.extend(keys.offer_keys());
        names.push(&keys.taken);
        let mut args = vec![owner];
        args.extend(seats.iter().map(String::as_str));
        args.extend(ids.iter().map(String::as_str));
        self.heal_seats.call(&names, &args)
    }

    /// A join of the waiting list, or its position (reply: [`JoinReply::decode`]).
    pub fn waitlist_call(
        &self,
        keys: &EventKeys,
        code: &CodeHash,
        nonce: &Nonce,
        level: &str,
        waiters_max: usize,
    ) -> Cmd {
        self.waitlist.call(
            &[&keys.adm, &keys.taken, &keys.cap, &keys.free, &keys.meta, &keys.waitq, &keys.waiters, &keys.waitseq],
            &[code.as_str(), nonce.as_str(), level, &waiters_max.to_string()],
        )
    }
}

/// The mark of admissions the database now holds: their pending entries dropped by name, in one
/// `ZREM` (no script: each entry is named by its admission, [`pending_member`], so a mark can only
/// drop its own, whatever happened to the code since). `ZREM` is not refused under OOM: it only
/// frees memory. Replies with the number of entries dropped. `admissions` must not be empty.
pub fn persisted_call<'a>(keys: &EventKeys, admissions: impl IntoIterator<Item = &'a Admission>) -> Cmd {
    let mut zrem = redis::cmd("ZREM");
    zrem.arg(&keys.pending);
    for a in admissions {
        zrem.arg(pending_member(a.code.as_str(), &a.id));
    }
    zrem
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// One attempt of an admit call, in the words the script takes.
#[derive(Clone, Copy, Debug)]
pub struct AdmitArgs<'a> {
    pub code: &'a CodeHash,
    pub nonce: &'a Nonce,
    pub level: &'a str,
    /// Fresh for this attempt; kept by Redis only if it admits.
    pub admission: &'a str,
    /// A gate refuses this request unless it is a retry of this nonce's admission.
    pub retry_only: bool,
}

/// An admit call's reply, one value per attempt. An error for the whole call (`NOSCRIPT`, OOM,
/// `READONLY`, `NOREPLICAS`) stands for every attempt in it; any other reply that is not one
/// value per attempt is unexpected for every attempt.
pub fn admit_replies(value: Value, attempts: usize) -> Vec<Result<Value, ReplyError>> {
    match value {
        Value::Array(items) if items.len() == attempts => items.into_iter().map(Ok).collect(),
        whole @ Value::ServerError(_) => vec![Ok(whole); attempts],
        other => vec![Err(ReplyError::Unexpected(other)); attempts],
    }
}

/// One attempt's reply (from [`admit_replies`]): its error reply is an `Err`, as is a reply that
/// is none of the documented ones.
pub fn decode_attempt(value: Result<Value, ReplyError>) -> RedisResult<AdmitReply> {
    let parse = |e: ReplyError| RedisError::from((ErrorKind::Parse, "admit reply", e.to_string()));
    match value.map_err(parse)? {
        Value::ServerError(e) => Err(e.into()),
        value => AdmitReply::decode(value).map_err(parse),
    }
}

/// True when the error means the script cache is empty (restart or failover).
pub fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Runs one script call on `conn`, loading the script once on `NOSCRIPT`.
pub async fn run<C: redis::aio::ConnectionLike>(conn: &mut C, script: &Script, cmd: &Cmd) -> RedisResult<Value> {
    run_as(conn, script, cmd).await
}

/// [`run`], its reply converted to `T`.
pub async fn run_as<T: redis::FromRedisValue, C: redis::aio::ConnectionLike>(
    conn: &mut C,
    script: &Script,
    cmd: &Cmd,
) -> RedisResult<T> {
    match cmd.query_async::<T>(conn).await {
        Err(err) if is_noscript(&err) => {
            script.load(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// A record of the `adm` hash, "nonce admission-id slot level admitted-ms": how `open` and
/// `reconcile` write one from a database row (admit.lua writes the same fields in Lua).
pub fn admission_record(nonce: &Nonce, admission_id: &str, slot: i64, level: &str, admitted_ms: i64) -> String {
    format!("{nonce} {admission_id} {slot} {level} {admitted_ms}")
}

/// The Redis layer owns the record format; the type belongs to the sale.
impl Admission {
    /// This admission's record in the `adm` hash.
    pub fn to_record(&self) -> String {
        admission_record(&self.nonce, &self.id, self.slot, &self.level, self.admitted_ms)
    }

    /// Parses a record of the `adm` hash ([`admission_record`]).
    pub fn from_record(code: CodeHash, record: &str) -> Option<Self> {
        let mut parts = record.split(' ');
        let nonce = Nonce::parse(parts.next()?)?;
        let id = parts.next()?.to_owned();
        let slot = parts.next()?.parse().ok()?;
        let level = parts.next()?.to_owned();
        let admitted_ms = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(Self { code, nonce, id, slot, level, admitted_ms })
    }
}

/// What the admit script decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitReply {
    /// Admitted now, or the original admission of a retry with the same nonce.
    Admitted { slot: i64, admitted_ms: i64, admission: String, level: String },
    /// It wrote nothing; the committer hands this on as it is, and the admit path turns it into
    /// the request's refusal.
    Refused(ScriptRefusal),
}

/// The admit script's refusals, as its reply says them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptRefusal {
    /// -1: this code holds a seat under another nonce.
    AlreadyAdmitted,
    /// -3: the level is at its cap.
    LevelFull,
    /// -2: no free seat left.
    SoldOut,
    /// -4: a "retry-only" call that was not a retry of this nonce's admission.
    NotARetry,
    /// -5, -6, -7: a fresh admission outside the sale window, by Redis's clock and the event's
    /// state in Redis.
    Outside(OutsideWindow),
}

/// Why the admit script refused a fresh admission by the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutsideWindow {
    /// -5: before `opens_at`.
    NotOpen,
    /// -6: closed, or at or after `closes_at`.
    Closed,
    /// -7: Redis holds no state for the event: it lost the event (a wipe), or `open` never ran.
    NotLoaded,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("script returned an unexpected reply: {0:?}")]
    Unexpected(Value),
}

impl AdmitReply {
    /// Decodes the reply of a call with one attempt ([`Scripts::admit_call`]).
    pub fn decode_single(value: Value) -> RedisResult<Self> {
        let mut replies = admit_replies(value, 1);
        decode_attempt(replies.pop().expect("one reply for one attempt"))
    }

    /// Decodes one attempt's reply; anything but the documented replies is an error.
    pub fn decode(value: Value) -> Result<Self, ReplyError> {
        match value {
            Value::Int(-1) => Ok(Self::Refused(ScriptRefusal::AlreadyAdmitted)),
            Value::Int(-3) => Ok(Self::Refused(ScriptRefusal::LevelFull)),
            Value::Int(-2) => Ok(Self::Refused(ScriptRefusal::SoldOut)),
            Value::Int(-4) => Ok(Self::Refused(ScriptRefusal::NotARetry)),
            Value::Int(-5) => Ok(Self::Refused(ScriptRefusal::Outside(OutsideWindow::NotOpen))),
            Value::Int(-6) => Ok(Self::Refused(ScriptRefusal::Outside(OutsideWindow::Closed))),
            Value::Int(-7) => Ok(Self::Refused(ScriptRefusal::Outside(OutsideWindow::NotLoaded))),
            Value::Array(ref items) if items.len() == 4 => {
                let admitted = (|| {
                    let slot = int(&items[0])?;
                    let admitted_ms = int(&items[1])?;
                    let admission = text(&items[2])?;
                    let level = text(&items[3])?;
                    (slot >= 1).then_some(Self::Admitted { slot, admitted_ms, admission, level })
                })();
                admitted.ok_or(ReplyError::Unexpected(value))
            }
            other => Err(ReplyError::Unexpected(other)),
        }
    }
}

/// A fresh admission id, as the request path makes one per admit call.
pub fn fresh_admission_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A freed seat given to its level's first waiter by release.lua or undo.lua
/// (`lua/with_offer.lua`): the waiter's admission, pending like any other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub admission: Admission,
    /// When the waiter joined, by Redis's clock (ms).
    pub joined_ms: i64,
}

impl Offer {
    /// An offer as amend.lua leaves it for a `serve` to book ({ev:ID}:adopt): the code hash, the
    /// admission record, and when the waiter joined.
    pub fn from_adopted(entry: &str) -> Option<Self> {
        let (code, rest) = entry.split_once(' ')?;
        let (record, joined) = rest.rsplit_once(' ')?;
        let admission = Admission::from_record(CodeHash::from_hex(code)?, record)?;
        Some(Self { admission, joined_ms: joined.parse().ok()? })
    }
}

/// What release.lua or undo.lua did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Freed {
    /// The guard refused: nothing changed.
    Unchanged,
    /// The seat went back to the pool (or, for a `seat-held` undo, stays out of it).
    ToPool,
    /// The seat went to a waiter.
    Offered(Offer),
}

impl Freed {
    pub fn changed(&self) -> bool {
        !matches!(self, Freed::Unchanged)
    }
}

/// Decodes the reply of release.lua, undo.lua and move_settle.lua.
pub fn decode_freed(value: Value) -> Result<Freed, ReplyError> {
    match value {
        Value::Int(0) => Ok(Freed::Unchanged),
        Value::Int(1) => Ok(Freed::ToPool),
        Value::Array(ref items) => decode_offer(items).map(Freed::Offered).ok_or(ReplyError::Unexpected(value)),
        other => Err(ReplyError::Unexpected(other)),
    }
}

/// What heal_seats.lua returned: the seats it put back, and the offers their room made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Returned {
    pub seats: usize,
    pub offers: Vec<Offer>,
}

/// Decodes the reply of heal_seats.lua; None when the lock was not the run's (-1).
pub fn decode_returned(value: Value) -> Result<Option<Returned>, ReplyError> {
    match value {
        Value::Int(-1) => Ok(None),
        Value::Array(ref items) if !items.is_empty() => {
            let returned = (|| {
                let seats = usize::try_from(int(&items[0])?).ok()?;
                let offers = items[1..]
                    .iter()
                    .map(|o| match o {
                        Value::Array(o) => decode_offer(o),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some(Returned { seats, offers })
            })();
            returned.map(Some).ok_or(ReplyError::Unexpected(value))
        }
        other => Err(ReplyError::Unexpected(other)),
    }
}

/// One offer as lua/with_offer.lua returns it.
fn decode_offer(items: &[Value]) -> Option<Offer> {
    let [code, nonce, id, slot, level, admitted_ms, joined_ms] = items else { return None };
    let admission = Admission {
        code: CodeHash::from_hex(&text(code)?)?,
        nonce: Nonce::parse(&text(nonce)?)?,
        id: text(id)?,
        slot: int(slot).filter(|s| *s >= 1)?,
        level: text(level)?,
        admitted_ms: int(admitted_ms)?,
    };
    Some(Offer { admission, joined_ms: int(joined_ms)? })
}

/// What the waiting list's script decided (`lua/waitlist.lua`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinReply {
    /// In the list: the level it waits for and its place (1 = next); `joined`: this call wrote
    /// the entry (a fresh join, which the caller has a replica acknowledge before answering).
    Waiting { level: String, position: i64, joined: bool },
    /// The code holds a seat with this nonce (offered, or booked): book it as a retry.
    Admitted,
    /// -1: the code holds a seat with another nonce.
    AlreadyAdmitted,
    /// -5, -6, -7: outside the sale window, as admit.lua says it.
    Outside(OutsideWindow),
    /// -9: the level has room now.
    SeatsAvailable,
    /// -10: the event's list is at its bound.
    Full,
}

impl JoinReply {
    pub fn decode(value: Value) -> Result<Self, ReplyError> {
        match value {
            Value::Int(-1) => Ok(Self::AlreadyAdmitted),
            Value::Int(-5) => Ok(Self::Outside(OutsideWindow::NotOpen)),
            Value::Int(-6) => Ok(Self::Outside(OutsideWindow::Closed)),
            Value::Int(-7) => Ok(Self::Outside(OutsideWindow::NotLoaded)),
            Value::Int(-9) => Ok(Self::SeatsAvailable),
            Value::Int(-10) => Ok(Self::Full),
            Value::Array(ref items) if items.len() == 2 || items.len() == 3 => {
                let waiting = (|| {
                    let position = int(&items[0]).filter(|p| *p >= 1)?;
                    // A third element is only ever the fresh join's flag, 1.
                    let joined = match items.get(2) {
                        None => false,
                        Some(flag) => int(flag).filter(|f| *f == 1).map(|_| true)?,
                    };
                    Some(Self::Waiting { level: text(&items[1])?, position, joined })
                })();
                waiting.ok_or(ReplyError::Unexpected(value))
            }
            Value::Array(_) if matches!(AdmitReply::decode(value.clone()), Ok(AdmitReply::Admitted { .. })) => {
                Ok(Self::Admitted)
            }
            other => Err(ReplyError::Unexpected(other)),
        }
    }
}

/// Decodes the 0/1 reply of undo and release.
pub fn decode_changed(value: Value) -> Result<bool, ReplyError> {
    match value {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(ReplyError::Unexpected(other)),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_replies_decode_into_their_variants() {
        assert_eq!(AdmitReply::decode(Value::Int(-1)).unwrap(), AdmitReply::Refused(ScriptRefusal::AlreadyAdmitted));
        assert_eq!(AdmitReply::decode(Value::Int(-3)).unwrap(), AdmitReply::Refused(ScriptRefusal::LevelFull));
        assert_eq!(AdmitReply::decode(Value::Int(-2)).unwrap(), AdmitReply::Refused(ScriptRefusal::SoldOut));
        assert_eq!(
            AdmitReply::decode(Value::Int(-6)).unwrap(),
            AdmitReply::Refused(ScriptRefusal::Outside(OutsideWindow::Closed))
        );
        let admitted = Value::Array(vec![
            Value::Int(7),
            Value::Int(1_800_000_000_000),
            Value::BulkString(b"abc".to_vec()),
            Value::BulkString(b"B1".to_vec()),
        ]);
        assert_eq!(
            AdmitReply::decode(admitted).unwrap(),
            AdmitReply::Admitted {
                slot: 7,
                admitted_ms: 1_800_000_000_000,
                admission: "abc".into(),
                level: "B1".into()
            }
        );
    }

    #[test]
    fn unknown_replies_are_errors_not_guesses() {
        assert!(AdmitReply::decode(Value::Int(-8)).is_err());
        assert!(AdmitReply::decode(Value::Int(0)).is_err());
        assert!(AdmitReply::decode(Value::Nil).is_err());
        assert!(AdmitReply::decode(Value::Array(vec![Value::Int(0), Value::Int(1), Value::Nil, Value::Nil])).is_err());
        assert!(decode_changed(Value::Int(2)).is_err());
    }

    #[test]
    fn records_parse_back_into_admissions() {
        let code = CodeHash::from_hex(&"a".repeat(64)).unwrap();
        let a = Admission::from_record(code.clone(), "nonce-123 adm1 12 B1 1800000000000").unwrap();
        assert_eq!((a.slot, a.level.as_str(), a.admitted_ms), (12, "B1", 1_800_000_000_000));
        assert!(Admission::from_record(code.clone(), "nonce-123 adm1 12 B1").is_none());
        assert!(Admission::from_record(code.clone(), "nonce-123 adm1 x B1 1").is_none());
        assert_eq!(a.to_record(), "nonce-123 adm1 12 B1 1800000000000", "written as it is read");
        assert_eq!(Admission::from_record(code, &a.to_record()), Some(a));
    }
}
