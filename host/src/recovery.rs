//! What to do, after a restart of the host, about each attempt found in its journal.
//!
//! [`decide`] is a pure function of what the journal says ([`Facts`]) and what the host sees
//! now ([`Observation`]: is the harness's process alive, does the server still count the step
//! as this host's). The agent applies the decision, writes the new state back, and asks again
//! until the attempt is settled: an `Observe` that is not written back would be handed out
//! again forever.
//!
//! Rules, and why:
//! - A process that still runs is never duplicated: it is adopted while the step is ours (also
//!   while the server cannot be reached: supervising takes nothing away), and terminated when the
//!   server has moved on (cancelled, or taken back after the lease lapsed) or when the host had
//!   already decided to stop it.
//! - A process the host was terminating (the reason journalled before the first signal) is
//!   concluded with that reason once gone: it did not "exit unexpectedly", the host killed it,
//!   and the recorded reason must stay true after a crash between the kill and the report.
//! - While the server cannot be reached, nothing destructive is decided about a dead process:
//!   its worktree and output are kept until the result can be reported.
//! - An attempt whose harness never started is concluded as an infrastructure failure, which
//!   the engine retries by itself.

use protocol::{Complete, Outcome};

use crate::journal::Phase;

/// What the journal says about an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub phase: Phase,
    /// The reason the host was stopping the harness, if it was.
    pub terminating: Option<String>,
    /// The result journalled after the harness exited.
    pub result: Option<Complete>,
}

/// What the server says about the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Server {
    /// Still leased or running under this host.
    Ours,
    /// Moved on without this host: its state now (`cancelled`, `failed`, `succeeded`, `gone`).
    MovedOn(String),
    /// Answered, but not with the step's standing (a 5xx, a change rolled back): ask again soon.
    Unsure,
    /// Cannot be reached now.
    Unreachable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub process_alive: bool,
    pub server: Server,
}

/// How an attempt ends.
#[derive(Debug, Clone, PartialEq)]
#[expect(clippy::large_enum_variant, reason = "one per journalled attempt, once at start: boxing the result would buy nothing")]
pub enum Conclusion {
    /// Report this result: the server still counts the step as ours.
    Report(Complete),
    /// Nothing to report: the step moved on without us (its state), or there is no step.
    Abandon(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Already cleaned: only the journal entry is left.
    Nothing,
    /// Settled (reported, or moved on with nothing running): remove the worktree and the entry.
    Clean,
    /// The process runs and the attempt is still ours: supervise it again.
    Adopt,
    /// Nothing can be decided yet (the server answered, but not what the step's standing is):
    /// look again shortly.
    Wait,
    /// The server cannot be reached: decide nothing destructive now; look again later.
    Defer,
    /// Move the attempt to this phase to match what was seen (write it back).
    Observe(Phase),
    /// The process is gone: end the attempt this way.
    Conclude(Conclusion),
    /// The process runs but the attempt cannot go on: journal the intent, stop the process
    /// group, and only once it is gone end the attempt this way.
    Terminate(Conclusion),
}

/// A failure to report, as the host reports its own.
pub fn failure(reason: &str, class: &str) -> Complete {
    Complete {
        outcome: Outcome::Failed,
        reason: Some(reason.to_owned()),
        class: Some(class.to_owned()),
        exit_code: None,
        output: serde_json::json!({}),
        usage: Default::default(),
        harness: None,
    }
}

/// The reason a host restart gives an attempt whose harness never started.
pub const NEVER_STARTED: &str = "host_restarted";

pub fn decide(facts: &Facts, seen: &Observation) -> Decision {
    use Decision::*;
    match facts.phase {
        Phase::Cleaned => return Nothing,
        Phase::Reported => return if seen.process_alive { Terminate(Conclusion::Abandon("reported".into())) } else { Clean },
        _ => {}
    }
    // The host had decided to stop this process: that stands, whatever else is true now.
    if let Some(why) = &facts.terminating {
        let end = match &seen.server {
            Server::MovedOn(state) => Conclusion::Abandon(state.clone()),
            Server::Ours | Server::Unreachable | Server::Unsure => Conclusion::Report(failure(why, "ordinary")),
        };
        return match (seen.process_alive, &seen.server) {
            (true, _) => Terminate(end),
            (false, Server::Unreachable) => Defer,
            (false, Server::Unsure) => Wait,
            (false, _) => Conclude(end),
        };
    }
    match (&seen.server, seen.process_alive) {
        (Server::MovedOn(state), true) => Terminate(Conclusion::Abandon(state.clone())),
        (Server::MovedOn(_), false) => Clean,
        // A process found for an attempt journalled as launching: record it first.
        (Server::Ours | Server::Unreachable | Server::Unsure, true) if facts.phase == Phase::Launching => Observe(Phase::Running),
        (Server::Unreachable | Server::Unsure, true) => Adopt,
        (Server::Unreachable, false) => Defer,
        (Server::Unsure, false) => Wait,
        (Server::Ours, true) => Adopt,
        (Server::Ours, false) => match facts.phase {
            Phase::Claimed | Phase::Prepared | Phase::Launching => Conclude(Conclusion::Report(failure(NEVER_STARTED, "infrastructure"))),
            // It finished while the host was away: its output file says how.
            Phase::Running => Observe(Phase::Exited),
            Phase::Exited => match &facts.result {
                Some(r) => Conclude(Conclusion::Report(r.clone())),
                // An exit whose result was never journalled: say so rather than guess.
                None => Conclude(Conclusion::Report(failure("exit status lost across a host restart", "infrastructure"))),
            },
            Phase::Reported | Phase::Cleaned => Clean,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(phase: Phase) -> Facts {
        Facts { phase, terminating: None, result: None }
    }

    fn seen(alive: bool, server: Server) -> Observation {
        Observation { process_alive: alive, server }
    }

    fn moved() -> Server {
        Server::MovedOn("cancelled".into())
    }

    #[test]
    fn cleaned_and_reported_attempts_need_little() {
        assert_eq!(decide(&facts(Phase::Cleaned), &seen(false, Server::Ours)), Decision::Nothing);
        assert_eq!(decide(&facts(Phase::Reported), &seen(false, Server::Unreachable)), Decision::Clean);
        // A process still running after its result was reported is stopped, not adopted.
        assert!(matches!(decide(&facts(Phase::Reported), &seen(true, Server::Ours)), Decision::Terminate(Conclusion::Abandon(_))));
    }

    #[test]
    fn a_live_process_of_ours_is_adopted_never_duplicated() {
        for phase in [Phase::Running, Phase::Prepared, Phase::Exited] {
            assert_eq!(decide(&facts(phase), &seen(true, Server::Ours)), Decision::Adopt, "{phase:?}");
        }
        // Supervising takes nothing away, so the server being away does not stop it.
        assert_eq!(decide(&facts(Phase::Running), &seen(true, Server::Unreachable)), Decision::Adopt);
        assert_eq!(decide(&facts(Phase::Running), &seen(true, Server::Unsure)), Decision::Adopt);
        // Started, but the host died before it wrote down the pid: record the process found.
        assert_eq!(decide(&facts(Phase::Launching), &seen(true, Server::Ours)), Decision::Observe(Phase::Running));
    }

    #[test]
    fn a_step_that_moved_on_is_terminated_or_cleaned() {
        assert_eq!(decide(&facts(Phase::Running), &seen(true, moved())), Decision::Terminate(Conclusion::Abandon("cancelled".into())));
        assert_eq!(decide(&facts(Phase::Running), &seen(false, moved())), Decision::Clean);
        assert_eq!(decide(&facts(Phase::Claimed), &seen(false, Server::MovedOn("failed".into()))), Decision::Clean);
    }

    #[test]
    fn nothing_destructive_while_the_server_is_away_or_unsure() {
        for phase in [Phase::Claimed, Phase::Prepared, Phase::Launching, Phase::Running, Phase::Exited] {
            assert_eq!(decide(&facts(phase), &seen(false, Server::Unreachable)), Decision::Defer, "{phase:?}");
            assert_eq!(decide(&facts(phase), &seen(false, Server::Unsure)), Decision::Wait, "{phase:?}");
        }
    }

    #[test]
    fn a_harness_that_never_started_is_an_infrastructure_failure() {
        for phase in [Phase::Claimed, Phase::Prepared, Phase::Launching] {
            let Decision::Conclude(Conclusion::Report(r)) = decide(&facts(phase), &seen(false, Server::Ours)) else { panic!("{phase:?}") };
            assert_eq!((r.reason.as_deref(), r.class.as_deref()), (Some(NEVER_STARTED), Some("infrastructure")));
        }
    }

    #[test]
    fn a_harness_that_finished_meanwhile_is_observed_then_concluded() {
        assert_eq!(decide(&facts(Phase::Running), &seen(false, Server::Ours)), Decision::Observe(Phase::Exited));
        let mut f = facts(Phase::Exited);
        let ok = Complete { outcome: Outcome::Succeeded, ..failure("", "ordinary") };
        f.result = Some(ok.clone());
        assert_eq!(decide(&f, &seen(false, Server::Ours)), Decision::Conclude(Conclusion::Report(ok)));
        let Decision::Conclude(Conclusion::Report(r)) = decide(&facts(Phase::Exited), &seen(false, Server::Ours)) else { panic!() };
        assert_eq!(r.class.as_deref(), Some("infrastructure"));
    }

    #[test]
    fn a_journalled_termination_keeps_its_reason() {
        let mut f = facts(Phase::Running);
        f.terminating = Some("timeout".into());
        // Killed by us, then we crashed before reporting: the reason is the journalled one.
        let Decision::Conclude(Conclusion::Report(r)) = decide(&f, &seen(false, Server::Ours)) else { panic!() };
        assert_eq!(r.reason.as_deref(), Some("timeout"));
        // Crashed before the kill took: terminate again, same reason.
        let Decision::Terminate(Conclusion::Report(r)) = decide(&f, &seen(true, Server::Ours)) else { panic!() };
        assert_eq!(r.reason.as_deref(), Some("timeout"));
        // Still stopped while the server is away; reported once it is back.
        assert!(matches!(decide(&f, &seen(true, Server::Unreachable)), Decision::Terminate(_)));
        assert_eq!(decide(&f, &seen(false, Server::Unreachable)), Decision::Defer);
        // The server moved on meanwhile: nothing to report.
        assert_eq!(decide(&f, &seen(false, moved())), Decision::Conclude(Conclusion::Abandon("cancelled".into())));
    }

    #[test]
    fn no_decision_adopts_a_dead_process_or_concludes_a_live_one() {
        let phases = [Phase::Claimed, Phase::Prepared, Phase::Launching, Phase::Running, Phase::Exited, Phase::Reported, Phase::Cleaned];
        let servers = [Server::Ours, moved(), Server::Unsure, Server::Unreachable];
        for phase in phases {
            for terminating in [None, Some("timeout".to_owned())] {
                for server in &servers {
                    for alive in [false, true] {
                        let f = Facts { phase, terminating: terminating.clone(), result: None };
                        let d = decide(&f, &seen(alive, server.clone()));
                        if !alive {
                            assert!(!matches!(d, Decision::Adopt | Decision::Terminate(_)), "{f:?} {server:?} dead: {d:?}");
                        } else if phase != Phase::Cleaned {
                            assert!(!matches!(d, Decision::Conclude(_) | Decision::Clean), "{f:?} {server:?} alive: {d:?}");
                        }
                    }
                }
            }
        }
    }
}
