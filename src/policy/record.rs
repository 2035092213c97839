//! The idempotency store's records and their rules: one keyed call's claim,
//! its lease, its outcome, and when the record expires.
//!
//! Owns the record's states and every transition between them, as one pure
//! function ([`apply`]) from the record read, an operation and the store's
//! clock (`now`, milliseconds) to a reply and the write to make. An engine
//! (`crate::store`) reads the record, calls [`apply`] and makes the write in
//! one atomic step, so every write after a claim checks the owner in the
//! same step. It must not know where records live, how they are named
//! (scope and key hashing), what the call was, or the wall clock.
//!
//! Rules:
//! * **Claim** only if absent (or expired): the caller owns the record and
//!   runs the call. The record lives at least `ttl`; the owner's liveness is
//!   a separate lease (`lease_until`), renewed every third of its length
//!   ([`renew_due`]), and each renewal also extends the record to `now +
//!   ttl`, so the record outlives its call.
//! * A claim on a record another owner holds with a live lease is **busy**
//!   (a twin waits and claims again later); one whose lease is gone becomes
//!   **unknown** (`owner_lost`): the call may have run.
//! * **Finish** by the owner: a result replaces the claim and is kept for
//!   `ttl` (replayed to every later claim); `Ran` keeps a `done` record
//!   without the result (a success too large to keep); `Released` deletes
//!   the record (a definite answer that is not kept: the next call runs);
//!   `Unknown` marks it (an ambiguous failure). A late success or `Ran` by
//!   the owner replaces an unknown record; a late `Released` lifts it.
//! * A write by anyone but the record's owner changes nothing
//!   ([`Reply::NotOwner`]).
//! * A record is gone once `now >= expires`: it is treated as absent and
//!   the engine purges it ([`expired`]).
//! * A reply gives its times as ages (`ago`) on the clock of the step that
//!   read the record, so no caller subtracts a time of the store's clock
//!   from its own (a shared store's clock is another host's).

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// Milliseconds of the store's clock.
pub type Millis = u64;

/// Why an earlier attempt's outcome is unknown when its owner vanished
/// without saying (its lease ran out).
pub const OWNER_LOST: &str = "owner_lost";

/// One key's record, as the engine keeps it (serialized as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The owner's token (random, per claim).
    pub owner: String,
    /// A digest of the call's arguments, to tell a twin with other
    /// arguments.
    pub args: String,
    /// When the claim was made.
    pub started: Millis,
    /// When the record is gone.
    pub expires: Millis,
    pub state: State,
    /// What the call was, for people (`status`); no rule reads it.
    #[serde(default)]
    pub about: About,
}

/// What a record says of its call to a person who must reconcile an
/// unknown outcome: the server's entry, the tool and the key, each as
/// safe to show as the caller made it (a redacted, shortened key). Never a
/// value of the server's `env` or `headers`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct About {
    #[serde(default)]
    pub server: String,
    #[serde(default)]
    pub tool: String,
    #[serde(default)]
    pub key: String,
}

/// Where a record is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// The call is running; its owner is alive until `lease_until`.
    Claimed { lease_until: Millis },
    /// The call succeeded at `at`; `result` is its raw JSON result, or
    /// `None` when it was too large to keep.
    Done { at: Millis, result: Option<String> },
    /// The call may have run: `cause` ended it without an outcome at `at`.
    Unknown { cause: String, at: Millis },
}

/// How long a record and a lease last, from the caller's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The record's lifetime (`idempotency_ttl`).
    pub ttl: Millis,
    /// The owner's lease.
    pub lease: Millis,
}

/// What the owner says of its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A success, kept and replayed (raw JSON result).
    Result(String),
    /// A success too large to keep.
    Ran,
    /// A definite answer that is not kept: the next call runs.
    Released,
    /// The call may have run (`cause`: `timeout`, `server_exited`, ...).
    Unknown(String),
}

/// An operation on one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Claim the record for `owner` (also how a waiting twin polls);
    /// `about` is kept in a record it makes.
    Claim {
        owner: String,
        args: String,
        timing: Timing,
        about: About,
    },
    /// Renew `owner`'s lease and extend the record.
    Renew { owner: String, timing: Timing },
    /// `owner`'s call ended with `outcome`.
    Finish {
        owner: String,
        outcome: Outcome,
        timing: Timing,
    },
}

/// What an operation found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The caller owns the record now: run the call.
    Claimed,
    /// Another owner's call, started `ago` ms before this step, is live:
    /// wait.
    Busy { ago: Millis, same_args: bool },
    /// A kept success (`ago` ms before this step): answer with it, without
    /// running.
    Replay {
        result: String,
        ago: Millis,
        same_args: bool,
    },
    /// The call succeeded `ago` ms before this step without a kept result:
    /// do not run.
    Ran { ago: Millis, same_args: bool },
    /// An earlier attempt, started `ago` ms before this step, may have
    /// run: do not run.
    Unknown {
        cause: String,
        ago: Millis,
        same_args: bool,
    },
    /// The owner's write was made.
    Written,
    /// The record is not the caller's (any more): nothing was written.
    NotOwner,
}

/// What the engine is to write, in the same atomic step as the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Keep,
    Put(Record),
    Delete,
}

/// Whether `record` is gone at `now`.
pub fn expired(record: &Record, now: Millis) -> bool {
    now >= record.expires
}

/// When a lease taken or renewed at `at` is to be renewed: after a third
/// of its length.
pub fn renew_due(at: Millis, lease: Millis) -> Millis {
    at.saturating_add((lease / 3).max(1))
}

/// `record` as it stands at `now` when its call's outcome is unknown: an
/// `unknown` record, or a claim whose owner's lease is gone (shown as
/// unknown, `owner_lost`, from when the lease ran out, as the next claim
/// would make it). `None` for a live claim, a result, or an expired record.
pub fn unknown_at(record: &Record, now: Millis) -> Option<Record> {
    if expired(record, now) {
        return None;
    }
    match record.state {
        State::Unknown { .. } => Some(record.clone()),
        State::Claimed { lease_until } if now >= lease_until => {
            let mut lost = record.clone();
            lost.state = State::Unknown {
                cause: OWNER_LOST.to_owned(),
                at: lease_until,
            };
            Some(lost)
        }
        _ => None,
    }
}

/// Whether `record` may be, or become, an unknown outcome (a claim or an
/// unknown record): the records an engine indexes for [`unknown_at`].
pub fn is_open(record: &Record) -> bool {
    matches!(record.state, State::Claimed { .. } | State::Unknown { .. })
}

/// The step of one operation: the reply and the write, from the record
/// read (`None`: absent) at `now`.
pub fn apply(current: Option<&Record>, op: &Op, now: Millis) -> (Reply, Write) {
    let live = current.filter(|r| !expired(r, now));
    let gone = if current.is_some() && live.is_none() {
        Write::Delete
    } else {
        Write::Keep
    };
    match op {
        Op::Claim {
            owner,
            args,
            timing,
            about,
        } => match live {
            None => {
                let record = Record {
                    owner: owner.clone(),
                    args: args.clone(),
                    started: now,
                    expires: now.saturating_add(timing.ttl.max(timing.lease)),
                    state: State::Claimed {
                        lease_until: now.saturating_add(timing.lease),
                    },
                    about: about.clone(),
                };
                (Reply::Claimed, Write::Put(record))
            }
            Some(r) => found(r, args, timing, now),
        },
        Op::Renew { owner, timing } => match live {
            Some(r) if r.owner == *owner && matches!(r.state, State::Claimed { .. }) => {
                let mut r = r.clone();
                r.state = State::Claimed {
                    lease_until: now.saturating_add(timing.lease),
                };
                r.expires = r.expires.max(now.saturating_add(timing.ttl));
                (Reply::Written, Write::Put(r))
            }
            _ => (Reply::NotOwner, gone),
        },
        Op::Finish {
            owner,
            outcome,
            timing,
        } => match live {
            Some(r) if r.owner == *owner => finish(r, outcome, timing, now),
            _ => (Reply::NotOwner, gone),
        },
    }
}

/// A claim that found a live record.
fn found(r: &Record, args: &str, timing: &Timing, now: Millis) -> (Reply, Write) {
    let same_args = r.args == args;
    match &r.state {
        State::Claimed { lease_until } if now < *lease_until => (
            Reply::Busy {
                ago: now.saturating_sub(r.started),
                same_args,
            },
            Write::Keep,
        ),
        State::Claimed { .. } => {
            let mut lost = r.clone();
            lost.state = State::Unknown {
                cause: OWNER_LOST.to_owned(),
                at: now,
            };
            lost.expires = r.expires.max(now.saturating_add(timing.ttl));
            let reply = Reply::Unknown {
                cause: OWNER_LOST.to_owned(),
                ago: now.saturating_sub(r.started),
                same_args,
            };
            (reply, Write::Put(lost))
        }
        State::Done {
            at,
            result: Some(result),
        } => (
            Reply::Replay {
                result: result.clone(),
                ago: now.saturating_sub(*at),
                same_args,
            },
            Write::Keep,
        ),
        State::Done { at, result: None } => {
            let ago = now.saturating_sub(*at);
            (Reply::Ran { ago, same_args }, Write::Keep)
        }
        State::Unknown { cause, .. } => (
            Reply::Unknown {
                cause: cause.clone(),
                ago: now.saturating_sub(r.started),
                same_args,
            },
            Write::Keep,
        ),
    }
}

/// The owner's outcome on its live record.
fn finish(r: &Record, outcome: &Outcome, timing: &Timing, now: Millis) -> (Reply, Write) {
    let mut next = r.clone();
    let open = matches!(r.state, State::Claimed { .. } | State::Unknown { .. });
    if !open {
        // Already done: the first outcome stands.
        return (Reply::NotOwner, Write::Keep);
    }
    match outcome {
        Outcome::Released => return (Reply::Written, Write::Delete),
        Outcome::Result(result) => {
            next.state = State::Done {
                at: now,
                result: Some(result.clone()),
            };
        }
        Outcome::Ran => {
            next.state = State::Done {
                at: now,
                result: None,
            }
        }
        Outcome::Unknown(cause) => {
            if matches!(r.state, State::Unknown { .. }) {
                return (Reply::Written, Write::Keep);
            }
            next.state = State::Unknown {
                cause: cause.clone(),
                at: now,
            };
        }
    }
    next.expires = now.saturating_add(timing.ttl);
    (Reply::Written, Write::Put(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        ttl: 60_000,
        lease: 3_000,
    };

    /// A tiny engine: one record, the writes applied.
    struct One(Option<Record>);

    impl One {
        fn run(&mut self, op: &Op, now: Millis) -> Reply {
            let (reply, write) = apply(self.0.as_ref(), op, now);
            match write {
                Write::Keep => {}
                Write::Put(r) => self.0 = Some(r),
                Write::Delete => self.0 = None,
            }
            reply
        }
    }

    fn claim(owner: &str, args: &str) -> Op {
        Op::Claim {
            owner: owner.into(),
            args: args.into(),
            timing: T,
            about: About::default(),
        }
    }

    fn finish(owner: &str, outcome: Outcome) -> Op {
        Op::Finish {
            owner: owner.into(),
            outcome,
            timing: T,
        }
    }

    fn renew(owner: &str) -> Op {
        Op::Renew {
            owner: owner.into(),
            timing: T,
        }
    }

    #[test]
    fn a_claim_is_made_only_if_absent() {
        let mut s = One(None);
        assert_eq!(s.run(&claim("a", "x"), 1_000), Reply::Claimed);
        let r = s.0.clone().unwrap();
        assert_eq!(r.started, 1_000);
        assert_eq!(r.expires, 61_000);
        assert_eq!(r.state, State::Claimed { lease_until: 4_000 });
        // A twin, same or other arguments, is busy while the lease lives.
        assert_eq!(
            s.run(&claim("b", "x"), 3_999),
            Reply::Busy {
                ago: 2_999,
                same_args: true
            }
        );
        assert_eq!(
            s.run(&claim("b", "y"), 2_000),
            Reply::Busy {
                ago: 1_000,
                same_args: false
            }
        );
        assert_eq!(s.0.as_ref().unwrap().owner, "a");
    }

    #[test]
    fn the_record_lives_at_least_the_lease() {
        let short = Timing {
            ttl: 10,
            lease: 500,
        };
        let (_, w) = apply(
            None,
            &Op::Claim {
                owner: "a".into(),
                args: "x".into(),
                timing: short,
                about: About::default(),
            },
            0,
        );
        let Write::Put(r) = w else { panic!() };
        assert_eq!(r.expires, 500);
    }

    #[test]
    fn renewal_extends_lease_and_record_for_the_owner_only() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        assert_eq!(renew_due(0, T.lease), 1_000);
        assert_eq!(s.run(&renew("b"), 1_000), Reply::NotOwner);
        assert_eq!(
            s.0.as_ref().unwrap().state,
            State::Claimed { lease_until: 3_000 }
        );
        assert_eq!(s.run(&renew("a"), 1_000), Reply::Written);
        let r = s.0.clone().unwrap();
        assert_eq!(r.state, State::Claimed { lease_until: 4_000 });
        assert_eq!(r.expires, 61_000);
        // A call that lives past the ttl keeps its record alive.
        let mut t = 1_000;
        while t < 100_000 {
            t = renew_due(t, T.lease);
            assert_eq!(s.run(&renew("a"), t), Reply::Written);
        }
        assert!(s.0.as_ref().unwrap().expires >= t + T.ttl);
        assert!(matches!(s.run(&claim("b", "x"), t + 1), Reply::Busy { .. }));
    }

    #[test]
    fn a_claim_whose_lease_is_gone_becomes_unknown() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        let unknown = |ago| Reply::Unknown {
            cause: OWNER_LOST.into(),
            ago,
            same_args: true,
        };
        assert_eq!(s.run(&claim("b", "x"), 3_000), unknown(3_000));
        let r = s.0.clone().unwrap();
        assert_eq!(r.owner, "a");
        assert_eq!(
            r.state,
            State::Unknown {
                cause: OWNER_LOST.into(),
                at: 3_000
            }
        );
        assert_eq!(r.expires, 63_000);
        // It stays unknown: never run again within its ttl.
        assert_eq!(s.run(&claim("c", "x"), 62_999), unknown(62_999));
        // The owner whose lease ran out cannot renew it back.
        assert_eq!(s.run(&renew("a"), 4_000), Reply::NotOwner);
    }

    #[test]
    fn a_result_is_kept_for_the_ttl_and_replayed() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        assert_eq!(
            s.run(&finish("a", Outcome::Result("{\"ok\":1}".into())), 2_000),
            Reply::Written
        );
        assert_eq!(s.0.as_ref().unwrap().expires, 62_000);
        let replay = Reply::Replay {
            result: "{\"ok\":1}".into(),
            ago: 59_999,
            same_args: true,
        };
        assert_eq!(s.run(&claim("b", "x"), 61_999), replay);
        // Expired: a new claim.
        assert_eq!(s.run(&claim("b", "x"), 62_000), Reply::Claimed);
        assert_eq!(s.0.as_ref().unwrap().owner, "b");
    }

    #[test]
    fn done_without_a_result_is_never_run_again() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        s.run(&finish("a", Outcome::Ran), 500);
        assert_eq!(
            s.run(&claim("b", "y"), 1_000),
            Reply::Ran {
                ago: 500,
                same_args: false
            }
        );
        // The first outcome stands.
        assert_eq!(s.run(&finish("a", Outcome::Released), 600), Reply::NotOwner);
        assert!(s.0.is_some());
    }

    #[test]
    fn released_lets_the_next_call_run() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        assert_eq!(s.run(&finish("a", Outcome::Released), 100), Reply::Written);
        assert_eq!(s.0, None);
        assert_eq!(s.run(&claim("b", "x"), 200), Reply::Claimed);
    }

    #[test]
    fn unknown_is_not_run_again_and_a_late_success_replaces_it() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        s.run(&finish("a", Outcome::Unknown("timeout".into())), 1_000);
        let r = s.0.clone().unwrap();
        assert_eq!(r.expires, 61_000);
        assert_eq!(
            s.run(&claim("b", "x"), 2_000),
            Reply::Unknown {
                cause: "timeout".into(),
                ago: 2_000,
                same_args: true
            }
        );
        // A second unknown keeps the first cause.
        s.run(
            &finish("a", Outcome::Unknown("server_exited".into())),
            2_500,
        );
        assert_eq!(s.0, Some(r));
        // Only the owner's late success replaces it.
        assert_eq!(
            s.run(&finish("b", Outcome::Result("1".into())), 3_000),
            Reply::NotOwner
        );
        assert_eq!(
            s.run(&finish("a", Outcome::Result("1".into())), 3_000),
            Reply::Written
        );
        assert!(matches!(
            s.run(&claim("b", "x"), 4_000),
            Reply::Replay { .. }
        ));
    }

    #[test]
    fn a_late_error_lifts_an_unknown_record() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        s.run(&claim("b", "x"), 5_000); // lease gone: unknown
        assert!(matches!(s.0.as_ref().unwrap().state, State::Unknown { .. }));
        assert_eq!(
            s.run(&finish("a", Outcome::Released), 6_000),
            Reply::Written
        );
        assert_eq!(s.run(&claim("b", "x"), 6_001), Reply::Claimed);
    }

    #[test]
    fn unknown_expires_after_its_ttl() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        s.run(&finish("a", Outcome::Unknown("timeout".into())), 10);
        assert!(matches!(
            s.run(&claim("b", "x"), 60_009),
            Reply::Unknown { .. }
        ));
        assert_eq!(s.run(&claim("b", "x"), 60_010), Reply::Claimed);
    }

    #[test]
    fn writes_on_an_expired_record_delete_it() {
        let mut s = One(None);
        s.run(&claim("a", "x"), 0);
        assert!(!expired(s.0.as_ref().unwrap(), 59_999));
        assert!(expired(s.0.as_ref().unwrap(), 60_000));
        assert_eq!(
            s.run(&finish("a", Outcome::Result("1".into())), 60_000),
            Reply::NotOwner
        );
        assert_eq!(s.0, None);
        assert_eq!(s.run(&renew("a"), 60_001), Reply::NotOwner);
    }

    #[test]
    fn an_unknown_outcome_is_seen_in_an_unknown_record_or_a_lapsed_lease() {
        let mut s = One(None);
        let mut about = claim("a", "x");
        if let Op::Claim { about: a, .. } = &mut about {
            a.tool = "pay".into();
            a.key = "K-1".into();
        }
        s.run(&about, 0);
        let r = s.0.clone().unwrap();
        assert_eq!(r.about.tool, "pay");
        assert!(is_open(&r));
        // A live claim is not unknown; once its lease is gone it is.
        assert_eq!(unknown_at(&r, 2_999), None);
        let lost = unknown_at(&r, 3_000).unwrap();
        assert_eq!(
            lost.state,
            State::Unknown {
                cause: OWNER_LOST.into(),
                at: 3_000
            }
        );
        assert_eq!((lost.started, &lost.about), (0, &r.about));
        // Nothing was written by looking.
        assert_eq!(s.0.as_ref(), Some(&r));
        s.run(&finish("a", Outcome::Unknown("timeout".into())), 1_000);
        let u = s.0.clone().unwrap();
        assert_eq!(unknown_at(&u, 5_000), Some(u.clone()));
        assert_eq!(unknown_at(&u, u.expires), None, "expired");
        s.run(&finish("a", Outcome::Result("1".into())), 2_000);
        let done = s.0.clone().unwrap();
        assert!(!is_open(&done));
        assert_eq!(unknown_at(&done, 5_000), None);
        assert_eq!(done.about.key, "K-1", "kept through the outcome");
    }

    #[test]
    fn a_record_without_about_reads_with_an_empty_one() {
        let text = r#"{"owner":"o","args":"","started":1,"expires":2,"state":{"state":"unknown","cause":"timeout","at":1}}"#;
        let r: Record = serde_json::from_str(text).unwrap();
        assert_eq!(r.about, About::default());
    }

    #[test]
    fn a_record_survives_its_json_form() {
        let r = Record {
            owner: "o".into(),
            args: "a".into(),
            started: 1,
            expires: 2,
            state: State::Done {
                at: 1,
                result: Some("{\"content\":[]}".into()),
            },
            about: About {
                server: "s".into(),
                tool: "pay".into(),
                key: "K-1".into(),
            },
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"state\":\"done\""), "{text}");
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r);
    }
}
