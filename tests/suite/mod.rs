//! The primitive suite: every rule of claim, lease and doc, run against each store.
//!
//! Races are injected by a rival write just before the next put (`Rig::race`), and time is moved
//! by the fake clock (`Rig::clock`). Each case is a plain async function of a [`Rig`]; the
//! `primitive_suite!` macro instantiates all of them for one store kind.

use crate::common::{Lie, Rig};
use cojob::error::Op;
use cojob::store::Outcome;
use cojob::{Error, LeaseOptions, LostReason, MAX_DOCUMENT_BYTES, PutMode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(60);

/// Instantiates every case of the suite as a `#[tokio::test]` for one store kind.
#[macro_export]
macro_rules! primitive_suite {
    ($kind:expr) => {
        $crate::primitive_suite!(@cases $kind;
            claim_first_wins_and_losers_converge,
            claim_with_identical_value_still_loses,
            claim_typed_values,
            claim_retries_when_the_winner_vanishes,
            claim_gives_up_after_bounded_attempts,
            claim_ambiguous_conflict_is_resolved_by_rereading,
            claim_refuses_foreign_documents,
            claim_refuses_oversized_and_unserializable_values,
            lease_document_is_canonical,
            lease_held_by_another_is_refused,
            lease_expiry_is_inclusive,
            lease_steal_if_expired_false,
            lease_epoch_bumps_on_every_acquisition,
            lease_state_fn_sees_state_and_can_abort,
            lease_renew_extends_deadline,
            lease_paused_holder_is_fenced,
            lease_holder_change_and_deletion_are_lost,
            lease_cooperative_write_is_absorbed,
            lease_write_replaces_unread_cooperative_state,
            lease_released_handle_is_lost,
            lease_release_with_reads_a_racing_cooperative_write,
            lease_attach_rules,
            lease_records_only_the_holder_digest,
            lease_resume_rules,
            lease_two_handles_on_one_period_converge,
            lease_zero_ttl_and_empty_holder_are_refused,
            lease_refuses_foreign_documents,
            lease_oversized_state_is_refused,
            lease_ambiguous_error_is_resolved_by_rereading,
            cooperative_write_needs_a_lease,
            doc_create_get_delete,
            doc_update_retries_lost_races,
            doc_gives_up_after_max_attempts,
            doc_update_can_abort,
            doc_refuses_foreign_documents,
            doc_ambiguous_write_is_not_applied_twice,
            doc_refuses_unserializable_values,
            store_counts_minimal_requests,
            store_verifies_conditional_writes,
            store_lists_sorted_and_rejects_bad_keys,
            store_measures_its_clock_offset,
            fence_refuses_older_tokens_even_in_a_race,
            reads_refuse_objects_over_the_document_limit,
        );
    };
    (@cases $kind:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                $crate::suite::$case($crate::common::Rig::new($kind).await).await;
            }
        )*
    };
}

fn later(r: &Rig, d: Duration) -> chrono::DateTime<chrono::Utc> {
    use cojob::clock::Clock;
    r.clock.now() + chrono::Duration::from_std(d).unwrap()
}

fn holder(name: &str) -> String {
    format!("{name}-{}", cojob::new_holder())
}

fn opts(name: &str) -> LeaseOptions {
    LeaseOptions::new(holder(name), TTL)
}

async fn stored(r: &Rig, key: &str) -> Option<Value> {
    r.raw
        .get(key)
        .await
        .unwrap()
        .map(|(b, _)| serde_json::from_slice(&b).unwrap())
}

async fn stored_bytes(r: &Rig, key: &str) -> Option<Vec<u8>> {
    r.raw.get(key).await.unwrap().map(|(b, _)| b.to_vec())
}

// ---------------------------------------------------------------- claim

pub async fn claim_first_wins_and_losers_converge(r: Rig) {
    let first = r.db.claim("t/1", &json!({"run_id": "a"})).await.unwrap();
    assert!(first.won);
    assert_eq!(first.value, json!({"run_id": "a"}));
    for other in ["b", "c"] {
        let lost = r.db.claim("t/1", &json!({"run_id": other})).await.unwrap();
        assert!(!lost.won);
        assert_eq!(lost.value, json!({"run_id": "a"}));
        assert_eq!(lost.etag, first.etag);
    }
    assert_eq!(stored_bytes(&r, "t/1").await.unwrap(), br#"{"run_id":"a"}"#);
}

pub async fn claim_with_identical_value_still_loses(r: Rig) {
    // Bytes alone cannot tell a second writer of the same value from the first one.
    let v = json!({"same": true});
    assert!(r.rival.claim("t/same", &v).await.unwrap().won);
    let again = r.db.claim("t/same", &v).await.unwrap();
    assert!(!again.won);
    assert_eq!(again.value, v);
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Decision {
    run_id: String,
    attempt: u32,
}

pub async fn claim_typed_values(r: Rig) {
    let d = Decision {
        run_id: "r1".into(),
        attempt: 1,
    };
    let won = r.db.claim("t/typed", &d).await.unwrap();
    assert!(won.won);
    let other = Decision {
        run_id: "r2".into(),
        attempt: 9,
    };
    let lost = r.db.claim("t/typed", &other).await.unwrap();
    assert!(!lost.won);
    assert_eq!(lost.value, d);
}

pub async fn claim_retries_when_the_winner_vanishes(r: Rig) {
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        assert!(rival.claim("t/v", &json!("rival")).await.unwrap().won);
    });
    let raw = r.raw.clone();
    r.race.before_next_get(move || async move {
        raw.delete("t/v").await.unwrap();
    });
    let c = r.db.claim("t/v", &json!("mine")).await.unwrap();
    assert!(
        c.won,
        "after the winner vanished the claim is retried and wins"
    );
    assert_eq!(stored(&r, "t/v").await, Some(json!("mine")));
    assert_eq!(r.race.pending_hooks(), 0);
}

pub async fn claim_gives_up_after_bounded_attempts(r: Rig) {
    for _ in 0..cojob::CLAIM_ATTEMPTS {
        let rival = r.rival.clone();
        r.race.before_next_put(move || async move {
            rival.claim("t/flap", &json!("rival")).await.unwrap();
        });
        let raw = r.raw.clone();
        r.race.before_next_get(move || async move {
            raw.delete("t/flap").await.unwrap();
        });
    }
    let err = r.db.claim("t/flap", &json!("mine")).await.unwrap_err();
    assert!(
        matches!(err, Error::Contention { attempts, .. } if attempts == cojob::CLAIM_ATTEMPTS),
        "{err}"
    );
}

pub async fn claim_ambiguous_conflict_is_resolved_by_rereading(r: Rig) {
    r.race.lie_on_next_put(Lie::Conflict);
    let c = r.db.claim("t/amb", &json!("mine")).await.unwrap();
    assert!(
        c.won,
        "our own write, reported as a conflict, is recognised"
    );
    r.race.lie_on_next_put(Lie::Error);
    let c = r.db.claim("t/amb2", &json!("mine")).await.unwrap();
    assert!(c.won, "our own write, reported as an error, is recognised");
    // And a genuine loss stays a loss.
    assert!(!r.db.claim("t/amb", &json!("again")).await.unwrap().won);
}

pub async fn claim_refuses_foreign_documents(r: Rig) {
    r.raw
        .put("t/foreign", "not json at all".into(), PutMode::Overwrite)
        .await
        .unwrap();
    let err = r.db.claim("t/foreign", &json!(1)).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    r.raw
        .put("t/shape", r#"{"x":1}"#.into(), PutMode::Overwrite)
        .await
        .unwrap();
    let d = Decision {
        run_id: "r".into(),
        attempt: 1,
    };
    let err = r.db.claim("t/shape", &d).await.unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { expected, .. } if expected.contains("Decision")),
        "{err}"
    );
    assert_eq!(
        stored_bytes(&r, "t/foreign").await.unwrap(),
        b"not json at all"
    );
}

/// A value whose serialization always fails.
#[derive(Debug)]
struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("this value refuses to serialize"))
    }
}

impl<'de> Deserialize<'de> for Unserializable {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Ok(Unserializable)
    }
}

pub async fn claim_refuses_oversized_and_unserializable_values(r: Rig) {
    let big = "x".repeat(MAX_DOCUMENT_BYTES);
    let err = r.db.claim("t/big", &json!(big)).await.unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { size, limit, .. } if size > limit && limit == MAX_DOCUMENT_BYTES),
        "{err}"
    );
    let err = r.db.claim("t/bad", &Unserializable).await.unwrap_err();
    assert!(matches!(err, Error::Serialize { .. }), "{err}");
    assert!(r.raw.get("t/big").await.unwrap().is_none());
    assert!(r.raw.get("t/bad").await.unwrap().is_none());
}

// ---------------------------------------------------------------- lease

pub async fn lease_document_is_canonical(r: Rig) {
    let o = LeaseOptions::new("h1", TTL).state_fn(|_| Ok(json!({"z": 1, "a": {"y": 2, "b": 3}})));
    let lease = r.db.lease("l", o).await.unwrap().unwrap();
    assert_eq!(lease.epoch(), 1);
    assert_eq!(
        String::from_utf8(stored_bytes(&r, "l").await.unwrap()).unwrap(),
        format!(
            r#"{{"deadline_at":"2026-08-09T02:01:00.000000Z","epoch":1,"holder":"{}","state":{{"a":{{"b":3,"y":2}},"z":1}}}}"#,
            cojob::holder_digest("h1")
        )
    );
    assert_eq!(lease.deadline(), later(&r, TTL));
}

pub async fn lease_held_by_another_is_refused(r: Rig) {
    let _held = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    let before = stored_bytes(&r, "l").await;
    assert!(r.db.lease("l", opts("b")).await.unwrap().is_none());
    assert_eq!(
        stored_bytes(&r, "l").await,
        before,
        "a refused lease writes nothing"
    );
}

pub async fn lease_expiry_is_inclusive(r: Rig) {
    r.db.lease("l", opts("a")).await.unwrap().unwrap();
    r.clock.advance(TTL - Duration::from_micros(1));
    assert!(
        r.db.lease("l", opts("b")).await.unwrap().is_none(),
        "1µs before the deadline"
    );
    r.clock.advance(Duration::from_micros(1));
    let stolen =
        r.db.lease("l", opts("b"))
            .await
            .unwrap()
            .expect("at the deadline it has expired");
    assert_eq!(stolen.epoch(), 2);
}

pub async fn lease_steal_if_expired_false(r: Rig) {
    let mut a = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    r.clock.advance(TTL * 2);
    assert!(
        r.db.lease("l", opts("b").steal_if_expired(false))
            .await
            .unwrap()
            .is_none()
    );
    a.release(None).await.unwrap();
    let b =
        r.db.lease("l", opts("b").steal_if_expired(false))
            .await
            .unwrap();
    assert_eq!(
        b.unwrap().epoch(),
        2,
        "a released lease is free even without stealing"
    );
}

pub async fn lease_epoch_bumps_on_every_acquisition(r: Rig) {
    let me = holder("me");
    let mut first =
        r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(first.epoch(), 1);
    // Re-acquiring while holding begins a new period and fences the old handle.
    let mut second =
        r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(second.epoch(), 2);
    let err = first.renew().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::EpochAdvanced { ours: 1, stored: 2 },
                ..
            }
        ),
        "{err}"
    );
    second.release(Some(json!({"done": true}))).await.unwrap();
    let doc = stored(&r, "l").await.unwrap();
    assert_eq!(
        doc["holder"],
        Value::Null,
        "release keeps the document, with no holder"
    );
    assert_eq!(doc["epoch"], 2);
    assert_eq!(doc["state"], json!({"done": true}));
    let third = r.db.lease("l", opts("x")).await.unwrap().unwrap();
    assert_eq!(third.epoch(), 3);
    assert_eq!(third.state(), &json!({"done": true}));
    r.clock.advance(TTL);
    let fourth = r.db.lease("l", opts("y")).await.unwrap().unwrap();
    assert_eq!(fourth.epoch(), 4);
}

pub async fn lease_state_fn_sees_state_and_can_abort(r: Rig) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let bump = move |s: Option<&Value>| -> Result<Value, cojob::BoxError> {
        log.lock().unwrap().push(s.cloned());
        if s.is_some_and(|s| s["status"] == "succeeded") {
            return Err("the run is terminal".into());
        }
        let attempt = s.and_then(|s| s["attempt"].as_u64()).unwrap_or(0) + 1;
        Ok(json!({"status": "pending", "attempt": attempt}))
    };
    let mut l =
        r.db.lease("l", opts("a").state_fn(bump.clone()))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(l.state(), &json!({"status": "pending", "attempt": 1}));
    l.release(None).await.unwrap();
    let mut l =
        r.db.lease("l", opts("b").state_fn(bump.clone()))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(l.state()["attempt"], 2);
    assert_eq!(
        seen.lock().unwrap()[0],
        None,
        "a fresh lease's state_fn sees None"
    );
    l.release(Some(json!({"status": "succeeded", "attempt": 2})))
        .await
        .unwrap();
    let before = stored_bytes(&r, "l").await;
    let err = r.db.lease("l", opts("c").state_fn(bump)).await.unwrap_err();
    assert!(matches!(err, Error::Aborted { .. }), "{err}");
    assert_eq!(
        stored_bytes(&r, "l").await,
        before,
        "an aborted acquisition writes nothing"
    );
}

pub async fn lease_renew_extends_deadline(r: Rig) {
    let mut l = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    r.clock.advance(Duration::from_secs(20));
    let before = r.db.store().stats();
    l.renew().await.unwrap();
    let used = r.db.store().stats().since(&before);
    assert_eq!(
        (used.puts(), used.gets()),
        (1, 0),
        "renew is one PUT: {used}"
    );
    assert_eq!(l.deadline(), later(&r, TTL));
    let doc = stored(&r, "l").await.unwrap();
    assert_eq!(doc["deadline_at"], cojob::json::format_time(later(&r, TTL)));
    assert_eq!(doc["epoch"], 1);
    // A holder past its deadline may carry on while nobody stole the lease.
    r.clock.advance(TTL * 3);
    l.renew().await.unwrap();
    assert_eq!(l.epoch(), 1);
}

pub async fn lease_paused_holder_is_fenced(r: Rig) {
    let mut paused = r.db.lease("l", opts("paused")).await.unwrap().unwrap();
    r.clock.advance(TTL + Duration::from_secs(1));
    let thief = r.rival.lease("l", opts("thief")).await.unwrap().unwrap();
    assert_eq!(thief.epoch(), 2);
    let after_steal = stored_bytes(&r, "l").await;
    let lost = |e: Error| {
        assert!(
            matches!(
                e,
                Error::LeaseLost {
                    reason: LostReason::EpochAdvanced { ours: 1, stored: 2 },
                    ..
                }
            ),
            "{e}"
        )
    };
    lost(paused.renew().await.unwrap_err());
    lost(paused.update_state(|_| json!("late")).await.unwrap_err());
    lost(paused.write(json!("late")).await.unwrap_err());
    lost(paused.release(Some(json!("late"))).await.unwrap_err());
    assert_eq!(
        stored_bytes(&r, "l").await,
        after_steal,
        "no late write landed"
    );
}

pub async fn lease_holder_change_and_deletion_are_lost(r: Rig) {
    let me = holder("me");
    let mut mine =
        r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    // Another handle on the same period releases it: same epoch, holder now null.
    let mut other = r.rival.attach_lease("l", &me, TTL).await.unwrap().unwrap();
    other.release(None).await.unwrap();
    let err = mine.renew().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::HolderChanged,
                ..
            }
        ),
        "{err}"
    );

    let mut gone = r.db.lease("l2", opts("a")).await.unwrap().unwrap();
    r.raw.delete("l2").await.unwrap();
    let err = gone.update_state(|s| s.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::Deleted,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_lease_lost());
}

pub async fn lease_cooperative_write_is_absorbed(r: Rig) {
    let mut l =
        r.db.lease("l", opts("a").state_fn(|_| Ok(json!({"progress": 0}))))
            .await
            .unwrap()
            .unwrap();
    let deadline = l.deadline();
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        rival
            .cooperative_write("l", |s| {
                cojob::lease::merge(s, json!({"cancel_requested": true}))
            })
            .await
            .unwrap();
    });
    l.update_state(|s| cojob::lease::merge(s, json!({"progress": 0.5})))
        .await
        .unwrap();
    assert_eq!(
        l.state(),
        &json!({"cancel_requested": true, "progress": 0.5})
    );
    let doc = stored(&r, "l").await.unwrap();
    assert_eq!(
        doc["state"],
        json!({"cancel_requested": true, "progress": 0.5})
    );
    assert_eq!(doc["epoch"], 1, "a cooperative write keeps the epoch");
    assert_eq!(
        doc["deadline_at"],
        cojob::json::format_time(deadline),
        "and the deadline"
    );
    // renew absorbs too, and keeps the absorbed state.
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        rival
            .cooperative_write("l", |s| cojob::lease::merge(s, json!({"note": "x"})))
            .await
            .unwrap();
    });
    l.renew().await.unwrap();
    assert_eq!(l.state()["note"], "x");
    assert_eq!(stored(&r, "l").await.unwrap()["state"]["note"], "x");
}

pub async fn lease_write_replaces_unread_cooperative_state(r: Rig) {
    let mut l = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        rival
            .cooperative_write("l", |_| json!({"cancel_requested": true}))
            .await
            .unwrap();
    });
    l.write(json!({"progress": 1})).await.unwrap();
    assert_eq!(
        stored(&r, "l").await.unwrap()["state"],
        json!({"progress": 1})
    );
}

pub async fn lease_release_with_reads_a_racing_cooperative_write(r: Rig) {
    let mut l =
        r.db.lease(
            "l",
            opts("a").state_fn(|_| Ok(json!({"status": "running"}))),
        )
        .await
        .unwrap()
        .unwrap();
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        rival
            .cooperative_write("l", |s| {
                cojob::lease::merge(s, json!({"cancel_requested": true}))
            })
            .await
            .unwrap();
    });
    let mut calls = 0;
    l.release_with(|s| {
        calls += 1;
        let status = if s["cancel_requested"] == json!(true) {
            "cancelled"
        } else {
            "retrying"
        };
        Ok(cojob::lease::merge(s, json!({"status": status})))
    })
    .await
    .unwrap();
    assert_eq!(calls, 2, "computed again from the state that won the race");
    let doc = stored(&r, "l").await.unwrap();
    assert_eq!(
        (doc["state"].clone(), doc["holder"].clone()),
        (
            json!({"cancel_requested": true, "status": "cancelled"}),
            Value::Null
        )
    );
    assert!(l.is_released());
    // A refusal writes nothing.
    let mut m = r.db.lease("m", opts("a")).await.unwrap().unwrap();
    let err = m.release_with(|_| Err("no".into())).await.unwrap_err();
    assert!(matches!(err, Error::Aborted { .. }), "{err}");
    assert!(!m.is_released());
    assert!(stored(&r, "m").await.unwrap()["holder"].is_string());
}

pub async fn lease_records_only_the_holder_digest(r: Rig) {
    let me = holder("me");
    let mut l =
        r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    l.update_state(|_| json!({"step": 1})).await.unwrap();
    r.db.cooperative_write("l", |s| cojob::lease::merge(s, json!({"seen": true})))
        .await
        .unwrap();
    l.renew().await.unwrap();
    let text = String::from_utf8(stored_bytes(&r, "l").await.unwrap()).unwrap();
    assert!(
        !text.contains(&me),
        "the credential itself is never stored: {text}"
    );
    assert_eq!(
        stored(&r, "l").await.unwrap()["holder"],
        cojob::holder_digest(&me)
    );
    let info = r.db.inspect_lease("l").await.unwrap().unwrap();
    assert!(info.is_held_by(&me) && !info.is_held_by(&holder("other")));
    // Whoever reads the document cannot attach with what it shows.
    let shown = info.holder.clone().unwrap();
    let refused = [
        r.db.attach_lease("l", &shown, TTL)
            .await
            .map(|l| l.is_some()),
        r.db.resume_lease("l", &shown, 1, TTL)
            .await
            .map(|l| l.is_some()),
        r.db.lease("l", LeaseOptions::new(shown.clone(), TTL))
            .await
            .map(|l| l.is_some()),
    ];
    for outcome in refused {
        assert!(matches!(outcome, Err(Error::InvalidHolder)), "{outcome:?}");
    }

    // A lease written before holders were digests (the holder in clear) still belongs to its
    // holder, and its next write records the digest.
    let legacy = holder("legacy");
    let body = json!({"deadline_at": cojob::json::format_time(later(&r, TTL)), "epoch": 4, "holder": legacy,
        "state": {"step": 7}});
    r.raw
        .put("old", body.to_string().into(), PutMode::Overwrite)
        .await
        .unwrap();
    let mut old =
        r.db.resume_lease("old", &legacy, 4, TTL)
            .await
            .unwrap()
            .expect("its holder resumes it");
    assert!(
        r.db.attach_lease("old", &holder("x"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    old.renew().await.unwrap();
    assert_eq!(
        stored(&r, "old").await.unwrap()["holder"],
        cojob::holder_digest(&legacy)
    );
    assert_eq!(old.epoch(), 4);
}

pub async fn lease_resume_rules(r: Rig) {
    let me = holder("me");
    assert!(
        r.db.resume_lease("l", &me, 1, TTL).await.unwrap().is_none(),
        "absent"
    );
    r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
        .await
        .unwrap()
        .unwrap();
    let before = r.db.store().stats();
    assert!(r.db.resume_lease("l", &me, 1, TTL).await.unwrap().is_some());
    let used = r.db.store().stats().since(&before);
    assert_eq!((used.gets(), used.puts()), (1, 0), "one read, no write");
    assert!(
        r.db.resume_lease("l", &me, 2, TTL).await.unwrap().is_none(),
        "another epoch, even with the same holder"
    );
    assert!(
        r.db.resume_lease("l", &holder("other"), 1, TTL)
            .await
            .unwrap()
            .is_none(),
        "another holder"
    );
    // Past the deadline by this reader's clock (a node clock running ahead), still resumable;
    // the renewal's compare-and-swap is the judge.
    r.clock.advance(TTL * 2);
    let mut late =
        r.db.resume_lease("l", &me, 1, TTL)
            .await
            .unwrap()
            .expect("ours");
    late.renew().await.unwrap();
    // Once stolen, a resumed handle of the old epoch is fenced at its first write.
    let mut stale = r.db.resume_lease("l", &me, 1, TTL).await.unwrap().unwrap();
    r.clock.advance(TTL * 2);
    r.db.lease("l", opts("thief")).await.unwrap().unwrap();
    let err = stale.renew().await.unwrap_err();
    assert!(err.is_lease_lost(), "{err}");
    assert!(r.db.resume_lease("l", &me, 1, TTL).await.unwrap().is_none());
}

pub async fn lease_released_handle_is_lost(r: Rig) {
    let mut l = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    l.release(None).await.unwrap();
    assert!(l.is_released());
    let before = r.db.store().stats();
    let err = l.renew().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LeaseLost {
                reason: LostReason::Released,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(r.db.store().stats().since(&before).total(), 0);
}

pub async fn lease_attach_rules(r: Rig) {
    let me = holder("me");
    assert!(
        r.db.attach_lease("l", &me, TTL).await.unwrap().is_none(),
        "absent"
    );
    let mut l =
        r.db.lease("l", LeaseOptions::new(me.clone(), TTL))
            .await
            .unwrap()
            .unwrap();
    let before = r.db.store().stats();
    let same =
        r.db.attach_lease("l", &me, TTL)
            .await
            .unwrap()
            .expect("mine and live");
    let used = r.db.store().stats().since(&before);
    assert_eq!(
        (used.gets(), used.puts()),
        (1, 0),
        "attach is one read and no write"
    );
    assert_eq!((same.epoch(), same.deadline()), (l.epoch(), l.deadline()));
    assert!(
        r.db.attach_lease("l", &holder("other"), TTL)
            .await
            .unwrap()
            .is_none(),
        "foreign"
    );
    r.clock.advance(TTL);
    assert!(
        r.db.attach_lease("l", &me, TTL).await.unwrap().is_none(),
        "expired, inclusively"
    );
    l.renew().await.unwrap();
    l.release(None).await.unwrap();
    assert!(
        r.db.attach_lease("l", &me, TTL).await.unwrap().is_none(),
        "released"
    );
}

pub async fn lease_two_handles_on_one_period_converge(r: Rig) {
    let me = holder("me");
    let mut a =
        r.db.lease(
            "l",
            LeaseOptions::new(me.clone(), TTL).state_fn(|_| Ok(json!({}))),
        )
        .await
        .unwrap()
        .unwrap();
    let mut b = r.rival.attach_lease("l", &me, TTL).await.unwrap().unwrap();
    b.update_state(|s| cojob::lease::merge(s, json!({"b": 1})))
        .await
        .unwrap();
    a.update_state(|s| cojob::lease::merge(s, json!({"a": 1})))
        .await
        .unwrap();
    b.renew().await.unwrap();
    assert_eq!(b.state(), &json!({"a": 1, "b": 1}));
    assert_eq!((a.epoch(), b.epoch()), (1, 1));
}

pub async fn lease_zero_ttl_and_empty_holder_are_refused(r: Rig) {
    let err =
        r.db.lease("l", LeaseOptions::new("a", Duration::ZERO))
            .await
            .unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err}");
    let err =
        r.db.attach_lease("l", "a", Duration::ZERO)
            .await
            .unwrap_err();
    assert!(matches!(err, Error::InvalidTtl { .. }), "{err}");
    let err =
        r.db.lease("l", LeaseOptions::new("", TTL))
            .await
            .unwrap_err();
    assert!(matches!(err, Error::InvalidHolder), "{err}");
    assert!(r.raw.get("l").await.unwrap().is_none());
}

pub async fn lease_refuses_foreign_documents(r: Rig) {
    let bad: [&str; 8] = [
        "garbage",
        "[1,2]",
        r#"{"epoch":1,"holder":"a","state":null}"#,
        r#"{"deadline_at":"2026-08-09T02:00:00.000000Z","epoch":1,"holder":"a","state":null,"extra":1}"#,
        r#"{"deadline_at":"yesterday","epoch":1,"holder":"a","state":null}"#,
        r#"{"deadline_at":"2026-08-09T02:00:00.000000Z","epoch":-1,"holder":"a","state":null}"#,
        r#"{"deadline_at":"2026-08-09T02:00:00.000000Z","epoch":0,"holder":"a","state":null}"#,
        r#"{"deadline_at":"2026-08-09T02:00:00.000000Z","epoch":1,"holder":7,"state":null}"#,
    ];
    for (i, body) in bad.iter().enumerate() {
        let key = format!("bad/{i}");
        r.raw
            .put(&key, body.to_string().into(), PutMode::Overwrite)
            .await
            .unwrap();
        let err = r.db.lease(&key, opts("a")).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{body}: {err}");
        let err = r.db.attach_lease(&key, "a", TTL).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{body}: {err}");
        let err =
            r.db.cooperative_write(&key, |s| s.clone())
                .await
                .unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{body}: {err}");
        assert_eq!(
            stored_bytes(&r, &key).await.unwrap(),
            body.as_bytes(),
            "left untouched"
        );
    }
}

pub async fn lease_oversized_state_is_refused(r: Rig) {
    let mut l = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    let before = stored_bytes(&r, "l").await;
    let err = l
        .write(json!("y".repeat(MAX_DOCUMENT_BYTES)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    let err =
        r.db.lease(
            "l2",
            opts("a").state_fn(|_| Ok(json!("z".repeat(MAX_DOCUMENT_BYTES)))),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    assert_eq!(stored_bytes(&r, "l").await, before);
    assert!(r.raw.get("l2").await.unwrap().is_none());
    l.renew().await.unwrap();
}

pub async fn lease_ambiguous_error_is_resolved_by_rereading(r: Rig) {
    r.race.lie_on_next_put(Lie::Error);
    let mut l =
        r.db.lease("l", opts("a"))
            .await
            .unwrap()
            .expect("the landed acquisition is ours");
    r.race.lie_on_next_put(Lie::Conflict);
    l.renew().await.unwrap();
    r.race.lie_on_next_put(Lie::Error);
    l.update_state(|_| json!({"n": 1})).await.unwrap();
    assert_eq!(stored(&r, "l").await.unwrap()["state"], json!({"n": 1}));
    l.renew().await.unwrap();
    assert_eq!(l.epoch(), 1);
}

pub async fn cooperative_write_needs_a_lease(r: Rig) {
    let err =
        r.db.cooperative_write("nothing", |s| s.clone())
            .await
            .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let mut l = r.db.lease("l", opts("a")).await.unwrap().unwrap();
    l.release(Some(json!({"status": "succeeded"})))
        .await
        .unwrap();
    let s =
        r.db.cooperative_write("l", |s| cojob::lease::merge(s, json!({"seen": true})))
            .await
            .unwrap();
    assert_eq!(s, json!({"status": "succeeded", "seen": true}));
    let doc = stored(&r, "l").await.unwrap();
    assert_eq!(
        (doc["holder"].clone(), doc["epoch"].clone()),
        (Value::Null, json!(1))
    );
}

// ---------------------------------------------------------------- doc

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone, Default)]
struct Counter {
    n: u64,
}

/// An update function that adds `n` to a counter.
fn add(n: u64) -> impl FnMut(Counter) -> Counter {
    move |mut c| {
        c.n += n;
        c
    }
}

/// Queues `times` rival increments by `n` of the counter at `key`, each just before the next put
/// of the code under test.
fn rival_adds(r: &Rig, key: &str, times: usize, n: u64) {
    for _ in 0..times {
        let rival = r.rival.doc::<Counter>(key);
        r.race.before_next_put(move || async move {
            rival.update(add(n), None).await.unwrap();
        });
    }
}

pub async fn doc_create_get_delete(r: Rig) {
    let d = r.db.doc::<Counter>("d");
    assert!(d.get().await.unwrap().is_none());
    let err = d.update(|c| c, None).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let (v, ver) = d.update(add(1), Some(Counter::default())).await.unwrap();
    assert_eq!(v, Counter { n: 1 });
    let (got, got_ver) = d.get().await.unwrap().unwrap();
    assert_eq!((got, got_ver), (Counter { n: 1 }, ver));
    assert_eq!(stored_bytes(&r, "d").await.unwrap(), br#"{"n":1}"#);
    d.delete().await.unwrap();
    d.delete().await.unwrap();
    assert!(d.get().await.unwrap().is_none());
}

pub async fn doc_update_retries_lost_races(r: Rig) {
    let d = r.db.doc::<Counter>("d");
    d.update(|c| c, Some(Counter::default())).await.unwrap();
    rival_adds(&r, "d", 3, 10);
    let calls = std::sync::atomic::AtomicU32::new(0);
    let (v, _) = d
        .update(
            |mut c| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.n += 1;
                c
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(v.n, 31);
    assert_eq!(calls.into_inner(), 4, "f runs once per round");
    assert_eq!(d.get().await.unwrap().unwrap().0.n, 31);
}

pub async fn doc_gives_up_after_max_attempts(r: Rig) {
    let d = r.db.doc::<Counter>("d").max_attempts(2);
    d.update(|c| c, Some(Counter::default())).await.unwrap();
    rival_adds(&r, "d", 2, 1);
    let err = d.update(add(100), None).await.unwrap_err();
    assert!(
        matches!(err, Error::Contention { attempts: 2, .. }),
        "{err}"
    );
    assert!(err.is_transient());
    assert_eq!(d.get().await.unwrap().unwrap().0.n, 2);
}

pub async fn doc_update_can_abort(r: Rig) {
    let d = r.db.doc::<Counter>("d");
    d.update(|c| c, Some(Counter { n: 5 })).await.unwrap();
    let err = d
        .try_update(|_| Err::<Counter, _>("no"), None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Aborted { .. }), "{err}");
    assert_eq!(d.get().await.unwrap().unwrap().0.n, 5);
}

pub async fn doc_refuses_foreign_documents(r: Rig) {
    for (i, body) in ["{{{", r#"{"n":"five"}"#, "[]"].iter().enumerate() {
        let key = format!("bad/{i}");
        r.raw
            .put(&key, body.to_string().into(), PutMode::Overwrite)
            .await
            .unwrap();
        let d = r.db.doc::<Counter>(&key);
        let err = d.get().await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{body}: {err}");
        let err = d.update(|c| c, Some(Counter::default())).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{body}: {err}");
        assert_eq!(stored_bytes(&r, &key).await.unwrap(), body.as_bytes());
    }
}

pub async fn doc_ambiguous_write_is_not_applied_twice(r: Rig) {
    let d = r.db.doc::<Counter>("d");
    r.race.lie_on_next_put(Lie::Conflict);
    d.update(add(1), Some(Counter::default())).await.unwrap();
    r.race.lie_on_next_put(Lie::Error);
    d.update(add(1), None).await.unwrap();
    r.race.lie_on_next_put(Lie::Conflict);
    d.update(add(1), None).await.unwrap();
    assert_eq!(
        d.get().await.unwrap().unwrap().0.n,
        3,
        "each increment applied exactly once"
    );
}

pub async fn doc_refuses_unserializable_values(r: Rig) {
    let d = r.db.doc::<Unserializable>("d");
    let err = d.update(|u| u, Some(Unserializable)).await.unwrap_err();
    assert!(matches!(err, Error::Serialize { .. }), "{err}");
    assert!(r.raw.get("d").await.unwrap().is_none());
}

// ---------------------------------------------------------------- store

pub async fn store_counts_minimal_requests(r: Rig) {
    let s = r.db.store();
    let measure = |before: cojob::store::StoreStats| s.stats().since(&before);
    let b = s.stats();
    assert!(r.db.claim("m/c", &1).await.unwrap().won);
    let u = measure(b);
    assert_eq!((u.puts(), u.gets()), (1, 0), "claim won: {u}");
    let b = s.stats();
    assert!(!r.db.claim("m/c", &2).await.unwrap().won);
    let u = measure(b);
    assert_eq!((u.puts(), u.gets()), (1, 1), "claim lost: {u}");
    assert_eq!(u.count(Op::PutIfAbsent, Outcome::Conflict), 1);
    let b = s.stats();
    let mut l = r.db.lease("m/l", opts("a")).await.unwrap().unwrap();
    let u = measure(b);
    assert_eq!((u.gets(), u.puts()), (1, 1), "fresh lease: {u}");
    let b = s.stats();
    l.renew().await.unwrap();
    assert_eq!(measure(b).total(), 1, "renew");
    let b = s.stats();
    l.release(None).await.unwrap();
    assert_eq!(measure(b).count(Op::PutIfMatch, Outcome::Ok), 1, "release");
    let d = r.db.doc::<Counter>("m/d");
    d.update(|c| c, Some(Counter::default())).await.unwrap();
    let b = s.stats();
    d.update(add(1), None).await.unwrap();
    let u = measure(b);
    assert_eq!(
        (u.gets(), u.puts(), u.total()),
        (1, 1, 2),
        "doc.update: {u}"
    );
}

pub async fn store_verifies_conditional_writes(r: Rig) {
    r.db.store().verify_conditional_writes().await.unwrap();
    assert!(
        r.raw.list("").await.unwrap().is_empty(),
        "the probe cleans up after itself"
    );
}

pub async fn store_lists_sorted_and_rejects_bad_keys(r: Rig) {
    for k in ["b/2", "a/1", "b/1", "b/sub/x", "bb"] {
        r.raw.put(k, "{}".into(), PutMode::Overwrite).await.unwrap();
    }
    assert_eq!(r.raw.list("b").await.unwrap(), ["b/1", "b/2", "b/sub/x"]);
    assert_eq!(
        r.raw.list("").await.unwrap(),
        ["a/1", "b/1", "b/2", "b/sub/x", "bb"]
    );
    r.raw.delete("b/1").await.unwrap();
    r.raw.delete("b/1").await.unwrap();
    assert_eq!(r.raw.list("b/").await.unwrap(), ["b/2", "b/sub/x"]);
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "a/../b",
        "./a",
        "a\nb",
        ".cojob-lock.x",
    ] {
        let err = r.db.claim(bad, &1).await.unwrap_err();
        assert!(
            matches!(err, Error::Store(cojob::StoreError::InvalidKey { .. })),
            "{bad:?}: {err}"
        );
    }
}

/// The store's clock agrees with this machine's (same host), and a local clock set a minute
/// ahead is seen a minute ahead; the scratch object is gone afterwards.
pub async fn store_measures_its_clock_offset(r: Rig) {
    let allowance = Duration::from_secs(5);
    let offset = r
        .raw
        .clock_offset(&cojob::clock::SystemClock)
        .await
        .unwrap();
    let (min, max) = (offset.min.unwrap(), offset.max.unwrap());
    assert!(
        min <= chrono::Duration::seconds(1) && max >= chrono::Duration::seconds(-1),
        "the same machine's clocks differ: {offset:?}"
    );
    assert!(!offset.exceeds(allowance), "{offset:?}");

    let ahead = cojob::clock::FakeClock::at(chrono::Utc::now() + chrono::Duration::seconds(60));
    let offset = r.raw.clock_offset(&ahead).await.unwrap();
    assert!(offset.exceeds(allowance), "{offset:?}");
    let estimate = offset.estimate().unwrap().num_seconds();
    assert!((-62..=-58).contains(&estimate), "{offset:?}");
    assert!(
        r.raw.list("cojob-clock").await.unwrap().is_empty(),
        "the scratch object is deleted"
    );
}

/// G4's recipe: a fenced document takes its own token again and newer ones, refuses older ones
/// (also when a newer attempt's write lands between the read and the compare-and-swap), and
/// never overwrites a foreign document.
pub async fn fence_refuses_older_tokens_even_in_a_race(r: Rig) {
    use cojob::fence::Fenced;
    let written = |f: &Fenced| matches!(f, Fenced::Written { .. });
    assert!(written(
        &r.db.fenced_put("effect", 1, "first").await.unwrap()
    ));
    assert!(written(
        &r.db
            .fenced_put("effect", 1, "first, retried")
            .await
            .unwrap()
    ));
    assert!(written(
        &r.db.fenced_put("effect", 3, "third").await.unwrap()
    ));
    assert_eq!(
        r.db.fenced_put("effect", 2, "second, late").await.unwrap(),
        Fenced::Stale { stored: 3 }
    );
    assert_eq!(
        stored_bytes(&r, "effect").await.unwrap(),
        br#"{"fence":3,"value":"third"}"#
    );

    // Attempt 5 writes between attempt 4's read and its compare-and-swap.
    let rival = r.rival.clone();
    r.race.before_next_put(move || async move {
        rival.fenced_put("effect", 5, "fifth").await.unwrap();
    });
    assert_eq!(
        r.db.fenced_put("effect", 4, "fourth").await.unwrap(),
        Fenced::Stale { stored: 5 }
    );
    assert_eq!(
        r.db.fenced_get::<String>("effect").await.unwrap(),
        Some((5, "fifth".to_string()))
    );

    r.raw
        .put("foreign", "{\"fence\":\"x\"}".into(), PutMode::Overwrite)
        .await
        .unwrap();
    let err = r.db.fenced_put("foreign", 9, "x").await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert_eq!(
        stored_bytes(&r, "foreign").await.unwrap(),
        br#"{"fence":"x"}"#
    );
}

/// An object larger than any document cojob writes (planted under a job's prefix, say) is
/// refused by every read with a typed error, instead of being buffered; one at the limit reads.
pub async fn reads_refuse_objects_over_the_document_limit(r: Rig) {
    use cojob::StoreError;
    let big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
    r.raw
        .put("huge", big.into(), PutMode::Overwrite)
        .await
        .unwrap();
    let err = r.raw.get("huge").await.unwrap_err();
    assert!(
        matches!(&err, StoreError::TooLarge { size, limit, .. } if *size == MAX_DOCUMENT_BYTES as u64 + 1 && *limit == MAX_DOCUMENT_BYTES),
        "{err:?}"
    );
    let err = r.db.doc::<Value>("huge").get().await.unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::TooLarge { .. })),
        "{err}"
    );
    assert!(!err.is_transient(), "not retried: {err}");
    let err = r.db.inspect_lease("huge").await.unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::TooLarge { .. })),
        "{err}"
    );
    let err = r.db.claim("huge", &1).await.unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::TooLarge { .. })),
        "{err}"
    );

    let mut at_limit = vec![b' '; MAX_DOCUMENT_BYTES - 2];
    at_limit.splice(0..0, *b"{}");
    r.raw
        .put("largest", at_limit.into(), PutMode::Overwrite)
        .await
        .unwrap();
    assert_eq!(
        r.raw.get("largest").await.unwrap().unwrap().0.len(),
        MAX_DOCUMENT_BYTES
    );
}
