//! Run and step states, and the legal moves between them.
//!
//! The moves are written once, in `moves!` below, which produces both the data table
//! (`STEP_MOVES`, `RUN_MOVES`, compared by a test with the table in ARCHITECTURE.md) and the
//! marker types with a `MoveTo<To>` impl for each legal pair. The store's transition functions
//! take the source states as a type parameter bounded by `MoveTo<To>`, so an illegal move does
//! not compile, and they put the same source states in the `WHERE` of the `UPDATE`, so a row
//! that is no longer in one of them (a stale holder, a concurrent cancel) is not touched.
//!
//! ```compile_fail
//! // A finished step never moves again: there is no `MoveTo<Running>` for `Succeeded`.
//! fn needs<F: engine::state::MoveTo<engine::state::step::Running>>() {}
//! needs::<engine::state::step::Succeeded>();
//! ```

use std::fmt;

/// A state's name as stored in the `state`/`status` column.
pub trait State {
    const NAME: &'static str;
}

/// Implemented for `(From, To)` pairs that are legal moves, and for tuples of sources that may
/// all move to `To`.
pub trait MoveTo<To: State> {
    fn sources() -> Vec<&'static str>;
}

macro_rules! states {
    ($module:ident, $enum:ident, $table:ident, { $($state:ident = $name:literal => [$($to:ident),*]),* $(,)? }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $enum { $($state),* }

        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$state),*];

            pub fn name(self) -> &'static str {
                match self { $($enum::$state => $name),* }
            }

            pub fn parse(s: &str) -> Option<$enum> {
                match s { $($name => Some($enum::$state),)* _ => None }
            }
        }

        impl fmt::Display for $enum {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        /// Every legal move, as data.
        pub const $table: &[($enum, $enum)] = &[$($(($enum::$state, $enum::$to),)*)*];

        /// Marker types, one per state.
        pub mod $module {
            $(
                #[derive(Debug, Clone, Copy)]
                pub struct $state;
                impl super::State for $state {
                    const NAME: &'static str = $name;
                }
                $(
                    impl super::MoveTo<$to> for $state {
                        fn sources() -> Vec<&'static str> {
                            vec![$name]
                        }
                    }
                )*
            )*
        }
    };
}

states!(step, StepState, STEP_MOVES, {
    Pending = "pending" => [Leased, Waiting, Succeeded, Failed, Cancelled],
    Leased = "leased" => [Running, Failed, Cancelled],
    // Back to pending: an output deferred by a GitHub rate limit or outage (`deferred:<why>`),
    // retried at the same attempt once the wake it leaves falls due.
    Running = "running" => [Pending, Succeeded, Failed, Cancelled],
    Waiting = "waiting" => [Succeeded, Failed, Cancelled],
    Succeeded = "succeeded" => [],
    Failed = "failed" => [],
    Cancelled = "cancelled" => [],
});

states!(run, RunStatus, RUN_MOVES, {
    Running = "running" => [Completed, Failed, Cancelled],
    Completed = "completed" => [],
    Failed = "failed" => [],
    Cancelled = "cancelled" => [],
});

impl<To: State, A: MoveTo<To>, B: MoveTo<To>> MoveTo<To> for (A, B) {
    fn sources() -> Vec<&'static str> {
        [A::sources(), B::sources()].concat()
    }
}

impl<To: State, A: MoveTo<To>, B: MoveTo<To>, C: MoveTo<To>> MoveTo<To> for (A, B, C) {
    fn sources() -> Vec<&'static str> {
        [A::sources(), B::sources(), C::sources()].concat()
    }
}

impl<To: State, A: MoveTo<To>, B: MoveTo<To>, C: MoveTo<To>, D: MoveTo<To>> MoveTo<To> for (A, B, C, D) {
    fn sources() -> Vec<&'static str> {
        [A::sources(), B::sources(), C::sources(), D::sources()].concat()
    }
}

impl StepState {
    /// Open steps hold a run back: something is still to happen to them.
    pub fn is_open(self) -> bool {
        matches!(self, StepState::Pending | StepState::Leased | StepState::Running | StepState::Waiting)
    }

    pub fn is_terminal(self) -> bool {
        !self.is_open()
    }
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

/// Whether `from → to` is in the table.
pub fn step_move_is_legal(from: StepState, to: StepState) -> bool {
    STEP_MOVES.contains(&(from, to))
}

pub fn run_move_is_legal(from: RunStatus, to: RunStatus) -> bool {
    RUN_MOVES.contains(&(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the `| from | to |` rows under a heading of ARCHITECTURE.md.
    fn documented_moves(heading: &str) -> Vec<(String, String)> {
        let doc = include_str!("../../ARCHITECTURE.md");
        let section = doc.split(heading).nth(1).unwrap_or_else(|| panic!("ARCHITECTURE.md has no `{heading}`"));
        let mut moves = Vec::new();
        for line in section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() != 2 || cells[0] == "from" || cells[0].starts_with('-') {
                continue;
            }
            for to in cells[1].split(',').map(str::trim).filter(|t| !t.is_empty() && *t != "—") {
                moves.push((cells[0].trim_matches('`').to_owned(), to.trim_matches('`').to_owned()));
            }
        }
        moves.sort();
        moves
    }

    fn table<S: Copy + fmt::Display>(moves: &[(S, S)]) -> Vec<(String, String)> {
        let mut v: Vec<_> = moves.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        v.sort();
        v
    }

    #[test]
    fn step_moves_match_the_table_in_architecture_md() {
        assert_eq!(table(STEP_MOVES), documented_moves("### Step states"));
    }

    #[test]
    fn run_moves_match_the_table_in_architecture_md() {
        assert_eq!(table(RUN_MOVES), documented_moves("### Run states"));
    }

    #[test]
    fn every_pair_of_step_states_is_legal_exactly_when_listed() {
        let mut legal = 0;
        for &from in StepState::ALL {
            for &to in StepState::ALL {
                let listed = STEP_MOVES.contains(&(from, to));
                assert_eq!(step_move_is_legal(from, to), listed);
                // No move leaves a terminal state, and none stays in place.
                if from.is_terminal() || from == to {
                    assert!(!listed, "{from} -> {to}");
                }
                legal += usize::from(listed);
            }
        }
        assert_eq!(legal, 15);
    }

    #[test]
    fn no_move_leaves_a_terminal_run() {
        for &from in RunStatus::ALL {
            for &to in RunStatus::ALL {
                let legal = run_move_is_legal(from, to);
                assert_eq!(legal, from == RunStatus::Running && to != RunStatus::Running, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn typed_sources_are_the_states_named_in_sql() {
        assert_eq!(<step::Pending as MoveTo<step::Leased>>::sources(), vec!["pending"]);
        assert_eq!(
            <(step::Pending, step::Leased, step::Running, step::Waiting) as MoveTo<step::Cancelled>>::sources(),
            vec!["pending", "leased", "running", "waiting"]
        );
    }

    #[test]
    fn state_names_round_trip() {
        for &s in StepState::ALL {
            assert_eq!(StepState::parse(s.name()), Some(s));
        }
        for &s in RunStatus::ALL {
            assert_eq!(RunStatus::parse(s.name()), Some(s));
        }
        assert_eq!(StepState::parse("bogus"), None);
    }
}
