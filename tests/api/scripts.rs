//! Each Lua script called directly against a real Redis: replies, guards, and error replies.

use crate::helpers::{nonce, spawn_app, AppOptions};
use seatrush::domain::nonce::Nonce;
use seatrush::domain::admission::Admission;
use seatrush::redis_io::scripts::{decode_changed, run, AdmitReply, Scripts};

async fn admit(app: &crate::helpers::TestApp, code: &str, level: &str, n: &str, id: &str) -> Result<AdmitReply, redis::RedisError> {
    let scripts = Scripts::new();
    let mut conn = app.sale.link.check().await.unwrap();
    let cmd = scripts.admit_call(&app.keys, &app.hash(code), &Nonce::parse(n).unwrap(), level, id);
    run(&mut conn, &scripts.admit, &cmd).await.map(|v| AdmitReply::decode(v).unwrap())
}

async fn back(app: &crate::helpers::TestApp, release: bool, adm: &Admission) -> bool {
    let scripts = Scripts::new();
    let (script, call) = if release { (&scripts.release, scripts.release_call(&app.keys, adm)) } else { (&scripts.undo, scripts.undo_call(&app.keys, adm)) };
    let mut conn = app.sale.link.check().await.unwrap();
    decode_changed(run(&mut conn, script, &call).await.unwrap()).unwrap()
}

fn admission(app: &crate::helpers::TestApp, code: &str, n: &str, reply: &AdmitReply) -> Admission {
    let AdmitReply::Admitted { slot, admitted_ms, admission, level } = reply.clone() else { panic!("{reply:?}") };
    Admission { code: app.hash(code), nonce: Nonce::parse(n).unwrap(), id: admission, slot, level, admitted_ms }
}

#[tokio::test]
async fn admit_returns_each_documented_reply_in_check_order() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 2)], replica: false, ..Default::default() }).await;
    let n = nonce("n");
    let first = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    assert!(matches!(&first, AdmitReply::Admitted { slot: 1, admission, .. } if admission == "id-1"));
    // same nonce: the original, whatever the new call's level or admission id
    assert_eq!(admit(&app, "CODE-00001", "B1", &n, "id-2").await.unwrap(), first);
    assert_eq!(admit(&app, "CODE-00001", "A1", &nonce("m"), "id-3").await.unwrap(), AdmitReply::AlreadyAdmitted);
    assert_eq!(admit(&app, "CODE-00002", "A1", &nonce("m"), "id-4").await.unwrap(), AdmitReply::LevelFull);
    assert!(matches!(admit(&app, "CODE-00002", "B1", &nonce("m"), "id-5").await.unwrap(), AdmitReply::Admitted { slot: 2, .. }));
    assert_eq!(admit(&app, "CODE-00003", "B1", &nonce("m"), "id-6").await.unwrap(), AdmitReply::SoldOut);
    let err = admit(&app, "CODE-00003", "ZZ", &nonce("m"), "id-7").await.unwrap_err();
    assert!(err.to_string().contains("unknown level"), "{err}");
}

#[tokio::test]
async fn undo_runs_once_and_a_second_run_changes_nothing() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let before = app.redis_state();
    let n = nonce("n");
    let reply = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    let adm = admission(&app, "CODE-00001", &n, &reply);
    assert!(back(&app, false, &adm).await, "the first undo returns the seat");
    assert_eq!(app.redis_state(), before);
    assert!(!back(&app, false, &adm).await, "the second undo is a no-op");
    assert_eq!(app.redis_state(), before, "and changed nothing");
}

#[tokio::test]
async fn undo_needs_the_same_nonce_and_admission_and_a_pending_entry() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n = nonce("n");
    let reply = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    let adm = admission(&app, "CODE-00001", &n, &reply);
    let other_nonce = Admission { nonce: Nonce::parse(&nonce("x")).unwrap(), ..adm.clone() };
    let other_id = Admission { id: "id-9".into(), ..adm.clone() };
    assert!(!back(&app, false, &other_nonce).await);
    assert!(!back(&app, false, &other_id).await);
    let scripts = Scripts::new();
    let mut conn = app.sale.link.check().await.unwrap();
    assert!(decode_changed(run(&mut conn, &scripts.persisted, &scripts.persisted_call(&app.keys, &adm)).await.unwrap()).unwrap());
    assert!(!back(&app, false, &adm).await, "a persisted admission is not undone; only release returns it");
    assert!(back(&app, true, &adm).await);
    assert!(!back(&app, true, &adm).await, "the second release is a no-op");
}

#[tokio::test]
async fn a_stale_release_cannot_free_the_seat_of_a_later_booking() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n1 = nonce("first");
    let first = admission(&app, "CODE-00001", &n1, &admit(&app, "CODE-00001", "A1", &n1, "id-1").await.unwrap());
    assert!(back(&app, true, &first).await);
    let n2 = nonce("second");
    let second = admission(&app, "CODE-00001", &n2, &admit(&app, "CODE-00001", "A1", &n2, "id-2").await.unwrap());
    let held = app.redis_state();
    assert!(!back(&app, true, &first).await, "the old booking's release is refused by the guard");
    assert!(!back(&app, false, &first).await);
    assert_eq!(app.redis_state(), held);
    assert!(back(&app, false, &second).await);
}

#[tokio::test]
async fn undo_and_release_run_on_a_full_redis_but_admit_does_not() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n = nonce("n");
    let adm = admission(&app, "CODE-00001", &n, &admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap());
    app.redis::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1));
    let before = app.redis_state();
    let err = admit(&app, "CODE-00002", "A1", &nonce("m"), "id-2").await.unwrap_err();
    assert!(err.to_string().contains("OOM"), "{err}");
    assert_eq!(app.redis_state(), before, "refused whole, before it ran");
    assert!(back(&app, false, &adm).await, "undo is allow-oom");
}

#[tokio::test]
async fn one_persisted_call_marks_a_batch_and_only_the_admissions_it_names() {
    let app = spawn_app(AppOptions { seats: 4, levels: vec![("A1", 4)], replica: false, ..Default::default() }).await;
    let mut admitted = Vec::new();
    for (i, code) in ["CODE-00001", "CODE-00002", "CODE-00003", "CODE-00004"].into_iter().enumerate() {
        let n = nonce(&format!("n{i}"));
        let reply = admit(&app, code, "A1", &n, &format!("id-{i}")).await.unwrap();
        admitted.push(admission(&app, code, &n, &reply));
    }
    assert_eq!(pending(&app).await.len(), 4);
    // Admission 1 under a nonce that is not its own and admission 2 under another admission id:
    // neither is this admission's mark, so both entries stay.
    let mut stale_nonce = admitted[1].clone();
    stale_nonce.nonce = Nonce::parse(&nonce("other")).unwrap();
    let mut stale_id = admitted[2].clone();
    stale_id.id = "id-other".into();
    let batch = [&admitted[0], &stale_nonce, &stale_id, &admitted[3], &admitted[3]];
    let scripts = Scripts::new();
    let mut conn = app.sale.link.check().await.unwrap();
    let call = scripts.persisted_batch_call(&app.keys, batch.into_iter());
    let dropped: i64 = redis::from_redis_value(run(&mut conn, &scripts.persisted, &call).await.unwrap()).unwrap();
    assert_eq!(dropped, 2, "one drop each for admissions 0 and 3; the repeat of 3 finds its entry gone");
    let left = pending(&app).await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&admitted[1].code.as_str().to_string()) && left.contains(&admitted[2].code.as_str().to_string()), "{left:?}");
    // Marked admissions are no longer undone; the ones the batch left are.
    assert!(!back(&app, false, &admitted[0]).await);
    assert!(back(&app, false, &admitted[1]).await);
}

async fn pending(app: &crate::helpers::TestApp) -> Vec<String> {
    let mut conn = app.sale.link.check().await.unwrap();
    redis::cmd("ZRANGE").arg(&app.keys.pending).arg(0).arg(-1).query_async(&mut conn).await.unwrap()
}
